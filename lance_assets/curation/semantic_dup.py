"""Semantic duplicates from the table's own embeddings (SemDeDup, Abbas et al. 2023): the
``semantic_cluster``, ``semantic_rep``, ``semantic_cos``, ``semantic_dup`` and ``semantic_vector``
columns. MinHash (``near_dup``) finds copies that share word 5-grams; this finds copies that say
the same in other words.

A row's vector is the normalised mean of its ``chunk_embeddings``, kept as int8
(``semantic_vector``: cosines on it are exact, so every executor computes the same bits). Rows
are clustered by k-means (one cluster per ``rows_per_cluster`` rows; trained again when the
table doubles or drifts, never changing a value written) and a row is flagged when an earlier
row (smaller ``id``) of its ``probes`` nearest clusters has cosine ``>= threshold`` with it; its
``semantic_rep`` is then that row's representative. The default threshold (0.94) was chosen on
3,500 real files with planted rewordings (docs/benchmarks.md). Rows whose ``lang`` is outside
``languages`` are not compared (``semantic_dup`` false, the rest null): the model is English.

The clusters and the stored rows' vectors are the side store (``semantic_store``: its state in a
side Lance dataset, checked against the columns on every run). No process holds the corpus: the
steps are tasks (Ray tasks under ``executor: ray``, the same functions locally): read each new
fragment's vectors, home them, compare per group of clusters (reading only those clusters),
resolve representatives in id order, write per fragment, then append the committed rows to the
store. Incremental on one pinned version: values written never change (but ``kept.elect`` after
deletes); settings that differ from the stored ones on written columns are refused. Any number
of runs may run at once (each switch of the store is a compare-and-swap: the loser rebases); a
run killed anywhere leaves rows the next run's check adds from the columns.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from dataclasses import fields as dataclass_fields
from functools import lru_cache
from typing import Any

import lance
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from lance_assets import keys
from lance_assets.curation import semantic_clusters as sc
from lance_assets.curation import semantic_store as ss
from lance_assets.curation.kept import elect
from lance_assets.embeddings import int8_vectors as iv
from lance_assets.embeddings import vector_files as vf
from lance_assets.embeddings.embeddings import DIM
from lance_assets.progress import progress
from lance_assets.table import Table, get_json_config
from lance_assets.table import executor as executors
from lance_assets.table.columns import (
    ColumnWriteReport,
    fragments_missing,
    rows_still_live,
)
from lance_assets.table.producer import ColumnProducer, Json, Run, Step, produce, setting

SEMANTIC_CLUSTER = pa.field(keys.SEMANTIC_CLUSTER, pa.int64())
SEMANTIC_REP = pa.field(keys.SEMANTIC_REP, pa.int64())
SEMANTIC_COS = pa.field(keys.SEMANTIC_COS, pa.float32())
SEMANTIC_DUP = pa.field(keys.SEMANTIC_DUP, pa.bool_())
SEMANTIC_VECTOR = pa.field(keys.SEMANTIC_VECTOR, pa.list_(pa.int8(), DIM))
FIELDS = [SEMANTIC_CLUSTER, SEMANTIC_REP, SEMANTIC_COS, SEMANTIC_DUP, SEMANTIC_VECTOR]
COLUMNS = [f.name for f in FIELDS]
DESCRIPTIONS = {
    SEMANTIC_CLUSTER.name: "The k-means cluster (of `semantic_vector`) the row was homed in when "
                           "written; null when the row was not compared (no chunks, or a "
                           "language outside the setting `languages`).",
    SEMANTIC_REP.name: "Id of the kept representative of the row's semantic-duplicate group "
                       "(its own id when it is kept).",
    SEMANTIC_COS.name: "The row's highest cosine with an earlier row of its probed clusters "
                       "(0 when none): flagged at >= threshold.",
    SEMANTIC_DUP.name: "True when an earlier row (smaller id) of its probed clusters is within "
                       "cosine >= threshold: a semantic duplicate, dropped by `NOT semantic_dup`.",
    SEMANTIC_VECTOR.name: "The document vector: the normalised mean of `chunk_embeddings`, "
                          "scaled to +-127 and rounded to int8 (cosine = dot / norms).",
}
MAX_CLUSTERS = 1 << 16
TRAIN_ROWS = 100_000  # k-means is trained on a hashed sample of about this many rows ...
TRAIN_ROWS_PER_CLUSTER = 40  # ... or this many per cluster, when more
GROWTH = 2.0  # retrain once the table holds this many times the rows trained on
DRIFT_FACTOR = 1.25  # retrain when rows added since sit this much farther from their centroid
DRIFT_MARGIN = 0.01  # ... plus this (a cosine distance): the training rows may sit on them
DRIFT_MIN_ROWS = 32  # ... and at least this many rows were added since
DRIFT_MIN_SHARE = 0.1  # ... and at least this share of the rows trained on
VECTOR = "int8 of the normalised mean of chunk_embeddings"
LOCAL_GROUPS = 16  # groups of clusters in a local run, at most (its progress steps; no effect
PAIRS_PER_GROUP = 2e9  # on values): one per this many pairs to compare (a few seconds each)


class SettingsMismatchError(ValueError):
    pass


class MissingChunkEmbeddingsError(RuntimeError):
    pass


class MissingLanguageError(RuntimeError):
    pass


@dataclass(frozen=True)
class SemanticDupSettings:
    threshold: float = setting(
        0.94, "A row is a semantic duplicate when an earlier row of its probed clusters has "
        "cosine >= this with it (`semantic_vector`: the normalised mean of `chunk_embeddings`). "
        "Chosen on 3,500 real files with planted rewordings (docs/benchmarks.md): 0.94 flags "
        "0.94% of the distinct English files and 92.5% of the rewordings MinHash misses; 0.88 "
        "flags 5.3% of the distinct files. Lower it for heavier rewordings (or use a rule on "
        "`semantic_cos`).")
    rows_per_cluster: int = setting(
        5000, "k-means clusters: one per this many rows (retrained as the table grows). Fewer "
        "rows per cluster: less work per new row, more copies split from their original.")
    probes: int = setting(
        3, "A new row is compared with the rows of its this many nearest clusters (multi-probe): "
        "a copy and its original on two sides of a boundary still meet.")
    languages: list[str] = setting(
        default_factory=lambda: ["en"], help="Rows whose detected `lang` is one of these are "
        "compared; the others are never flagged (semantic_dup false, the other columns null; "
        "counted as other_languages): the "
        "embedding model (all-MiniLM-L6-v2) is English. [] compares every row (tables without "
        "`lang`, or a multilingual model).")
    seed: int = setting(0, "Seed of the k-means initialisation and of its training sample.")

    def __post_init__(self) -> None:
        if not 0.0 < self.threshold <= 1.0:
            raise ValueError(f"threshold={self.threshold}: a cosine in (0, 1], e.g. 0.9")
        if not 1 <= self.rows_per_cluster:
            raise ValueError(f"rows_per_cluster={self.rows_per_cluster}: at least 1, e.g. 5000")
        if not 1 <= self.probes <= 64:
            raise ValueError(f"probes={self.probes}: 1 to 64, e.g. 3")

    def to_dict(self) -> dict:
        out = asdict(self)
        out["languages"] = sorted(set(self.languages))
        return out


# ---------------------------------------------------------------------------- document vectors

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


quantize = iv.quantize


def auto_clusters(rows: int, rows_per_cluster: int) -> int:
    return int(min(MAX_CLUSTERS, max(1, -(-rows // rows_per_cluster))))


# ---------------------------------------------------------------------------- the tasks

COMPUTED, NO_CHUNKS, OTHER_LANGUAGE = 0, 1, 2


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


def _best(qid: np.ndarray, cos: np.ndarray, bid: np.ndarray, brep: np.ndarray) -> tuple:
    """One row per new id: its highest cosine, ties to the smallest matched id."""
    if not len(qid):
        return qid, cos, bid, brep
    order = np.lexsort((bid, -cos.astype(np.float64), qid))
    qid, cos, bid, brep = qid[order], cos[order], bid[order], brep[order]
    first = np.r_[True, qid[1:] != qid[:-1]]
    return qid[first], cos[first], bid[first], brep[first]


NEW_PAIRS = 1 << 22  # new rows against new rows of a group in one product up to this many pairs


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
    bid = np.full(len(queries), sc.NONE, np.int64)
    brep = np.full(len(queries), sc.NONE, np.int64)
    at_query = np.full(len(ids), -1, np.int64)
    at_query[queries] = np.arange(len(queries))
    read = pairs = 0

    def merge(rows: np.ndarray, v: np.ndarray, vid: np.ndarray, vrep: np.ndarray) -> None:
        k = at_query[rows]
        b, i, r = best[k], bid[k], brep[k]
        before = i.copy()
        sc.merge_best(b, i, v, vid)
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
            v, at, p = sc.best_earlier(qids, qvecs, qxi, seg.ids, seg.vt, seg.inv)
            pairs += p
            ok = at >= 0
            merge(q, v, np.where(ok, seg.ids[np.maximum(at, 0)], sc.NONE),
                  np.where(ok, seg.reps[np.maximum(at, 0)], sc.NONE))
    home = near[:, 0]
    cand = np.flatnonzero((home >= lo) & (home < hi))  # new rows homed in the group
    if len(cand) and len(queries) * len(cand) <= NEW_PAIRS:
        allowed = (near[queries][:, :, None] == home[cand][None, None, :]).any(axis=1)
        parts = [(queries, allowed, cand)]
    else:
        parts = [(np.flatnonzero((near == c).any(axis=1)), None, cand[home[cand] == c])
                 for c in np.unique(home[cand]).tolist()]
    for q, allowed, homed in parts:
        v, at, p = sc.best_earlier(ids[q], vecs[q], xi[q], ids[homed], vecs[homed].T, xi[homed],
                                   allowed)
        pairs += p
        merge(q, v, np.where(at >= 0, ids[homed][np.maximum(at, 0)], sc.NONE),
              np.full(len(q), sc.NONE, np.int64))
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
    old = dup & (brep != sc.NONE)
    rep[old] = brep[old]
    for k in np.flatnonzero(dup & ~old).tolist():  # in id order: an earlier new rep is final
        rep[k] = rep[np.searchsorted(qid, bid[k])]
    cos = np.where(np.isfinite(cos), cos, 0.0).astype(np.float32)
    return Resolved(qid, rep, cos, dup, old)


def store_group(store: vf.Store, state: dict, lo: int, hi: int, batch: tuple,
                resolved: Resolved) -> tuple:
    """One group of clusters: the new rows homed there appended to the store. Returns the
    clusters' segment lists and (rows, flagged) appended."""
    ids, vecs, near, _ = batch
    homes = near[:, 0] if len(near) else np.zeros(0, np.int64)
    sel = (homes >= lo) & (homes < hi)
    at = np.searchsorted(resolved.ids, ids[sel])
    out = store.append_run(state["generation"], state["segments"], homes[sel], ids[sel],
                           resolved.rep[at], vecs[sel])
    return out, np.array([int(sel.sum()), int(resolved.dup[at].sum())], np.int64)


