"""Semantic duplicates from the table's own embeddings: the ``semantic_cluster``,
``semantic_rep``, ``semantic_cos`` and ``semantic_dup`` columns.

After SemDeDup (Abbas et al. 2023; NeMo Curator's ``SemDedup``): documents are embedded,
clustered with k-means, and within a cluster a document is dropped when an earlier one is within
cosine ``threshold`` of it. MinHash (``near_dup``) finds copies that share word 5-grams; this
finds copies that say the same thing in other words (sentences reordered or dropped, words
replaced), which share few 5-grams.

**The document vector** is the normalised mean of the row's ``chunk_embeddings`` (one
all-MiniLM-L6-v2 vector per overlapping chunk covering the whole document), not ``embedding``
(the first 128 word pieces only): on long documents, reworded copies measured a median cosine
of 0.943 (10th percentile 0.817) with first-chunk vectors, 0.963 (0.930) with the chunk mean,
so the mean separates copies from other documents on the same topic far better. A row whose
``chunk_embeddings`` is null or empty gets null in all four columns (counted as
``not_computed``); a fragment lacking ``chunk_embeddings`` altogether is refused with the fix
(materialize ``chunk_embeddings`` first), so no row is written null by mistake.

**Clusters** are spherical k-means (cosine) centroids trained once, on the first run, on that
version's document vectors, and stored in the table's config (``SEMANTIC_DUP_KEY``, float16,
with the settings and the chunking they were made from): every later run assigns its new rows
to the same clusters. ``clusters=0`` picks one cluster per ``ROWS_PER_CLUSTER`` rows of the
first run (1 to ``AUTO_MAX_CLUSTERS``). A copy that lands in another cluster than its original
is missed: that is SemDeDup's trade of recall for cost.

- ``semantic_cluster`` (int64): the cluster the row was compared within.
- ``semantic_dup`` (bool): true when an earlier row (smaller ``id``) of its cluster has cosine
  ``>= threshold`` with it: the row is dropped, the earlier one kept.
- ``semantic_rep`` (int64): the ``id`` of the kept representative of its group: its own id
  when it is kept, else the representative of its nearest earlier row (the group's first
  member, so groups chain like ``near_dup`` clusters).
- ``semantic_cos`` (float32): cosine with that representative (1.0 for itself; through a chain
  it may be below ``threshold``).

Incremental like ``near_dup``: one pinned version; the fragments lacking the columns are
computed in id order, each row against every earlier row of its cluster (the rows written
before, whose vectors are read back from that version's ``chunk_embeddings``, and the earlier
new rows), with blocked matrix products (memory bounded by the block, not the cluster squared).
Values already written never change. Settings that differ from the stored ones on a written
column are refused.
"""

from __future__ import annotations

import base64
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field

import lance
import numpy as np
import pyarrow as pa

from lance_assets import keys
from lance_assets.curation.kept import elect
from lance_assets.embeddings.embeddings import DIM
from lance_assets.table import Table, get_json_config
from lance_assets.table.columns import (
    ColumnWriteReport,
    Staged,
    fragments_missing,
    pinned_rows_end,
    rows_still_live,
    write_columns,
)
from lance_assets.table.producer import ColumnProducer, Json, Produced, WriteOptions, setting

