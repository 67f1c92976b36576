"""Document vectors grouped by cluster in files: ``semantic_dup``'s side store, read a cluster
at a time. Pure numpy over files read and written through ``storage`` (local disk or object
storage), no table access: every function is one task's work, locally or as a Ray task.

A file holds its rows sorted by cluster, then id: ids (int64), representatives (int64), 1 / norms
(float32), then the int8 vectors cluster by cluster, each cluster's block by dimension (the
layout the exact int8 product, ``int8_vectors.cosines``, takes as it is): 404 bytes a row, read
with four ranged reads and multiplied without a copy. A cluster is read as one part: its largest
segment into a reused scratch buffer (fresh memory per read costs more than the read), the
slices of the runs since after it, each run file read once for a group of clusters.

A cluster's rows are a few slices of files ([file, rows, first row] per slice): its own file
from its last compaction and the slices of run files appended since; past ``MAX_SEGMENTS``
slices it is compacted into a file of its own. Files are named by what they hold, written before
the state that lists them (``curation/semantic_store``) and never edited; files no state lists
are removed after a switch.
"""

from __future__ import annotations

import io
import os
import threading
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np

from lance_assets import storage
from lance_assets.embeddings.int8_vectors import DIM, inv_norms

FORMAT = 2  # 1: float32 vectors (read as no store: made again from the columns)
MAX_SEGMENTS = 8  # files a cluster is read from, at most
ROW_BYTES = 8 + 8 + 4 + DIM  # id, representative, 1 / norm, int8 vector


@dataclass(frozen=True)
class Segment:
    """A segment's rows: ids ascending, representatives, 1 / norms, and the int8 vectors by
    dimension (``vt``: 384 x rows)."""

    ids: np.ndarray
    reps: np.ndarray
    inv: np.ndarray
    vt: np.ndarray


