"""How ``semantic_dup`` compares: each new row against the earlier rows of its probed clusters.

A row's vector is the normalised mean of its ``chunk_embeddings`` (``document_vectors``), kept as
int8: cosines on it are exact (``int8_vectors.cosines``), so every executor computes the same
bits. The steps are tasks (Ray tasks under ``executor: ray``, the same functions locally): read
each new fragment's vectors (``read_new``), home them in their ``probes`` nearest clusters
(``assign``), gather them into one batch, compare per group of clusters (``compare_group``: the
stored rows of a cluster read from the store there, and the new rows homed there), and resolve
representatives in id order (``resolve``): a flagged row takes its nearest earlier row's
representative. ``compare_batch`` does the same for one in-memory batch (benchmarks, tests).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import lance
import numpy as np
import pyarrow as pa

from lance_assets import keys
from lance_assets.embeddings import int8_vectors as iv
from lance_assets.embeddings import vector_files as vf
from lance_assets.embeddings.embeddings import DIM
from lance_assets.embeddings.int8_vectors import cosines
from lance_assets.progress import progress
from lance_assets.table import Table
from lance_assets.table import executor as executors

COMPUTED, NO_CHUNKS, OTHER_LANGUAGE = 0, 1, 2  # a new row's status
NEW_BLOCK = 1024  # new rows per matrix product
OLD_BLOCK = 8192  # candidate rows per matrix product: 1024 x 8192 cosines (32 MB)
NONE = np.int64(-1)

LOCAL_GROUPS = 16  # groups of clusters in a local run, at most (its progress steps; no effect
PAIRS_PER_GROUP = 2e9  # on values): one per this many pairs to compare (a few seconds each)
NEW_PAIRS = 1 << 22  # new rows against new rows of a group in one product up to this many pairs


# ---------------------------------------------------------------------------- vectors

def document_vectors(col: pa.Array | pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray]:
    """list<fixed_size_list<float32, 384>> -> ((rows, 384) unit vectors: the normalised mean of
    each row's chunks, has-vector mask). Rows that are null or have no chunks get zeros."""
    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks() if col.num_chunks else pa.array([], col.type)
    n = len(col)
    out = np.zeros((n, DIM), np.float32)
    if n == 0:
        return out, np.zeros(0, bool)
    offsets = col.offsets.to_numpy(zero_copy_only=False).astype(np.int64)
    inner = col.values
    flat = inner.values.to_numpy(zero_copy_only=False)[inner.offset * DIM:
                                                       (inner.offset + len(inner)) * DIM]
    flat = flat.reshape(-1, DIM)
    counts = np.diff(offsets)
    ok = np.asarray(col.is_valid()) & (counts > 0)
    rows = np.flatnonzero(counts > 0)  # sorted starts: each segment ends where the next begins
    if len(rows):
        sums = np.add.reduceat(flat[:offsets[-1]], offsets[rows], axis=0)
        norms = np.linalg.norm(sums, axis=1, keepdims=True)
        ok[rows[norms[:, 0] == 0]] = False
        unit = (sums / np.where(norms == 0, 1, norms)).astype(np.float32)
        keep = ok[rows]
        out[rows[keep]] = unit[keep]
    return out, ok


@dataclass(frozen=True)
class Scan:
    """What the read tasks share: the table at the pinned version and the languages compared."""

    table: Table
    version: int
    languages: tuple[str, ...]


@lru_cache(maxsize=4)
def _open(table: Table, version: int) -> lance.LanceDataset:
    return table.open(version)


# a new fragment's rows: (ids, int8 vectors, status: COMPUTED / NO_CHUNKS / OTHER_LANGUAGE)
Payload = tuple[np.ndarray, np.ndarray, np.ndarray]


def read_new(scan: Scan, fragment_id: int) -> tuple:
    """A new fragment: its document vectors. Returns (first id, last id, rows, computed, no
    chunks, other languages) and its payload."""
    frag = _open(scan.table, scan.version).get_fragment(fragment_id)
    cols = ["id", keys.CHUNK_EMBEDDINGS] + (["lang"] if scan.languages else [])
    ids, vecs, status = [], [], []
    for b in frag.to_batches(columns=cols, batch_size=4096):
        unit, ok = document_vectors(b.column(keys.CHUNK_EMBEDDINGS))
        st = np.where(ok, COMPUTED, NO_CHUNKS).astype(np.int8)
        if scan.languages:
            lang = np.asarray(b.column("lang").to_pylist(), dtype=object)
            st[ok & ~np.isin(lang, list(scan.languages))] = OTHER_LANGUAGE
        ids.append(b.column("id").to_numpy(zero_copy_only=False))
        vecs.append(iv.quantize(unit))
        status.append(st)
    i = np.concatenate(ids) if ids else np.zeros(0, np.int64)
    v = np.concatenate(vecs) if vecs else np.zeros((0, DIM), np.int8)
    s = np.concatenate(status) if status else np.zeros(0, np.int8)
    span = np.array([i[0] if len(i) else 0, i[-1] if len(i) else -1, len(i),
                     int((s == COMPUTED).sum()), int((s == NO_CHUNKS).sum()),
                     int((s == OTHER_LANGUAGE).sum())], np.int64)
    return span, (i, v, s)


def assign(centroids: np.ndarray, probes: int, trained_through: int, payload: Payload) -> tuple:
    """A fragment's computed rows homed: their ``probes`` nearest clusters (the first: home; -1
    for rows not computed), and (rows added since training, their summed distance to home)."""
    ids, vecs, status = payload
    x, inv = iv.as_unit(vecs)
    near, best = iv.nearest(x * inv[:, None], centroids, probes)
    near[status != COMPUTED] = -1
    since = (status == COMPUTED) & (ids > trained_through)
    return near, np.array([float(since.sum()), float((1.0 - best[since]).sum())])


def gather(n: int, *args) -> list[np.ndarray]:
    """The computed new rows of ``n`` fragments (their payloads, then their probes): (ids, int8
    vectors, probes, 1 / norms), by id. One object handed to every group's task."""
    payloads, homes = args[:n], args[n:2 * n]
    ids = np.concatenate([p[0] for p in payloads]) if n else np.zeros(0, np.int64)
    vecs = np.concatenate([p[1] for p in payloads]) if n else np.zeros((0, DIM), np.int8)
    near = np.concatenate(homes) if n else np.zeros((0, 1), np.int64)
    keep = near[:, 0] >= 0 if len(near) else np.zeros(0, bool)
    ids, vecs, near = ids[keep], vecs[keep], near[keep]
    order = np.argsort(ids, kind="stable")
    vecs = vecs[order]
    return [ids[order], vecs, near[order], iv.inv_norms(vecs)]  # a list: one result, not four


# ---------------------------------------------------------------------------- comparing

def best_earlier(new_ids: np.ndarray, x: np.ndarray, xi: np.ndarray, cand_ids: np.ndarray,
                 yt: np.ndarray, yi: np.ndarray, allowed: np.ndarray | None = None
                 ) -> tuple[np.ndarray, np.ndarray, int]:
    """For each new row (ids ascending; ``x`` int8 vectors (rows, 384), ``xi`` 1 / their norms),
    its best cosine with a candidate of smaller id (``cand_ids`` ascending, ``yt`` their int8
    vectors by dimension (384, rows), ``yi`` 1 / their norms; ``allowed``: a (rows, candidates)
    mask of the pairs to compare, default all) and that candidate's position (-1 and -inf when
    there is none); ties go to the smallest id. Returns also the pairs compared."""
    n = len(new_ids)
    best = np.full(n, -np.inf, np.float32)
    best_at = np.full(n, -1, np.int64)
    if n == 0 or len(cand_ids) == 0:
        return best, best_at, 0
    pairs = 0
    for clo in range(0, len(cand_ids), OLD_BLOCK):
        c_ids = cand_ids[clo:clo + OLD_BLOCK]
        yb, yib = yt[:, clo:clo + OLD_BLOCK], yi[clo:clo + OLD_BLOCK]
        for lo in range(0, n, NEW_BLOCK):
            ids = new_ids[lo:lo + NEW_BLOCK]
            if c_ids[0] >= ids[-1]:
                continue
            s = cosines(x[lo:lo + NEW_BLOCK], xi[lo:lo + NEW_BLOCK], yb, yib)
            if c_ids[-1] < ids[0] and allowed is None:  # every candidate is earlier (stored rows)
                pairs += s.size
            else:
                later = c_ids[None, :] >= ids[:, None]
                if allowed is not None:
                    later |= ~allowed[lo:lo + NEW_BLOCK, clo:clo + OLD_BLOCK]
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


def _best(qid: np.ndarray, cos: np.ndarray, bid: np.ndarray, brep: np.ndarray) -> tuple:
    """One row per new id: its highest cosine, ties to the smallest matched id."""
    if not len(qid):
        return qid, cos, bid, brep
    order = np.lexsort((bid, -cos.astype(np.float64), qid))
    qid, cos, bid, brep = qid[order], cos[order], bid[order], brep[order]
    first = np.r_[True, qid[1:] != qid[:-1]]
    return qid[first], cos[first], bid[first], brep[first]


def compare_group(store: vf.Store, state: dict, lo: int, hi: int, batch: tuple) -> tuple:
    """One group of clusters ``[lo, hi)``: every new row probing one of them against the earlier
    rows homed there: the stored rows, read from the store here, a cluster at a time, and the
    new rows (in one product for the group when it is small, else a cluster at a time: the same
    pairs). Returns (new id, best cosine, its id, its representative when stored else NONE) and
    (stored rows read, pairs compared)."""
    ids, vecs, near, xi = batch
    in_group = (near >= lo) & (near < hi)
    queries = np.flatnonzero(in_group.any(axis=1))
    best = np.full(len(queries), -np.inf, np.float32)
    bid = np.full(len(queries), NONE, np.int64)
    brep = np.full(len(queries), NONE, np.int64)
    at_query = np.full(len(ids), -1, np.int64)
    at_query[queries] = np.arange(len(queries))
    read = pairs = 0

    def merge(rows: np.ndarray, v: np.ndarray, vid: np.ndarray, vrep: np.ndarray) -> None:
        k = at_query[rows]
        b, i, r = best[k], bid[k], brep[k]
        before = i.copy()
        merge_best(b, i, v, vid)
        took = i != before
        r[took] = vrep[took]
        best[k], bid[k], brep[k] = b, i, r

    rows, probe = np.nonzero(in_group)  # (row, cluster) pairs, by cluster then row
    probed = near[rows, probe]
    order = np.argsort(probed, kind="stable")
    rows, probed = rows[order], probed[order]
    starts = np.flatnonzero(np.r_[True, probed[1:] != probed[:-1]])
    clusters = probed[starts].tolist()
    tails = store.tails(state, clusters)  # the small slices of recent runs: each file read once
    for c, q in zip(clusters, np.split(rows, starts[1:])):
        qids, qvecs, qxi = ids[q], vecs[q], xi[q]
        for seg in store.cluster(state, c, tails):  # stored rows: all earlier than the new ones
            read += len(seg.ids)
            v, at, p = best_earlier(qids, qvecs, qxi, seg.ids, seg.vt, seg.inv)
            pairs += p
            ok = at >= 0
            merge(q, v, np.where(ok, seg.ids[np.maximum(at, 0)], NONE),
                  np.where(ok, seg.reps[np.maximum(at, 0)], NONE))
    home = near[:, 0]
    cand = np.flatnonzero((home >= lo) & (home < hi))  # new rows homed in the group
    if len(cand) and len(queries) * len(cand) <= NEW_PAIRS:
        allowed = (near[queries][:, :, None] == home[cand][None, None, :]).any(axis=1)
        parts = [(queries, allowed, cand)]
    else:
        parts = [(np.flatnonzero((near == c).any(axis=1)), None, cand[home[cand] == c])
                 for c in np.unique(home[cand]).tolist()]
    for q, allowed, homed in parts:
        v, at, p = best_earlier(ids[q], vecs[q], xi[q], ids[homed], vecs[homed].T, xi[homed],
                                   allowed)
        pairs += p
        merge(q, v, np.where(at >= 0, ids[homed][np.maximum(at, 0)], NONE),
              np.full(len(q), NONE, np.int64))
    return (ids[queries], best, bid, brep), np.array([read, pairs], np.int64)


@dataclass(frozen=True)
class Resolved:
    """Every computed new row, in id order: representative, cosine, flag, and whether it was
    flagged against a stored row (an earlier run's)."""

    ids: np.ndarray
    rep: np.ndarray
    cos: np.ndarray
    dup: np.ndarray
    old: np.ndarray


def resolve(threshold: float, *results) -> Resolved:
    """The compared groups' best matches per new row, resolved in id order: a flagged row takes
    its nearest earlier row's representative."""
    qid, cos, bid, brep = _best(*(np.concatenate(x) for x in zip(*results))) if results else \
        (np.zeros(0, np.int64), np.zeros(0, np.float32), np.zeros(0, np.int64),
         np.zeros(0, np.int64))
    rep = qid.copy()
    dup = cos >= threshold
    old = dup & (brep != NONE)
    rep[old] = brep[old]
    for k in np.flatnonzero(dup & ~old).tolist():  # in id order: an earlier new rep is final
        rep[k] = rep[np.searchsorted(qid, bid[k])]
    cos = np.where(np.isfinite(cos), cos, 0.0).astype(np.float32)
    return Resolved(qid, rep, cos, dup, old)


def tally(resolved: Resolved) -> np.ndarray:
    return np.array([int(resolved.dup.sum()), int(resolved.old.sum())], np.int64)


def local_groups(state: dict, homes: list[np.ndarray]) -> int:
    """How many groups a local run compares in: its progress steps, one per
    ``PAIRS_PER_GROUP`` pairs it will compare (up to ``LOCAL_GROUPS``), so a small increment
    is one step and pays the per-step costs (reads of the run files, one product of its new
    rows) once."""
    k = int(state["clusters"])
    stored = np.zeros(k)
    for c, entries in state["segments"].items():
        stored[int(c)] = sum(int(e[1]) for e in entries)
    near = np.concatenate(homes) if homes else np.zeros((0, 1), np.int64)
    probes = near[near >= 0]
    work = float(np.bincount(probes, minlength=k)[:k] @ stored) + \
        len(near) * len(probes) / (2 * k)  # new rows against new rows of their probes
    return int(min(LOCAL_GROUPS, max(1, np.ceil(work / PAIRS_PER_GROUP))))


def cut(k: int, groups: int) -> list[tuple[int, int]]:
    """Clusters ``[0, k)`` in ``groups`` contiguous ranges."""
    g = max(1, min(groups, k))
    bounds = np.linspace(0, k, g + 1).round().astype(int)
    return [(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:]) if b > a]


