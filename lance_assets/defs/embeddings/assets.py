"""Embeddings assets: the ANN indexes ``vector_index`` (on ``embeddings``) and ``chunk_index``
(on ``chunk_embeddings``), both ``embeddings/vector_index.py``. The two vector columns are
column producers (``embeddings/embeddings.py``, ``embeddings/chunk_embeddings.py``), made into
assets by ``defs/columns.py``.

The index assets write the corpus table and take the ``lance_corpus`` pool.
"""

import dagster as dg

from lance_assets.defs.common import CHUNK_EMBEDDINGS, EMBEDDINGS, POOL, TABLE_TAGS
from lance_assets.defs.common import EMBEDDINGS_GROUP as GROUP
from lance_assets.defs.conditions import ON_NEW_DATA
from lance_assets.defs.config import RunConfig
from lance_assets.defs.metadata import index_data_version
from lance_assets.defs.resources import LanceStore
from lance_assets.embeddings import vector_index as vindex
from lance_assets.markdown import markdown_table


class VectorIndexConfig(RunConfig):
    index_type: str = vindex.DEFAULT_INDEX_TYPE
    """`IVF_HNSW_SQ` (default) or `IVF_PQ`; partitions and sub-vectors come from the row count."""
    target_recall: float = 0.95
    """nprobes doubles until recall@10 against exact search reaches this."""
    recall_queries: int = 100
    """Rows whose own vectors are the queries for the recall measurement."""
    flat_below: int = vindex.FLAT_BELOW
    """Below this many rows no index is built: search is an exact scan."""


def index_metadata(context: dg.AssetExecutionContext, config: VectorIndexConfig,
                   lance_store: LanceStore, target: vindex.VectorColumn) -> dict:
    """Build or update ``target``'s index; the metadata both index assets show."""
    r = vindex.vector_index(lance_store.table, index_type=config.index_type,
                            target_recall=config.target_recall,
                            recall_queries=config.recall_queries, flat_below=config.flat_below,
                            target=target, log=context.log.info)
    s = r.settings
    if s.index_type == "FLAT":
        context.log.info(f"{r.rows} rows < {config.flat_below}: exact search, no index")
    return {
        "dagster/uri": lance_store.table.uri,
        "lance/table_version": r.version,
        "dagster/row_count": r.rows,
        "index_name": target.index_name,
        "action": r.action,
        "nothing_to_do": r.nothing_to_do,
        "index_type": s.index_type,
        "search": ("exact (flat scan): the table is too small for an ANN index to pay off"
                   if s.index_type == "FLAT" else "approximate (ANN index)"),
        "num_partitions": s.num_partitions,
        "num_sub_vectors": s.num_sub_vectors,
        "nprobes": s.nprobes,
        "refine_factor": s.refine_factor or 0,
        "recall_at_10": s.recall_at_10,
        "recall_queries": s.recall_queries,
        "recall_tuning": dg.MetadataValue.md(markdown_table(s.tuning)),
        "unindexed_rows": r.unindexed_rows,
        "build_s": round(r.build_s, 3),
        "duration_s": round(r.duration_s, 3),
    }


@dg.asset(deps=[EMBEDDINGS], group_name=GROUP, kinds={"lance"}, code_version="1", pool=POOL,
          tags=TABLE_TAGS, automation_condition=ON_NEW_DATA)
def vector_index(context: dg.AssetExecutionContext, config: VectorIndexConfig,
                 lance_store: LanceStore):
    """ANN index `embedding_ann` on `embedding` (cosine): IVF_HNSW_SQ with ~sqrt(rows)
    partitions, nprobes tuned until recall@10 against exact search reaches the target, measured
    on a query sample and shown here. Tiny tables get no index (exact search) and say so."""
    metadata = index_metadata(context, config, lance_store, vindex.DOCUMENTS)
    version = index_data_version(context, lance_store.table, vindex.DOCUMENTS.index_name)
    return dg.MaterializeResult(data_version=version, metadata=metadata)


@dg.asset(deps=[CHUNK_EMBEDDINGS], group_name=GROUP, kinds={"lance"}, code_version="1",
          pool=POOL, tags=TABLE_TAGS, automation_condition=ON_NEW_DATA)
def chunk_index(context: dg.AssetExecutionContext, config: VectorIndexConfig,
                lance_store: LanceStore):
    """ANN index `chunk_embeddings_ann` on the multivector `chunk_embeddings` (cosine, MaxSim):
    IVF_HNSW_SQ with ~sqrt(rows) partitions trained on every chunk vector, nprobes tuned until
    recall@10 against an exact MaxSim scan reaches the target (queries: chunks of the table's
    own rows). Tiny tables get no index (exact search) and say so."""
    metadata = index_metadata(context, config, lance_store, vindex.CHUNKS)
    version = index_data_version(context, lance_store.table, vindex.CHUNKS.index_name)
    return dg.MaterializeResult(data_version=version, metadata=metadata)
