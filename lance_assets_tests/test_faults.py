"""Fault injection: every table writer SIGKILLed before, during and after a commit (the first
and a later one) and while its new data files are written but not committed; then run again.

The table must end equal to an uninterrupted run's: the same rows, ids and values in every
column, no duplicates, nothing lost. See docs/reliability.md for the table of faults.
"""

import json
import os
import shutil
import signal
from datetime import timedelta

import lance
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lance_assets import paths
from lance_assets.ingest.raw_text import ingest
from lance_assets.ingest.synthetic import SyntheticSpec, generate
from lance_assets.table import Table
from lance_assets_tests import fault_driver
from lance_assets_tests.fault_driver import EVAL_SET
from lance_assets_tests.fault_driver import run as run_writer
from lance_assets_tests.helpers import quiet

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# (point, n): the first commit of a column writer is its add_columns (schema), or its config
# update (the model, detector or tokenizer it records) where it records one; the first of an
# ingest creates the table; "later" points land in the middle of the per-fragment commits.
COLUMN_FAULTS = [("before-commit", 1), ("after-commit", 1), ("files-written", 2),
                 ("during-commit", 4), ("after-commit", 4)]
COLUMN_WRITERS = ["dedup_flag", "token_ids", "quality_signals", "fineweb_signals", "near_dup",
                  "embeddings", "detected_language", "personal_data", "paragraph_dups",
                  "contamination", "quality_score", "chunk_embeddings", "semantic_dup"]
# Every writer commits through one path (``write_columns``: add_columns, then one
# DataReplacement per fragment; Table.write_fragments for the data files). That path gets every
# fault twice: through a writer whose first commit is its add_columns (quality_signals) and one
# whose first commits are config updates (token_ids, two of them). Every other writer gets the
# faults that reach its own code: a kill part-way through its backfill (after-commit 4: the
# rerun plans again from what is written, its cross-row state included) and, for a writer that
# records its config first, a kill right after that record (the rerun finds its config and no
# column).
SHARED_PATH = ("quality_signals", "token_ids")
CONFIG_FIRST = ("token_ids", "near_dup", "embeddings", "detected_language", "quality_score",
                "chunk_embeddings", "semantic_dup")
COLUMN_CASES = [(w, p, n) for (p, n) in COLUMN_FAULTS for w in COLUMN_WRITERS
                if w in SHARED_PATH or (p, n) == ("after-commit", 4)
                or (w in CONFIG_FIRST and (p, n) == ("after-commit", 1))]
INGEST_FAULTS = [("before-commit", 1), ("during-commit", 1), ("after-commit", 1),
                 ("files-written", 1), ("during-commit", 3), ("after-commit", 3),
                 ("files-written", 4)]


def table_content(root) -> list[dict]:
    ds = lance.dataset(paths.table_uri(root))
    rows = ds.to_table().sort_by("id").to_pylist()
    ids = [r["id"] for r in rows]
    assert len(ids) == len(set(ids)), "duplicate ids"
    return rows


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """Source files, a raw table to add columns to, and the uninterrupted result of each writer."""
    base = tmp_path_factory.mktemp("faults")
    src = base / "src"
    src.mkdir()
    corpus = generate(SyntheticSpec(rows=900, seed=3, dup_fraction=0.1))
    texts = corpus.column("text")
    for i in range(3):
        # `score` is the label `quality_score` learns from
        pq.write_table(pa.table({"text": texts.slice(i * 300, 300),
                                 "id": [f"d{i}-{j}" for j in range(300)],
                                 "score": corpus.column("score").slice(i * 300, 300)}),
                       src / f"{i}.parquet", row_group_size=100)
    raw = base / "raw"
    ingest(Table.of(raw), str(src), rows_per_fragment=128, rows_per_commit=200, log=quiet)
    # an evaluation set for `contamination`: 30-word passages of three documents
    planted = [" ".join(t.split()[:30]) for t in texts.to_pylist()[10:400:130]]
    (raw / EVAL_SET).parent.mkdir(parents=True)
    (raw / EVAL_SET).write_text("".join(json.dumps({"question": q}) + "\n" for q in planted))
    # `quality_score` reads `embedding`: its runs start from a table that has it
    embedded = base / "embedded"
    shutil.copytree(raw, embedded)
    run_writer("embeddings", str(embedded), None)
    # `semantic_dup` reads `chunk_embeddings`
    chunked = base / "chunked"
    shutil.copytree(raw, chunked)
    run_writer("chunk_embeddings", str(chunked), None)
    reference = {}
    ref_ingest = base / "ref-ingest"
    run_writer("ingest", str(ref_ingest), str(src))
    reference["ingest"] = table_content(ref_ingest)
    for writer in COLUMN_WRITERS:
        ref = base / f"ref-{writer}"
        shutil.copytree(start_of(writer, embedded, chunked, raw), ref)
        run_writer(writer, str(ref), None)
        reference[writer] = table_content(ref)
    return {"src": src, "raw": raw, "embedded": embedded, "chunked": chunked,
            "reference": reference}


