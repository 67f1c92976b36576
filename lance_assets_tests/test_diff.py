"""What changed between two snapshots (``python -m lance_assets diff A B``, the ``data_diff``
metadata of ``pretrained_model``): on a planted history (an ingest, a new tagger column, a rule
change, a re-threshold, a delete by hand, a forget, a compaction between two tagged runs) the
diff reports exactly what a recomputation from the two versions' rows finds, whether it reads
only the changed rows or every row; a snapshot that cleanup removed is named with the retention
that released it."""

from __future__ import annotations

import contextlib
import io
import json
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import lance
import numpy as np
import pyarrow as pa
import pytest

from lance_assets import keys, paths
from lance_assets.__main__ import main as cli
from lance_assets.curation import dedup_flag, near_dup, personal_data, quality_signals, rules
from lance_assets.curation.rules import Curation
from lance_assets.forensics.diff import DiffError, diff
from lance_assets.ingest.raw_text import ingest
from lance_assets.ingest.synthetic import SyntheticSpec, generate
from lance_assets.table import RAW_SCHEMA, Table
from lance_assets.table import read_record as records
from lance_assets.table import snapshots as snaps
from lance_assets.table.forget import forget
from lance_assets.table.maintenance import maintain
from lance_assets.table.producer import produce
from lance_assets.tokens import token_ids
from lance_assets_tests.helpers import quiet, write_fineweb_parquet

RULES_A = {k: rules.DEFAULT_RULES[k] for k in
           ("exact_dup", "near_dup", "gopher_word_count", "gopher_stop_words",
            "fineweb_line_punct")}
# B: one rule re-thresholded, one removed, one added
RULES_B = {**{k: v for k, v in RULES_A.items() if k != "fineweb_line_punct"},
           "gopher_word_count": "word_count BETWEEN 80 AND 100000",
           "no_symbols": "symbol_word_ratio <= 0.05"}


def columns(root) -> None:
    for producer in (dedup_flag, quality_signals, near_dup):
        produce(producer.PRODUCER, Table.of(root), log=quiet)
    produce(token_ids.PRODUCER, Table.of(root), token_ids.TokenIdsSettings(tokenizer="byte"), log=quiet)


def run_record(root, name: str, tag: str, version: int, read: list[int]) -> None:
    """What a finished training run leaves: its summary and its read record."""
    run = paths.run_dir(root, name)
    run.mkdir(parents=True, exist_ok=True)
    (run / "summary.json").write_text(json.dumps({"table_version": version, "table_tag": tag,
                                                  "filter": "NOT is_dup"}))
    order = run / "permutations" / "epoch-0.lance"
    lance.write_dataset(pa.table({"row_id": pa.array(read, pa.uint64())}), str(order))
    records.write(run, table_version=version, step=4, epochs=[
        {"epoch": 0, "rows": str(order), "split_sizes": [len(read)], "positions": None}])


