"""Fault injection: every table writer SIGKILLed before, during and after a commit (the first
and a later one) and while its new data files are written but not committed; then run again.

The table must end equal to an uninterrupted run's: the same rows, ids and values in every
column, no duplicates, nothing lost. See docs/reliability.md for the table of faults.
"""

import os
import shutil
import signal
import subprocess
import sys

import lance
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lance_assets import paths
from lance_assets.corpus.ingest import ingest
from lance_assets.corpus.synthetic import SyntheticSpec, generate
from lance_assets.corpus.table import table_exists
from lance_assets_tests.conftest import quiet
from lance_assets_tests.fault_driver import run as run_writer

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# (point, n): the first commit of a column writer is its add_columns (schema), the first of an
# ingest creates the table; "later" points land in the middle of the per-fragment commits.
COLUMN_FAULTS = [("before-commit", 1), ("after-commit", 1), ("files-written", 2),
                 ("during-commit", 4), ("after-commit", 4)]
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
    texts = generate(SyntheticSpec(rows=900, seed=3, dup_fraction=0.1)).column("text")
    for i in range(3):
        pq.write_table(pa.table({"text": texts.slice(i * 300, 300),
                                 "id": [f"d{i}-{j}" for j in range(300)]}),
                       src / f"{i}.parquet", row_group_size=100)
    raw = base / "raw"
    ingest(raw, str(src), rows_per_fragment=128, rows_per_commit=200, log=quiet)
    reference = {}
    ref_ingest = base / "ref-ingest"
    run_writer("ingest", str(ref_ingest), str(src))
    reference["ingest"] = table_content(ref_ingest)
    for writer in ("dedup_flag", "token_ids", "quality_signals", "near_dup", "embeddings",
                   "chunk_embeddings"):
        ref = base / f"ref-{writer}"
        shutil.copytree(raw, ref)
        run_writer(writer, str(ref), None)
        reference[writer] = table_content(ref)
    return {"src": src, "raw": raw, "reference": reference}


def kill_then_rerun(world, tmp_path, writer: str, point: str, n: int) -> None:
    root = tmp_path / "data"
    if writer != "ingest":
        shutil.copytree(world["raw"], root)
    cmd = [sys.executable, "-m", "lance_assets_tests.fault_driver", writer, str(root), point,
           str(n), str(world["src"])]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "LANCE_LOG": "error"})
    assert proc.returncode == -signal.SIGKILL, (
        f"{writer} was not killed at {point} {n} (rc {proc.returncode}): {proc.stderr[-2000:]}")
    if writer == "ingest" and point == "before-commit" and n == 1:
        assert not table_exists(root)  # killed before the first commit: no table at all
    run_writer(writer, str(root), str(world["src"]))
    assert table_content(root) == world["reference"][writer]


@pytest.mark.parametrize("point,n", INGEST_FAULTS, ids=[f"{p}-{n}" for p, n in INGEST_FAULTS])
def test_ingest_killed_then_rerun_equals_uninterrupted(world, tmp_path, point, n):
    kill_then_rerun(world, tmp_path, "ingest", point, n)


@pytest.mark.parametrize("writer", ["dedup_flag", "token_ids", "quality_signals", "near_dup",
                                    "embeddings", "chunk_embeddings"])
@pytest.mark.parametrize("point,n", COLUMN_FAULTS, ids=[f"{p}-{n}" for p, n in COLUMN_FAULTS])
def test_column_writer_killed_then_rerun_equals_uninterrupted(world, tmp_path, writer, point, n):
    kill_then_rerun(world, tmp_path, writer, point, n)


def jsonl_lines(n: int) -> list[str]:
    return [f'{{"text": "document {i}: ' + "some words of text " * 30 + '"}' for i in range(n)]


def test_a_long_line_is_one_document_and_a_broken_first_ingest_leaves_a_valid_table(tmp_path):
    """A 900,000-character line at line 50 is read whole (parts are line-aligned, not fixed
    blocks). A read error after the first parts of a first-ever ingest keeps those parts in a
    valid table; the next run reports the same file again and adds nothing twice."""
    src = tmp_path / "src"
    src.mkdir()
    lines = jsonl_lines(4000)
    lines[50] = '{"text": "' + "y" * 900_000 + '"}'
    (src / "long.jsonl").write_text("\n".join(lines) + "\n")
    root = tmp_path / "data"
    report = ingest(root, str(src), log=quiet)
    assert report.files_failed == {} and report.rows_added == 4000
    ds = lance.dataset(paths.table_uri(root))
    assert ds.count_rows("n_chars = 900000") == 1

    lines[3900] = '{"text": broken'
    (src / "broken.jsonl").write_text("\n".join(lines) + "\n")
    first = ingest(tmp_path / "fresh", str(src / "broken.jsonl"), rows_per_commit=500, log=quiet)
    assert "not valid JSON" in first.files_failed[str((src / "broken.jsonl").resolve())]
    assert 0 < first.rows_added < 3900 and table_exists(tmp_path / "fresh")
    again = ingest(tmp_path / "fresh", str(src / "broken.jsonl"), rows_per_commit=500, log=quiet)
    assert again.rows_added == 0 and again.files_failed
    ds = lance.dataset(paths.table_uri(tmp_path / "fresh"))
    assert ds.count_rows() == first.rows_added
