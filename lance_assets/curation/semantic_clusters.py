"""The clusters ``semantic_dup`` compares within, and its side store: the kept document vectors
grouped by cluster, so a run reads the rows of the clusters its new rows probe and nothing else.

Pure numpy over files under ``<data root>/semantic_dup/`` (``paths.semantic_dup_dir``), read and
written through ``storage`` (local disk or object storage), no table access: every function here
is one task's work, called in this process locally and as a Ray task under ``executor: ray``.

Layout::

    state.json                        the generation in force (written last: the switch)
    g<gen>/centroids.npy              (k, 384) float32 unit centroids
    g<gen>/c<cluster>/<first>-<last>-<rows>.bin   a cluster's rows: ids, reps, 1/norms, vectors
    g<gen>/r<cluster>/<first>-<last>-<rows>.bin   a run's new rows of a group of clusters

A file holds its rows' vectors as float32 copies of the int8 ones (exact: small integers), by
dimension (384 x rows: the layout the matrix product streams fastest), so a run maps it into
memory and multiplies without converting or copying it; 1.5 kB a row, a tenth of the
``chunk_embeddings`` it replaces.

A cluster's rows are a few slices of files (the state lists, per cluster, [file, rows, first
row]): its own file from its last compaction, and the slices of the run files appended since
(one file per run and group of clusters, so a run writes a few files, not one per cluster).
Past ``MAX_SEGMENTS`` slices a cluster is compacted into a file of its own. Files are named by
what they hold, written before the state that lists them, and never edited: a run killed
anywhere leaves the state in force readable; files no state lists are removed after the next
state is saved, or with their generation.

The store holds what the table's columns hold (``id``, ``semantic_rep``, ``semantic_vector`` of
the rows written, homed by cluster), so it can always be made again from them: ``forget``
removes it, a run that finds the columns written and no store rebuilds it.
"""

from __future__ import annotations

import io
import json
import mmap
import os
from dataclasses import dataclass

import numpy as np

from lance_assets import storage

DIM = 384
STATE = "state.json"
FORMAT = 1
NEW_BLOCK = 1024  # new rows per matrix product
OLD_BLOCK = 8192  # candidate rows per matrix product: 1024 x 8192 float32 (32 MB)
KMEANS_ITERATIONS = 25
MAX_SEGMENTS = 8  # files a cluster is read from, at most
NONE = np.int64(-1)
MAP_FLAGS = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)


# ---------------------------------------------------------------------------- vectors

def quantize(unit: np.ndarray) -> np.ndarray:
    """Unit vectors as int8, each scaled so its largest component is +-127. A cosine of two such
    vectors (dot / norms) is exact in float32 arithmetic: every partial sum of a dot product is an
    integer below 2**24 (127 * 127 * 384 = 6.2 M), whatever the order a BLAS adds in, so local and
    Ray runs agree to the bit. Rows of zeros stay zeros."""
    unit = np.asarray(unit, np.float32)
    peak = np.abs(unit).max(axis=1, keepdims=True) if len(unit) else np.ones((0, 1), np.float32)
    scaled = unit * (127.0 / np.where(peak == 0, 1, peak))
    return np.clip(np.rint(scaled), -127, 127).astype(np.int8)


