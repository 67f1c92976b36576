"""Column assets of the corpus table: ``raw_text`` -> ``dedup_flag`` -> ``token_ids`` (which
also depends on the ``tokenizer`` asset in ``tokenizer.py``).

Each writes its own column(s) with Lance's column APIs and never rewrites existing data files.
They take the ``lance_corpus`` pool, which the instance may use to queue table writers (a
throughput nicety); correctness does not depend on it: the library's writes are safe under
concurrent writers from any process or instance.
"""

from typing import Optional

import dagster as dg
from dagster_ray import RayResource

from lance_assets.corpus import dedup, ingest, tokenize
from lance_assets.defs.executor import RAY_RESOURCE_DEFS, ExecutorConfig, column_executor
from lance_assets.defs.metadata import lineage, markdown_table, table_metadata
from lance_assets.defs.resources import LanceStore

POOL = "lance_corpus"
GROUP = "corpus"


class RawTextConfig(dg.Config):
    source: Optional[str] = None
    """Override LANCE_ASSETS_SOURCE for this run: synthetic[:ROWS], a file, folder or glob,
    or hf:DATASET[:CONFIG]."""
    text_column: str = "text"
    """Name of the text column in parquet / jsonl / Hugging Face sources."""
    rows_per_fragment: int = ingest.DEFAULT_ROWS_PER_FRAGMENT
    """Rows per Lance fragment: the unit of incremental column writes."""
    rows_per_commit: int = ingest.DEFAULT_ROWS_PER_COMMIT
    """Rows per append commit (ends on a row-group boundary): a kill loses at most one commit."""
    max_doc_chars: int = ingest.DEFAULT_MAX_DOC_CHARS
    """Longer documents are skipped and counted."""
    max_new_rows: Optional[int] = None
    """Stop after about this many new rows (at a commit boundary); the next run continues.
    Meant for endless streams such as hf: sources."""


@dg.asset(
    group_name=GROUP, kinds={"lance", "python"}, code_version="2", pool=POOL,
    tags={"lance_assets/table": "corpus"},
)
def raw_text(context: dg.AssetExecutionContext, config: RawTextConfig, lance_store: LanceStore):
    """Documents appended to the `corpus` Lance table: `id`, `text`, `n_chars`, `source` /
    `source_part` (the ingest watermark) and the FineWeb columns (`doc_id`, `url`, `dump`,
    `date`, `score`, `int_score`, `language`, `language_score`, `token_count`). Incremental and
    exactly-once: what is already in the table is skipped, a killed run resumes."""
    source = config.source or lance_store.source
    report = ingest.ingest(lance_store.root, source, text_column=config.text_column,
                           rows_per_fragment=config.rows_per_fragment,
                           rows_per_commit=config.rows_per_commit,
                           max_doc_chars=config.max_doc_chars,
                           max_new_rows=config.max_new_rows, log=context.log.info)
    if report.nothing_new:
        context.log.info(f"nothing new in {source!r}")
    for warning in report.warnings:
        context.log.warning(warning)
    for path, why in report.files_failed.items():
        context.log.warning(f"not ingested: {path}: {why}")
    return dg.MaterializeResult(metadata={
        **table_metadata(lance_store.table_uri, report.duration_s, rows_processed=report.rows_added),
        "summary": dg.MetadataValue.md(report.markdown()),
        "source": source,
        "nothing_new": report.nothing_new,
        "units_ingested": dg.MetadataValue.json(report.units_ingested),
        "units_with_nothing_new": len(report.units_already_present),
        "files_failed": dg.MetadataValue.json(report.files_failed),
        "warnings": dg.MetadataValue.json(report.warnings),
        "ingest_lock_wait_s": round(report.lock_wait_s, 3),
        "rows_added": report.rows_added,
        "bytes_added": report.bytes_added,
        "commits": report.commits,
        "fragments_added": report.fragments_added,
        "rows_skipped": sum(report.rows_skipped.values()),
        "rows_skipped_by_reason": dg.MetadataValue.json(report.rows_skipped),
        "mb_per_s": round(report.bytes_added / 1e6 / report.duration_s, 2) if report.duration_s else 0,
    })


class ColumnConfig(ExecutorConfig):
    fragments_per_commit: int = 4
    """Fragments computed per commit: a kill loses at most this many fragments' work."""