@pytest.fixture(scope="module")
def history(tmp_path_factory):
    base = tmp_path_factory.mktemp("diff")
    root = base / "data"
    ingest(Table.of(root), "synthetic:300", rows_per_fragment=100, log=quiet)
    columns(root)
    table = Table.of(root)
    # an unnamed run on this version: the retention releases it before B
    table.snapshots.hold("train-r0", table.newest().version, owner="pretrained_model",
                         kind=snaps.RUN, named=False)
    run_record(root, "r0", "train-r0", table.newest().version, [1, 2])
    rules.put_in_force(Table.of(root), RULES_A, keep_languages=[], drop_contaminated=False)
    a = table.newest().version
    table.snapshots.hold("train-r1", a, owner="pretrained_model", kind=snaps.RUN)
    run_record(root, "r1", "train-r1", a, list(range(0, 200, 2)))
    ds = table.newest()
    # a kept document with an exact copy: deleting it makes the copy the kept one (is_dup flips)
    copies = ds.to_table(columns=["id", "text_hash"], filter="is_dup").to_pylist()
    dup_of = {r["text_hash"]: r["id"] for r in copies}
    kept = ds.to_table(columns=["id", "text_hash"], filter="NOT is_dup").to_pylist()
    original = next(r["id"] for r in kept if r["text_hash"] in dup_of)
    copy = dup_of[next(r["text_hash"] for r in kept if r["id"] == original)]

    # between the two runs
    more = write_fineweb_parquet(base / "more.parquet", generate(
        SyntheticSpec(rows=120, seed=5)).column("text").to_pylist())
    ingest(Table.of(root), str(more), rows_per_fragment=100, log=quiet)  # ids 300-419
    columns(root)
    produce(personal_data.PRODUCER, Table.of(root), log=quiet)  # a new tagger: columns only B has
    rules.put_in_force(Table.of(root), RULES_B, keep_languages=[], drop_contaminated=False)
    deleted = [original, 7, 150]
    table.commit("delete", lambda d: d.delete(f"id IN ({', '.join(map(str, deleted))})"))
    produce(dedup_flag.PRODUCER, Table.of(root), log=quiet)  # the copy is now the kept member
    # two ingested since A, two A holds and r1 read: forget redacts r1's snapshot
    texts = table.newest().to_table(columns=["text"], filter="id IN (301, 302, 4, 6)")
    with contextlib.redirect_stdout(io.StringIO()):  # as typed: python -m lance_assets forget
        assert cli(["forget", "--where", "id IN (301, 302, 4, 6)", "--data", str(root)]) == 0
    maintain(table, keep_versions_for=timedelta(0), keep_unnamed_runs=0, log=quiet)
    b = table.newest().version
    table.snapshots.hold("train-r2", b, owner="pretrained_model", kind=snaps.RUN)
    run_record(root, "r2", "train-r2", b, list(range(100, 400, 3)))
    return {"root": root, "a": a, "b": b, "deleted": sorted(deleted), "copy": copy,
            "a_ref": "train-r1", "forgotten": [4, 6],
            "texts": texts.column("text").to_pylist()}


# ---- the recomputation: every row of both versions, rules by Lance's filter, in plain Python

def rows_of(ds: lance.LanceDataset) -> dict[int, dict]:
    return {r["id"]: r for r in ds.to_table(
        columns=[f.name for f in ds.schema if f.name != "text"]).to_pylist()}


def kept_ids(ds: lance.LanceDataset, rule_set: dict[str, str]) -> dict[str, set[int]]:
    preds, problems = rules.rule_predicates(ds, rule_set)
    assert not problems
    return {n: set(ds.to_table(columns=["id"], filter=p.lance).column("id").to_pylist())
            for n, p in preds.items()}


