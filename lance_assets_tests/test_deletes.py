"""Deletes keep the columns true and never fail a run.

- Every column writer writes the fragments that hold deleted rows (a delete, a ``forget``): its
  live rows get the values a run before the delete gave them, and the blocking coverage check
  finds every row written, with no compaction in between.
- A writer running while rows are deleted under it finishes, and one more run leaves every
  column written.
- The duplicate columns keep a member of every cluster: when the kept copy of an exact, near or
  semantic duplicate is deleted, the next run of the column unflags a survivor (the smallest
  remaining id), and nothing else.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import lance
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from lance_assets import paths
from lance_assets.table import Table
from lance_assets.table.columns import is_written_marker, unwritten_rows
from lance_assets.table.producer import produce
from lance_assets_tests.fault_driver import EVAL_SET, WRITERS
from lance_assets_tests.fault_driver import run as run_writer
from lance_assets_tests.helpers import quiet, write_fineweb_parquet

REPO = Path(__file__).resolve().parents[1]
COLUMN_WRITERS = [w for w in WRITERS if w != "ingest"]
# Columns whose value depends on the row alone (the others compare a row with the rows before it,
# or learn from every row: deleting rows may change them, which is the point of the last test).
PER_ROW_PREFIXES = ("text_hash", "n_bytes", "input_ids", "n_tokens", "word_count", "embedding",
                    "lang", "pii_", "contam", "chunk_embeddings", "mean_word", "frac_", "line_")


def _texts(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)  # words of letters: MinHash's normalisation drops digits
    words = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(3, 9)))
             for _ in range(400)]
    return ["\n\n".join(" ".join(rng.choice(words) for _ in range(40)) for _ in range(3))
            for _ in range(n)]


def _raw(base: Path) -> Path:
    """600 documents (60 exact copies among them) in fragments of 50, with an evaluation set."""
    from lance_assets.ingest.raw_text import ingest

    texts = _texts(540, 7)
    texts += texts[:60]
    src = write_fineweb_parquet(base / "src.parquet", texts,
                                extra={"score": pa.array([float(i % 5) for i in range(600)])})
    root = base / "raw"
    ingest(Table.of(root), str(src), rows_per_fragment=50, log=quiet)
    (root / EVAL_SET).parent.mkdir(parents=True)
    (root / EVAL_SET).write_text("".join(json.dumps({"question": " ".join(t.split()[:30])}) + "\n"
                                         for t in texts[5:300:97]))
    return root


def _every_writer(root: Path) -> None:
    for writer in COLUMN_WRITERS:
        run_writer(writer, str(root), None)


def _written_everywhere(root: Path) -> None:
    ds = lance.dataset(paths.table_uri(root))
    columns = [c for c in ds.schema.names if not is_written_marker(c)
               and c not in lance.dataset(paths.table_uri(root), version=1).schema.names]
    cover = unwritten_rows(ds, columns)
    assert cover.complete and cover.unwritten_rows == 0, cover


def _by_id(root: Path, columns: list[str]) -> dict[int, tuple]:
    t = lance.dataset(paths.table_uri(root)).to_table(columns=["id", *columns]).sort_by("id")
    cols = [t.column(c).to_pylist() for c in columns]
    return {i: tuple(c[k] for c in cols) for k, i in enumerate(t.column("id").to_pylist())}


@pytest.fixture(scope="module")
def raw(tmp_path_factory) -> Path:
    return _raw(tmp_path_factory.mktemp("deletes"))


def test_every_writer_writes_fragments_with_deleted_rows(raw, tmp_path):
    before = tmp_path / "before"  # every column written, then the rows deleted
    shutil.copytree(raw, before)
    _every_writer(before)
    after = tmp_path / "after"  # the rows deleted first, then every column written
    shutil.copytree(raw, after)
    gone = "id % 7 = 3 OR id % 11 = 5"  # in every fragment, none emptied
    for root in (before, after):
        Table.of(root).commit("delete", lambda ds: ds.delete(gone))
    ds = lance.dataset(paths.table_uri(after))
    assert all(f.metadata.deletion_file is not None for f in ds.get_fragments())

    _every_writer(after)  # no compaction in between: no writer may leave a fragment out
    _written_everywhere(after)
    ds = lance.dataset(paths.table_uri(after))
    assert all(f.metadata.deletion_file is not None for f in ds.get_fragments())
    per_row = [c for c in ds.schema.names
               if c.startswith(PER_ROW_PREFIXES) and not is_written_marker(c)]
    assert {"text_hash", "input_ids", "word_count", "embedding", "chunk_embeddings"} <= set(per_row)
    assert _by_id(after, per_row) == _by_id(before, per_row)
    # the deleted rows stay deleted in every version the writers made
    assert ds.count_rows(filter=gone) == 0
    assert ds.count_rows() == lance.dataset(paths.table_uri(before)).count_rows()


DELETER = """
import random, sys, time
from lance_assets.table import Table
table, rng = Table.of(sys.argv[1]), random.Random(0)
for k in range(12):
    table.commit("delete", lambda ds, k=k: ds.delete(f"id % 23 = {k}"))
    time.sleep(rng.uniform(0.05, 0.3))