def start_of(writer, embedded, chunked, raw):
    """The table a writer starts from: one holding the columns it reads."""
    return {"quality_score": embedded, "semantic_dup": chunked}.get(writer, raw)


def kill_then_rerun(world, tmp_path, writer: str, point: str, n: int) -> None:
    root = tmp_path / "data"
    if writer != "ingest":
        shutil.copytree(start_of(writer, world["embedded"], world["chunked"], world["raw"]), root)
    code, out = fault_driver.killed([writer, str(root), point, str(n), str(world["src"])], REPO)
    assert code == -signal.SIGKILL, (
        f"{writer} was not killed at {point} {n} (rc {code}): {out[-2000:]}")
    if writer == "ingest" and point == "before-commit" and n == 1:
        assert not Table.of(root).exists()  # killed before the first commit: no table at all
    run_writer(writer, str(root), str(world["src"]))
    assert table_content(root) == world["reference"][writer]


@pytest.mark.parametrize("point,n", INGEST_FAULTS, ids=[f"{p}-{n}" for p, n in INGEST_FAULTS])
def test_ingest_killed_then_rerun_equals_uninterrupted(world, tmp_path, point, n):
    kill_then_rerun(world, tmp_path, "ingest", point, n)


@pytest.mark.parametrize("writer,point,n", COLUMN_CASES,
                         ids=[f"{p}-{n}-{w}" for w, p, n in COLUMN_CASES])
def test_column_writer_killed_then_rerun_equals_uninterrupted(world, tmp_path, writer, point, n):
    kill_then_rerun(world, tmp_path, writer, point, n)


# Each writer's first column group, and the commit after which a kill leaves it part-written
# with at least two adjacent fragments written (token_ids records its redaction setting in the
# table config before its first fragment).
FIRST_GROUP = {"dedup_flag": ["text_hash"], "token_ids": ["n_bytes"], "quality_signals": ["word_count"],
               "near_dup": ["near_dup_cluster", "near_dup"], "embeddings": ["embedding"],
               "detected_language": ["lang", "lang_score"], "personal_data": ["pii_email_count"],
               "paragraph_dups": ["dup_paragraph_frac"], "quality_score": ["quality_score"],
               "chunk_embeddings": ["chunk_embeddings"],
               "semantic_dup": ["semantic_cluster", "semantic_rep", "semantic_cos", "semantic_dup"],
               "contamination": ["contam_"]}  # the set's column: its name ends in a fingerprint
KILL_AFTER_COMMIT = {"token_ids": 5}
# Lance's own compaction merges written and unwritten fragments: every writer reruns after it
# (fragment ids change under its plan). Our maintenance keeps part-written fragments out of its
# merges, a path of its own that the shared writers cover.
COMPACTION_CASES = [(w, c) for c in ("table_maintenance", "lance_compact_files")
                    for w in sorted(FIRST_GROUP) if c == "lance_compact_files" or w in SHARED_PATH]


@pytest.mark.parametrize("writer,compaction", COMPACTION_CASES,
                         ids=[f"{w}-{c}" for w, c in COMPACTION_CASES])
