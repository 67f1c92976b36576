"""``dedup_flag`` from a kept ``text_hash``: the Ray map/reduce (1, 2 and 4 buckets) writes what
the local path writes, and what a plain Python dedup of the texts says; a later run reads no
text of old fragments; a table whose ``is_dup`` predates ``text_hash`` is backfilled without a
written flag changing; a failed or killed task costs only its part.

One local Ray (4 CPUs) for the module; the corpus is ingested in three increments with
whitespace-variant copies planted within and across them."""

from __future__ import annotations

import os
import random
import shutil
from dataclasses import dataclass
from pathlib import Path

import lance
import numpy as np
import pyarrow as pa
import pytest

from lance_assets import paths
from lance_assets.curation import dedup_flag as dedup
from lance_assets.ingest.raw_text import ingest
from lance_assets.table import Table, data_files_by_field
from lance_assets.table.columns import FragmentsFailedError, fragments_missing, write_columns
from lance_assets.table.producer import produce
from lance_assets_tests.helpers import quiet, write_fineweb_parquet

ray = pytest.importorskip("ray")

# the worker's one Ray cluster (conftest.ray_cluster), shared with the other Ray modules
pytestmark = pytest.mark.xdist_group("ray")

ROWS = 240  # per increment; 80 rows per fragment: 3 fragments each
COLUMNS = ["id", "is_dup", "text_hash", "_written_is_dup", "_written_text_hash"]


def _variant(text: str, rng: random.Random) -> str:
    """The same words under other whitespace: what normalisation must see through."""
    seps = [" ", "  ", "\n", "\t ", " \r\n "]
    words = text.split(" ")
    return rng.choice(["", " ", "\n"]) + "".join(
        w + (rng.choice(seps) if i < len(words) - 1 else "") for i, w in enumerate(words)
    ) + rng.choice(["", "\t", "  "])


def _increments(seed: int = 5) -> list[list[str]]:
    """Three increments of fresh texts with copies (whitespace variants) of earlier texts, of
    this increment's and of earlier increments'."""
    rng = random.Random(seed)
    vocab = [f"w{i}" for i in range(300)] + ["naïve", "东京", "café"]
    out: list[list[str]] = []
    seen: list[str] = []
    for _ in range(3):
        texts: list[str] = []
        for _ in range(ROWS):
            pool = seen + texts
            if pool and rng.random() < 0.25:
                texts.append(_variant(rng.choice(pool), rng))
            else:
                texts.append(" ".join(rng.choice(vocab) for _ in range(rng.randint(3, 30))))
        seen += texts
        out.append(texts)
    return out


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> list[Path]:
    base = tmp_path_factory.mktemp("dedup-src")
    files = []
    for i, texts in enumerate(_increments()):
        path = base / f"inc{i}" / "part.parquet"
        path.parent.mkdir()
        write_fineweb_parquet(path, texts, start_id=i * ROWS)
        files.append(path)
    return files


def _ingest(root: Path, source: Path) -> None:
    ingest(Table.of(root), str(source), rows_per_fragment=80, log=quiet)


def _columns(root: Path, cols=COLUMNS) -> pa.Table:
    return lance.dataset(paths.table_uri(root)).to_table(columns=cols).sort_by("id")


def _expected_is_dup(root: Path) -> list[bool]:
    """Plain Python: a row is a duplicate when its normalised text came at a smaller id."""
    rows = lance.dataset(paths.table_uri(root)).to_table(columns=["id", "text"]).sort_by("id")
    first: set[str] = set()
    out = []
    for text in rows.column("text").to_pylist():
        key = dedup.normalise(text)
        out.append(key in first)
        first.add(key)
    return out


@pytest.fixture(scope="module")
def local_run(sources, tmp_path_factory) -> pa.Table:
    """The local path, run after each increment."""
    root = tmp_path_factory.mktemp("dedup-local") / "data"
    for source in sources:
        _ingest(root, source)
        produce(dedup.PRODUCER, Table.of(root), log=quiet)
    got = _columns(root)
    assert got.column("is_dup").to_pylist() == _expected_is_dup(root)
    assert 0 < sum(got.column("is_dup").to_pylist()) < got.num_rows
    return got


@pytest.mark.parametrize("buckets", [1, 2, 4])
def test_ray_map_reduce_equals_the_local_path_over_three_increments(
        ray_cluster, sources, local_run, tmp_path, buckets):
    root = tmp_path / "data"
    for source in sources:
        _ingest(root, source)
        produce(dedup.PRODUCER, Table.of(root), dedup.DedupSettings(buckets=buckets), executor="ray",
                log=quiet)
    assert _columns(root).equals(local_run)
    # the same buckets in-process give the same columns too
    local = tmp_path / "local"
    for source in sources:
        _ingest(local, source)
        produce(dedup.PRODUCER, Table.of(local), dedup.DedupSettings(buckets=buckets), log=quiet)
    assert _columns(local).equals(local_run)


