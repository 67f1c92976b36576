"""Exact duplicates on whitespace-normalised text: the ``text_hash`` and ``is_dup`` columns.

A document is a duplicate when an earlier document (smaller ``id``) has the same text after
runs of whitespace are collapsed to one space and the ends trimmed. First occurrences keep
``is_dup = false``; because ids only grow, values already written never change.

Two phases on one pinned version, both fanned out per fragment (Ray tasks under
``executor: ray``), declared as the producer's two steps (``produce`` pins the version and
writes them in order):

1. ``text_hash`` (16 bytes: md5 of the normalised text) is written for the fragments that lack
   it. It is the only step that reads text, once per row ever: a later run reads the kept
   hashes of old fragments, never their text. A table whose ``is_dup`` predates the column gets
   it on its next run (one read of its text).
2. ``is_dup`` for the fragments that lack it, by a partitioned group-by: the hash space is cut
   into ``buckets`` by the hash's leading bits; a map task per fragment sends each bucket its
   (hash, id) pairs, a reduce task per bucket sorts them by (hash, id) and returns the ids of
   the *new* rows whose hash came at a smaller id. The driver holds object references and those
   ids only (O(fragments x buckets + new duplicates)), never the hashes; then per-fragment tasks
   (``DupFlags``) look their ids up and write the flag. Locally the same map and reduce run in
   this process.

``NORMALISED_HASH_SQL`` is the same hash in SQL (``md5`` returns it as hex: ``lower(hex(
text_hash))``), for DuckDB queries over the table.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from functools import lru_cache

import lance
import numpy as np
import pyarrow as pa

from lance_assets import keys
from lance_assets.curation.kept import elect
from lance_assets.table import Table
from lance_assets.table import executor as executors
from lance_assets.table.columns import ColumnWriteReport, fragments_missing
from lance_assets.table.producer import ColumnProducer, Run, Step, setting

IS_DUP = pa.field(keys.IS_DUP, pa.bool_())
TEXT_HASH = pa.field(keys.TEXT_HASH, pa.binary(16))
DESCRIPTIONS = {
    IS_DUP.name: "True when the whitespace-normalised text appeared at a smaller id.",
    TEXT_HASH.name: "md5 of the whitespace-normalised text (16 bytes; lower(hex(text_hash)) "
                    "equals DuckDB's md5 of it), kept so later runs never hash old text again.",
}
# RE2 (DuckDB) and Python agree on this explicit class; `\s` differs between them.
WHITESPACE_RUN = r"[ \t\n\r\f\v]+"
NORMALISED_HASH_SQL = f"md5(trim(regexp_replace(text, '{WHITESPACE_RUN}', ' ', 'g')))"
BATCH_ROWS = 1024  # texts per batch: ~5 MB of Python strings at 4.6 KB a document


def normalise(text: str) -> str:
    """The Python twin of the SQL normalisation (used by tests and tools)."""
    import re

    return re.sub(WHITESPACE_RUN, " ", text).strip(" ")


def digests(texts: pa.Array) -> bytes:
    """The 16-byte md5 of each whitespace-normalised text, concatenated (zeros for a null).

    ``bytes.split()`` splits on exactly ``[ \t\n\r\f\v]`` (ASCII whitespace), and no byte of
    a multi-byte UTF-8 character is one of those, so joining the pieces with one space is
    ``NORMALISED_HASH_SQL``'s normalisation, byte for byte, at ~10x the speed of the regex."""
    md5, space = hashlib.md5, b" "
    return b"".join(md5(space.join(t.encode().split())).digest() if t is not None
                    else bytes(16) for t in texts.to_pylist())


def text_hashes(texts: pa.Array) -> np.ndarray:
    """md5 of each whitespace-normalised text, as ``[n, 2]`` uint64 (little-endian words)."""
    return np.frombuffer(digests(texts), dtype="<u8").reshape(-1, 2)