def sample_group(store: vf.Store, state: dict, lo: int, hi: int, rate: float,
                 seed: int) -> tuple:
    """The training sample among the stored rows of clusters ``[lo, hi)``: (ids, vectors)."""
    ids, vecs = [np.zeros(0, np.int64)], [np.zeros((0, DIM), np.int8)]
    for c in range(lo, hi):
        i, _, v = store.read_cluster(state, c)
        keep = sc.hashed_sample(i, rate, seed)
        ids.append(i[keep])
        vecs.append(v[keep])
    return np.concatenate(ids), np.concatenate(vecs)


def sample_new(rate: float, seed: int, payload: Payload) -> tuple:
    ids, vecs, status = payload
    keep = (status == COMPUTED) & sc.hashed_sample(ids, rate, seed)
    return ids[keep], vecs[keep]


def rehome_group(store: vf.Store, state: dict, lo: int, hi: int, centroids: np.ndarray,
                 starts: np.ndarray) -> tuple:
    """Stored rows of old clusters ``[lo, hi)`` homed in the new ``centroids``, split by the
    group of their new cluster (``starts``: each group's first cluster but the first's)."""
    parts = [store.read_cluster(state, c) for c in range(lo, hi)]
    ids = np.concatenate([p[0] for p in parts] or [np.zeros(0, np.int64)])
    reps = np.concatenate([p[1] for p in parts] or [np.zeros(0, np.int64)])
    vecs = np.concatenate([p[2] for p in parts] or [np.zeros((0, DIM), np.int8)])
    x, inv = iv.as_unit(vecs)
    home = iv.nearest(x * inv[:, None], centroids)[0][:, 0] if len(ids) else \
        np.zeros(0, np.int64)
    group = np.searchsorted(starts, home, side="right")
    return tuple((ids[group == g], reps[group == g], vecs[group == g], home[group == g])
                 for g in range(len(starts) + 1))