def compare_batch(ids: np.ndarray, unit: np.ndarray, cluster: np.ndarray,
                  threshold: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One batch of rows (``ids`` ascending), each against the earlier rows of its cluster, as
    a run compares them (int8 vectors, exact cosines): (flag, representative, cosine). For
    benchmarks and tests."""
    q = iv.quantize(unit)
    xi = iv.inv_norms(q)
    results = []
    for c in np.unique(cluster):
        sel = np.flatnonzero(cluster == c)
        best, at, _ = best_earlier(ids[sel], q[sel], xi[sel], ids[sel], q[sel].T, xi[sel])
        bid = np.where(at >= 0, ids[sel][np.maximum(at, 0)], NONE)
        results.append((ids[sel], best, bid, np.full(len(sel), NONE)))
    r = resolve(threshold, *results)
    order = np.searchsorted(r.ids, ids)
    return r.dup[order], r.rep[order], r.cos[order]


# ---------------------------------------------------------------------------- a run's tasks

@dataclass
class NewRows:
    """The new fragments' rows as read: their payloads (values, or references under Ray) and
    the counts of their rows."""

    payloads: dict  # fragment id -> Payload (or its reference)
    computed: int  # rows with a vector, compared
    not_computed: int  # rows without chunks
    other_languages: int  # rows in a language not compared
    last_id: int  # the largest new id (-1: none)


def read_fragments(tasks: executors.Tasks, scan: Scan, fragment_ids: list[int]) -> NewRows:
    """``read_new`` for each new fragment, as tasks."""
    out = {f: tasks(read_new, scan, f, returns=2) for f in fragment_ids}
    spans = dict(zip(fragment_ids, tasks.get([o[0] for o in out.values()])))
    return NewRows({f: o[1] for f, o in out.items()},
                   int(sum(s[3] for s in spans.values())),
                   int(sum(s[4] for s in spans.values())),
                   int(sum(s[5] for s in spans.values())),
                   max((int(s[1]) for s in spans.values() if s[2]), default=-1))


def home(tasks: executors.Tasks, store: vf.Store, state: dict, probes: int,
         payloads: dict) -> tuple[dict, np.ndarray]:
    """Each new fragment's rows homed in ``state``'s clusters (``assign``, as tasks): their
    probes per fragment (values or references) and the drift (rows added since the clusters
    were trained, their summed distance to home)."""
    c_ref = tasks.put(store.centroids(state))
    assigned = {f: tasks(assign, c_ref, probes, int(state["trained_through"]), p, returns=2)
                for f, p in payloads.items()}
    drift = np.sum(tasks.get([a[1] for a in assigned.values()]) or [np.zeros(2)], axis=0)
    return {f: a[0] for f, a in assigned.items()}, drift


def compare_all(tasks: executors.Tasks, store: vf.Store, state_ref, groups: list, batch,
                threshold: float, log) -> tuple[object, np.ndarray, np.ndarray]:
    """``compare_group`` for every group of clusters (Ray tasks, or here one after another),
    then ``resolve``: (the resolved rows, or their reference; (stored rows read, pairs
    compared); (flagged, flagged against a stored row))."""
    compared, counts = [], np.zeros(2, np.int64)
    with progress(total=len(groups), desc="semantic_dup: compare", unit="group",
                  log=log) as bar:
        for lo, hi in groups:  # locally each call runs here and now; Ray tasks start
            compared.append(tasks(compare_group, store, state_ref, lo, hi, batch, returns=2))
            if not tasks.ray:
                counts += compared[-1][1]
                bar.update(1)
        for c in compared if tasks.ray else ():
            counts += tasks.get([c[1]])[0]
            bar.update(1)
    resolved = tasks(resolve, threshold, *[c[0] for c in compared])[0]
    return resolved, counts, tasks.get(tasks(tally, resolved))[0]