def test_text_hash_is_the_sql_twin_md5(local_run, sources, tmp_path):
    import duckdb

    root = tmp_path / "data"
    _ingest(root, sources[0])
    produce(dedup.PRODUCER, Table.of(root), log=quiet)
    t = _columns(root, ["id", "text", "text_hash"])
    assert t.schema.field("text_hash").type == pa.binary(16)
    mismatched = duckdb.sql(
        f"SELECT count(*) FROM t WHERE lower(hex(text_hash)) <> {dedup.NORMALISED_HASH_SQL}"
    ).fetchall()[0][0]
    assert mismatched == 0 and t.num_rows == ROWS


def _record_reads(monkeypatch) -> list[tuple[object, tuple | None]]:
    """Every scan and take, with the fragments it touches (None: all) and its columns."""
    from lance.fragment import LanceFragment

    seen: list[tuple[object, tuple | None]] = []

    def spy(cls, name, where):
        real = getattr(cls, name)

        def wrapped(self, *args, **kwargs):
            cols = kwargs.get("columns")
            if name == "take" and cols is None and len(args) > 1:
                cols = args[1]
            seen.append((where(self, kwargs), None if cols is None else tuple(cols)))
            return real(self, *args, **kwargs)

        monkeypatch.setattr(cls, name, wrapped)

    spy(LanceFragment, "scanner", lambda f, kw: (f.fragment_id,))
    spy(LanceFragment, "take", lambda f, kw: (f.fragment_id,))
    spy(lance.LanceDataset, "scanner",
        lambda d, kw: tuple(f.fragment_id for f in kw["fragments"]) if kw.get("fragments")
        else None)
    spy(lance.LanceDataset, "take", lambda d, kw: None)
    return seen


def test_a_later_run_reads_no_text_of_old_fragments(sources, tmp_path, monkeypatch):
    root = tmp_path / "data"
    _ingest(root, sources[0])
    _ingest(root, sources[1])
    produce(dedup.PRODUCER, Table.of(root), log=quiet)
    old = {f.fragment_id for f in Table.of(root).newest().get_fragments()}
    _ingest(root, sources[2])
    new = {f.fragment_id for f in Table.of(root).newest().get_fragments()} - old
    seen = _record_reads(monkeypatch)
    produce(dedup.PRODUCER, Table.of(root), dedup.DedupSettings(buckets=2), log=quiet)
    text_reads = [frags for frags, cols in seen if cols is None or "text" in cols]
    assert text_reads and all(frags is not None and set(frags) <= new for frags in text_reads)
    assert {f for frags in text_reads for f in frags} == new  # each new fragment hashed once
    hash_reads = {f for frags, cols in seen if cols and "text_hash" in cols for f in frags or ()}
    assert old <= hash_reads  # old rows took part through their kept hashes
    assert _columns(root, ["id", "is_dup"]).column(1).to_pylist() == _expected_is_dup(root)


def test_an_is_dup_written_before_text_hash_is_kept_and_text_hash_backfilled(
        sources, local_run, tmp_path):
    """A table flagged by the earlier code (is_dup only): the next run writes text_hash for
    every row, leaves every is_dup data file as it was, and flags the new increment."""
    root = tmp_path / "data"
    _ingest(root, sources[0])
    _ingest(root, sources[1])
    ds = Table.of(root).newest()
    rows = ds.to_table(columns=["id", "text"])
    h = dedup.text_hashes(rows.column("text"))
    ids = rows.column("id").to_numpy()
    order = np.lexsort((ids, h[:, 1], h[:, 0]))
    first = np.r_[True, (h[order][1:] != h[order][:-1]).any(axis=1)]
    write_columns(Table.of(root), [dedup.IS_DUP], dedup.DupFlags(np.sort(ids[order][~first])), log=quiet)
    ds = Table.of(root).newest()
    assert "text_hash" not in ds.schema.names
    before_files = data_files_by_field(ds, "is_dup")
    before = _columns(root, ["id", "is_dup"])

    _ingest(root, sources[2])
    produce(dedup.PRODUCER, Table.of(root), log=quiet)
    ds = Table.of(root).newest()
    after_files = data_files_by_field(ds, "is_dup")
    assert {f: after_files[f] for f in before_files} == before_files  # not rewritten
    assert _columns(root, ["id", "is_dup"]).slice(0, before.num_rows).equals(before)
    assert not fragments_missing(ds, ["text_hash", "is_dup"])
    assert _columns(root).equals(local_run)


