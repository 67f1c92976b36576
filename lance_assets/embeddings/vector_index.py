"""The ANN index on ``embedding`` and exact-vs-index recall, measured every time it changes.

Parameters come from the row count N: ``num_partitions`` ~ sqrt(N) (so a partition holds
~sqrt(N) rows), then either 8-bit scalar quantization with an HNSW graph per partition
(IVF_HNSW_SQ, the default: 5x faster to build than IVF_PQ at 100k rows on 2 cores, recall@10
~0.95) or PQ with 48 sub-vectors of 8 dimensions (IVF_PQ); the top candidates are re-ranked on
the full vectors (``refine_factor``). Below ``FLAT_BELOW`` rows no index
is built: an exact scan of a few hundred 384-d vectors is faster than any index and exact.

After each build the search settings are tuned on a sample of the table's own vectors used as
queries: ``nprobes`` doubles until recall@10 against exact search reaches ``target_recall``. The
chosen settings and the measured recall live in the table config (``VECTOR_INDEX_KEY``), so
every search uses what was measured. Rows appended later are added to the index
(``optimize_indices``) unless the table more than doubled since training, which rebuilds it.

The same code indexes the multivector ``chunk_embeddings`` (``CHUNKS``): Lance trains the IVF
partitions on every chunk vector and scores a document by its best chunk (MaxSim). There a
query is one vector (one chunk of the query text) and recall@10 is measured with chunk vectors
of the table's own rows as queries, against an exact MaxSim scan.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import lance
import numpy as np

from lance_assets import keys
from lance_assets.embeddings.embeddings import DIM, EMBEDDING
from lance_assets.keys import VECTOR_INDEX_KEY
from lance_assets.progress import phase
from lance_assets.table import Table, get_json_config


@dataclass(frozen=True)
class VectorColumn:
    """A vector column, its ANN index and where the index settings live in the table config."""

    column: str
    index_name: str
    config_key: str
    asset: str  # the asset that writes the column (named in errors)
    multivector: bool = False  # list<fixed_size_list>: a document is a set of vectors


DOCUMENTS = VectorColumn(EMBEDDING.name, "embedding_ann", VECTOR_INDEX_KEY, "embeddings")
CHUNKS = VectorColumn(keys.CHUNK_EMBEDDINGS, "chunk_embeddings_ann", keys.CHUNK_INDEX_KEY,
                      "chunk_embeddings", multivector=True)
INDEX_NAME = DOCUMENTS.index_name
FLAT_BELOW = 1024
METRIC = "cosine"
DEFAULT_INDEX_TYPE = "IVF_HNSW_SQ"
# Re-rank k x this many candidates on the full float32 vectors: PQ codes are coarse (recall@10
# ~0.6 without it at 100k rows), 8-bit SQ much less so.
REFINE_FACTOR = {"IVF_PQ": 5, "IVF_HNSW_SQ": 2}


@dataclass
class IndexSettings:
    index_type: str  # "IVF_PQ", "IVF_HNSW_SQ" or "FLAT" (no index: exact search)
    rows: int  # rows the index was trained on
    num_partitions: int = 0
    num_sub_vectors: int = 0
    nprobes: int = 0
    refine_factor: int | None = None
    metric: str = METRIC
    recall_at_10: float = 1.0
    recall_queries: int = 0
    tuning: list[dict] = field(default_factory=list)  # recall at each nprobes tried

    def to_dict(self) -> dict:
        return asdict(self)


def derive_settings(rows: int, index_type: str = DEFAULT_INDEX_TYPE,
                    flat_below: int = FLAT_BELOW) -> IndexSettings:
    """Index parameters for ``rows`` vectors."""
    if rows < flat_below:
        return IndexSettings("FLAT", rows)
    if index_type not in ("IVF_PQ", "IVF_HNSW_SQ"):
        raise ValueError(f"index_type {index_type!r}: use 'IVF_PQ' or 'IVF_HNSW_SQ'")
    partitions = max(1, min(4096, round(math.sqrt(rows))))
    sub_vectors = DIM // 8 if index_type == "IVF_PQ" else 0
    return IndexSettings(index_type, rows, num_partitions=partitions, num_sub_vectors=sub_vectors,
                         nprobes=max(1, partitions // 32),
                         refine_factor=REFINE_FACTOR[index_type])


def current_settings(ds: lance.LanceDataset, target: VectorColumn = DOCUMENTS
                     ) -> IndexSettings | None:
    raw = get_json_config(ds, target.config_key)
    return IndexSettings(**raw) if raw else None


def has_index(ds: lance.LanceDataset, target: VectorColumn = DOCUMENTS) -> bool:
    return target.index_name in {i.name for i in ds.describe_indices()}


def embedded_rows(ds: lance.LanceDataset, target: VectorColumn = DOCUMENTS) -> int:
    return ds.count_rows(filter=f"{target.column} IS NOT NULL")


def nearest_arg(settings: IndexSettings | None, q: np.ndarray, k: int,
                target: VectorColumn = DOCUMENTS) -> dict:
    """The ``nearest=`` argument of a Lance scan for ``q``: one vector or a (n, 384) batch of
    queries, or (on a multivector column) one vector scored against each row's best chunk."""
    arg = {"column": target.column, "q": q, "k": k, "metric": METRIC}
    if settings is None or settings.index_type == "FLAT":
        arg["use_index"] = False
        return arg
    arg["minimum_nprobes"] = settings.nprobes
    if settings.refine_factor:
        arg["refine_factor"] = settings.refine_factor
    return arg