def recompute(root, a: int, b: int, rules_a: dict, rules_b: dict, domains: dict) -> dict:
    da = lance.dataset(paths.table_uri(root), version=a)
    db = lance.dataset(paths.table_uri(root), version=b)
    ra, rb = rows_of(da), rows_of(db)
    ka, kb = kept_ids(da, rules_a), kept_ids(db, rules_b)
    all_a, all_b = set(ra), set(rb)
    kept_a = set.intersection(all_a, *ka.values())
    kept_b = set.intersection(all_b, *kb.values())
    both = all_a & all_b

    def tok(rows, ids):
        return sum(rows[i]["n_tokens"] or 0 for i in ids)

    out = {"added": sorted(all_b - all_a), "removed": sorted(all_a - all_b),
           "out": sorted((kept_a - kept_b) & both), "in": sorted((kept_b - kept_a) & both)}
    out["net"] = (len(kept_b) - len(kept_a), tok(rb, kept_b) - tok(ra, kept_a))
    out["rules"] = {}
    for name in list(rules_a) + [n for n in rules_b if n not in rules_a]:
        va, vb = ka.get(name, all_a), kb.get(name, all_b)
        o, i = (va - vb) & both, (vb - va) & both
        out["rules"][name] = (len(o), tok(ra, o), len(i), tok(rb, i))
    out["sources"] = {}
    for src in {r["source"] for r in [*ra.values(), *rb.values()]}:
        ga = {i for i in all_a if ra[i]["source"] == src}
        gb = {i for i in all_b if rb[i]["source"] == src}
        out["sources"][src] = (len(gb - all_a), len(ga - all_b),
                               len(gb & kept_b) - len(ga & kept_a))
    out["domains"] = {}
    for name, text in domains.items():
        ga = set(da.to_table(columns=["id"], filter=text).column("id").to_pylist())
        gb = set(db.to_table(columns=["id"], filter=text).column("id").to_pylist())
        out["domains"][name] = (len(gb - all_a), len(ga - all_b),
                                len(gb & kept_b) - len(ga & kept_a), len((gb & kept_b & both)
                                                                         - kept_a))
    out["columns"] = {}
    ours = [f.name for f in db.schema if f.name not in RAW_SCHEMA.names
            and not f.name.startswith("_")]
    for col in [c for c in ours if c in da.schema.names]:
        t = da.schema.field(col).type
        if not (pa.types.is_boolean(t) or pa.types.is_integer(t) or pa.types.is_floating(t)
                or pa.types.is_string(t)):
            continue

        def same(x, y):
            return x == y or (x != x and y != y)  # NaN is NaN

        changed = [i for i in both if ra[i][col] is not None and rb[i][col] is not None
                   and not same(ra[i][col], rb[i][col])]
        filled = [i for i in both if ra[i][col] is None and rb[i][col] is not None]
        cleared = [i for i in both if ra[i][col] is not None and rb[i][col] is None]
        out["columns"][col] = (len(changed), len(filled), len(cleared),
                               sorted(changed + filled + cleared)[:5])
    out["only_b"] = [c for c in ours if c not in da.schema.names]
    return out


def runs(id_runs: list[list[int]]) -> list[int]:
    return [i for a, b in id_runs for i in range(a, b + 1)]


DOMAINS = {"long": "word_count >= 150", "boilerplate": "bullet_line_share > 0"}


@pytest.mark.parametrize("full", [False, True], ids=["row-versions", "full-scan"])
def test_the_diff_reports_exactly_the_planted_changes(history, full):
    root, a, b = history["root"], history["a"], history["b"]
    got = diff(Table.of(root), "r1", "r2", domains=DOMAINS, full=full)
    want = recompute(root, history["a_ref"], b, RULES_A, RULES_B, DOMAINS)
    assert got.cost["mode"] == ("full scan" if full else "row versions")
    # r1's snapshot was redacted: the documents forget took from it, apart; the rest exactly
    assert runs(got.documents["forgotten_ids"]) == history["forgotten"]
    assert got.a["version"] != a and got.a["forgotten"] == 2 and got.a["branch"]
    # the planted facts, by name
    assert runs(got.documents["removed_ids"]) == want["removed"] == history["deleted"]
    assert runs(got.documents["added_ids"]) == want["added"] == \
        [i for i in range(300, 420) if i not in (301, 302)]  # forgotten: in neither version
    status = {r.rule: r.status for r in got.rules}
    assert status == {"exact_dup": "same", "near_dup": "same", "gopher_word_count": "changed",
                      "gopher_stop_words": "same", "fineweb_line_punct": "removed",
                      "no_symbols": "added"}
    is_dup = next(c for c in got.columns if c.column == "is_dup")
    assert is_dup.to_false >= 1 and history["copy"] in is_dup.examples
    assert {"pii_email_count", "pii_spans"} <= set(got.columns_only_b)
    assert got.columns_only_b == want["only_b"]
    # everything else, against the recomputation
    moved = {r.rule: (r.out_docs, r.out_tokens, r.in_docs, r.in_tokens) for r in got.rules}
    assert moved == want["rules"]
    assert moved["gopher_word_count"][0] > 0 and moved["fineweb_line_punct"][2] > 0
    assert got.training["out_docs"] == len(want["out"]) and got.training["in_docs"] == len(want["in"])
    assert (got.training["net_docs"], got.training["net_tokens"]) == want["net"]
    sources = {g.group: (g.added_docs, g.removed_docs, g.kept_docs_net) for g in got.sources}
    assert sources == {k: v for k, v in want["sources"].items() if any(v)} and len(sources) == 2
    domains = {g.group: (g.added_docs, g.removed_docs, g.kept_docs_net, g.in_docs)
               for g in got.domains}
    assert domains == {k: v for k, v in want["domains"].items() if any(v)}
    flipped = {c.column: (c.changed, c.filled, c.cleared, c.examples) for c in got.columns}
    assert {k: v for k, v in flipped.items() if any(v[:3])} == \
        {k: v for k, v in want["columns"].items() if any(v[:3])}
    assert got.tokenizer["same"] is True
    read_a, read_b = set(range(0, 200, 2)), set(range(100, 400, 3))
    assert got.read == {"a": len(read_a), "b": len(read_b), "both": len(read_a & read_b),
                        "only_a": len(read_a - read_b), "only_b": len(read_b - read_a)}