@dataclass(frozen=True)
class FailOnce:
    """text_hash of one fragment raises the first time (a marker file remembers it), in
    whichever process runs it."""

    marker: str
    fragment_id: int

    def __call__(self, frag):
        if frag.fragment_id == self.fragment_id and not os.path.exists(self.marker):
            Path(self.marker).touch()
            raise ValueError(f"injected failure on fragment {frag.fragment_id}")
        from lance_assets.curation.dedup_flag import TextHashes
        return TextHashes()(frag)


@dataclass(frozen=True)
class ExitOnce:
    """A map task whose worker process dies the first time it reaches one fragment; in a Ray
    worker the module is unpatched, so the real map runs after that."""

    marker: str
    fragment_id: int

    def __call__(self, scan, chunk):
        if any(p.fragment_id == self.fragment_id for p in chunk) and \
                not os.path.exists(self.marker):
            Path(self.marker).touch()
            os._exit(1)
        from lance_assets.curation.dedup_flag import map_part
        return map_part(scan, chunk)


def test_a_failed_text_hash_task_costs_its_fragment_only(ray_cluster, sources, local_run,
                                                         tmp_path, monkeypatch):
    root = tmp_path / "data"
    for source in sources:
        _ingest(root, source)
    marker = str(tmp_path / "failed-once")
    monkeypatch.setattr(dedup, "TextHashes", lambda: FailOnce(marker, 4))
    with pytest.raises(FragmentsFailedError, match="fragment 4: ValueError: injected"):
        produce(dedup.PRODUCER, Table.of(root), dedup.DedupSettings(buckets=2), executor="ray", log=quiet)
    ds = Table.of(root).newest()
    assert [f.fragment_id for f in fragments_missing(ds, ["text_hash"])] == [4]
    kept = data_files_by_field(ds, "text_hash")
    # the rerun
    produce(dedup.PRODUCER, Table.of(root), dedup.DedupSettings(buckets=2), executor="ray", log=quiet)
    after = data_files_by_field(Table.of(root).newest(), "text_hash")
    assert {f: v for f, v in after.items() if f != 4} == {f: v for f, v in kept.items() if f != 4}
    assert _columns(root).equals(local_run)


def test_a_map_worker_killed_mid_run_is_retried_and_the_result_is_unchanged(
        ray_cluster, sources, local_run, tmp_path, monkeypatch):
    root = tmp_path / "data"
    _ingest(root, sources[0])
    produce(dedup.PRODUCER, Table.of(root), dedup.DedupSettings(buckets=2), executor="ray", log=quiet)
    _ingest(root, sources[1])
    _ingest(root, sources[2])
    marker = tmp_path / "exited-once"
    monkeypatch.setattr(dedup, "map_part", ExitOnce(str(marker), 1))
    produce(dedup.PRODUCER, Table.of(root), dedup.DedupSettings(buckets=2), executor="ray", log=quiet)
    assert marker.exists()  # the worker did die
    assert _columns(root).equals(local_run)


def test_a_bad_bucket_count_is_refused_with_the_fix(sources, tmp_path):
    root = tmp_path / "data"
    _ingest(root, sources[0])
    with pytest.raises(ValueError, match="buckets=-1.*whole number"):
        produce(dedup.PRODUCER, Table.of(root), dedup.DedupSettings(buckets=-1), log=quiet)
    shutil.rmtree(root)


def test_map_tasks_pass_rays_inline_limit_and_never_mix_new_and_old_fragments():
    """Each map task's per-bucket result must pass Ray's 100 KiB inline limit (smaller results
    stay in the driver's memory, a few bytes per document): fragments are grouped in order,
    new and old apart, until a bucket's share passes ``MAP_PART_BYTES``."""
    parts = tuple(dedup.FragmentPart(i, i >= 20, rows=4096 if i % 3 else 1000)
                  for i in range(30))
    for buckets in (1, 8, 64):
        chunks = dedup.map_chunks(parts, buckets)
        assert [p.fragment_id for c in chunks for p in c] == list(range(30))
        assert all(len({p.new for p in c}) == 1 for c in chunks)
        for c, after in zip(chunks, chunks[1:]):
            if after[0].new == c[0].new:  # not the last of its kind: big enough
                assert sum(p.rows for p in c) * dedup.PAIR_BYTES / buckets >= 100 << 10