SEMANTIC_CLUSTER = pa.field(keys.SEMANTIC_CLUSTER, pa.int64())
SEMANTIC_REP = pa.field(keys.SEMANTIC_REP, pa.int64())
SEMANTIC_COS = pa.field(keys.SEMANTIC_COS, pa.float32())
SEMANTIC_DUP = pa.field(keys.SEMANTIC_DUP, pa.bool_())
FIELDS = [SEMANTIC_CLUSTER, SEMANTIC_REP, SEMANTIC_COS, SEMANTIC_DUP]
COLUMNS = [f.name for f in FIELDS]
DESCRIPTIONS = {
    SEMANTIC_CLUSTER.name: "The k-means cluster (of the normalised mean of `chunk_embeddings`) "
                           "the row was compared within; null when the row has no chunks.",
    SEMANTIC_REP.name: "Id of the kept representative of the row's semantic-duplicate group "
                       "(its own id when it is kept).",
    SEMANTIC_COS.name: "Cosine between the row's document vector and its representative's "
                       "(1.0 for a kept row).",
    SEMANTIC_DUP.name: "True when an earlier row (smaller id) of its cluster is within cosine "
                       ">= threshold: a semantic duplicate, dropped by `NOT semantic_dup`.",
}
ROWS_PER_CLUSTER = 5000
AUTO_MAX_CLUSTERS = 256
MAX_CLUSTERS = 1024
TRAIN_ROWS = 100_000  # k-means is trained on at most this many rows (a seeded sample)
KMEANS_ITERATIONS = 25
NEW_BLOCK = 1024  # new rows per matrix product
OLD_BLOCK = 8192  # earlier rows per matrix product: a product holds 1024 x 8192 float32 (32 MB)


class SettingsMismatchError(ValueError):
    pass


class MissingChunkEmbeddingsError(RuntimeError):
    pass


@dataclass(frozen=True)
class SemanticDupSettings:
    threshold: float = setting(
        0.88, "A row is a semantic duplicate when an earlier row of its cluster has cosine >= "
        "this with it (document vectors: the normalised mean of `chunk_embeddings`). Measured on "
        "planted rewordings with all-MiniLM-L6-v2 (docs/benchmarks.md): 0.88 finds 91-98% of "
        "them, which MinHash misses, while unrelated documents on the same topics stay below "
        "0.82; 0.95 finds 29-63%, and NeMo's eps=0.01 (0.99) almost none. Raise it to flag "
        "only closer copies.")
    clusters: int = setting(
        0, f"k-means clusters, trained once on the first run; 0: one per {ROWS_PER_CLUSTER} rows "
        f"of the first run (1 to {AUTO_MAX_CLUSTERS}); at most {MAX_CLUSTERS}. More clusters: "
        "less work per row, more copies split from their original.")
    seed: int = setting(0, "Seed of the k-means initialisation and of its training sample.")

    def __post_init__(self) -> None:
        if not 0.0 < self.threshold <= 1.0:
            raise ValueError(f"threshold={self.threshold}: a cosine in (0, 1], e.g. 0.95")
        if not 0 <= self.clusters <= MAX_CLUSTERS:
            raise ValueError(f"clusters={self.clusters}: 0 (automatic) to {MAX_CLUSTERS}")

    def to_dict(self) -> dict:
        return asdict(self)


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


# ---------------------------------------------------------------------------- clusters

def auto_clusters(rows: int) -> int:
    return int(min(AUTO_MAX_CLUSTERS, max(1, round(rows / ROWS_PER_CLUSTER))))


def nearest_centroid(x: np.ndarray, centroids: np.ndarray) -> np.ndarray:
    out = np.empty(len(x), np.int64)
    for lo in range(0, len(x), OLD_BLOCK):
        out[lo:lo + OLD_BLOCK] = np.argmax(x[lo:lo + OLD_BLOCK] @ centroids.T, axis=1)
    return out


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
        new = nearest_centroid(x, centroids)
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


def encode_centroids(centroids: np.ndarray) -> str:
    return base64.b64encode(np.ascontiguousarray(centroids, np.float16).tobytes()).decode()


def decode_centroids(text: str, k: int) -> np.ndarray:
    return np.frombuffer(base64.b64decode(text), np.float16).astype(np.float32).reshape(k, DIM)


# ---------------------------------------------------------------------------- comparing