def write_group(store: vf.Store, generation: int, *pieces) -> dict:
    """A group of new clusters: its rehomed rows written, one segment per cluster."""
    ids, reps, vecs, home = (np.concatenate(x) for x in zip(*pieces))
    out = {}
    for c in np.unique(home).tolist():
        sel = home == c
        out[str(c)] = [store.write_segment(generation, c, ids[sel], reps[sel], vecs[sel])]
    return out


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


# ---------------------------------------------------------------------------- the write

@dataclass
class SemanticDupStats:
    documents: int = 0
    flagged: int = 0
    flagged_against_earlier_runs: int = 0
    not_computed: int = 0
    other_languages: int = 0
    earlier_rows: int = 0
    clusters: int = 0
    trained: bool = False
    retrained: str = ""  # why the clusters were trained in this run
    caught_up: int = 0  # rows written but missing from the store (a killed or raced run's)
    removed_from_store: int = 0  # rows the store held that were deleted (or held twice)
    side_rows_read: int = 0
    pairs_compared: int = 0
    groups: int = 1
    compare_s: float = 0.0
    read_s: float = 0.0
    train_s: float = 0.0
    kept_after_deletes: int = 0  # unflagged: their group's representative was deleted


@dataclass(frozen=True)
class SemanticColumns:
    """The write: a fragment's rows looked up in the resolved new rows. Small and picklable
    (references under Ray), so a Ray task can run it."""

    first_cluster: int
    payloads: dict  # fragment id -> Payload (or its reference)
    homes: dict  # fragment id -> probes (or its reference)
    resolved: object  # resolve()'s result (or its reference)
    in_order = True

    def bind(self, fragment_id: int) -> SemanticColumns:
        keep = {fragment_id} & set(self.payloads)
        return SemanticColumns(self.first_cluster, {f: self.payloads[f] for f in keep},
                               {f: self.homes[f] for f in keep}, self.resolved)

    def __call__(self, frag) -> Iterator[pa.RecordBatch]:
        if frag.fragment_id not in self.payloads:
            raise RuntimeError(f"fragment {frag.fragment_id} was not planned by this "
                               "semantic_dup run (the table changed meanwhile); run again")
        ids, vecs, status = executors.value_of(self.payloads[frag.fragment_id])
        near = executors.value_of(self.homes[frag.fragment_id])
        r = executors.value_of(self.resolved)
        qid, rep, cos, dup = r.ids, r.rep, r.cos, r.dup
        at = rows_still_live(frag, ids)  # rows deleted since the plan are dropped
        if at is not None:
            ids, vecs, status, near = ids[at], vecs[at], status[at], near[at]
        n = len(ids)
        ok = status == COMPUTED
        pos = np.minimum(np.searchsorted(qid, ids), max(len(qid) - 1, 0))
        if ok.any() and not np.array_equal(qid[pos[ok]], ids[ok]):
            raise RuntimeError(f"fragment {frag.fragment_id}: rows missing from the comparison")
        z = np.zeros(n)
        cluster = np.where(ok, near[:, 0] + self.first_cluster, 0) if n else z
        vec = pa.FixedSizeListArray.from_arrays(pa.array(vecs.reshape(-1), pa.int8()), DIM)
        mask = ~ok
        yield pa.RecordBatch.from_arrays(
            [pa.array(cluster, pa.int64(), mask=mask),
             pa.array(np.where(ok, rep[pos] if len(qid) else z, 0), pa.int64(), mask=mask),
             pa.array(np.where(ok, cos[pos] if len(qid) else z, 0), pa.float32(), mask=mask),
             pa.array(np.where(ok, dup[pos] if len(qid) else z, False).astype(bool), pa.bool_(),
                      mask=mask & (status != OTHER_LANGUAGE)),  # not compared: not flagged
             pc.if_else(pa.array(ok), vec, pa.nulls(n, vec.type))],
            schema=pa.schema(FIELDS))


