"""``forget`` off the happy path: killed at every phase and run again, after an operator's own
delete, racing a column writer. Afterwards no version on disk holds a forgotten document, read
through Lance (every version's rows, and every data file a version references, deleted rows
included), and no side store holds its vector."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import lance
import pytest

from lance_assets import paths
from lance_assets.curation import semantic_dup as sd
from lance_assets.curation import semantic_store as ss
from lance_assets.embeddings import chunk_embeddings
from lance_assets.ingest.raw_text import ingest
from lance_assets.table import Table
from lance_assets.table.forget import ForgetError, forget
from lance_assets.table.producer import produce
from lance_assets.testing.semantic_planted import SynonymBagEmbedder, planted_set
from lance_assets_tests.helpers import held_on_disk, quiet

REPO = Path(__file__).resolve().parents[1]
SEMANTIC = sd.SemanticDupSettings(threshold=0.75, rows_per_cluster=40, languages=[])


def stored_vectors(root) -> set[int]:
    store = ss.side_store(Table.of(root))
    state = store.load_state()
    return set() if state is None else set(store.ids(state).tolist())


@pytest.fixture(scope="module")
def semantic_table(tmp_path_factory):
    """Planted originals and reworded copies with their chunk embeddings and `semantic_dup`; the
    id of one original (with its copy) to forget."""
    planted = planted_set(8, 1, 8, seed=29, drop=0.1, synonyms=0.4, shuffle=0.5)
    base = tmp_path_factory.mktemp("forget-faults")
    root = base / "data"
    src = base / "a.jsonl"
    src.write_text("".join(json.dumps({"text": t, "url": f"https://ex.org/{i}"}) + "\n"
                           for i, t in enumerate(planted.texts)))
    ingest(Table.of(root), str(src), rows_per_fragment=8, log=quiet)
    produce(chunk_embeddings.PRODUCER, Table.of(root),
            chunk_embeddings.ChunkEmbeddingsSettings(chunk_tokens=64, overlap_tokens=8,
                                                     embedder=SynonymBagEmbedder()),
            log=quiet)
    produce(sd.PRODUCER, Table.of(root), SEMANTIC, log=quiet)
    copy, original = next(iter(planted.copy_of.items()))
    return {"root": root, "planted": planted, "original": original, "copy": copy, "base": base}


def _fresh(semantic_table, tmp_path) -> Path:
    root = tmp_path / "data"
    shutil.copytree(semantic_table["root"], root)
    return root


def _run_killed(root, point: str, n: int, where: str) -> None:
    proc = subprocess.run([sys.executable, "-m", "lance_assets_tests.fault_driver", "forget",
                           str(root), point, str(n), where], cwd=REPO, capture_output=True,
                          text=True, timeout=300, env={**os.environ, "LANCE_LOG": "error"})
    assert proc.returncode == -signal.SIGKILL, (
        f"forget was not killed at {point} {n} (rc {proc.returncode}): {proc.stderr[-2000:]}")


def _copy_comes_back_unflagged(root, semantic_table) -> None:
    """A new copy of the forgotten document is not flagged against it: its vector is gone."""
    planted = semantic_table["planted"]
    src = Path(root).parent / "again.jsonl"
    src.write_text(json.dumps({"text": planted.texts[semantic_table["original"]]}) + "\n")
    ingest(Table.of(root), str(src), rows_per_fragment=8, log=quiet)
    produce(chunk_embeddings.PRODUCER, Table.of(root),
            chunk_embeddings.ChunkEmbeddingsSettings(chunk_tokens=64, overlap_tokens=8,
                                                     embedder=SynonymBagEmbedder()),
            log=quiet)
    produce(sd.PRODUCER, Table.of(root), SEMANTIC, log=quiet)
    new = lance.dataset(paths.table_uri(root)).to_table(
        columns=["id", "semantic_rep", "semantic_dup"]).sort_by("id").to_pylist()[-1]
    assert new["semantic_rep"] not in (semantic_table["original"], semantic_table["copy"]), new


def test_a_forget_killed_right_after_its_delete_is_finished_by_the_next_run(semantic_table,
                                                                           tmp_path):
    """The issue's case: a process killed right after its delete commit. Run again, the same
    forget finishes it (the documents are found in every version on disk, not only the newest)
    and no side store keeps their vectors."""
    root = _fresh(semantic_table, tmp_path)
    ids = {semantic_table["original"], semantic_table["copy"]}
    where = f"id IN ({', '.join(map(str, sorted(ids)))})"
    assert held_on_disk(root, ids) and ids <= stored_vectors(root)
    _run_killed(root, "after-delete", 1, where)
    assert lance.dataset(paths.table_uri(root)).count_rows(filter=where) == 0  # deleted ...
    assert held_on_disk(root, ids)  # ... but older versions still hold them
    report = forget(Table.of(root), where, log=quiet)
    assert report.still_readable == 0
    assert held_on_disk(root, ids) == []
    assert not ids & stored_vectors(root)
    _copy_comes_back_unflagged(root, semantic_table)


KILL_POINTS = ["plan", "files", "delete-commit", "delete", "compaction", "indexes", "cleanup",
               "side-stores", "done"] + [f"redact:train-r1:{p}" for p in (
                   "held", "branch", "overwrite", "delete", "rewrite", "tag", "clean")] + [
               "redact:train-r2:overwrite", "redact:train-r2:rewrite"]


class Killed(BaseException):
    """Stands for a SIGKILL in this process: nothing after it runs (the journal's last append
    is on disk, the next step never starts)."""


def _kill_at(monkeypatch, point: str) -> None:
    import lance_assets.table.forget as fg
    from lance_assets.table import forget_journal as fj

    def after(fn, check=lambda *a, **k: True):
        def inner(*args, **kwargs):
            out = fn(*args, **kwargs)
            if check(*args, **kwargs):
                raise Killed(point)
            return out
        return inner
    if point in ("plan", "files", "delete", "indexes", "done") or point.startswith("redact:"):
        event = point
        monkeypatch.setattr(fj.Journal, "_append", after(
            fj.Journal._append, lambda self, op, ev, *a, **k: ev == event))
    elif point == "delete-commit":
        monkeypatch.setattr(Table, "commit", after(
            Table.commit, lambda self, what, *a, **k: what == "forget: delete"))
    else:
        name = {"compaction": "compact_table", "cleanup": "cleanup_versions",
                "side-stores": "reset_side_folder"}[point]
        monkeypatch.setattr(fg, name, after(getattr(fg, name)))


@pytest.mark.parametrize("point", KILL_POINTS)
def test_a_forget_killed_at_any_phase_is_finished_by_the_next_one(semantic_table, tmp_path,
                                                                  monkeypatch, point):
    """Killed after each phase of its journal (or inside one, after its commit), a forget
    leaves nothing the next one cannot finish: no version of any branch holds the documents, no
    side store their vectors, no report quotes them, the two snapshots that held them are
    redacted once (their tags on one branch, every other row kept, the rewritten files shared),
    and the log has the line."""
    root = _fresh(semantic_table, tmp_path)
    table = Table.of(root)
    ids = {semantic_table["original"], semantic_table["copy"]}
    where = f"id IN ({', '.join(map(str, sorted(ids)))})"
    for tag in ("train-r1", "train-r2"):
        table.snapshots.hold(tag, table.newest().version, owner="test")
    rows = table.open("train-r1").count_rows()
    story = paths.reports_dir(root) / "stories" / f"{semantic_table['original']}.md"
    story.parent.mkdir(parents=True)
    story.write_text("a story")
    _kill_at(monkeypatch, point)
    with pytest.raises(Killed):
        forget(Table.of(root), where, log=quiet)
    monkeypatch.undo()
    report = forget(Table.of(root), where, log=quiet)
    assert report.still_readable == report.still_in_files == 0
    assert [r["ids"] for r in report.resumed] == ([] if point == "done" else [2])
    assert held_on_disk(root, ids) == [] and not ids & stored_vectors(root)
    assert not story.exists()
    from lance_assets.table.redact import redactions

    snap = table.snapshots.get("train-r1")
    assert snap.owner == "test" and set(table.newest().branches.list()) == {snap.branch}
    own = []
    for tag in ("train-r1", "train-r2"):
        copy = table.open(tag)
        assert table.snapshots.get(tag).branch == snap.branch and copy.count_rows() == rows - 2
        assert len(redactions(copy)) == 1
        own.append({f.path for frag in copy.get_fragments() for f in frag.metadata.files
                    if f.base_id is None})
    assert own[0] and own[0] == own[1]  # one rewritten file per fragment, shared
    logged = [json.loads(line) for line in (root / "forget.log.jsonl").read_text().splitlines()]
    assert any(e["ids"] == 2 for e in logged)


def test_an_operators_delete_then_forget_removes_them_from_every_version(semantic_table,
                                                                        tmp_path):
    root = _fresh(semantic_table, tmp_path)
    doc = semantic_table["original"]
    url = f"https://ex.org/{doc}"
    lance.dataset(paths.table_uri(root)).delete(f"url = '{url}'")  # by hand, with Lance
    assert held_on_disk(root, {doc})
    out = subprocess.run([sys.executable, "-m", "lance_assets", "forget", "--where",
                          f"url = '{url}'", "--data", str(root), "--json"],
                         capture_output=True, text=True, cwd=REPO)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["ids"] == 1 and report["still_readable"] == 0
    assert held_on_disk(root, {doc}) == []
    assert doc not in stored_vectors(root)


def test_a_forget_racing_a_column_writer_leaves_no_forgotten_row_in_any_data_file(tmp_path):
    """`quality_signals` commits fragment by fragment in another process while `forget` erases
    one document of every fragment. The forget either leaves no forgotten row in any data file
    a version on disk references, or fails and says so; the writer's next run completes every
    column (its blocking check passes)."""
    import time

    from lance_assets.table.columns import unwritten_rows

    root = tmp_path / "data"
    ingest(Table.of(root), "synthetic:3000", rows_per_fragment=25, log=quiet)
    ids = set(range(7, 3000, 210))
    where = f"id IN ({', '.join(map(str, sorted(ids)))})"
    writer = subprocess.Popen([sys.executable, "-m", "lance_assets_tests.fault_driver",
                               "quality_signals", str(root), "none", "0"], cwd=REPO,
                              stderr=subprocess.PIPE, text=True)
    uri = paths.table_uri(root)
    deadline = time.time() + 120
    while "word_count" not in lance.dataset(uri).schema.names and time.time() < deadline:
        time.sleep(0.05)  # the writer's first commit (its columns) has landed
    try:
        report = forget(Table.of(root), where, log=quiet)
    except ForgetError as e:  # allowed: it says so
        assert "run forget again" in str(e), e
        report = forget(Table.of(root), where, log=quiet)  # finishes once the writer is done
    _, err = writer.communicate(timeout=300)
    assert report.still_readable == 0
    assert held_on_disk(root, ids) == []
    from lance_assets.curation import quality_signals

    produce(quality_signals.PRODUCER, Table.of(root), log=quiet)  # the writer's next run
    ds = lance.dataset(uri)
    assert unwritten_rows(ds, ["word_count"]).complete
    assert ds.count_rows() == 3000 - len(ids)


def test_a_forget_whose_rewrite_a_writer_keeps_preempting_fails_and_says_so(tmp_path,
                                                                           monkeypatch):
    """A writer that commits to a fragment faster than the forget can rewrite it (compaction
    drops a rewrite whose fragments changed meanwhile, and gives up after its rounds): the
    forget checks the data files themselves, never reports success while one holds a forgotten
    row behind a deletion file, and the next forget finishes the job."""
    import lance_assets.table.forget as fg

    root = tmp_path / "data"
    ingest(Table.of(root), "synthetic:400", rows_per_fragment=50, log=quiet)
    real = fg.compact_table

    def preempted(table, *, include=None, **kwargs):  # every rewrite of fragment 2 is dropped
        return real(table, include={f for f in (include or set()) if f != 2}, **kwargs)
    monkeypatch.setattr(fg, "compact_table", preempted)
    monkeypatch.setattr("lance_assets.table.maintenance.incomplete_fragments",
                        lambda ds: {f.fragment_id for f in ds.get_fragments()})
    with pytest.raises(ForgetError, match="run forget again"):
        forget(Table.of(root), "id IN (3, 107, 260)", log=quiet)
    monkeypatch.undo()
    assert held_on_disk(root, {107})  # fragment 2 still holds it, behind a deletion file
    report = forget(Table.of(root), "id IN (3, 107, 260)", log=quiet)
    assert report.still_readable == 0 and held_on_disk(root, {3, 107, 260}) == []


def test_a_forget_landing_inside_a_semantic_dup_run_leaves_no_vector_of_it(semantic_table,
                                                                           tmp_path,
                                                                           monkeypatch):
    """`semantic_dup` reads the earlier rows' vectors and writes its columns; a forget of one
    of those rows lands before the run switches its rows into the store. The run's switch then
    fails against the store `forget` reset and does not put the vector back; the next run makes
    the store again from the remaining rows."""
    root = _fresh(semantic_table, tmp_path)
    planted = semantic_table["planted"]
    ids = {semantic_table["original"], semantic_table["copy"]}
    src = tmp_path / "more.jsonl"
    src.write_text("".join(json.dumps({"text": planted.texts[i] + " more"}) + "\n"
                           for i in range(3)))
    ingest(Table.of(root), str(src), rows_per_fragment=8, log=quiet)
    produce(chunk_embeddings.PRODUCER, Table.of(root),
            chunk_embeddings.ChunkEmbeddingsSettings(chunk_tokens=64, overlap_tokens=8,
                                                     embedder=SynonymBagEmbedder()),
            log=quiet)
    real = ss.append

    def forget_first(*args):
        forget(Table.of(root), f"id IN ({', '.join(map(str, sorted(ids)))})", log=quiet)
        return real(*args)
    monkeypatch.setattr(ss, "append", forget_first)
    produce(sd.PRODUCER, Table.of(root), SEMANTIC, log=quiet)
    monkeypatch.undo()
    assert not ids & stored_vectors(root) and held_on_disk(root, ids) == []
    _copy_comes_back_unflagged(root, semantic_table)
    assert not ids & stored_vectors(root)