@dataclass(frozen=True)
class Store:
    """Where the side store lives (a folder URI); picklable, so tasks get it as an argument."""

    uri: str

    @cached_property
    def root(self):
        return storage.location(self.uri)

    def path(self, name: str):
        return self.root / name

    def centroids(self, state: dict) -> np.ndarray:
        return load_npy(self.path(f"g{state['generation']}/centroids.npy"))

    def save_centroids(self, generation: int, centroids: np.ndarray) -> None:
        buf = io.BytesIO()
        np.save(buf, np.ascontiguousarray(centroids, np.float32), allow_pickle=False)
        storage.write_atomic(self.path(f"g{generation}/centroids.npy"), buf.getvalue())

    def read_cluster(self, state: dict, c: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """A cluster's rows (ids ascending, reps, int8 vectors)."""
        parts = [(g.ids, g.reps, g.vt.T) for g in self.segments(state, c)]
        if not parts:
            return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros((0, DIM), np.int8)
        ids, reps, vecs = (np.concatenate(x) for x in zip(*parts))
        order = np.argsort(ids, kind="stable")
        return ids[order], reps[order], vecs[order]

    def segments(self, state: dict, c: int) -> list[Segment]:
        return [self.read_segment(state["generation"], e)
                for e in state["segments"].get(str(c), [])]

    def cluster(self, state: dict, c: int, tails: dict[int, Segment]) -> list[Segment]:
        """A cluster's stored rows as one part, one product: its largest segment read straight
        into the first columns of the scratch buffer (valid until its next use), the small
        slices of the runs since (``tails``, read for the group beforehand) copied after it,
        ids ascending. Two parts when the slices' ids do not all follow the largest segment's
        file (never, as the store appends)."""
        entries = state["segments"].get(str(c), [])
        if not entries:
            return []
        gen = state["generation"]
        big = max(entries, key=lambda e: int(e[1]))
        tail = tails.get(c)
        rel, rows, start = big[0], int(big[1]), int(big[2])
        _, last, n = file_rows(rel)
        if tail is None or int(tail.ids[0]) <= last:
            return [self.read_segment(gen, big, scratch=True)] + ([tail] if tail is not None else [])
        total = rows + len(tail.ids)
        buf = scratch_buffer(DIM * total)
        vt = np.frombuffer(buf, np.int8).reshape(DIM, total)
        path = self.file(gen, rel)
        *ranges, (vectors, _) = row_ranges(n, start, start + rows)
        parts = storage.read_ranges(path, ranges)
        got = storage.read_scattered(path, vectors,
                                     [buf[d * total:d * total + rows] for d in range(DIM)])
        if [len(x) for x in parts] != [b - a for a, b in ranges] or got != DIM * rows:
            self._short(path, n)
        vt[:, rows:] = tail.vt
        return [Segment(np.concatenate([np.frombuffer(parts[0], "<i8"), tail.ids]),
                        np.concatenate([np.frombuffer(parts[1], "<i8"), tail.reps]),
                        np.concatenate([np.frombuffer(parts[2], "<f4"), tail.inv]), vt)]

    def tails(self, state: dict, clusters: list[int]) -> dict[int, Segment]:
        """Every segment but the largest of each cluster (the slices of the runs since its last
        compaction), as one part per cluster, by id. Each file is read once, its span of these
        clusters' slices (a run file holds every cluster's slice, by cluster)."""
        gen = state["generation"]
        wanted: dict[str, list[tuple[int, list]]] = {}
        for c in clusters:
            entries = state["segments"].get(str(c), [])
            if len(entries) < 2:
                continue
            big = max(range(len(entries)), key=lambda i: int(entries[i][1]))
            for i, e in enumerate(entries):
                if i != big:
                    wanted.setdefault(e[0], []).append((c, e))
        parts: dict[int, list[Segment]] = {}
        for rel, slices in wanted.items():
            lo = min(int(e[2]) for _, e in slices)
            hi = max(int(e[2]) + int(e[1]) for _, e in slices)
            ids, reps, inv, raw = self._read_span(gen, rel, lo, hi)
            for c, e in slices:
                a, b = int(e[2]) - lo, int(e[2]) - lo + int(e[1])
                parts.setdefault(c, []).append(Segment(
                    ids[a:b], reps[a:b], inv[a:b],
                    raw[DIM * a:DIM * b].reshape(DIM, b - a)))  # a slice is one cluster's block
        out = {}
        for c, got in parts.items():
            ids = np.concatenate([g.ids for g in got])
            order = np.argsort(ids, kind="stable")
            out[c] = Segment(ids[order], np.concatenate([g.reps for g in got])[order],
                             np.concatenate([g.inv for g in got])[order],
                             np.concatenate([g.vt for g in got], axis=1)[:, order])
        return out

    def read_segment(self, generation: int, entry: list, scratch: bool = False) -> Segment:
        """A cluster's rows in one file: ``entry`` is [file, rows, first row in the file]. Only
        those rows are read (their ids, representatives, norms and their block of vectors).
        ``scratch``: the vectors are read into this thread's scratch buffer, valid until its next
        use (a fresh buffer per read costs more than the read: its pages are new to the
        process, and out of the cache)."""
        rel, rows, start = entry[0], int(entry[1]), int(entry[2])
        ids, reps, inv, raw = self._read_span(generation, rel, start, start + rows, scratch)
        return Segment(ids, reps, inv, raw.reshape(DIM, rows))

    def _read_span(self, generation: int, rel: str, start: int, end: int,
                   scratch: bool = False) -> tuple[np.ndarray, ...]:
        """Rows ``[start, end)`` of a file: ids, reps, 1 / norms and their vectors' bytes (the
        blocks of the clusters they belong to, one after the other). A whole file is one read."""
        n = file_rows(rel)[2]
        path = self.file(generation, rel)
        ranges = [(0, n * ROW_BYTES)] if start == 0 and end == n else row_ranges(n, start, end)
        into = [scratch_buffer(b - a) if scratch and i == len(ranges) - 1 else None
                for i, (a, b) in enumerate(ranges)]
        parts = storage.read_ranges(path, ranges, into)
        if [len(x) for x in parts] != [b - a for a, b in ranges]:
            self._short(path, n)
        if len(parts) == 1:
            whole = parts[0]
            parts = [whole[:8 * n], whole[8 * n:16 * n], whole[16 * n:20 * n], whole[20 * n:]]
        return (np.frombuffer(parts[0], "<i8"), np.frombuffer(parts[1], "<i8"),
                np.frombuffer(parts[2], "<f4"), np.frombuffer(parts[3], np.int8))

    def _short(self, path, n: int) -> None:
        raise RuntimeError(f"{path}: shorter than its {n} rows; the next run of semantic_dup "
                           "makes the store again from the table's columns")

    def file(self, generation: int, rel: str):
        """A file of the store: a plain string locally (no path object to build per read)."""
        if isinstance(self.root, Path):
            return os.path.join(self.root, f"g{generation}", rel)
        return self.path(f"g{generation}/{rel}")

    def write_rows(self, generation: int, folder: str, ids: np.ndarray, reps: np.ndarray,
                   vecs: np.ndarray, blocks: list[int] | None = None) -> str:
        """One file of rows (int8 vectors), in the order given, their vectors by dimension in
        ``blocks`` of rows (one per cluster; default: one); returns its path in the
        generation's folder."""
        vecs = np.asarray(vecs, np.int8)
        bounds = np.cumsum([0] + (blocks or [len(ids)]))
        if bounds[-1] != len(ids):
            raise ValueError(f"blocks {blocks} do not add up to {len(ids)} rows")
        rel = f"{folder}/{int(ids.min())}-{int(ids.max())}-{len(ids)}.bin"
        data = b"".join([ids.astype("<i8").tobytes(), reps.astype("<i8").tobytes(),
                         inv_norms(vecs).astype("<f4").tobytes()] +
                        [np.ascontiguousarray(vecs[lo:hi].T).tobytes()
                         for lo, hi in zip(bounds[:-1], bounds[1:])])
        storage.write_atomic(self.path(f"g{generation}/{rel}"), data)
        return rel

    def write_segment(self, generation: int, c: int, ids: np.ndarray, reps: np.ndarray,
                      vecs: np.ndarray) -> list:
        """A cluster's rows in a file of its own; returns its entry."""
        order = np.argsort(ids, kind="stable")
        return [self.write_rows(generation, f"c{c}", ids[order], reps[order], vecs[order]),
                int(len(ids)), 0]

    def append(self, generation: int, c: int, segments: list, ids: np.ndarray, reps: np.ndarray,
               vecs: np.ndarray) -> list:
        """``segments`` of cluster ``c`` with the rows added (a new list; no file is removed:
        the state in force may still list them)."""
        segs = [list(e) for e in segments]
        if not len(ids):
            return segs
        segs.append(self.write_segment(generation, c, ids, reps, vecs))
        out = self.compacted(generation, c, segs)
        self._drop_if_unlisted(generation, segs[-1][0], [out])
        return out

    def append_run(self, generation: int, segments: dict, homes: np.ndarray, ids: np.ndarray,
                   reps: np.ndarray, vecs: np.ndarray) -> dict:
        """A run's new rows of several clusters in one file (sorted by cluster, then id); returns
        the clusters' new segment lists. One file a run, whatever the clusters it touches."""
        if not len(ids):
            return {}
        order = np.lexsort((ids, homes))
        homes, ids, reps, vecs = homes[order], ids[order], reps[order], vecs[order]
        cs, starts, counts = np.unique(homes, return_index=True, return_counts=True)
        rel = self.write_rows(generation, f"r{int(homes[0])}", ids, reps, vecs,
                              blocks=counts.tolist())
        out = {}
        for c, start, rows in zip(cs.tolist(), starts.tolist(), counts.tolist()):
            segs = [list(e) for e in segments.get(str(c), [])] + [[rel, rows, start]]
            out[str(c)] = self.compacted(generation, c, segs)
        self._drop_if_unlisted(generation, rel, out.values())  # merged away at once
        return out

    def _drop_if_unlisted(self, generation: int, rel: str, lists) -> None:
        """A file this call wrote that no list names any more (merged at once): no state ever
        listed it, so it goes now."""
        if not any(e[0] == rel for segs in lists for e in segs):
            self._remove(generation, rel)

    def compacted(self, generation: int, c: int, segs: list) -> list:
        """At most ``MAX_SEGMENTS`` entries: past it, every entry but the first (the cluster's
        rows at its last compaction) is merged into one file, and that one into the first once it
        holds half as many rows. A row is rewritten a few times over a generation, a cluster is
        read from a few files."""
        if len(segs) <= MAX_SEGMENTS:
            return segs
        tail = segs[1:] if int(segs[0][1]) > 2 * sum(int(e[1]) for e in segs[1:]) else segs
        parts = [self.read_segment(generation, e) for e in tail]
        merged = self.write_segment(
            generation, c, np.concatenate([p.ids for p in parts]),
            np.concatenate([p.reps for p in parts]),
            np.concatenate([p.vt.T for p in parts]))
        return ([] if tail is segs else segs[:1]) + [merged]

    def referenced(self, state: dict) -> set[str]:
        return {e[0] for segs in state["segments"].values() for e in segs}

    def remove_replaced(self, before: dict, after: dict) -> int:
        """Remove the files ``before`` listed and ``after`` (saved) no longer does: slices
        merged into a cluster's file. Run after ``after`` is saved, same generation only."""
        if before.get("generation") != after.get("generation"):
            return 0
        gone = self.referenced(before) - self.referenced(after)
        for rel in gone:
            self._remove(after["generation"], rel)
        return len(gone)

    def _remove(self, generation: int, rel: str) -> None:
        path = self.path(f"g{generation}/{rel}")
        if storage.is_object_store(path):
            if path.exists():
                path.fs.rm(path.path)
        else:
            path.unlink(missing_ok=True)


def file_rows(rel: str) -> tuple[int, int, int]:
    """A file's first id, last id and rows, from its name (``<first>-<last>-<rows>.bin``)."""
    first, last, rows = rel.rsplit("/", 1)[-1].removesuffix(".bin").split("-")
    return int(first), int(last), int(rows)


def row_ranges(n: int, start: int, end: int) -> list[tuple[int, int]]:
    """The byte ranges of rows ``[start, end)`` of a file of ``n`` rows: their ids, their
    representatives, their 1 / norms and their vectors (one cluster's block, or several)."""
    return [(8 * start, 8 * end), (8 * (n + start), 8 * (n + end)),
            (16 * n + 4 * start, 16 * n + 4 * end), (20 * n + DIM * start, 20 * n + DIM * end)]


_scratch = threading.local()


def scratch_buffer(nbytes: int) -> memoryview:
    """``nbytes`` of this thread's scratch buffer (grown as needed, kept for the process)."""
    buf = getattr(_scratch, "buf", None)
    if buf is None or len(buf) < nbytes:
        buf = _scratch.buf = bytearray(max(nbytes, 2 * len(buf) if buf is not None else 0))
    return memoryview(buf)[:nbytes]


def load_npy(path) -> np.ndarray:
    return np.load(io.BytesIO(storage.read_bytes(path)), allow_pickle=False)