def retrain_reason(state: dict | None, rows_new: int, since_rows: float, since_dist: float,
                   settings: SemanticDupSettings) -> str:
    if state is None:
        return "first run"
    if int(state["trained_rows"]) == 0:
        return "store made again"
    total = int(state["rows"]) + rows_new
    if total >= GROWTH * int(state["trained_rows"]) and \
            auto_clusters(total, settings.rows_per_cluster) > int(state["clusters"]):
        return f"grown from {state['trained_rows']} to {total} rows"
    if int(state["clusters"]) == 1 and auto_clusters(total, settings.rows_per_cluster) == 1:
        return ""  # one cluster either way: training again changes nothing
    rows = int(state["since_rows"]) + since_rows
    if rows >= max(DRIFT_MIN_ROWS, DRIFT_MIN_SHARE * int(state["trained_rows"])):
        mean = (float(state["since_distance"]) + since_dist) / rows
        if mean > DRIFT_FACTOR * float(state["trained_distance"]) + DRIFT_MARGIN:
            return (f"drifted: rows added since sit {mean:.3f} from their centroid, the rows "
                    f"trained on {float(state['trained_distance']):.3f}")
    return ""


def retrain(side: ss.SideStore, snap: ss.Snapshot, state: dict | None, payloads: dict,
            rows_new: int, last_new: int, settings: SemanticDupSettings,
            tasks: executors.Tasks, parts: int, reason: str,
            log: Callable[[str], None]) -> ss.Snapshot:
    """New centroids trained on the stored rows and the new ones; the stored rows homed in them
    (a new generation of the store), switched in against ``snap`` (``StoreMoved`` when another
    run switched first: this generation's files are removed). Returns the snapshot in force."""
    store = side.files
    old_rows = 0 if state is None else int(state["rows"])
    total = old_rows + rows_new
    k = auto_clusters(total, settings.rows_per_cluster)
    rate = min(1.0, max(TRAIN_ROWS, TRAIN_ROWS_PER_CLUSTER * k) / max(total, 1))
    pieces = [tasks(sample_new, rate, settings.seed, p, returns=2) for p in payloads.values()]
    state_ref = tasks.put(state)
    if state is not None:
        pieces += [tasks(sample_group, store, state_ref, lo, hi, rate, settings.seed, returns=2)
                   for lo, hi in cut(int(state["clusters"]), parts)]
    ids = np.concatenate(tasks.get([p[0] for p in pieces]) or [np.zeros(0, np.int64)])
    vecs = np.concatenate(tasks.get([p[1] for p in pieces]) or [np.zeros((0, DIM), np.int8)])
    order = np.argsort(ids, kind="stable")
    x, inv = iv.as_unit(vecs[order])
    x *= inv[:, None]
    if not len(x):
        x = np.zeros((1, DIM), np.float32)
        x[0, 0] = 1.0
    centroids = iv.spherical_kmeans(x, k, settings.seed)
    distance = float(np.mean(1.0 - iv.nearest(x, centroids)[1]))
    gen = ss.new_generation()
    store.save_centroids(gen, centroids)
    k = len(centroids)
    segments: dict = {}
    if state is not None and old_rows:
        new_groups = cut(k, parts)
        starts = np.array([lo for lo, _ in new_groups[1:]], np.int64)
        c_ref = tasks.put(centroids)
        rehomed = [tasks(rehome_group, store, state_ref, lo, hi, c_ref, starts,
                         returns=len(new_groups)) for lo, hi in cut(int(state["clusters"]), parts)]
        with progress(total=len(new_groups), desc="semantic_dup: retrain", unit="group",
                      log=log) as bar:
            for g in range(len(new_groups)):
                segments.update(tasks.get(tasks(write_group, store, gen,
                                                *[r[g] for r in rehomed]))[0])
                bar.update(1)
    first = 0 if state is None else int(state["first_cluster"]) + int(state["clusters"])
    new_state = {"format": vf.FORMAT, "generation": gen, "first_cluster": first, "clusters": k,
                 "segments": segments, "rows": old_rows,
                 "digest": ss.id_digest(np.zeros(0)) if state is None else state["digest"],
                 "flagged": 0 if state is None else int(state.get("flagged", 0)),
                 "table_sig": None if state is None else state.get("table_sig"),
                 "trained_rows": total, "trained_through": int(last_new),
                 "trained_distance": distance, "since_rows": 0, "since_distance": 0.0,
                 "reason": reason}
    try:
        done = side.switch(snap, new_state)
    except ss.StoreMoved:
        side.remove_generation(gen)
        raise
    if snap.state is not None and int(snap.state["generation"]) != gen:
        side.remove_generation(int(snap.state["generation"]))
    side.remove_orphans(new_state)
    log(f"semantic_dup: {k} cluster(s) trained on {len(x)} of {total} rows ({reason})")
    return done