print("deleted")
"""


@pytest.mark.parametrize("writer", ["quality_signals", "token_ids", "dedup_flag", "near_dup"])
def test_a_writer_running_while_rows_are_deleted_under_it_finishes(raw, tmp_path, writer):
    root = tmp_path / "data"
    shutil.copytree(raw, root)
    if writer == "near_dup":
        run_writer("dedup_flag", str(root), None)
    env = {**os.environ, "LANCE_LOG": "error"}
    deleter = subprocess.Popen([sys.executable, "-c", DELETER, str(root)], cwd=REPO, env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        run_writer(writer, str(root), None)  # one commit per fragment: deletes land between
    finally:
        out = deleter.communicate(timeout=300)[0]
    assert deleter.returncode == 0 and "deleted" in out, out[-3000:]
    run_writer(writer, str(root), None)
    _written_everywhere(root)
    assert lance.dataset(paths.table_uri(root)).count_rows(filter="id % 23 < 12") == 0


@pytest.mark.parametrize("how", ["forget", "delete"])
def test_the_surviving_copy_is_kept_after_the_kept_one_is_deleted(raw, tmp_path, how):
    from lance_assets.curation import dedup_flag, near_dup
    from lance_assets.table.forget import forget

    root = tmp_path / "data"
    shutil.copytree(raw, root)
    produce(dedup_flag.PRODUCER, Table.of(root), log=quiet)
    produce(near_dup.PRODUCER, Table.of(root), log=quiet)
    for writer in ("chunk_embeddings", "semantic_dup"):
        run_writer(writer, str(root), None)
    semantic = _by_id(root, ["semantic_rep", "semantic_dup"])
    cols = ["text_hash", "is_dup", "near_dup_cluster", "near_dup"]
    flags = _by_id(root, cols)
    # the copies at ids 540..599 repeat ids 0..59: forget the kept one of ten of them
    kept = [i for i in range(0, 60, 6)]
    assert all(not flags[i][1] and flags[i + 540][1] and flags[i + 540][3] for i in kept)
    where = f"id IN ({','.join(map(str, kept))})"
    if how == "forget":
        assert forget(Table.of(root), where, log=quiet).rows_deleted == len(kept)
    else:
        Table.of(root).commit("delete", lambda ds: ds.delete(where))
    assert all(_by_id(root, cols)[i + 540][1] for i in kept)  # until the columns run again

    produce(dedup_flag.PRODUCER, Table.of(root), log=quiet)
    produce(near_dup.PRODUCER, Table.of(root), log=quiet)
    run_writer("semantic_dup", str(root), None)
    now = _by_id(root, cols)
    for i in kept:
        assert now[i + 540][1] is False and now[i + 540][3] is False, (i, now[i + 540])
    survivors = {i + 540 for i in kept}
    assert {i: v for i, v in now.items() if i not in survivors} == \
        {i: v for i, v in flags.items() if i not in survivors and i not in kept}
    # every text and every near-duplicate cluster still has exactly one kept member
    lost = {semantic[i][0] for i in kept if not semantic[i][1]}  # groups whose rep was deleted
    assert lost and any(semantic[i + 540][0] in lost for i in kept)
    for col, flag in (("text_hash", "is_dup"), ("near_dup_cluster", "near_dup"),
                      ("semantic_rep", "semantic_dup")):
        t = lance.dataset(paths.table_uri(root)).to_table(columns=[col, flag])
        t = t.append_column("kept", pc.invert(t.column(flag)))
        kept_per_cluster = t.group_by(col).aggregate([("kept", "sum")]).column("kept_sum")
        assert set(kept_per_cluster.to_pylist()) == {1}, col
    version = Table.of(root).newest().version
    # nothing more to elect: the flags stay as they are
    produce(dedup_flag.PRODUCER, Table.of(root), log=quiet)
    produce(near_dup.PRODUCER, Table.of(root), log=quiet)
    run_writer("semantic_dup", str(root), None)
    assert _by_id(root, cols) == now
    assert Table.of(root).newest().version == version  # and nothing was committed


def test_two_config_updates_of_one_key_retry_and_other_incompatible_commits_do_not():
    """Lance calls two concurrent updates of one config key incompatible; the attempt re-reads
    the newest config, so the commit retries. Other incompatible transactions are raised."""
    from lance_assets.table.core import is_retryable_conflict

    said = ("Incompatible transaction: This UpdateConfig transaction is incompatible with "
            "concurrent transaction UpdateConfig at version 15., conflict_resolver.rs:2357:34")
    assert is_retryable_conflict(OSError(said))
    assert not is_retryable_conflict(OSError(said.replace("UpdateConfig at", "Rewrite at")))
    assert not is_retryable_conflict(ValueError(said))
