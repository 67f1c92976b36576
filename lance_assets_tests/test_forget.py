"""Snapshots with owners and a retention, and ``forget``: documents removed from every version
on disk, the runs that held them named, a running run protecting its snapshot unless forced."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import lance
import numpy as np
import pyarrow as pa
import pytest

from lance_assets.curation import dedup_flag
from lance_assets.defs.training.assets import training_snapshot
from lance_assets.defs.training.config import TrainConfig
from lance_assets.ingest.raw_text import ingest
from lance_assets.table import Table
from lance_assets.table.fingerprint import data_version
from lance_assets.table.forget import ForgetError, forget
from lance_assets.table.forget_journal import Journal
from lance_assets.table.maintenance import maintain
from lance_assets.table.producer import produce
from lance_assets_tests.helpers import quiet, write_fineweb_parquet


def _table(root: Path, rows: int = 600) -> Table:
    ingest(Table.of(root), f"synthetic:{rows}", rows_per_fragment=100, rows_per_commit=200, log=quiet)
    return Table.of(root)


def test_five_unnamed_runs_with_a_retention_of_two_keep_the_newest_two(tmp_path):
    root = tmp_path / "data"
    table = _table(root, 300)
    tags = []
    for i in range(5):  # the asset's own snapshot step, one ingest between runs
        ingest(Table.of(root), f"synthetic:{300 + 100 * (i + 1)}", rows_per_fragment=100, log=quiet)
        tag, version = training_snapshot(TrainConfig(), table, root / "train" / f"run{i}")
        tags.append((tag, version))
    named, _ = training_snapshot(TrainConfig(run_name="keep"), table, root / "train" / "keep")
    report = maintain(table, keep_versions_for=timedelta(0), keep_unnamed_runs=2, log=quiet)
    assert set(report.tags_released) == {t for t, _ in tags[:3]}
    assert set(report.tags_kept) == {tags[3][0], tags[4][0], named}
    assert "newest 2 unnamed" in report.retention[tags[0][0]]
    from lance_assets.forensics.pinned import open_snapshot
    from lance_assets.train.data import resolve_version

    for tag, version in tags[3:]:  # how resume (the trainer) and the forensics open a run's data
        assert resolve_version(table, tag=tag) == version
        pinned = open_snapshot(table, version, tag)
        assert pinned.version == version
        assert pinned.count_rows() == lance.dataset(table.uri, version=version).count_rows()
    for tag, version in tags[:3]:
        with pytest.raises(FileNotFoundError, match="no longer exists"):
            open_snapshot(table, version, tag)


def test_maintenance_commits_do_not_change_the_data_version(tmp_path):
    root = tmp_path / "data"
    table = _table(root)
    produce(dedup_flag.PRODUCER, Table.of(root), log=quiet)
    before = data_version(table.newest())
    maintain(table, keep_versions_for=timedelta(0), target_rows_per_fragment=1000, log=quiet)
    table.set_config("lance_assets.test", {"x": 1})
    assert table.newest().version > 0 and data_version(table.newest()) == before
    table.newest().delete("id = 3")
    assert data_version(table.newest()) != before


def _texts(table: Table, where: str) -> list[str]:
    return table.newest().to_table(columns=["text"], filter=where).column("text").to_pylist()


def _on_disk(uri: str, texts: list[str]) -> list[str]:
    """Data files on disk (referenced by a version or not) that hold one of ``texts``: every
    file is read as a Lance file, so compressed text is found too."""
    from lance.file import LanceFileReader

    found = []
    for path in Path(uri, "data").glob("*.lance"):
        table = LanceFileReader(str(path)).read_all().to_table()
        for col in table.columns:
            if pa.types.is_string(col.type) and set(texts) & set(col.to_pylist()):
                found.append(path.name)
    return found


def test_forget_removes_the_documents_from_every_version_on_disk_and_names_the_runs(tmp_path):
    root = tmp_path / "data"
    src = tmp_path / "src" / "a.parquet"
    src.parent.mkdir()
    write_fineweb_parquet(src, [f"document {i}: " + " ".join(f"w{i * 7 + j}" for j in range(80))
                                for i in range(600)])
    ingest(Table.of(root), str(src), rows_per_fragment=100, rows_per_commit=200, log=quiet)
    table = Table.of(root)
    forgotten = _texts(table, "id IN (5, 123, 444)")
    run = root / "train" / "r1"
    run.mkdir(parents=True)
    tag, version = training_snapshot(TrainConfig(run_name="r1"), table, run)
    (run / "summary.json").write_text(json.dumps({"table_version": version, "table_tag": tag,
                                                  "filter": "id < 200"}))
    (run / "ckpt_0000010.pt").write_bytes(b"weights")
    (root / "train" / "LATEST").write_text(str(run / "ckpt_0000010.pt"))  # the newest model
    reports = root / "reports"
    reports.mkdir()
    (reports / "forensics.json").write_text(json.dumps({"excerpt": forgotten[0][:300]}))
    ingest(Table.of(root), "synthetic:900", rows_per_fragment=100, rows_per_commit=200, log=quiet)
    produce(dedup_flag.PRODUCER, Table.of(root), log=quiet)
    assert _on_disk(table.uri, forgotten)

    out = subprocess.run([sys.executable, "-m", "lance_assets", "forget", "--where",
                          "id IN (5, 123, 444)", "--data", str(root), "--json"],
                         capture_output=True, text=True, check=True)
    report = json.loads(out.stdout)
    assert report["ids"] == 3 and report["rows_deleted"] == 3
    assert report["runs"] == ["r1"] and report["released"] == {}
    assert report["redacted"][tag]["from_version"] == version  # r1's snapshot, minus the three
    assert table.open(tag).count_rows() == 597
    holder = report["holders"][0]
    assert holder["rows"] == 3 and holder["trained_on"] == 2  # ids 5 and 123 passed id < 200
    assert holder["checkpoints"] == [str(run / "ckpt_0000010.pt")]
    assert report["still_readable"] == 0
    for v in table.newest().versions():
        ds = lance.dataset(table.uri, version=v["version"])
        assert ds.count_rows(filter="id IN (5, 123, 444)") == 0
    # no data file holds the text any more (unless another document has the same text)
    live = set(table.newest().to_table(columns=["text"]).column("text").to_pylist())
    gone = [t for t in forgotten if t not in live]
    assert gone and not _on_disk(table.uri, gone)
    log = (root / "forget.log.jsonl").read_text().splitlines()
    assert json.loads(log[-1])["ids"] == 3
    # every rebuild command works as printed: the report pinned r1's snapshot, redacted, so
    # `--select forensics` alone makes it again; r1's own folder goes before a run of that name
    import shlex

    import dagster as dg

    from lance_assets.definitions import defs
    from lance_assets.forensics.pinned import resolve_pin

    rebuild = next(f["rebuild"] for f in report["files_removed"]
                   if f["path"].endswith("forensics.json"))
    selection = shlex.split(rebuild)[shlex.split(rebuild).index("--select") + 1]
    chosen = dg.AssetSelection.from_string(selection).resolve(defs.resolve_asset_graph())
    assert {k.to_user_string() for k in chosen} == {"forensics"}
    pin = resolve_pin(Table.of(root))  # what `--select forensics` meets: r1's redacted snapshot
    assert pin.version == version and pin.tag == tag
    words = shlex.split(holder["rebuild"])
    assert words[:3] == ["rm", "-rf", str(run)] and words[3] == "&&"
    config = json.loads(words[-1])["ops"]["pretrained_model"]["config"]
    assert config == {"run_name": "r1"}


def test_forget_refuses_while_a_run_reads_a_snapshot_unless_forced(tmp_path):
    root = tmp_path / "data"
    table = _table(root)
    tag, _ = training_snapshot(TrainConfig(run_name="busy"), table, root / "train" / "busy")
    with table.snapshots.using(tag):
        with pytest.raises(ForgetError, match="train-busy"):
            forget(table, "id = 7", log=quiet)
        assert table.newest().count_rows(filter="id = 7") == 1  # nothing happened
        report = forget(table, "id = 7", force=True, log=quiet)
    assert report.forced and tag in report.redacted and report.still_readable == 0


@pytest.mark.parametrize("where", ["text = 'x'; DROP TABLE corpus", "nope > 1", ""])
def test_forget_rejects_a_bad_predicate_and_changes_nothing(tmp_path, where):
    table = _table(tmp_path / "data", 200)
    version = table.newest().version
    with pytest.raises(ForgetError):
        forget(table, where, log=quiet)
    assert table.newest().version == version


WORD = "zorblax"


def _files_holding(base: Path, needle: bytes) -> list[str]:
    return sorted(str(p.relative_to(base)) for p in base.rglob("*")
                  if p.is_file() and needle in p.read_bytes())


def test_forget_reaches_the_indexes_reports_samples_and_log(tmp_path):
    """A document with a word no other has, through the full-text and vector indexes, a corpus
    BPE, its story, a forensics report and a sample that reproduces it; then a forget whose
    predicate quotes it. Afterwards no file under the data root holds the word but the tokenizer,
    which the report names with the command that rebuilds it; every index in force was rebuilt
    over the remaining rows; the log keeps the predicate's digest, not its text."""
    from lance_assets.embeddings import embeddings
    from lance_assets.embeddings.vector_index import vector_index
    from lance_assets.forensics import explain as ex
    from lance_assets.forensics.text_index import search, text_index
    from lance_assets.testing.embedders import ClusteredEmbedder
    from lance_assets.tokens.bpe import train_bpe

    root = tmp_path / "data"
    planted = " ".join(f"{WORD} stands beside common word{i} here" for i in range(12))
    texts = [f"document {i}: " + " ".join(f"w{(i * 7 + j) % 300}" for j in range(60))
             for i in range(1200)]
    src = tmp_path / "src" / "a.parquet"
    src.parent.mkdir()
    write_fineweb_parquet(src, texts[:700] + [planted] + texts[700:])
    ingest(Table.of(root), str(src), rows_per_fragment=200, log=quiet)
    table = Table.of(root)
    doc = int(table.newest().to_table(columns=["id"], filter=f"text LIKE '%{WORD}%'")
              .column("id")[0].as_py())
    produce(dedup_flag.PRODUCER, Table.of(root), log=quiet)
    text_index(Table.of(root))
    produce(embeddings.PRODUCER, Table.of(root), embeddings.EmbeddingsSettings(embedder=ClusteredEmbedder()),
            log=quiet)
    vector_index(Table.of(root), flat_below=0, index_type="IVF_PQ", recall_queries=5)
    train_bpe(Table.of(root), log=quiet)
    ex.save(table, ex.explain(table, doc))
    reports, samples = root / "reports", root / "samples"
    (reports / "forensics.json").write_text(json.dumps({"sources": [{"id": doc,
                                                                     "excerpt": planted[:200]}]}))
    (reports / "forensics.md").write_text("> " + planted[40:400] + "\n")
    samples.mkdir()
    (samples / "samples.json").write_text(json.dumps({"samples": [
        {"prompt": "The", "completion": planted[17:300]}, {"prompt": "", "completion": "x y"}]}))
    (samples / "other.json").write_text(json.dumps({"samples": [{"completion": texts[3]}]}))
    assert len(search(Table.of(root), WORD, columns=("id",))) == 1
    assert "reports/forensics.md" in _files_holding(root, WORD.encode())
    uuids = {name: {i["uuid"] for i in table.newest().list_indices() if i["name"] == name}
             for name in ("text_fts", "embedding_ann")}
    assert all(uuids.values())

    where = f"text LIKE '%{WORD}%'"
    report = forget(table, where, log=quiet)
    assert report.ids == 1 and report.still_readable == 0

    # no file outside the table (whose files are checked like any version) quotes it, but the
    # tokenizer, named with its rebuild command
    left = _files_holding(root, WORD.encode())
    assert all(p.startswith("tokenizers/") for p in left), left
    tokenizer = (root / "tokenizers" / "LATEST").read_text().strip()
    assert [(a["path"], a["rebuild"].split()[-1]) for a in report.artifacts] == \
        [(str(root / "tokenizers" / f"{tokenizer}.json"), "tokenizer")]
    removed = {Path(f["path"]).relative_to(root).as_posix(): f["rebuild"]
               for f in report.files_removed}
    assert set(removed) == {f"reports/stories/{doc}.md", f"reports/stories/{doc}.json",
                            "reports/forensics.json", "reports/forensics.md",
                            "samples/samples.json"}
    assert removed["samples/samples.json"].endswith("--select samples")
    assert removed[f"reports/stories/{doc}.md"].endswith("--select document_stories")
    assert (samples / "other.json").is_file()  # it quotes another document only
    indexes = {i["name"]: i for i in report.indexes}
    assert set(indexes) == {"text_fts", "embedding_ann"}, indexes
    rows = table.newest().count_rows()
    assert all(i["rows"] == rows == i["indexed_rows_now"] for i in report.indexes)
    after = table.newest()
    for name, before in uuids.items():  # built again, not remapped
        assert not before & {i["uuid"] for i in after.list_indices() if i["name"] == name}
    # the BM25 dictionary holds exactly the words of the remaining rows: as a fresh index's
    fresh = lance.write_dataset(after.to_table(columns=["text"]), tmp_path / "fresh.lance")
    fresh.create_scalar_index("text", "INVERTED")
    tokens = [lance.dataset(u).stats.index_stats(n)["indices"][0]["num_tokens"]
              for u, n in ((after.uri, "text_fts"), (fresh.uri, "text_idx"))]
    assert tokens[0] == tokens[1], tokens
    assert len(search(Table.of(root), WORD, columns=("id",))) == 0
    assert len(search(Table.of(root), "common", columns=("id",))) == 0  # its other words went too
    assert len(search(Table.of(root), "w5", columns=("id",))) > 0  # the index still serves the rest
    log = (root / "forget.log.jsonl").read_text()
    assert WORD not in log and json.loads(log.splitlines()[-1])["predicate_sha256"].startswith(
        "sha256:")