@dataclass(frozen=True)
class SemanticDupRun(SemanticDupSettings):
    """The asset's settings, and how many groups of clusters (library callers and tests)."""

    partitions: int = 0


def base_settings(settings: SemanticDupSettings) -> SemanticDupSettings:
    """The settings the columns depend on (recorded in the table's config), without the run's."""
    if type(settings) is SemanticDupSettings:
        return settings
    return SemanticDupSettings(**{f.name: getattr(settings, f.name)
                                  for f in dataclass_fields(SemanticDupSettings)})


@dataclass
class Appending:
    """What the store append after the write needs from the comparison."""

    tasks: Any
    side: ss.SideStore
    snap: ss.Snapshot
    state_ref: Any
    probes: int
    groups: list
    frags: list
    entries: dict  # the pinned version's fragments holding the columns (semantic_store)
    deletions: dict  # fragment -> its deletion file at the pinned version
    payloads: dict
    homes: dict
    resolved: Any
    drift: np.ndarray
    batch: Any


@dataclass
class Comparison:
    """The step's state: the write (``compute``), the numbers, the fragments that wait for
    their inputs, and the store append that follows the commit (None: nothing new)."""

    compute: SemanticColumns
    stats: SemanticDupStats
    lacking: set = field(default_factory=set)
    appending: Appending | None = None


MAX_RESTARTS = 20  # comparisons started again because another run switched the store


def compare(run: Run) -> Comparison:
    """The step's state, on the pinned version: the settings checked and recorded, the store
    checked against the table (and repaired), the new rows read, homed (the clusters trained
    again when the table grew or drifted) and compared with the earlier rows of their probed
    clusters. Started again when another run switches the store meanwhile."""
    side = ss.side_store(run.table)
    for n in range(1, MAX_RESTARTS + 1):
        read = side.read()
        try:
            return _compare(run)
        except ss.StoreMoved:
            run.log("semantic_dup: another run switched the side store; comparing again")
        except Exception as exc:
            cause = _store_failure(exc, side)
            if cause is None or n == MAX_RESTARTS:
                _raise_task_failure(run.table, exc)
                raise
            now = side.read()
            if now.version == read.version:  # nobody moved it: a file is lost, make it again
                run.log(f"semantic_dup: the side store cannot be read ({cause}); making it "
                        "again from the table's columns")
                try:
                    side.switch(now, None)
                except ss.StoreMoved:
                    pass
    raise RuntimeError(f"semantic_dup of {run.table.uri}: the side store kept changing under "
                       f"{MAX_RESTARTS} comparisons (other runs); run again")


def _store_failure(exc: BaseException, side: ss.SideStore) -> str | None:
    """A store file missing or short (read while another run replaced it, or lost): what it
    says; None for any other error."""
    cause = getattr(exc, "cause", None) if type(exc).__module__.startswith("ray") else exc
    if isinstance(cause, FileNotFoundError) and side.uri in str(cause):
        return str(cause).splitlines()[0][:200]
    if isinstance(cause, RuntimeError) and "shorter than its" in str(cause):
        return str(cause).splitlines()[0][:200]
    return None