def knn_ids(ds: lance.LanceDataset, queries: np.ndarray, k: int, settings: IndexSettings | None,
            filter: str | None = None, target: VectorColumn = DOCUMENTS) -> list[list[int]]:
    """For each query vector, the ids of its ``k`` nearest rows (batched in one scan; one scan
    per query on a multivector column, where several vectors would make one query)."""
    queries = np.atleast_2d(np.asarray(queries, np.float32))
    if target.multivector:
        return [ds.to_table(columns=["id"], nearest=nearest_arg(settings, q, k, target),
                            filter=filter, prefilter=filter is not None,
                            disable_scoring_autoprojection=True).column("id").to_pylist()
                for q in queries]
    tbl = ds.to_table(columns=["id"], nearest=nearest_arg(settings, queries, k), filter=filter,
                      prefilter=filter is not None, disable_scoring_autoprojection=True)
    out: list[list[int]] = [[] for _ in range(len(queries))]
    if len(queries) == 1 and "query_index" not in tbl.column_names:
        out[0] = tbl.column("id").to_pylist()
        return out
    for qi, rid in zip(tbl.column("query_index").to_pylist(), tbl.column("id").to_pylist()):
        out[qi].append(rid)
    return out


def sample_queries(ds: lance.LanceDataset, n: int, seed: int = 0,
                   target: VectorColumn = DOCUMENTS) -> tuple[np.ndarray, np.ndarray]:
    """(ids, vectors) of ``n`` rows drawn at random among those with a vector (on a multivector
    column: one of the row's chunks, drawn at random)."""
    total = ds.count_rows()
    rng = np.random.default_rng(seed)
    picks = np.sort(rng.choice(total, size=min(total, n * 2), replace=False))
    tbl = ds.take(picks, columns=["id", target.column])
    ids = np.array(tbl.column("id").to_pylist())
    rows = tbl.column(target.column).to_pylist()
    if target.multivector:
        rows = [v[int(rng.integers(len(v)))] if v else None for v in rows]
    keep = np.array([v is not None for v in rows], bool)
    flat = np.stack([np.asarray(v, np.float32) for v, k in zip(rows, keep) if k]) \
        if keep.any() else np.zeros((0, DIM), np.float32)
    return ids[keep][:n], flat[:n]


def recall_at_k(ds: lance.LanceDataset, settings: IndexSettings, ids: np.ndarray,
                queries: np.ndarray, k: int = 10,
                exact: list[list[int]] | None = None,
                target: VectorColumn = DOCUMENTS) -> tuple[float, list[list[int]]]:
    """Mean |index top-k ∩ exact top-k| / k; each query's own row is left out of both lists."""
    if exact is None:
        exact = knn_ids(ds, queries, k + 1, None, target=target)
    found = knn_ids(ds, queries, k + 1, settings, target=target)
    hits = []
    for qid, ex, got in zip(ids, exact, found):
        ex = [r for r in ex if r != qid][:k]
        got = [r for r in got if r != qid][:k]
        if ex:
            hits.append(len(set(ex) & set(got)) / len(ex))
    return (float(np.mean(hits)) if hits else 1.0), exact