@dataclass
class SemanticDupStats:
    documents: int = 0
    flagged: int = 0
    flagged_against_earlier_runs: int = 0
    not_computed: int = 0
    earlier_rows: int = 0
    earlier_flagged: int = 0
    clusters: int = 0
    trained: bool = False
    pairs_compared: int = 0
    compare_s: float = 0.0
    read_s: float = 0.0
    kept_after_deletes: int = 0  # unflagged: their group's representative was deleted


@dataclass
class Compared:
    cluster: np.ndarray
    rep: np.ndarray
    cos: np.ndarray
    dup: np.ndarray


def compare(new_ids: np.ndarray, new_vecs: np.ndarray, new_cluster: np.ndarray,
            old_ids: np.ndarray, old_vecs: np.ndarray, old_cluster: np.ndarray,
            old_rep: np.ndarray, threshold: float, stats: SemanticDupStats) -> Compared:
    """Representatives, cosines and flags of new rows (``new_ids`` ascending) against every
    earlier row (smaller id) of their cluster: the old rows and the new rows before them."""
    n = len(new_ids)
    rep = new_ids.copy()
    cos = np.ones(n, np.float32)
    dup = np.zeros(n, bool)
    for c in np.unique(new_cluster):
        ni = np.flatnonzero(new_cluster == c)  # ascending, so ascending ids
        oi = np.flatnonzero(old_cluster == c)
        nv, ov, o_ids = new_vecs[ni], old_vecs[oi], old_ids[oi]
        ids = new_ids[ni]
        o_before_all = len(o_ids) == 0 or o_ids.max() < ids.min()
        for lo in range(0, len(ni), NEW_BLOCK):
            hi = min(lo + NEW_BLOCK, len(ni))
            block = nv[lo:hi]
            best = np.full(hi - lo, -np.inf, np.float32)
            best_at = np.full(hi - lo, -1, np.int64)  # >= 0: an old row, < 0: -(new pos) - 2
            for olo in range(0, len(oi), OLD_BLOCK):
                s = block @ ov[olo:olo + OLD_BLOCK].T
                if not o_before_all:
                    s[o_ids[None, olo:olo + OLD_BLOCK] >= ids[lo:hi, None]] = -np.inf
                j = np.argmax(s, axis=1)
                v = s[np.arange(hi - lo), j]
                better = v > best
                best[better], best_at[better] = v[better], olo + j[better]
                stats.pairs_compared += s.size
            if hi > 0:
                s = block @ nv[:hi].T  # earlier new rows: positions below each row's own
                s[np.arange(lo, hi)[:, None] <= np.arange(hi)[None, :]] = -np.inf
                j = np.argmax(s, axis=1)
                v = s[np.arange(hi - lo), j]
                better = v > best
                best[better], best_at[better] = v[better], -j[better] - 2
                stats.pairs_compared += (hi - lo) * lo + (hi - lo) * (hi - lo - 1) // 2
            for r in np.flatnonzero(best >= threshold):  # in id order: earlier reps are final
                pos = ni[lo + r]
                at = best_at[r]
                dup[pos] = True
                if at >= 0:
                    rep[pos] = old_rep[oi[at]]
                    stats.flagged_against_earlier_runs += 1
                else:
                    rep[pos] = rep[ni[-at - 2]]
        # cosine with the representative (an old row or an earlier new row of the cluster)
        flagged = ni[dup[ni]]
        if len(flagged):
            wanted = rep[flagged]
            where = {int(i): ov[k] for k in np.flatnonzero(np.isin(o_ids, wanted))
                     for i in (o_ids[k],)}
            where.update({int(i): nv[k] for k in np.flatnonzero(np.isin(ids, wanted))
                          for i in (ids[k],)})
            for pos in flagged:
                cos[pos] = float(new_vecs[pos] @ where[int(rep[pos])])
    stats.flagged += int(dup.sum())
    return Compared(new_cluster.astype(np.int64), rep, cos, dup)


# ---------------------------------------------------------------------------- the write