def _compare(run: Run) -> Comparison:
    table, ds, log = run.table, run.pinned, run.log
    settings = base_settings(run.settings)
    where = run.where
    partitions = getattr(run.settings, "partitions", 0)
    parts = executors.resolve_partitions(partitions, where, "semantic_dup partitions") \
        if partitions or where == "ray" else LOCAL_GROUPS
    stats = SemanticDupStats(groups=parts)
    if keys.CHUNK_EMBEDDINGS not in ds.schema.names:
        raise MissingChunkEmbeddingsError(
            f"{table.uri} has no `chunk_embeddings` column: materialize `chunk_embeddings` "
            "first (semantic_dup compares the mean of each row's chunk vectors)")
    if settings.languages and "lang" not in ds.schema.names:
        raise MissingLanguageError(
            f"{table.uri} has no `lang` column, and semantic_dup compares only rows in "
            f"{settings.to_dict()['languages']}: materialize `detected_language` first, or "
            "set languages: [] to compare every row")
    chunking = get_json_config(ds, keys.CHUNK_EMBEDDING_KEY)
    stored = get_json_config(ds, keys.SEMANTIC_DUP_KEY)
    have = all(c in ds.schema.names for c in COLUMNS)
    if not have and any(c in ds.schema.names for c in COLUMNS):
        raise SettingsMismatchError(
            f"{table.uri}: semantic-duplicate columns from an earlier version of semantic_dup "
            f"(without `semantic_vector`); drop them first "
            f"(Table.of(DATA).newest().drop_columns({[c for c in COLUMNS if c in ds.schema.names]})) "
            "to compute them again.")
    todo = fragments_missing(ds, COLUMNS) if have else ds.get_fragments()
    written = have and len(todo) < len(ds.get_fragments())
    wanted = {"settings": settings.to_dict(), "chunking": chunking, "vector": VECTOR}
    if written and (stored is None or "vector" not in stored):
        raise SettingsMismatchError(
            f"{table.uri}: semantic-duplicate columns are written but the table's config has "
            f"no record of how ({keys.SEMANTIC_DUP_KEY}); drop the columns first "
            f"(Table.of(DATA).newest().drop_columns({COLUMNS})) to compute them again.")
    if written and (stored["settings"] != wanted["settings"] or
                    stored.get("chunking") != chunking):
        raise SettingsMismatchError(
            f"{table.uri}: semantic-duplicate columns were written with "
            f"{stored['settings']} on chunking {stored.get('chunking')}, not "
            f"{wanted['settings']} on {chunking}. Keep the stored settings, or drop the "
            f"columns first (Table.of(DATA).newest().drop_columns({COLUMNS})).")
    if not todo:
        return Comparison(SemanticColumns(0, {}, {}, None), stats)
    inputs = [keys.CHUNK_EMBEDDINGS] + (["lang"] if settings.languages else [])
    lacking = {f.fragment_id for c in inputs for f in fragments_missing(
        ds, [c], among=[f.fragment_id for f in todo])}
    ready = [f.fragment_id for f in todo if f.fragment_id not in lacking]
    if lacking and ready and min(lacking) > max(ready):
        # rows ingested after `chunk_embeddings` (or `detected_language`) ran: they wait,
        # for the next run (a row is compared with every earlier one: none may be skipped)
        log(f"semantic_dup: fragments {sorted(lacking)} have no `chunk_embeddings` or "
            "`lang` yet; they wait for the next run")
        todo = [f for f in todo if f.fragment_id not in lacking]
    elif lacking:
        raise MissingChunkEmbeddingsError(
            f"{table.uri}: fragments {sorted(lacking)} have no `chunk_embeddings` (or `lang`) "
            "yet; materialize `chunk_embeddings` and `detected_language` first, then "
            "semantic_dup")
    if stored != wanted and not written:
        table.set_config(keys.SEMANTIC_DUP_KEY, wanted, log=log)
    if where == "ray":
        executors.ensure_ray(log)
    tasks = executors.Tasks(where == "ray")
    side = ss.side_store(table)
    store = side.files
    t0 = time.perf_counter()
    todo_ids = [f.fragment_id for f in todo]
    snap = side.read()
    if written:
        snap, stats.caught_up, stats.removed_from_store = ss.reconcile(side, ds, snap, log)
        state = snap.state
    else:  # a first run: a store another first run made meanwhile is this table's too
        state = ss.current(side, table, snap)
    stats.earlier_rows = 0 if state is None else int(state["rows"])

    scan = tasks.put(Scan(table, ds.version, tuple(settings.to_dict()["languages"])))
    new_out = {f: tasks(read_new, scan, f, returns=2) for f in todo_ids}
    spans = dict(zip(todo_ids, tasks.get([o[0] for o in new_out.values()])))
    payloads = {f: o[1] for f, o in new_out.items()}
    stats.documents = int(sum(s[3] for s in spans.values()))
    stats.not_computed = int(sum(s[4] for s in spans.values()))
    stats.other_languages = int(sum(s[5] for s in spans.values()))
    last_new = max((int(s[1]) for s in spans.values() if s[2]), default=-1)
    stats.read_s = time.perf_counter() - t0

    t1 = time.perf_counter()
    homes: dict = {}
    drift = np.zeros(2)
    if state is not None:
        c_ref = tasks.put(store.centroids(state))
        assigned = {f: tasks(assign, c_ref, settings.probes, int(state["trained_through"]),
                             p, returns=2) for f, p in payloads.items()}
        homes = {f: a[0] for f, a in assigned.items()}
        drift = np.sum(tasks.get([a[1] for a in assigned.values()]) or [np.zeros(2)], axis=0)
    reason = retrain_reason(state, stats.documents, float(drift[0]), float(drift[1]),
                            settings)
    if reason:
        snap = retrain(side, snap, state, payloads, stats.documents, last_new, settings, tasks,
                       parts, reason, log)
        state = snap.state
        stats.trained, stats.retrained = True, reason
        c_ref = tasks.put(store.centroids(state))
        assigned = {f: tasks(assign, c_ref, settings.probes, int(state["trained_through"]),
                             p, returns=2) for f, p in payloads.items()}
        homes = {f: a[0] for f, a in assigned.items()}
        drift = np.sum(tasks.get([a[1] for a in assigned.values()]) or [np.zeros(2)], axis=0)
    stats.train_s = time.perf_counter() - t1
    stats.clusters = int(state["clusters"])

    t2 = time.perf_counter()
    frags = list(payloads)
    batch = tasks(gather, len(frags), *[payloads[f] for f in frags],
                  *[homes[f] for f in frags])[0]
    state_ref = tasks.put(state)
    if not (partitions or where == "ray"):
        parts = local_groups(state, [executors.value_of(homes[f]) for f in frags])
    groups = cut(stats.clusters, parts)
    stats.groups = len(groups)
    compared, counts = [], np.zeros(2, np.int64)
    with progress(total=len(groups), desc="semantic_dup: compare", unit="group",
                  log=log) as bar:
        for lo, hi in groups:  # locally each call runs here and now; Ray tasks start
            compared.append(tasks(compare_group, store, state_ref, lo, hi, batch,
                                  returns=2))
            if not tasks.ray:
                counts += compared[-1][1]
                bar.update(1)
        for c in compared if tasks.ray else ():
            counts += tasks.get([c[1]])[0]
            bar.update(1)
    stats.side_rows_read, stats.pairs_compared = int(counts[0]), int(counts[1])
    resolved = tasks(resolve, settings.threshold, *[c[0] for c in compared])[0]
    flags = tasks.get(tasks(_tally, resolved))[0]
    stats.flagged, stats.flagged_against_earlier_runs = int(flags[0]), int(flags[1])
    stats.compare_s = time.perf_counter() - t2
    log(f"semantic_dup: {stats.documents} rows against {stats.earlier_rows} earlier ones in "
        f"{stats.clusters} cluster(s), {settings.probes} probed each: {stats.flagged} "
        f"flagged; {stats.other_languages} in other languages, {stats.not_computed} without "
        "chunks")
    return Comparison(SemanticColumns(int(state["first_cluster"]), payloads, homes, resolved),
                      stats, lacking, Appending(
                          tasks, side, snap, state_ref, settings.probes, groups, frags,
                          ss.table_entries(ds), {f.fragment_id: _deletion(f) for f in todo},
                          payloads, homes, resolved, drift, batch))