def tune_nprobes(ds: lance.LanceDataset, settings: IndexSettings, ids: np.ndarray,
                 queries: np.ndarray, target_recall: float, k: int = 10,
                 target: VectorColumn = DOCUMENTS) -> IndexSettings:
    """Double ``nprobes`` until recall@k reaches ``target_recall``, stops improving (the
    quantization, not the probing, limits it) or every partition is read."""
    exact, previous = None, None
    settings.tuning = []
    while True:
        recall, exact = recall_at_k(ds, settings, ids, queries, k, exact, target)
        settings.tuning.append({"nprobes": settings.nprobes, "recall_at_10": round(recall, 4)})
        if (recall >= target_recall or settings.nprobes >= settings.num_partitions
                or (previous is not None and recall <= previous + 0.002)):
            break
        previous = recall
        settings.nprobes = min(settings.num_partitions, settings.nprobes * 2)
    settings.recall_at_10 = round(recall, 4)
    settings.recall_queries = len(ids)
    return settings


@dataclass
class VectorIndexReport:
    action: str  # "created", "rebuilt", "updated", "up_to_date", "flat"
    settings: IndexSettings
    rows: int
    unindexed_rows: int
    build_s: float
    version: int
    duration_s: float

    @property
    def nothing_to_do(self) -> bool:
        return self.action == "up_to_date"


def vector_index(table: Table, *, index_type: str = DEFAULT_INDEX_TYPE,
                 target_recall: float = 0.95, recall_queries: int = 100,
                 flat_below: int = FLAT_BELOW, seed: int = 0,
                 target: VectorColumn = DOCUMENTS,
                 log: Callable[[str], None] | None = None) -> VectorIndexReport:
    """Create (or update) the ANN index on ``embedding`` (or ``target``'s column), tune nprobes,
    record recall@10. ``log``:
    progress lines."""
    start = time.perf_counter()
    name = target.index_name
    uri = table.uri
    ds = table.newest()
    if target.column not in ds.schema.names:
        raise RuntimeError(f"{uri} has no `{target.column}` column: materialize "
                           f"`{target.asset}` first")
    rows = embedded_rows(ds, target)
    if rows < ds.count_rows():
        raise RuntimeError(f"{uri}: {ds.count_rows() - rows} rows have no {target.column} yet; "
                           f"materialize `{target.asset}` first (it resumes where it stopped)")
    old = current_settings(ds, target)
    want = derive_settings(rows, index_type, flat_below)
    indexed = has_index(ds, target)
    unindexed = ds.stats.index_stats(name)["num_unindexed_rows"] if indexed else 0
    build_s = 0.0
    if want.index_type == "FLAT":
        action = "flat"
        if indexed:
            ds.drop_index(name)
        settings = want
        settings.recall_at_10, settings.recall_queries = 1.0, 0
    elif (indexed and old is not None and old.index_type == want.index_type
          and rows <= 2 * old.rows):
        if unindexed == 0:
            return VectorIndexReport("up_to_date", old, rows, 0, 0.0, ds.version,
                                     time.perf_counter() - start)
        t = time.perf_counter()
        with phase(f"{name}: adding {unindexed:,} rows to the index", log):
            table.commit("vector index update", lambda ds: ds.optimize.optimize_indices(
                index_names=[name]))
        build_s = time.perf_counter() - t
        action, settings = "updated", IndexSettings(**{**old.to_dict(), "rows": old.rows})
    else:
        t = time.perf_counter()
        kwargs = {"num_partitions": want.num_partitions}
        if want.index_type == "IVF_PQ":
            kwargs["num_sub_vectors"] = want.num_sub_vectors
        with phase(f"{name}: building the {want.index_type} index over {rows:,} rows "
                   f"({want.num_partitions} partitions)", log):
            table.commit("vector index", lambda ds: ds.create_index(
                target.column, want.index_type, name=name, metric=METRIC, replace=True,
                **kwargs))
        build_s = time.perf_counter() - t
        action = "rebuilt" if indexed else "created"
        settings = want
    ds = table.newest()
    if settings.index_type != "FLAT":
        with phase(f"{name}: tuning nprobes to recall@10 {target_recall}", log):
            ids, queries = sample_queries(ds, recall_queries, seed, target)
            settings = tune_nprobes(ds, settings, ids, queries, target_recall, target=target)
    table.set_config(target.config_key, settings.to_dict())
    ds = table.newest()
    left = ds.stats.index_stats(name)["num_unindexed_rows"] if has_index(ds, target) else rows
    return VectorIndexReport(action, settings, rows, left if settings.index_type != "FLAT" else 0,
                             build_s, ds.version, time.perf_counter() - start)
