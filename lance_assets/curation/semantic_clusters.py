"""The clusters ``semantic_dup`` compares within: k-means over the rows' int8 document vectors.

One cluster per ``rows_per_cluster`` rows, trained (``retrain``) on a hashed sample of the stored
rows and the new ones (the same rows whichever task reads them), then the stored rows homed in
the new centroids: a new generation of the store, switched in as one compare-and-swap
(``semantic_store``), so a value written never changes. The clusters are trained again when the
table doubled since they were, or drifted (the rows added since sit farther from their
centroids than the rows trained on). ``home`` homes a run's new rows, training first when due.
Each function is one task's work, locally or as a Ray task. The rows themselves live in
``embeddings/vector_files`` (the files) and ``semantic_store`` (the state that lists them)::

    state.lance                                   the state in force (a compare-and-swap)
    g<gen>/c<cluster>/<first>-<last>-<rows>.bin   a cluster's rows
    g<gen>/r<cluster>/<first>-<last>-<rows>.bin   a run's new rows of a group of clusters
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from lance_assets.curation import semantic_compare as cmp
from lance_assets.curation import semantic_store as ss
from lance_assets.embeddings import int8_vectors as iv
from lance_assets.embeddings import vector_files as vf
from lance_assets.embeddings.embeddings import DIM
from lance_assets.progress import progress
from lance_assets.table import executor as executors

MAX_CLUSTERS = 1 << 16
TRAIN_ROWS = 100_000  # k-means is trained on a hashed sample of about this many rows ...
TRAIN_ROWS_PER_CLUSTER = 40  # ... or this many per cluster, when more
GROWTH = 2.0  # retrain once the table holds this many times the rows trained on
DRIFT_FACTOR = 1.25  # retrain when rows added since sit this much farther from their centroid
DRIFT_MARGIN = 0.01  # ... plus this (a cosine distance): the training rows may sit on them
DRIFT_MIN_ROWS = 32  # ... and at least this many rows were added since
DRIFT_MIN_SHARE = 0.1  # ... and at least this share of the rows trained on

def hashed_sample(ids: np.ndarray, rate: float, seed: int) -> np.ndarray:
    """The rows kept by a sample of ``rate``: a hash of (id, seed), so the same rows are kept
    whichever task reads them."""
    if rate >= 1:
        return np.ones(len(ids), bool)
    h = (ids.astype(np.uint64) + np.uint64(seed) * np.uint64(0x9E3779B97F4A7C15))
    h = (h ^ (h >> np.uint64(31))) * np.uint64(0xBF58476D1CE4E5B9)
    h ^= h >> np.uint64(29)
    return (h >> np.uint64(11)).astype(np.float64) / float(1 << 53) < rate

def auto_clusters(rows: int, rows_per_cluster: int) -> int:
    return int(min(MAX_CLUSTERS, max(1, -(-rows // rows_per_cluster))))

def sample_group(store: vf.Store, state: dict, lo: int, hi: int, rate: float,
                 seed: int) -> tuple:
    """The training sample among the stored rows of clusters ``[lo, hi)``: (ids, vectors)."""
    ids, vecs = [np.zeros(0, np.int64)], [np.zeros((0, DIM), np.int8)]
    for c in range(lo, hi):
        i, _, v = store.read_cluster(state, c)
        keep = hashed_sample(i, rate, seed)
        ids.append(i[keep])
        vecs.append(v[keep])
    return np.concatenate(ids), np.concatenate(vecs)

def sample_new(rate: float, seed: int, payload: cmp.Payload) -> tuple:
    ids, vecs, status = payload
    keep = (status == cmp.COMPUTED) & hashed_sample(ids, rate, seed)
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

def retrain_reason(state: dict | None, rows_new: int, since_rows: float, since_dist: float,
                   rows_per_cluster: int) -> str:
    """Why the clusters are trained in this run ("" when they are not)."""
    if state is None:
        return "first run"
    if int(state["trained_rows"]) == 0:
        return "store made again"
    total = int(state["rows"]) + rows_new
    if total >= GROWTH * int(state["trained_rows"]) and \
            auto_clusters(total, rows_per_cluster) > int(state["clusters"]):
        return f"grown from {state['trained_rows']} to {total} rows"
    if int(state["clusters"]) == 1 and auto_clusters(total, rows_per_cluster) == 1:
        return ""  # one cluster either way: training again changes nothing
    rows = int(state["since_rows"]) + since_rows
    if rows >= max(DRIFT_MIN_ROWS, DRIFT_MIN_SHARE * int(state["trained_rows"])):
        mean = (float(state["since_distance"]) + since_dist) / rows
        if mean > DRIFT_FACTOR * float(state["trained_distance"]) + DRIFT_MARGIN:
            return (f"drifted: rows added since sit {mean:.3f} from their centroid, the rows "
                    f"trained on {float(state['trained_distance']):.3f}")
    return ""

def retrain(side: ss.SideStore, snap: ss.Snapshot, state: dict | None, payloads: dict,
            rows_new: int, last_new: int, rows_per_cluster: int, seed: int,
            tasks: executors.Tasks, parts: int, reason: str,
            log: Callable[[str], None]) -> ss.Snapshot:
    """New centroids trained on the stored rows and the new ones; the stored rows homed in them
    (a new generation of the store), switched in against ``snap`` (``StoreMoved`` when another
    run switched first: this generation's files are removed). Returns the snapshot in force."""
    store = side.files
    old_rows = 0 if state is None else int(state["rows"])
    total = old_rows + rows_new
    k = auto_clusters(total, rows_per_cluster)
    rate = min(1.0, max(TRAIN_ROWS, TRAIN_ROWS_PER_CLUSTER * k) / max(total, 1))
    pieces = [tasks(sample_new, rate, seed, p, returns=2) for p in payloads.values()]
    state_ref = tasks.put(state)
    if state is not None:
        pieces += [tasks(sample_group, store, state_ref, lo, hi, rate, seed, returns=2)
                   for lo, hi in cmp.cut(int(state["clusters"]), parts)]
    ids = np.concatenate(tasks.get([p[0] for p in pieces]) or [np.zeros(0, np.int64)])
    vecs = np.concatenate(tasks.get([p[1] for p in pieces]) or [np.zeros((0, DIM), np.int8)])
    order = np.argsort(ids, kind="stable")
    x, inv = iv.as_unit(vecs[order])
    x *= inv[:, None]
    if not len(x):
        x = np.zeros((1, DIM), np.float32)
        x[0, 0] = 1.0
    centroids = iv.spherical_kmeans(x, k, seed)
    distance = float(np.mean(1.0 - iv.nearest(x, centroids)[1]))
    gen = ss.new_generation()
    store.save_centroids(gen, centroids)
    k = len(centroids)
    segments: dict = {}
    if state is not None and old_rows:
        new_groups = cmp.cut(k, parts)
        starts = np.array([lo for lo, _ in new_groups[1:]], np.int64)
        c_ref = tasks.put(centroids)
        rehomed = [tasks(rehome_group, store, state_ref, lo, hi, c_ref, starts,
                         returns=len(new_groups)) for lo, hi in cmp.cut(int(state["clusters"]), parts)]
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


@dataclass
class Homed:
    """A run's new rows homed: the store's snapshot in force, each fragment's probes (values
    or references), the drift, and why the clusters were trained now ("" when not)."""

    snap: ss.Snapshot
    homes: dict
    drift: np.ndarray
    retrained: str


def home(tasks: executors.Tasks, side: ss.SideStore, snap: ss.Snapshot, state: dict | None,
         rows: cmp.NewRows, probes: int, rows_per_cluster: int, seed: int, parts: int,
         log: Callable[[str], None]) -> Homed:
    """The new rows homed in the clusters in force, after training them again when the table
    grew or drifted (or has none yet)."""
    homes, drift = {}, np.zeros(2)
    if state is not None:
        homes, drift = cmp.home(tasks, side.files, state, probes, rows.payloads)
    reason = retrain_reason(state, rows.computed, float(drift[0]), float(drift[1]),
                            rows_per_cluster)
    if reason:
        snap = retrain(side, snap, state, rows.payloads, rows.computed, rows.last_id,
                       rows_per_cluster, seed, tasks, parts, reason, log)
        homes, drift = cmp.home(tasks, side.files, snap.state, probes, rows.payloads)
    return Homed(snap, homes, drift, reason)