def hash_words(column: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """A ``text_hash`` column as ``[n, 2]`` uint64, big-endian words: the first word holds the
    leading bits, so its order is the bytes' order."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    raw = np.frombuffer(column.buffers()[1], dtype=np.uint8)
    raw = raw[column.offset * 16:(column.offset + len(column)) * 16]
    return raw.view(">u8").reshape(-1, 2).astype(np.uint64)


# ---------------------------------------------------------------------------- phase 1: text_hash

@dataclass(frozen=True)
class TextHashes:
    """``text_hash`` of one fragment: its text read and hashed, once per row ever."""

    def __call__(self, frag) -> Iterator[pa.RecordBatch]:
        for batch in frag.to_batches(columns=["text"], batch_size=BATCH_ROWS):
            n = batch.num_rows
            values = pa.FixedSizeBinaryArray.from_buffers(
                TEXT_HASH.type, n, [None, pa.py_buffer(digests(batch.column("text")))])
            yield pa.RecordBatch.from_arrays([values], names=[TEXT_HASH.name])


# ---------------------------------------------------------------------------- phase 2: duplicates

@dataclass(frozen=True)
class HashScan:
    """What every map task shares: the table at the version holding the hashes, the end of the
    pinned version's rows (rows from there on wait for the next run) and the bucket count."""

    table: Table
    version: int
    rows_end: int
    buckets: int


@dataclass(frozen=True)
class FragmentPart:
    """One map task's fragment: ``new`` when it lacks ``is_dup`` (its duplicates are wanted),
    ``from_text`` when it lacks ``text_hash`` (rows that arrived after the pin, or compacted
    with them: hashed from their text, never the case for the pinned version's fragments)."""

    fragment_id: int
    new: bool
    from_text: bool = False
    rows: int = 0  # physical rows: how map tasks are sized


# A bucket's share of one fragment: (hash words [n, 2], ids [n], new)
Part = tuple[np.ndarray, np.ndarray, bool]


@lru_cache(maxsize=4)
def _open(table: Table, version: int) -> lance.LanceDataset:
    return table.open(version)


def bucket_of(words: np.ndarray, buckets: int) -> np.ndarray:
    """The bucket of each hash: its leading 32 bits scaled to ``[0, buckets)``, so bucket b
    holds a contiguous range of the hash order."""
    return ((words[:, 0] >> np.uint64(32)) * np.uint64(buckets)) >> np.uint64(32)


def bucket_parts(scan: HashScan, part: FragmentPart) -> list[Part]:
    """The map side: one fragment's (hash, id) pairs of the pinned version's rows, split by
    bucket. Reads ``id`` and ``text_hash`` (24 bytes a row), or ``text`` for ``from_text``."""
    frag = _open(scan.table, scan.version).get_fragment(part.fragment_id)
    ids, words = [], []
    if part.from_text:
        if frag.count_rows(f"id < {int(scan.rows_end)}") == 0:
            return [(np.zeros((0, 2), np.uint64), np.zeros(0, np.int64), part.new)] * scan.buckets
        for batch in frag.to_batches(columns=["id", "text"], batch_size=BATCH_ROWS):
            ids.append(batch.column("id").to_numpy(zero_copy_only=False))
            words.append(np.frombuffer(digests(batch.column("text")), ">u8")
                         .reshape(-1, 2).astype(np.uint64))
    else:
        for batch in frag.to_batches(columns=["id", TEXT_HASH.name], batch_size=1 << 16):
            ids.append(batch.column("id").to_numpy(zero_copy_only=False))
            words.append(hash_words(batch.column(TEXT_HASH.name)))
    id_arr = np.concatenate(ids) if ids else np.zeros(0, np.int64)
    w = np.concatenate(words) if words else np.zeros((0, 2), np.uint64)
    keep = id_arr < scan.rows_end
    id_arr, w = id_arr[keep], w[keep]
    if scan.buckets == 1:
        return [(w, id_arr, part.new)]
    b = bucket_of(w, scan.buckets)
    order = np.argsort(b, kind="stable")
    bounds = np.searchsorted(b[order], np.arange(scan.buckets + 1))
    return [(w[order[lo:hi]], id_arr[order[lo:hi]], part.new)
            for lo, hi in zip(bounds[:-1], bounds[1:])]


def bucket_duplicates(*parts: Part) -> np.ndarray:
    """The reduce side: of one bucket's pairs, the ids (sorted) of the new rows whose hash came
    at a smaller id, like ``min(id) OVER (PARTITION BY hash) < id``."""
    parts = tuple(p for p in parts if len(p[1]))
    if not any(p[2] for p in parts):
        return np.zeros(0, np.int64)
    w = np.concatenate([p[0] for p in parts])
    ids = np.concatenate([p[1] for p in parts])
    new = np.concatenate([np.full(len(p[1]), p[2]) for p in parts])
    order = np.lexsort((ids, w[:, 1], w[:, 0]))
    w = w[order]
    first_of_hash = np.r_[True, (w[1:] != w[:-1]).any(axis=1)]
    return np.sort(ids[order][~first_of_hash & new[order]])


@dataclass(frozen=True)
class DupPlan:
    """One search for duplicates: the map tasks' fragments and where they run."""

    scan: HashScan
    parts: tuple[FragmentPart, ...]
    executor: str


# A map task covers fragments enough for each of its bucket parts to pass Ray's inline limit
# (100 KiB): smaller task results are kept in the owner's (the driver's) memory, larger ones in
# the object store.
MAP_PART_BYTES = 128 << 10
PAIR_BYTES = 24  # a (hash, id) pair


def map_chunks(parts: tuple[FragmentPart, ...], buckets: int) -> list[tuple[FragmentPart, ...]]:
    """Consecutive fragments of the same kind (new or not) grouped into map tasks of at least
    ``MAP_PART_BYTES`` per bucket (a fragment alone when it is larger)."""
    want = MAP_PART_BYTES * buckets // PAIR_BYTES
    chunks: list[list[FragmentPart]] = []
    rows = 0
    for part in parts:
        if not chunks or chunks[-1][0].new != part.new or rows >= want:
            chunks.append([])
            rows = 0
        chunks[-1].append(part)
        rows += part.rows
    return [tuple(c) for c in chunks]


def map_part(scan: HashScan, chunk: tuple[FragmentPart, ...]) -> tuple:
    """A map task over fragments of one kind: the ``(first id, last id, rows)`` span of their
    rows, then their (hash, id) pairs split by bucket."""
    by_bucket: list[list[Part]] = [[] for _ in range(scan.buckets)]
    for part in chunk:
        for b, piece in enumerate(bucket_parts(scan, part)):
            by_bucket[b].append(piece)
    new = chunk[0].new
    pieces = [(np.concatenate([p[0] for p in ps]), np.concatenate([p[1] for p in ps]), new)
              for ps in by_bucket]
    ids = [p[1] for p in pieces if len(p[1])]
    lo = min(int(i.min()) for i in ids) if ids else 0
    hi = max(int(i.max()) for i in ids) if ids else -1
    return (np.array([lo, hi, sum(len(i) for i in ids)], np.int64), *pieces)


def reduce_bucket(starts: np.ndarray, *parts: Part) -> tuple:
    """A reduce task: how many new duplicates one bucket holds, then their ids split by group
    of new rows."""
    found = bucket_duplicates(*parts)
    groups = executors.group_of(found, starts)
    bounds = np.searchsorted(groups, np.arange(len(starts) + 2))
    return (len(found), *(found[lo:hi] for lo, hi in zip(bounds[:-1], bounds[1:])))


def duplicate_ids(plan: DupPlan, log: Callable[[str], None] = print) -> DupFlags:
    """The new rows (those of ``new`` fragments) whose normalised text appeared at a smaller id
    anywhere in the pinned version, as the ``is_dup`` write's compute: their ids per bucket and
    per group of new rows (contiguous id ranges, one per bucket), values locally and object
    references under Ray. The driver holds the references, spans and counts only."""
    scan = plan.scan
    if not any(p.new for p in plan.parts):
        return DupFlags(np.zeros(0, np.int64))
    tasks = executors.Tasks(plan.executor == "ray")
    if tasks.ray:
        executors.ensure_ray(log)
    try:
        scan_ref = tasks.put(scan)
        chunks = map_chunks(plan.parts, scan.buckets)
        maps = [tasks(map_part, scan_ref, chunk, returns=1 + scan.buckets) for chunk in chunks]
        chunk_spans = dict(enumerate(tasks.get([m[0] for m in maps])))
        starts = executors.contiguous_groups(
            {i: s for i, s in chunk_spans.items() if chunks[i][0].new}, scan.buckets)
        # a write task looks its fragment up in the groups its chunk's ids span
        spans = {p.fragment_id: chunk_spans[i] for i, chunk in enumerate(chunks) for p in chunk
                 if p.new}
        n_groups = len(starts) + 1
        reduces = [tasks(reduce_bucket, starts, *[m[1 + b] for m in maps],
                         returns=1 + n_groups) for b in range(scan.buckets)]
        del maps
        groups = tuple(tuple(r[1 + g] for r in reduces) for g in range(n_groups))
        count = sum(int(c) for c in tasks.get([r[0] for r in reduces]))
    except Exception as exc:
        if not tasks.ray:
            raise
        cause = getattr(exc, "cause", None) or exc  # the task's own exception, when Ray kept it
        raise RuntimeError(f"is_dup of {scan.table.uri}: a hash map or reduce task failed "
                           f"({type(cause).__name__}: {cause}); nothing of is_dup was written "
                           "by this run; run again (committed text_hash values are kept).") from exc
    return DupFlags(None, groups, starts, count, spans)


@dataclass(frozen=True)
class DupFlags:
    """``is_dup`` of one fragment: its ids looked up among the new duplicate ids (no text or
    hash is read here). Either ``dup_ids`` (sorted), or per group of new rows the buckets' ids
    (values, or object references under Ray: a task fetches its own group's only). Small and
    picklable, so a Ray task can run it."""

    dup_ids: np.ndarray | None
    groups: tuple = ()
    starts: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    count: int = -1

    spans: dict = field(default_factory=dict)  # fragment id -> (first id, last id, rows)

    def bind(self, fragment_id: int) -> DupFlags:
        """The compute of one fragment: its groups' references only."""
        span = self.spans.get(fragment_id)
        if self.dup_ids is not None or span is None:
            return self
        touched = set(executors.group_of(span[:2], self.starts).tolist()) if span[2] else set()
        groups = tuple(p if g in touched else () for g, p in enumerate(self.groups))
        return DupFlags(None, groups, self.starts, self.count)

    @property
    def new_duplicates(self) -> int:
        return len(self.dup_ids) if self.dup_ids is not None else self.count

    def _dups_for(self, ids: np.ndarray) -> np.ndarray:
        if self.dup_ids is not None:
            return self.dup_ids
        touched = np.unique(executors.group_of(ids[[0, -1]], self.starts)) if len(ids) else []
        pieces = [executors.value_of(p) for g in range(min(touched, default=0),
                                                        max(touched, default=-1) + 1)
                  for p in self.groups[g]]
        return np.sort(np.concatenate(pieces)) if pieces else np.zeros(0, np.int64)

    def __call__(self, frag) -> Iterator[pa.RecordBatch]:
        for batch in frag.to_batches(columns=["id"]):
            ids = batch.column("id").to_numpy(zero_copy_only=False)
            dups = self._dups_for(ids)
            pos = np.minimum(np.searchsorted(dups, ids), max(len(dups) - 1, 0))
            flags = dups[pos] == ids if len(dups) else np.zeros(len(ids), bool)
            yield pa.RecordBatch.from_arrays([pa.array(flags)], names=[IS_DUP.name])


# ---------------------------------------------------------------------------- the run

@dataclass(frozen=True)
class DedupSettings:
    buckets: int = setting(
        0, "Partitions of the hash space (by the hash's leading bits) for finding duplicates: "
        "one reduce task each under Ray, one sort each locally. 0: one per CPU of the Ray "
        "cluster under executor ray, 1 locally.")


@dataclass
class DedupReport(ColumnWriteReport):
    """The ``is_dup`` write's report, with the run's numbers."""

    rows_hashed_from_text: int = 0
    new_duplicates: int = 0
    buckets: int = 1
    kept_after_deletes: int = 0  # copies unflagged: their cluster's kept member was deleted


@dataclass(frozen=True)
class Hashed:
    """The ``text_hash`` step's result: the bucket count and the rows it hashed."""

    buckets: int
    rows_hashed: int


@dataclass(frozen=True)
class Duplicates:
    """The ``is_dup`` step's state: the write's compute and what the hashes gave."""

    flags: DupFlags
    hashed: Hashed


def resolve_buckets(run: Run, before: None) -> int:
    """The first step's state: the bucket count for where this run's tasks run."""
    return executors.resolve_partitions(run.settings.buckets, run.where,
                                        "dedup_flag setting buckets")


def hashes_written(run: Run, buckets: int, written: ColumnWriteReport) -> Hashed:
    return Hashed(buckets, written.rows_written)


def find_duplicates(run: Run, hashed: Hashed) -> Duplicates:
    """The ``is_dup`` step's state, built once ``text_hash`` is written for the pinned version:
    the map/reduce group-by over the hashes (the map reads the fragments the pin holds, and
    hashes from text the rows a compaction merged with newer ones)."""
    view = run.table.newest()  # the pinned version's hashes, as the step before committed them
    names = view.schema.names
    new = {f.fragment_id for f in (fragments_missing(view, [IS_DUP.name])
                                   if IS_DUP.name in names else view.get_fragments())}
    unhashed = {f.fragment_id for f in fragments_missing(view, [TEXT_HASH.name])}
    parts = tuple(FragmentPart(f.fragment_id, f.fragment_id in new, f.fragment_id in unhashed,
                               f.physical_rows)
                  for f in view.get_fragments())
    plan = DupPlan(HashScan(run.table, view.version, run.rows_end, hashed.buckets), parts,
                   run.where)
    flags = duplicate_ids(plan, run.log) if new else DupFlags(np.zeros(0, np.int64))
    return Duplicates(flags, hashed)


def elect_kept(run: Run, dups: Duplicates, written: ColumnWriteReport) -> DedupReport:
    """After ``is_dup``: a copy whose cluster's kept member was deleted is kept instead."""
    kept = elect(run.table, flag=IS_DUP.name, cluster=TEXT_HASH.name, rows_end=run.rows_end,
                 log=run.log)
    return DedupReport(**asdict(written), rows_hashed_from_text=dups.hashed.rows_hashed,
                       new_duplicates=dups.flags.new_duplicates, buckets=dups.hashed.buckets,
                       kept_after_deletes=kept)


STEPS = (
    Step(fields=[TEXT_HASH], state=resolve_buckets, compute=lambda settings, buckets: TextHashes(),
         after=hashes_written),
    Step(fields=[IS_DUP], state=find_duplicates, compute=lambda settings, dups: dups.flags,
         after=elect_kept),
)


def summary(table: Table, report: DedupReport) -> dict:
    from lance_assets.curation.profile import flag_rate

    return {
        "duplicate_rate": round(flag_rate(table, IS_DUP.name), 4),
        "rows_hashed_from_text": report.rows_hashed_from_text,
        "new_duplicates": report.new_duplicates,
        "buckets": report.buckets,
        "kept_after_deletes": report.kept_after_deletes,
    }


PRODUCER = ColumnProducer(
    name="dedup_flag",
    doc="`is_dup` (bool): true for a document whose whitespace-normalised text appeared at a "
        "smaller `id` that is still in the table; `text_hash` (16 bytes): md5 of that text, kept "
        "so each text is hashed once ever. Duplicates found by a group-by partitioned on the hash "
        "(map per fragment, reduce per bucket), written per fragment; old values never change, "
        "except that a copy whose kept member was deleted is kept instead (curation/kept.py).",
    descriptions=DESCRIPTIONS, steps=STEPS, settings=DedupSettings, summary=summary,
    reads={IS_DUP.name: [("raw_text", "text"), ("raw_text", "id")],
           TEXT_HASH.name: [("raw_text", "text")]},
    group="curation", kinds=("lance", "duckdb"), version="2")