@dg.asset(
    deps=[raw_text], group_name=GROUP, kinds={"lance", "duckdb"}, code_version="1", pool=POOL,
    tags={"lance_assets/table": "corpus"}, resource_defs=RAY_RESOURCE_DEFS,
)
def dedup_flag(context: dg.AssetExecutionContext, config: ColumnConfig, lance_store: LanceStore,
               ray_cluster: RayResource):
    """`is_dup` (bool): true for a document whose whitespace-normalised text appeared at a
    smaller `id`. Computed with DuckDB over the Lance table, written per fragment."""
    report = dedup.dedup_flag(lance_store.root, fragments_per_commit=config.fragments_per_commit,
                              executor=column_executor(context, config, ray_cluster),
                              log=context.log.info)
    return dg.MaterializeResult(metadata={
        **table_metadata(lance_store.table_uri, report.duration_s, rows_processed=report.rows_written),
        "dagster/column_lineage": lineage({"is_dup": [("raw_text", "text"), ("raw_text", "id")]}),
        "nothing_to_do": report.nothing_to_do,
        "fragments_written": len(report.fragments_written),
        "fragments_already_done": report.fragments_already_done,
        "rows_written": report.rows_written,
        "duplicate_rate": round(dedup.duplicate_rate(lance_store.root), 4),
    })


class TokenIdsConfig(ColumnConfig):
    tokenizer: str = "auto"
    """`auto` (the tokenizer `input_ids` already hold, else the trained BPE of the `tokenizer`
    asset, else `byte`), `byte`, `bpe` (the newest trained BPE), `bpe:<sha256>`, or a tiktoken
    encoding available offline (`cl100k_base`; `gpt2`, `r50k_base` when in tiktoken's cache)."""
    replace: bool = False
    """When `input_ids` hold another tokenizer: drop them in a new table version and tokenize
    every fragment again (otherwise that is refused)."""


@dg.asset(
    deps=[dedup_flag, dg.AssetKey("tokenizer")], group_name=GROUP, kinds={"lance", "python"},
    code_version="2", pool=POOL, tags={"lance_assets/table": "corpus"},
    resource_defs=RAY_RESOURCE_DEFS,
)
def token_ids(context: dg.AssetExecutionContext, config: TokenIdsConfig, lance_store: LanceStore,
              ray_cluster: RayResource):
    """`input_ids` (list<int32>, no EOS: the loader adds it when packing), `n_tokens` (int32) and
    `n_bytes` (int32, UTF-8 length of `text`, for bits per byte). The tokenizer (name, EOS/PAD
    ids, sha256) is recorded in the table's config; by default the trained BPE."""
    report, info, tokens = tokenize.token_ids(
        lance_store.root, config.tokenizer, fragments_per_commit=config.fragments_per_commit,
        replace=config.replace, executor=column_executor(context, config, ray_cluster),
        log=context.log.info)
    meta = table_metadata(lance_store.table_uri, report.duration_s, rows_processed=report.rows_written)
    seconds = report.duration_s
    return dg.MaterializeResult(metadata={
        **meta,
        "dagster/column_lineage": lineage({"input_ids": [("raw_text", "text")],
                                           "n_tokens": [("raw_text", "text")],
                                           "n_bytes": [("raw_text", "text")]}),
        "nothing_to_do": report.nothing_to_do,
        "fragments_written": len(report.fragments_written),
        "fragments_already_done": report.fragments_already_done,
        "rows_written": report.rows_written,
        "tokens_written": tokens,
        "tokens_per_s": round(tokens / seconds, 1) if seconds else 0.0,
        "mb_per_s": round(report.bytes_tokenized / 1e6 / seconds, 2) if seconds else 0.0,
        "bytes_per_token": round(report.bytes_tokenized / tokens, 3) if tokens else None,
        "tokenizer_choice": report.tokenizer_choice,
        "replaced": report.replaced,
        "tokenizer": dg.MetadataValue.md(markdown_table([info.to_dict()])),
        "tokenizer_name": info.name,
        "tokenizer_sha256": info.sha256,
        "eos_id": info.eos_id,
        "pad_id": info.pad_id,
        "vocab_size": info.vocab_size,
    })