def test_a_diff_backwards_is_the_mirror_image(history):
    table = Table.of(history["root"])
    ahead, back = diff(table, "r1", "r2"), diff(table, "r2", "r1")
    assert back.cost["mode"] == "row versions"
    assert back.documents["added_ids"] == ahead.documents["removed_ids"]
    assert back.documents["removed_ids"] == ahead.documents["added_ids"]
    assert {r.rule: (r.in_docs, r.in_tokens, r.out_docs, r.out_tokens) for r in back.rules} == \
        {r.rule: (r.out_docs, r.out_tokens, r.in_docs, r.in_tokens) for r in ahead.rules}
    assert back.training["net_docs"] == -ahead.training["net_docs"]
    assert {c.column: (c.changed, c.to_true, c.to_false) for c in back.columns} == \
        {c.column: (c.changed, c.to_false, c.to_true) for c in ahead.columns}
    assert back.columns_only_a == ahead.columns_only_b


def test_the_cli_as_typed_matches_the_library_and_names_what_there_is(history, capsys):
    root = history["root"]
    out = subprocess.run([sys.executable, "-m", "lance_assets", "diff", "train-r1", "r2",
                          "--json", "--data", str(root)], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    typed = json.loads(out.stdout)
    library = diff(Table.of(root), "r1", "r2").to_dict()
    assert typed["a"]["ref"] == "train-r1" and typed["a"]["kind"] == "run"  # a run's tag: the run
    for d in (typed, library):
        d.pop("cost"), d["a"].pop("ref")
    assert typed == json.loads(json.dumps(library, default=str))
    assert cli(["diff", "r1", str(history["b"]), "--data", str(root)]) == 0
    text = capsys.readouterr().out
    assert "| gopher_word_count | changed |" in text and "pii_email_count" in text
    assert cli(["diff", "r1", "nowhere", "--data", str(root)]) == 2
    err = capsys.readouterr().err
    assert "'nowhere' names no tag" in err and "train-r2 (version" in err and "r1" in err


def test_a_snapshot_cleanup_removed_names_the_retention_that_released_it(history):
    with pytest.raises(DiffError) as err:
        diff(Table.of(history["root"]), "r0", "r2")
    message = str(err.value)
    assert "training run r0" in message and "train-r0" in message
    assert "table_maintenance's retention: older than the newest 0 unnamed run(s)" in message
    # forget had redacted it (r0 read a forgotten document); the retention released the copy
    assert "the copy forget redacted, deleted with the tag" in message
    assert "`forget` removed version" in message
    table = Table.of(history["root"])  # and its branch went with it, files and all
    assert set(table.newest().branches.list()) == {table.snapshots.get("train-r1").branch}
    assert [p.name for p in (Path(table.uri) / "tree").iterdir()] == \
        [table.snapshots.get("train-r1").branch]


def test_the_forgotten_text_is_in_no_file_and_explain_answers_for_it(history, capsys):
    """After the planted history: no file under the data root holds a forgotten document's text
    (raw bytes, and every Lance file read as Lance: pages may be compressed), no version of any
    branch reads one, and `explain --id` says when and by which forget it went, and that r1,
    whose redacted snapshot no longer has it, had read it."""
    from lance.file import LanceFileReader

    from lance_assets_tests.helpers import held_on_disk

    root, texts = history["root"], history["texts"]
    assert len(texts) == 4 and held_on_disk(root, [4, 6, 301, 302]) == []
    for path in (p for p in Path(root).rglob("*") if p.is_file()):
        raw = path.read_bytes()
        assert not any(t[:60].encode() in raw for t in texts), path
        if path.suffix == ".lance" and "_versions" not in path.parts:
            got = LanceFileReader(str(path)).read_all().to_table()
            for col in (c for c in got.columns if pa.types.is_string(c.type)):
                assert not set(texts) & set(col.to_pylist()), path
    assert cli(["explain", "--id", "4", "--json", "--data", str(root)]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["forgotten"]["done"] and got["forgotten"]["ids"] == 4
    assert got["forgotten"]["predicate_sha256"].startswith("sha256:")
    r1 = next(s for s in got["snapshots"] if s["name"] == "r1")
    assert r1["read"] is True and r1["note"].startswith("forgotten: forget redacted it")
    assert cli(["explain", "--id", "4", "--data", str(root)]) == 0
    assert "forgotten by `forget` (journal" in capsys.readouterr().out


def test_a_snapshot_forget_redacted_is_read_and_a_version_it_removed_is_named(tmp_path, capsys):
    """``forget`` redacts the snapshots holding what it forgets: the diff reads the copy (the
    row a hand delete hid stays hidden) and counts the forgotten documents apart; a version its
    cleanup removed is named as forget's doing."""
    from benchmarks.diff_bench import write_table

    table = write_table(tmp_path / "data", rows=1_000, rows_per_fragment=500)
    untagged = table.newest().version
    table.commit("a delete by hand", lambda d: d.delete("id = 9"))
    table.snapshots.hold("train-old", table.newest().version, owner="pretrained_model",
                         kind=snaps.RUN)
    forget(table, "id IN (3, 4)", log=quiet)
    got = diff(table, "train-old", table.newest().version)
    assert got.documents["a"] == 997 and runs(got.documents["forgotten_ids"]) == [3, 4]
    assert got.documents["removed"] == got.documents["added"] == 0
    assert table.open("train-old").count_rows(filter="id IN (3, 4, 9)") == 0
    # forget's own cleanup removed the untagged version (forget's log says so)
    code = cli(["diff", str(untagged), str(table.newest().version), "--data", str(table.root)])
    message = capsys.readouterr().err
    assert code == 2 and f"`forget` removed version {untagged} at " in message, message
    assert "table_maintenance" not in message
    code = cli(["explain", "--id", "5", "--version", str(untagged), "--data", str(table.root)])
    message = capsys.readouterr().err  # explain, through Table.choose, names forget too
    assert code == 2 and f"`forget` removed version {untagged} at " in message, message
    assert "table_maintenance" not in message


def test_a_release_killed_after_its_note_leaves_the_snapshot_readable(history):
    """``release`` writes its note before it deletes the tag: a process killed in between leaves
    a note for a tag that still exists, and the tag wins."""
    table = Table.of(history["root"])
    note = table.snapshots.folder / snaps.RELEASED / "train-r1.json"
    note.write_text(json.dumps({"tag": "train-r1", "version": history["a"], "why": "killed"}))
    try:
        assert diff(table, "r1", "r2").a["version"] == table.snapshots.get("train-r1").version
    finally:
        note.unlink()


def test_a_side_that_a_cleanup_removes_while_it_is_read_is_named(tmp_path, monkeypatch):
    from benchmarks.diff_bench import change, write_table
    from lance_assets.forensics.diff import rows

    table = write_table(tmp_path / "data", rows=2_000, rows_per_fragment=500)
    untagged = table.newest().version
    change(table, share=0.01, rows_per_fragment=500)
    table.snapshots.hold("b", table.newest().version, owner="test")
    plan = rows.tracked_changes

    def cleanup_first(lo, hi, columns, *line):  # maintenance lands between resolving and reading
        maintain(table, keep_versions_for=timedelta(0), log=quiet)
        return plan(lo, hi, columns, *line)

    monkeypatch.setattr(rows, "tracked_changes", cleanup_first)
    with pytest.raises(DiffError, match=f"a cleanup removed files of version {untagged} "
                       "or version .*, tag b.* while the diff read them"):
        diff(table, untagged, "b")


def test_a_restore_between_the_sides_is_read_whole(tmp_path):
    """A restore brings back rows whose row versions predate the older side: the row versions
    cannot say what changed, so both versions are read whole."""
    from benchmarks.diff_bench import write_table

    table = write_table(tmp_path / "data", rows=2_000, rows_per_fragment=500)
    before = table.newest().version
    table.commit("delete", lambda d: d.delete("id < 10"))
    table.snapshots.hold("a", table.newest().version, owner="test")
    table.open(before).restore()  # an operator's restore: rows 0-9 are back
    got = diff(table, "a", table.newest().version)
    assert got.cost["mode"] == "full scan" and "a restore" in got.cost["why"]
    assert got.documents["added_ids"] == [[0, 9]] and got.documents["removed"] == 0


def test_explain_says_how_one_document_differs_between_two_snapshots(history, capsys):
    root = history["root"]
    copy = history["copy"]
    assert cli(["explain", "--id", str(copy), "--version", "train-r1", "--against", "r2",
                "--json", "--data", str(root)]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["present"] == [True, True]
    is_dup = next(s for s in got["signals"] if s["column"] == "is_dup")
    assert is_dup == {"column": "is_dup", "A": True, "B": False}
    exact = next(r for r in got["rules"] if r["rule"] == "exact_dup")
    assert exact["A"] == "removes" and exact["B"] == "keeps" and exact["changed"]
    gone = history["deleted"][0]
    assert cli(["explain", "--id", str(gone), "--version", "r1", "--against", "r2",
                "--data", str(root)]) == 1
    assert "tag train-r2): not in that version" in capsys.readouterr().out


def test_only_changed_fragments_are_read(tmp_path):
    """A table written with pylance (as the benchmark's): an append, one fragment's `is_dup`
    rewritten, deletes, then a new tagger's column written on every fragment; the diff reads the
    changed fragments and no other, and says what a full scan says. A re-threshold then moves
    rows that did not change: they are read too."""
    from benchmarks.diff_bench import RULES, _add_group, change, write_table

    root = tmp_path / "data"
    table = write_table(root, rows=4_000, rows_per_fragment=500)
    table.snapshots.hold("a", table.newest().version, owner="test")
    touched = change(table, share=0.01, rows_per_fragment=500)
    _add_group(table.newest(), lambda ids: pa.table({"lang": pa.array(
        np.where(ids % 3 == 0, "fr", "en"))}))  # every row's version moves; no value read does
    table.snapshots.hold("b", table.newest().version, owner="test")
    table.set_config(keys.CURATION_KEY, Curation(rules={
        **RULES, "words": "word_count BETWEEN 200 AND 100000"}).to_dict())
    table.snapshots.hold("c", table.newest().version, owner="test")
    for b, most in (("b", 3), ("c", None)):
        fast, slow = diff(table, "a", b), diff(table, "a", b, full=True)
        assert fast.cost["mode"] == "row versions"
        fd, sd = fast.to_dict(), slow.to_dict()
        fd.pop("cost"), sd.pop("cost")
        assert fd == sd and fast.documents["added"] == touched["added"]
        assert fast.columns_only_b == ["lang"]
        is_dup = next(c for c in fast.columns if c.column == "is_dup")
        assert is_dup.changed == len(touched["flipped"]) and touched["flipped"][0] in is_dup.examples
        if most is not None:  # the new fragment, the rewritten one, the one with deletes
            assert fast.cost["b"]["fragments_read"] <= most < fast.cost["b"]["fragments_total"]
            assert fast.cost["b"]["bytes_read"] < slow.cost["b"]["bytes_read"] / 2
    words = next(r for r in fast.rules if r.rule == "words")
    assert words.status == "changed" and words.out_docs > 0 and fast.cost["flipped_rows"] > 0