def read_earlier(ds: lance.LanceDataset, frags: list, stats: SemanticDupStats
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The rows written before (ids, document vectors, clusters, representatives), read batch
    by batch: only the vectors stay (1.5 kB a row), not the chunks."""
    parts = []
    if frags:
        scanner = ds.scanner(columns=["id", SEMANTIC_CLUSTER.name, SEMANTIC_REP.name,
                                      SEMANTIC_DUP.name, keys.CHUNK_EMBEDDINGS],
                             filter=f"{SEMANTIC_CLUSTER.name} IS NOT NULL", fragments=frags,
                             batch_size=4096)
        for b in scanner.to_batches():
            if not b.num_rows:
                continue
            vecs, _ = document_vectors(b.column(keys.CHUNK_EMBEDDINGS))
            parts.append((b.column("id").to_numpy(), vecs,
                          b.column(SEMANTIC_CLUSTER.name).to_numpy(),
                          b.column(SEMANTIC_REP.name).to_numpy()))
            stats.earlier_flagged += int(np.sum(b.column(SEMANTIC_DUP.name).to_numpy(
                zero_copy_only=False)))
    if not parts:
        empty = np.zeros(0, np.int64)
        return empty, np.zeros((0, DIM), np.float32), empty, empty
    ids, vecs, cluster, rep = (np.concatenate(x) for x in zip(*parts))
    stats.earlier_rows = len(ids)
    return ids, vecs, cluster, rep


@dataclass
class Results:
    """The computed rows of each fragment, in its row order, handed to ``write_columns``."""

    by_fragment: dict[int, pa.RecordBatch] = field(default_factory=dict)
    ids: dict[int, np.ndarray] = field(default_factory=dict)  # the rows each batch is for

    def __call__(self, frag, _payload) -> Iterator[pa.RecordBatch]:
        if frag.fragment_id not in self.by_fragment:
            raise RuntimeError(f"fragment {frag.fragment_id} was not in the version this run "
                               "pinned; the next run writes it")
        batch = self.by_fragment[frag.fragment_id]
        at = rows_still_live(frag, self.ids[frag.fragment_id])  # rows deleted since the plan
        yield batch if at is None else batch.take(pa.array(at))


def _nothing(frag) -> None:
    return None


def semantic_dup(table: Table | str, settings: SemanticDupSettings = SemanticDupSettings(),  # noqa: B008 - frozen
                 *, fragments_per_commit: int | None = None, executor: str | None = None,
                 log: Callable[[str], None] = print
                 ) -> tuple[ColumnWriteReport | None, SemanticDupStats]:
    """Write the semantic-duplicate columns for every fragment of one pinned version that lacks
    them, each row against every earlier row of its cluster."""
    table = Table.of(table)

    def run(ds: lance.LanceDataset) -> tuple[ColumnWriteReport | None, SemanticDupStats]:
        stats = SemanticDupStats()
        if keys.CHUNK_EMBEDDINGS not in ds.schema.names:
            raise MissingChunkEmbeddingsError(
                f"{table.uri} has no `chunk_embeddings` column: materialize `chunk_embeddings` "
                "first (semantic_dup compares the mean of each row's chunk vectors)")
        chunking = get_json_config(ds, keys.CHUNK_EMBEDDING_KEY)
        stored = get_json_config(ds, keys.SEMANTIC_DUP_KEY)
        have = all(c in ds.schema.names for c in COLUMNS)
        todo = fragments_missing(ds, COLUMNS) if have else ds.get_fragments()
        written = have and len(fragments_missing(ds, COLUMNS)) < len(ds.get_fragments())
        if stored is None and written:
            raise SettingsMismatchError(
                f"{table.uri}: semantic-duplicate columns are written but the table's config has "
                f"no record of their clusters ({keys.SEMANTIC_DUP_KEY}); drop the columns first "
                f"(Table.of(DATA).newest().drop_columns({COLUMNS})) to compute them again.")
        if stored is not None and written:
            if stored["settings"] != settings.to_dict() or stored.get("chunking") != chunking:
                raise SettingsMismatchError(
                    f"{table.uri}: semantic-duplicate columns were written with "
                    f"{stored['settings']} on chunking {stored.get('chunking')}, not "
                    f"{settings.to_dict()} on {chunking}. Keep the stored settings, or drop the "
                    f"columns first (Table.of(DATA).newest().drop_columns({COLUMNS})).")
        if not todo:
            return write_columns(table, FIELDS, Staged(_nothing, Results()), pinned=ds,
                                 fragments_per_commit=fragments_per_commit, executor=executor,
                                 log=log), stats
        lacking = {f.fragment_id for f in fragments_missing(ds, [keys.CHUNK_EMBEDDINGS],
                                                            among=[f.fragment_id for f in todo])}
        ready = [f.fragment_id for f in todo if f.fragment_id not in lacking]
        if lacking and ready and min(lacking) > max(ready):
            # rows ingested after `chunk_embeddings` ran: they wait for it, and for the next run
            log(f"semantic_dup: fragments {sorted(lacking)} have no `chunk_embeddings` yet; "
                "they wait for the next run")
            todo = [f for f in todo if f.fragment_id not in lacking]
        elif lacking:
            raise MissingChunkEmbeddingsError(
                f"{table.uri}: fragments {sorted(lacking)} have no `chunk_embeddings` yet; "
                "materialize `chunk_embeddings` first, then semantic_dup")
        t0 = time.perf_counter()
        todo_ids = {f.fragment_id for f in todo}
        done = [f for f in ds.get_fragments() if f.fragment_id not in todo_ids]
        old_ids, old_vecs, old_cluster, old_rep = read_earlier(ds, done if written else [],
                                                               stats)
        parts = []
        for f in todo:
            t = f.to_table(columns=["id", keys.CHUNK_EMBEDDINGS])
            vecs, ok = document_vectors(t.column(keys.CHUNK_EMBEDDINGS))
            parts.append((f.fragment_id, t.column("id").to_numpy(), vecs, ok))
        stats.read_s = time.perf_counter() - t0

        if stored is None or not written:  # the first run: train the clusters here
            train = np.concatenate([p[2][p[3]] for p in parts] + [old_vecs])
            if len(train) == 0:
                train = np.zeros((1, DIM), np.float32)
                train[0, 0] = 1.0
            k = settings.clusters or auto_clusters(len(train))
            rng = np.random.default_rng(settings.seed)
            sample = train if len(train) <= TRAIN_ROWS else \
                train[np.sort(rng.choice(len(train), TRAIN_ROWS, replace=False))]
            centroids = spherical_kmeans(sample, k, settings.seed)
            stored = {"settings": settings.to_dict(), "chunking": chunking,
                      "vector": "normalised mean of chunk_embeddings",
                      "clusters": len(centroids), "trained_rows": len(sample),
                      "centroids_float16": encode_centroids(centroids)}
            table.set_config(keys.SEMANTIC_DUP_KEY, stored, log=log)
            stats.trained = True
        centroids = decode_centroids(stored["centroids_float16"], stored["clusters"])
        stats.clusters = len(centroids)

        # every new row, in id order (fragments are compared in id order, rows within them too)
        frag_of = np.concatenate([np.full(len(p[1]), i) for i, p in enumerate(parts)])
        ids = np.concatenate([p[1] for p in parts])
        vecs = np.concatenate([p[2] for p in parts])
        ok = np.concatenate([p[3] for p in parts])
        order = np.argsort(ids, kind="stable")
        sel = order[ok[order]]
        t1 = time.perf_counter()
        got = compare(ids[sel], vecs[sel], nearest_centroid(vecs[sel], centroids),
                      old_ids, old_vecs, old_cluster, old_rep, settings.threshold, stats)
        stats.compare_s = time.perf_counter() - t1
        stats.documents = len(sel)
        stats.not_computed = int((~ok).sum())
        cluster = np.zeros(len(ids), np.int64)
        rep = np.zeros(len(ids), np.int64)
        cos = np.zeros(len(ids), np.float32)
        dup = np.zeros(len(ids), bool)
        cluster[sel], rep[sel], cos[sel], dup[sel] = got.cluster, got.rep, got.cos, got.dup
        results = Results()
        schema = pa.schema(FIELDS)
        for i, (frag_id, _, _, frag_ok) in enumerate(parts):
            at = np.flatnonzero(frag_of == i)  # this fragment's rows, in its row order
            results.ids[frag_id] = ids[at]
            results.by_fragment[frag_id] = pa.RecordBatch.from_arrays(
                [pa.array(cluster[at], pa.int64(), mask=~frag_ok),
                 pa.array(rep[at], pa.int64(), mask=~frag_ok),
                 pa.array(cos[at], pa.float32(), mask=~frag_ok),
                 pa.array(dup[at], pa.bool_(), mask=~frag_ok)], schema=schema)
        log(f"semantic_dup: {stats.documents} rows against {stats.earlier_rows} earlier ones in "
            f"{stats.clusters} cluster(s): {stats.flagged} flagged")
        report = write_columns(table, FIELDS, Staged(_nothing, results), pinned=ds,
                               fragments_per_commit=fragments_per_commit, executor=executor,
                               log=log, waiting=lacking)
        return report, stats

    def run_and_elect(ds: lance.LanceDataset):
        report, stats = run(ds)
        stats.kept_after_deletes = elect(table, flag=SEMANTIC_DUP.name,
                                         cluster=SEMANTIC_REP.name,
                                         rows_end=pinned_rows_end(table, ds), log=log)
        return report, stats

    return table.pinned(run_and_elect, what="semantic_dup", log=log)


def write(table: Table, settings: SemanticDupSettings, options: WriteOptions) -> Produced:
    report, stats = semantic_dup(table, settings, fragments_per_commit=options.fragments_per_commit,
                                 executor=options.executor, log=options.log)
    computed = stats.earlier_rows + stats.documents
    return Produced(write=report, summary={
        "new_rows_flagged": stats.flagged,
        "new_rows_flagged_against_earlier_runs": stats.flagged_against_earlier_runs,
        "not_computed": stats.not_computed,
        "semantic_dup_rate": round((stats.earlier_flagged + stats.flagged) / computed, 4)
        if computed else 0.0,
        "clusters": stats.clusters,
        "clusters_trained_now": stats.trained,
        "kept_after_deletes": stats.kept_after_deletes,
        "pairs_compared": stats.pairs_compared,
        "compare_us_per_doc": round(stats.compare_s / stats.documents * 1e6, 1)
        if stats.documents else 0.0,
        "settings": Json(settings.to_dict()),
    })


PRODUCER = ColumnProducer(
    name="semantic_dup",
    doc="`semantic_cluster`, `semantic_rep`, `semantic_cos` and `semantic_dup`: semantic "
        "duplicates after SemDeDup. Document vectors (the normalised mean of `chunk_embeddings`) "
        "are clustered by k-means (trained once, centroids kept in the table's config); within a "
        "cluster a row is flagged when an earlier row has cosine >= threshold with it. Finds "
        "rewordings MinHash misses. New rows are compared against old ones; old values are never "
        "rewritten. Opt-in rule: `NOT semantic_dup`.",
    fields=FIELDS, descriptions=DESCRIPTIONS, write=write, settings=SemanticDupSettings,
    deps=("raw_text", "chunk_embeddings"), kinds=("lance", "numpy"),
    input_errors=(SettingsMismatchError,),
    reads={c: [("chunk_embeddings", keys.CHUNK_EMBEDDINGS), ("raw_text", "id")] for c in COLUMNS})