def append_and_elect(run: Run, comparison: Comparison) -> int:
    """After the write: the committed rows appended to the side store (after the commit, so it
    never holds a row the table does not; a run killed before is caught up by the next), then
    groups whose kept member was deleted keep their smallest live id."""
    if comparison.appending is not None:
        try:
            _append(run, comparison.appending)
        except Exception as exc:
            _raise_task_failure(run.table, exc)
            raise
    comparison.stats.kept_after_deletes = elect(run.table, flag=SEMANTIC_DUP.name,
                                                cluster=SEMANTIC_REP.name,
                                                rows_end=run.rows_end, log=run.log)
    return comparison.stats.kept_after_deletes


def _append(run: Run, a: Appending) -> None:
    """The committed rows appended to the store and switched in. When another run switched it
    since it was read, the append is rebased on the state in force: the rows it already holds
    or that the table no longer has are left out, the rest homed in its clusters."""
    tasks, side, snap, resolved = a.tasks, a.side, a.snap, a.resolved
    report = run.reports[STEP]
    committed = [f for f in a.frags if f in set(report.fragments_written)]
    if committed != a.frags:
        batch = tasks(gather, len(committed), *[a.payloads[f] for f in committed],
                      *[a.homes[f] for f in committed])[0]
    else:
        batch = a.batch
    drift, rebased = a.drift, False
    state, state_ref, groups = snap.state, a.state_ref, a.groups
    for _ in range(MAX_RESTARTS):
        appended = [tasks(store_group, side.files, state_ref, lo, hi, batch, resolved, returns=2)
                    for lo, hi in (groups if tasks.ray else [(0, int(state["clusters"]))])]
        # (a file per group's task under Ray; one file locally)
        segments, added = dict(state["segments"]), np.zeros(2, np.int64)
        for got in tasks.get([out[0] for out in appended]):
            segments.update(got)
        added += np.sum(tasks.get([out[1] for out in appended]) or [np.zeros(2, np.int64)], axis=0)
        ids = executors.value_of(batch)[0]
        after = {**state, "segments": segments, "rows": int(state["rows"]) + int(added[0]),
                 "digest": _digest_plus(state["digest"], ids),
                 "flagged": int(state.get("flagged", 0)) + int(added[1]),
                 "since_rows": int(state["since_rows"]) + int(drift[0]),
                 "since_distance": float(state["since_distance"]) + float(drift[1]),
                 "table_sig": None if rebased else ss.after_commit(
                     run.table.newest(), a.entries, a.deletions, committed)}
        try:
            side.switch(snap, after)
            side.files.remove_replaced(state, after)
            return
        except ss.StoreMoved:
            side.files.remove_replaced(after, state)  # this attempt's files: never in force
        snap = side.read()
        if snap.state is None:
            run.log("semantic_dup: the side store was reset meanwhile (forget); the next run "
                    "makes it again from the table's columns")
            return
        state, rebased = snap.state, True  # the next run checks the rows against the table
        batch, drift = _rebased(run.table, side, state, executors.value_of(batch), a.probes)
        state_ref = tasks.put(state)
        groups = cut(int(state["clusters"]), len(a.groups))
        run.log("semantic_dup: another run switched the side store; appending on its state")
    raise RuntimeError(f"semantic_dup of {run.table.uri}: the side store kept changing under "
                       f"{MAX_RESTARTS} appends (other runs); the next run adds these rows")


def _deletion(frag) -> list | None:
    d = frag.metadata.deletion_file
    return None if d is None else [d.id, d.read_version]


def _digest_plus(digest: str, ids: np.ndarray) -> str:
    """The digest of a multiset of ids with ``ids`` added."""
    total = (int(digest, 16) + int(ss.id_digest(ids), 16)) % (1 << 64)
    return f"{total:016x}"