def test_a_forget_that_matches_nothing_changes_nothing(tmp_path):
    root = tmp_path / "data"
    table = _table(root, 300)
    ingest(Table.of(root), "synthetic:400", rows_per_fragment=100, log=quiet)  # a second version or more
    versions = [v["version"] for v in table.newest().versions()]
    assert len(versions) > 1
    report = forget(table, "id = 123456", log=quiet)
    assert report.ids == 0 and report.rows_deleted == 0 and report.versions_removed == 0
    assert [v["version"] for v in table.newest().versions()] == versions
    assert "nothing was deleted" in report.markdown()


def _cli(capsys, root, *args) -> subprocess.CompletedProcess:
    """``python -m lance_assets forget ARGS`` (its ``main``, in this process)."""
    from lance_assets.__main__ import main

    code = main(["forget", "--data", str(root), *args])
    out = capsys.readouterr()
    return subprocess.CompletedProcess(args, code, out.out, out.err)


def test_forget_guards_a_large_or_total_erasure_and_a_dry_run_changes_nothing(tmp_path, capsys):
    """`forget --where "text LIKE '%'"` erases nothing without --allow-all; more than
    --max-share of the rows is refused likewise; --dry-run prints the count, a few urls and
    the snapshots it would release, and changes nothing."""
    root = tmp_path / "data"
    src = tmp_path / "src" / "a.parquet"
    src.parent.mkdir()
    write_fineweb_parquet(src, [f"document {i}: " + " ".join(f"w{i}x{j}" for j in range(20))
                                for i in range(200)])
    ingest(Table.of(root), str(src), rows_per_fragment=50, log=quiet)
    table = Table.of(root)
    tag, _ = training_snapshot(TrainConfig(run_name="r1"), table, root / "train" / "r1")
    version = table.newest().version

    everything = _cli(capsys, root, "--where", "text LIKE '%'")
    assert everything.returncode == 2 and "--allow-all" in everything.stderr
    assert "200 document(s) match in the versions on disk, 100% of the 200 rows" in \
        everything.stderr and "the whole table" in everything.stderr
    many = _cli(capsys, root, "--where", "id < 50")
    assert many.returncode == 2 and "50 document(s) match in the versions on disk, 25% of the " \
        "200 rows the largest version on disk holds" in many.stderr
    assert "--max-share 0.26" in many.stderr
    dry = _cli(capsys, root, "--where", "text LIKE '%'", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert "Dry run: **200 document(s)**" in dry.stdout and f"`{tag}`" in dry.stdout
    assert "https://site0.example/0" in dry.stdout  # a sample of what would go
    assert table.newest().version == version and table.newest().count_rows() == 200
    assert tag in table.snapshots.list()

    done = _cli(capsys, root, "--where", "id < 50", "--max-share", "0.26", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["rows_deleted"] == 50
    assert _cli(capsys, root, "--where", "id >= 0", "--allow-all", "--max-share", "1").returncode == 0
    assert table.newest().count_rows() == 0 and table.open(tag).count_rows() == 0  # redacted


def _forget(root, *args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "lance_assets", "forget", "--data", str(root),
                           *args], capture_output=True, text=True)


def test_the_guard_counts_every_version_and_a_hand_made_snapshot_is_redacted(tmp_path, capsys):
    """An operator tags the table by hand, then deletes `id >= 20` by hand. `forget --where
    "id >= 20"` matches none of the newest version's 20 rows but 380 of the 400 documents on
    disk: refused against the largest version; nothing changes before that. The dry run reports
    the same figures. With the share allowed, the hand-made tag is redacted: it keeps its 20
    other rows.
    Once the newest version is emptied by hand, forgetting what the older one holds is the whole
    table: `--allow-all`, whatever `--max-share`."""
    root = tmp_path / "data"
    table = _table(root, 400)
    table.newest().tags.create("before-cleanup", table.newest().version)  # by hand, with Lance
    table.commit("a delete by hand", lambda d: d.delete("id >= 20"))
    version = table.newest().version
    wide = _forget(root, "--where", "id >= 20")
    assert wide.returncode == 2, wide.stderr
    assert "error: forget (sha256:" in wide.stderr and "Traceback" not in wide.stderr
    assert "380 document(s) match in the versions on disk, 95% of the 400 rows the largest " \
        "version on disk holds" in wide.stderr and "--max-share 0.96" in wide.stderr
    dry = _cli(capsys, root, "--where", "id >= 20", "--dry-run")
    assert dry.returncode == 0 and "Dry run: **380 document(s)**" in dry.stdout
    assert "95% of the 400 rows" in dry.stdout and "0 of them in the newest version's 20" in dry.stdout
    assert "`before-cleanup` (made or named by a user)" in dry.stdout
    assert "--max-share 0.96" in dry.stdout and "Would redact: `before-cleanup`" in dry.stdout
    typo = _cli(capsys, root, "--where", "id >= 20", "--max-share", "0.96", "--release", "befor")
    assert typo.returncode == 2 and "--release befor: the table has no such tag" in typo.stderr
    assert table.newest().version == version and "before-cleanup" in table.snapshots.list()
    assert table.open("before-cleanup").count_rows() == 400
    assert not Journal(table).pending() and not (root / "forget.log.jsonl").exists()

    named = _forget(root, "--where", "id >= 20", "--max-share", "0.96", "--json")
    assert named.returncode == 0, named.stderr
    report = json.loads(named.stdout)
    assert report["released"] == {} and report["ids"] == 380
    assert report["redacted"]["before-cleanup"]["from_version"] == version - 1
    assert (report["largest_rows"], report["share"]) == (400, 0.95)
    kept = table.open("before-cleanup").to_table(columns=["id"]).column("id").to_pylist()
    assert sorted(kept) == list(range(20)) and table.newest().count_rows() == 20

    table.commit("another delete by hand", lambda d: d.delete("id >= 0"))
    whole = _cli(capsys, root, "--where", "id < 20", "--max-share", "1")
    assert whole.returncode == 2 and "the whole table" in whole.stderr
    assert "--allow-all" in whole.stderr and table.open(table.newest().version - 1).count_rows() == 20
    done = _cli(capsys, root, "--where", "id < 20", "--max-share", "1", "--allow-all")
    assert done.returncode == 0, done.stderr


def test_a_pending_forget_redacts_a_users_snapshot_and_releases_it_only_when_named(
        tmp_path, capsys):
    """Forgets killed after their plan, each with a snapshot made by hand that holds its
    documents: one planned without naming it (the rerun redacts it), one whose plan named it
    (the rerun releases it unasked), one tagged after the plan (found by the verification,
    redacted)."""
    root = tmp_path / "data"
    table = _table(root, 300)
    journal = Journal(table)

    def killed_after_plan(ids: list[int], tag: str, release: list[str], holders=True) -> None:
        table.newest().tags.create(tag, table.newest().version)  # by hand, with Lance
        journal.plan(np.asarray(ids), {"release": release, "holders": [
            {"tag": tag, "version": table.newest().version, "rows": len(ids)}] if holders else []})

    killed_after_plan([5, 6], "mine", [])
    rerun = _cli(capsys, root, "--where", "id = 7")
    assert rerun.returncode == 0, rerun.stderr
    assert not journal.pending() and table.snapshots.get("mine").branch
    assert table.open("mine").count_rows() == 297  # 5, 6 and 7 gone, every other row kept
    assert table.open("mine").count_rows(filter="id IN (5, 6, 7)") == 0

    killed_after_plan([8], "yours", ["yours"])
    assert _cli(capsys, root, "--where", "id = 9").returncode == 0
    assert "yours" not in table.snapshots.list()

    killed_after_plan([10], "late", [], holders=False)
    late = _cli(capsys, root, "--where", "id = 11")
    assert late.returncode == 0, late.stderr
    assert not journal.pending() and table.snapshots.get("late").branch
    assert table.open("late").count_rows(filter="id IN (10, 11)") == 0


def test_a_closed_standard_output_costs_the_output_only(tmp_path):
    """`python -m lance_assets forget ... | head -0`: the reader is gone before anything is
    printed. The forget finishes, prints no traceback and exits 0 (its own status); `diff
    --list` through the same entry point likewise, and `python -m lance_assets.forensics
    search`."""
    root = tmp_path / "data"
    _table(root, 200)

    def closed(*args, module="lance_assets") -> subprocess.CompletedProcess:
        read, write = os.pipe()
        os.close(read)  # no reader: the first write fails with EPIPE
        try:
            return subprocess.run([sys.executable, "-m", module, *args, "--data",
                                   str(root)], stdout=write, stderr=subprocess.PIPE, text=True)
        finally:
            os.close(write)

    done = closed("forget", "--where", "id = 7")
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    assert "Forgot **1 document(s)**" in done.stderr  # its log on the standard error
    assert Table.of(root).newest().count_rows(filter="id = 7") == 0
    assert json.loads((root / "forget.log.jsonl").read_text())["ids"] == 1
    listed = closed("diff", "--list")
    assert listed.returncode == 0 and "Traceback" not in listed.stderr, listed.stderr
    found = closed("search", "document", "--mode", "text", module="lance_assets.forensics")
    assert found.returncode == 0 and "Traceback" not in found.stderr, found.stderr
    assert "BrokenPipe" not in found.stderr


def test_snapshots_that_share_a_fragment_share_its_rewritten_file(tmp_path, capsys):
    """Two snapshots made by hand share the fragment that holds id 5 as it is, and hold the
    fragment of id 255 with different deletions (a hand delete of 250 between them). One
    `forget` of both ids puts both copies on one branch: the fragment of 5 is rewritten once and
    both copies read that one file; the fragment of 255 is rewritten for each. Releasing one
    snapshot, a cleanup of the main line with no retention and a second forget leave the other
    reading exactly its rows, and no file under the root keeps a forgotten text."""
    from lance_assets import paths
    from lance_assets.table.redact import redactions
    from lance_assets_tests.helpers import held_on_disk

    root = tmp_path / "data"
    table = _table(root, 300)  # three fragments of 100 rows
    table.newest().tags.create("a", table.newest().version)
    table.commit("a delete by hand", lambda d: d.delete("id = 250"))
    table.newest().tags.create("b", table.newest().version)
    gone = _texts(table, "id IN (5, 6, 255)")

    done = _cli(capsys, root, "--where", "id IN (5, 255)", "--json")
    assert done.returncode == 0, done.stderr
    redacted = json.loads(done.stdout)["redacted"]
    assert {r["branch"] for r in redacted.values()} == {redacted["a"]["branch"]}  # one branch
    branch = redacted["a"]["branch"]
    assert sorted(r["fragments_rewritten"] for r in redacted.values()) == [1, 2]  # 5's once
    snaps = {t: table.open(t) for t in ("a", "b")}
    assert {t: s.count_rows() for t, s in snaps.items()} == {"a": 298, "b": 297}
    files = {t: {f.path for frag in s.get_fragments() for f in frag.metadata.files
                 if f.base_id is None} for t, s in snaps.items()}  # the branch's own files
    assert len(files["a"]) == len(files["b"]) == 2 and len(files["a"] & files["b"]) == 1
    uri = Path(paths.table_uri(root))
    own = {p.name for p in (uri / "tree" / branch / "data").glob("*.lance")}
    assert own == files["a"] | files["b"]  # three rewritten files in all, nothing else

    table.snapshots.release("a", "a test")
    main = table.newest()
    main.cleanup_old_versions(older_than=timedelta(0), error_if_tagged_old_versions=False,
                              delete_unverified=True)
    b = table.open("b")
    assert sorted(b.to_table(columns=["id"]).column("id").to_pylist()) == \
        [i for i in range(300) if i not in (5, 250, 255)]
    assert len(b.to_table()) == 297  # every column of every row reads
    again = _cli(capsys, root, "--where", "id = 6")
    assert again.returncode == 0, again.stderr
    b = table.open("b")
    assert table.snapshots.get("b").branch == branch and b.count_rows() == 296
    assert len({r["op"] for r in redactions(b)}) == 2  # redacted again, in place
    assert held_on_disk(root, [5, 6, 255]) == []
    assert _on_disk(str(uri), gone) == []
    for folder in (uri / "tree").iterdir():
        assert _on_disk(str(folder), gone) == []