def as_unit(q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """int8 vectors -> (float32 copies, 1 / norm of each)."""
    x = q.astype(np.float32)
    norms = np.sqrt(np.einsum("ij,ij->i", x, x))
    return x, (1.0 / np.where(norms == 0, 1, norms)).astype(np.float32)


def hashed_sample(ids: np.ndarray, rate: float, seed: int) -> np.ndarray:
    """The rows kept by a sample of ``rate``: a hash of (id, seed), so the same rows are kept
    whichever task reads them."""
    if rate >= 1:
        return np.ones(len(ids), bool)
    h = (ids.astype(np.uint64) + np.uint64(seed) * np.uint64(0x9E3779B97F4A7C15))
    h = (h ^ (h >> np.uint64(31))) * np.uint64(0xBF58476D1CE4E5B9)
    h ^= h >> np.uint64(29)
    return (h >> np.uint64(11)).astype(np.float64) / float(1 << 53) < rate


# ---------------------------------------------------------------------------- k-means

def nearest(x: np.ndarray, centroids: np.ndarray, probes: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """The ``probes`` nearest centroids of each unit row of ``x`` (best first) and the cosine
    with the nearest."""
    n, k = len(x), len(centroids)
    p = min(probes, k)
    out = np.empty((n, p), np.int64)
    best = np.empty(n, np.float32)
    for lo in range(0, n, OLD_BLOCK):
        s = x[lo:lo + OLD_BLOCK] @ centroids.T
        if p == 1:
            top = np.argmax(s, axis=1)[:, None]
        else:
            top = np.argpartition(-s, p - 1, axis=1)[:, :p]
            order = np.argsort(-np.take_along_axis(s, top, axis=1), axis=1, kind="stable")
            top = np.take_along_axis(top, order, axis=1)
        out[lo:lo + OLD_BLOCK] = top
        best[lo:lo + OLD_BLOCK] = s[np.arange(len(s)), top[:, 0]]
    return out, best


def spherical_kmeans(x: np.ndarray, k: int, seed: int,
                     iterations: int = KMEANS_ITERATIONS) -> np.ndarray:
    """(k, 384) unit centroids of the unit rows ``x`` (cosine k-means, k-means++ start)."""
    rng = np.random.default_rng(seed)
    n = len(x)
    k = max(1, min(k, n))
    centroids = np.empty((k, x.shape[1]), np.float32)
    centroids[0] = x[rng.integers(n)]
    dist = 1.0 - x @ centroids[0]
    for c in range(1, k):  # k-means++: the next start far from those chosen
        p = np.clip(dist, 0, None) ** 2
        i = rng.choice(n, p=p / p.sum()) if p.sum() > 0 else rng.integers(n)
        centroids[c] = x[i]
        dist = np.minimum(dist, 1.0 - x @ centroids[c])
    labels = None
    for _ in range(iterations):
        new = nearest(x, centroids)[0][:, 0]
        if labels is not None and np.array_equal(new, labels):
            break
        labels = new
        order = np.argsort(labels, kind="stable")
        present, starts = np.unique(labels[order], return_index=True)
        sums = np.zeros_like(centroids, dtype=np.float64)
        sums[present] = np.add.reduceat(x[order], starts, axis=0)
        norms = np.linalg.norm(sums, axis=1)
        empty = norms == 0
        if empty.any():  # an empty cluster restarts at the rows worst served
            worst = np.argsort(np.einsum("ij,ij->i", x, centroids[labels]))[:int(empty.sum())]
            sums[empty] = x[worst]
            norms[empty] = 1.0
        centroids = (sums / norms[:, None]).astype(np.float32)
    return centroids


# ---------------------------------------------------------------------------- the store

@dataclass(frozen=True)
class Segment:
    """A segment's rows: ids ascending, representatives, 1 / norms, float32 vectors."""

    ids: np.ndarray
    reps: np.ndarray
    inv: np.ndarray
    vecs: np.ndarray


@dataclass(frozen=True)
class Store:
    """Where the side store lives (a folder URI); picklable, so tasks get it as an argument."""

    uri: str

    def path(self, name: str):
        return storage.location(self.uri) / name

    def load_state(self) -> dict | None:
        p = self.path(STATE)
        try:
            state = json.loads(storage.read_bytes(p))
        except FileNotFoundError:
            return None
        if state.get("format") != FORMAT:
            return None
        return state

    def save_state(self, state: dict) -> None:
        storage.write_atomic(self.path(STATE), json.dumps(state, sort_keys=True).encode())

    def centroids(self, state: dict) -> np.ndarray:
        return load_npy(self.path(f"g{state['generation']}/centroids.npy"))

    def save_centroids(self, generation: int, centroids: np.ndarray) -> None:
        buf = io.BytesIO()
        np.save(buf, np.ascontiguousarray(centroids, np.float32), allow_pickle=False)
        storage.write_atomic(self.path(f"g{generation}/centroids.npy"), buf.getvalue())

    def read_cluster(self, state: dict, c: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """A cluster's rows (ids ascending, reps, int8 vectors)."""
        parts = [(g.ids, g.reps, g.vecs.astype(np.int8)) for g in self.segments(state, c)]
        if not parts:
            return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros((0, DIM), np.int8)
        ids, reps, vecs = (np.concatenate(x) for x in zip(*parts))
        order = np.argsort(ids, kind="stable")
        return ids[order], reps[order], vecs[order]

    def segments(self, state: dict, c: int) -> list[Segment]:
        return [self.read_segment(state["generation"], e)
                for e in state["segments"].get(str(c), [])]

    def read_segment(self, generation: int, entry: list) -> Segment:
        """A cluster's rows in one file: ``entry`` is [file, rows, first row in the file]."""
        rel, rows, start = entry[0], int(entry[1]), int(entry[2])
        n = int(rel.rsplit("-", 1)[1].split(".")[0])
        path = self.path(f"g{generation}/{rel}")
        if storage.is_object_store(path):
            buf = np.frombuffer(storage.read_bytes(path), np.uint8)
        else:  # mapped, every page at once (one fault per page costs more than the product)
            with open(os.fspath(path), "rb") as fh:
                size = os.fstat(fh.fileno()).st_size
                buf = np.frombuffer(mmap.mmap(fh.fileno(), size, flags=MAP_FLAGS,
                                              prot=mmap.PROT_READ), np.uint8) if size else \
                    np.zeros(0, np.uint8)
        if len(buf) != n * (20 + 4 * DIM):
            raise RuntimeError(f"{path}: {len(buf)} bytes, not {n} rows; remove "
                               f"{self.uri} and run again (it is made again from the columns)")
        end = start + rows
        return Segment(buf[:8 * n].view("<i8")[start:end], buf[8 * n:16 * n].view("<i8")[start:end],
                       buf[16 * n:20 * n].view("<f4")[start:end],
                       buf[20 * n:].view("<f4").reshape(DIM, n).T[start:end])

    def write_rows(self, generation: int, folder: str, ids: np.ndarray, reps: np.ndarray,
                   vecs: np.ndarray) -> str:
        """One file of rows (int8 vectors), in the order given; returns its path in the
        generation's folder."""
        x, inv = as_unit(vecs)
        rel = f"{folder}/{int(ids.min())}-{int(ids.max())}-{len(ids)}.bin"
        data = b"".join([ids.astype("<i8").tobytes(), reps.astype("<i8").tobytes(),
                         inv.astype("<f4").tobytes(), x.T.astype("<f4").tobytes()])
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
        rel = self.write_rows(generation, f"r{int(homes[0])}", ids, reps, vecs)
        cs, starts, counts = np.unique(homes, return_index=True, return_counts=True)
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
            np.concatenate([p.vecs for p in parts]).astype(np.int8))
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

    def remove_generations(self, keep: int) -> int:
        """Remove every generation folder but ``keep`` (after the state naming it is saved)."""
        root = storage.location(self.uri)
        if not root.exists():
            return 0
        removed = 0
        for p in root.iterdir():
            if p.name.startswith("g") and p.name[1:].isdigit() and int(p.name[1:]) != keep:
                removed += storage.remove_tree(p)
        return removed


def load_npy(path) -> np.ndarray:
    return np.load(io.BytesIO(storage.read_bytes(path)), allow_pickle=False)


# ---------------------------------------------------------------------------- comparing

def best_earlier(new_ids: np.ndarray, x: np.ndarray, xi: np.ndarray, cand_ids: np.ndarray,
                 y: np.ndarray, yi: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    """For each new row (ids ascending; ``x`` float32 copies of int8 vectors, ``xi`` 1 / their
    norms), its best cosine with a candidate of smaller id (``cand_ids`` ascending, ``y``,
    ``yi`` likewise) and that candidate's position (-1 and -inf when there is none); ties go to
    the smallest id. Returns also the pairs compared."""
    n = len(new_ids)
    best = np.full(n, -np.inf, np.float32)
    best_at = np.full(n, -1, np.int64)
    if n == 0 or len(cand_ids) == 0:
        return best, best_at, 0
    pairs = 0
    for clo in range(0, len(cand_ids), OLD_BLOCK):
        c_ids = cand_ids[clo:clo + OLD_BLOCK]
        yb, yib = y[clo:clo + OLD_BLOCK], yi[clo:clo + OLD_BLOCK]
        for lo in range(0, n, NEW_BLOCK):
            ids = new_ids[lo:lo + NEW_BLOCK]
            if c_ids[0] >= ids[-1]:
                continue
            s = x[lo:lo + NEW_BLOCK] @ yb.T  # exact: integer sums below 2**24
            s *= xi[lo:lo + NEW_BLOCK, None]
            s *= yib[None, :]
            if c_ids[-1] < ids[0]:  # every candidate is earlier (stored rows, mostly)
                pairs += s.size
            else:
                later = c_ids[None, :] >= ids[:, None]
                s[later] = -np.inf
                pairs += s.size - int(np.count_nonzero(later))
            j = np.argmax(s, axis=1)  # the first of equal values: the smallest id
            v = s[np.arange(len(ids)), j]
            better = v > best[lo:lo + NEW_BLOCK]  # an earlier block has smaller ids: keeps ties
            best[lo:lo + NEW_BLOCK][better] = v[better]
            best_at[lo:lo + NEW_BLOCK][better] = clo + j[better]
    return best, best_at, pairs


def merge_best(best: np.ndarray, best_id: np.ndarray, v: np.ndarray, vid: np.ndarray) -> None:
    """Keep, per row, the higher cosine of two candidates' sets (ties: the smaller id)."""
    take = (vid >= 0) & ((v > best) | ((v == best) & ((best_id < 0) | (vid < best_id))))
    best[take] = v[take]
    best_id[take] = vid[take]