def test_column_writer_killed_then_compacted_then_rerun_equals_uninterrupted(
        world, tmp_path, writer, compaction):
    """A backfill killed part-way leaves some fragments written. A compaction in between,
    ours or Lance's own (what an operator or lancedb's optimize runs), must not turn the
    unwritten values into stored nulls that count as written: the rerun fills every row and
    the table equals an uninterrupted run's."""
    from lance_assets.table.columns import is_written_marker, unwritten_rows
    from lance_assets.table.maintenance import maintain

    root = tmp_path / "data"
    shutil.copytree(start_of(writer, world["embedded"], world["chunked"], world["raw"]), root)
    code, out = fault_driver.killed(
        [writer, str(root), "after-commit", str(KILL_AFTER_COMMIT.get(writer, 4))], REPO)
    assert code == -signal.SIGKILL, out[-2000:]
    uri = paths.table_uri(root)
    group = [c for c in lance.dataset(uri).schema.names for want in FIRST_GROUP[writer]
             if c == want or (want.endswith("_") and c.startswith(want))]
    assert len(group) == len(FIRST_GROUP[writer])
    before = unwritten_rows(lance.dataset(uri), group)
    assert 0 < before.unwritten_rows < before.rows  # killed part-way
    fragments = len(lance.dataset(uri).get_fragments())
    if compaction == "table_maintenance":
        report = maintain(Table.of(root), keep_versions_for=timedelta(0), log=quiet)
        assert report.fragments_removed > 0 and report.fragments_left_out > 0
    else:
        lance.dataset(uri).optimize.compact_files()  # merges written and unwritten fragments
    assert len(lance.dataset(uri).get_fragments()) < fragments
    after = unwritten_rows(lance.dataset(uri), group)
    assert after.unwritten_rows == before.unwritten_rows  # still known to be unwritten
    run_writer(writer, str(root), None)
    written = [c for c in lance.dataset(uri).schema.names if c not in world["reference"]["ingest"][0]
               and not is_written_marker(c)]
    assert unwritten_rows(lance.dataset(uri), written).complete
    assert table_content(root) == world["reference"][writer]


def jsonl_lines(n: int) -> list[str]:
    return [f'{{"text": "document {i}: ' + "some words of text " * 30 + '"}' for i in range(n)]


def test_a_long_line_is_one_document_and_a_broken_first_ingest_leaves_a_valid_table(tmp_path,
                                                                                    monkeypatch):
    """A 900,000-character line at line 50 is read whole (parts are line-aligned, not fixed
    blocks). A malformed line is skipped and named by its line; the rest of its file lands. A
    read error after the first parts of a first-ever ingest keeps those parts in a valid
    table."""
    src = tmp_path / "src"
    src.mkdir()
    lines = jsonl_lines(4000)
    lines[50] = '{"text": "' + "y" * 900_000 + '"}'
    (src / "long.jsonl").write_text("\n".join(lines) + "\n")
    root = tmp_path / "data"
    report = ingest(Table.of(root), str(src), log=quiet)
    assert report.files_failed == {} and report.rows_added == 4000
    ds = lance.dataset(paths.table_uri(root))
    assert ds.count_rows("n_chars = 900000") == 1

    lines[3900] = '{"text": broken'
    (src / "broken.jsonl").write_text("\n".join(lines) + "\n")
    broken = str((src / "broken.jsonl").resolve())
    first = ingest(Table.of(tmp_path / "fresh"), str(src / "broken.jsonl"), rows_per_commit=500, log=quiet)
    assert first.rows_skipped == {f"malformed JSON: {broken} line 3901": 1}
    assert first.rows_added == 3999 and not first.files_failed
    assert Table.of(tmp_path / "fresh").exists()
    (src / "unreadable.jsonl").write_text("\n".join(lines) + "\n")  # three parts
    from lance_assets.ingest import sources

    real, calls = sources._parse_json_lines, {"n": 0}

    def failing(*args, **kwargs):  # the disk fails while the third part is read
        calls["n"] += 1
        if calls["n"] > 2:
            raise OSError("input/output error")
        yield from real(*args, **kwargs)
    monkeypatch.setattr(sources, "_parse_json_lines", failing)
    cut = ingest(Table.of(tmp_path / "cut"), str(src / "unreadable.jsonl"), rows_per_commit=100, log=quiet)
    monkeypatch.undo()
    assert "input/output error" in cut.files_failed[str((src / "unreadable.jsonl").resolve())]
    assert 0 < cut.rows_added < 4000 and Table.of(tmp_path / "cut").exists()
    ds = lance.dataset(paths.table_uri(tmp_path / "cut"))
    assert ds.count_rows() == cut.rows_added