def _rebased(table: Table, side: ss.SideStore, state: dict, batch: list,
             probes: int) -> tuple[list, np.ndarray]:
    """``batch`` (ids, vectors, probes, 1 / norms) without the rows ``state`` holds or the
    newest table lacks (deleted, forgotten), homed in ``state``'s clusters; and its drift."""
    ids, vecs = batch[0], batch[1]
    if len(ids):
        live = table.newest().to_table(
            columns=["id"], filter=f"id >= {int(ids.min())} AND id <= {int(ids.max())}")
        keep = np.isin(ids, live.column("id").to_numpy()) & ~np.isin(ids, side.ids(state))
        ids, vecs = ids[keep], vecs[keep]
    x, inv = iv.as_unit(vecs)
    near, best = iv.nearest(x * inv[:, None], side.files.centroids(state), probes) \
        if len(ids) else (np.zeros((0, probes), np.int64), np.zeros(0, np.float32))
    since = ids > int(state["trained_through"])
    drift = np.array([float(since.sum()), float((1.0 - best[since]).sum())])
    return [ids, vecs, near, iv.inv_norms(vecs)], drift


def _raise_task_failure(table: Table, exc: BaseException) -> None:
    """A Ray task's failure as one error that names the cause and the fix."""
    cause = getattr(exc, "cause", None)
    if type(exc).__module__.startswith("ray") and isinstance(cause, BaseException):
        raise RuntimeError(f"semantic_dup of {table.uri}: a task failed "
                           f"({type(cause).__name__}: {cause}); run again (committed "
                           "fragments are kept).") from exc


def semantic_dup(table: Table | str, settings: SemanticDupSettings = SemanticDupSettings(),  # noqa: B008 - frozen
                 *, fragments_per_commit: int | None = None, executor: str | None = None,
                 partitions: int = 0, log: Callable[[str], None] = print
                 ) -> tuple[ColumnWriteReport | None, SemanticDupStats]:
    """Write the semantic-duplicate columns for every fragment of one pinned version that lacks
    them, each row against the earlier rows of its probed clusters. ``partitions``: groups of
    clusters, one task each (0: one per CPU of the Ray cluster under ``executor: ray``,
    ``LOCAL_GROUPS`` locally); the columns do not depend on it."""
    done = produce(PRODUCER, table, SemanticDupRun(**asdict(settings), partitions=partitions),
                   executor=executor, fragments_per_commit=fragments_per_commit, log=log,
                   summarize=False)
    return done.write, done.run.states[STEP].stats


def _tally(resolved: Resolved) -> np.ndarray:
    return np.array([int(resolved.dup.sum()), int(resolved.old.sum())], np.int64)


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
        best, at, _ = sc.best_earlier(ids[sel], q[sel], xi[sel], ids[sel], q[sel].T, xi[sel])
        bid = np.where(at >= 0, ids[sel][np.maximum(at, 0)], sc.NONE)
        results.append((ids[sel], best, bid, np.full(len(sel), sc.NONE)))
    r = resolve(threshold, *results)
    order = np.searchsorted(r.ids, ids)
    return r.dup[order], r.rep[order], r.cos[order]


STEP = "semantic_dup"
STEPS = (Step(fields=FIELDS, name=STEP, state=compare,
              compute=lambda settings, state: state.compute,
              waiting=lambda state: state.lacking, after=append_and_elect),)


def summary(run: Run) -> dict:
    stats: SemanticDupStats = run.states[STEP].stats
    state = ss.side_store(run.table).load_state() or {}
    rows, flagged = int(state.get("rows", 0)), int(state.get("flagged", 0))
    return {
        "new_rows_flagged": stats.flagged,
        "new_rows_flagged_against_earlier_runs": stats.flagged_against_earlier_runs,
        "not_computed": stats.not_computed,
        "other_languages": stats.other_languages,
        "semantic_dup_rate": round(flagged / rows, 4) if rows else 0.0,
        "clusters": stats.clusters,
        "clusters_trained_now": stats.trained,
        "retrained": stats.retrained,
        "kept_after_deletes": stats.kept_after_deletes,
        "stored_rows_read": stats.side_rows_read,
        "pairs_compared": stats.pairs_compared,
        "compare_us_per_doc": round(stats.compare_s / stats.documents * 1e6, 1)
        if stats.documents else 0.0,
        "settings": Json(base_settings(run.settings).to_dict()),
    }


PRODUCER = ColumnProducer(
    name="semantic_dup",
    doc="`semantic_cluster`, `semantic_rep`, `semantic_cos`, `semantic_dup` and "
        "`semantic_vector`: semantic duplicates after SemDeDup. Document vectors (the normalised "
        "mean of `chunk_embeddings`, kept as int8) are clustered by k-means (one cluster per "
        "rows_per_cluster rows, retrained as the table grows or drifts; centroids and vectors in "
        "a side store under the data root); a row is flagged when an earlier row of its nearest "
        "clusters has cosine >= threshold with it. Rows outside `languages` (default English) "
        "are not compared. Finds rewordings MinHash misses. New rows are compared against old "
        "ones; old values are never rewritten. Opt-in rule: `NOT semantic_dup`.",
    fields=FIELDS, descriptions=DESCRIPTIONS, steps=STEPS, summary=summary,
    settings=SemanticDupSettings,
    deps=("raw_text", "chunk_embeddings", "detected_language"), kinds=("lance", "numpy"),
    input_errors=(SettingsMismatchError, MissingLanguageError), version="2",
    reads={c: [("chunk_embeddings", keys.CHUNK_EMBEDDINGS), ("detected_language", "lang"),
               ("raw_text", "id")] for c in COLUMNS})
