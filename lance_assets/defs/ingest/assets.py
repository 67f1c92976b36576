"""``raw_text``: the rows of the corpus table, appended by ingest (``ingest/raw_text.py``)."""

from datetime import timedelta
from typing import Optional

import dagster as dg
import pydantic

from lance_assets.defs.common import INGEST_GROUP as GROUP
from lance_assets.defs.common import POOL, TABLE_TAGS
from lance_assets.defs.conditions import CHECK_ON_ASSET_UPDATE
from lance_assets.defs.config import RunConfig
from lance_assets.defs.metadata import (
    column_data_version,
    column_schema,
    table_metadata,
)
from lance_assets.defs.resources import LanceStore
from lance_assets.ingest import raw_text as ingest
from lance_assets.ingest.columns import SOURCE_COLUMN_KEY, SourceError
from lance_assets.ingest.sources import ENV
from lance_assets.table import RAW_DESCRIPTIONS, RAW_SCHEMA

RAW_TEXT_COLUMNS = column_schema(RAW_SCHEMA, RAW_DESCRIPTIONS)


class RawTextConfig(RunConfig):
    source: Optional[str] = None
    """Override LANCE_ASSETS_SOURCE for this run: synthetic[:ROWS], synthetic-web[:ROWS] (the
    FineWeb-shaped corpus at real size), a file, folder or glob,
    or hf:DATASET[:CONFIG]."""
    text_column: str = "text"
    """Name of the text column in parquet / jsonl / Hugging Face sources."""
    rows_per_fragment: int = ingest.DEFAULT_ROWS_PER_FRAGMENT
    """Rows per Lance fragment: the unit of incremental column writes (1 to 2,147,483,647)."""
    rows_per_commit: int = ingest.DEFAULT_ROWS_PER_COMMIT
    """Rows per append commit (ends on a row-group boundary): a kill loses at most one commit
    (1 to 2,147,483,647)."""
    max_doc_chars: int = ingest.DEFAULT_MAX_DOC_CHARS
    """Longer documents are skipped and counted (1 to 2,147,483,647)."""
    max_new_rows: Optional[int] = None
    """Stop after about this many new rows (at a commit boundary); the next run continues.
    Meant for endless streams such as hf: sources."""
    drop_columns: list[str] = []
    """Columns of the source to leave out (every other column is kept next to the text, with
    its type), e.g. ["file_path"]."""
    max_bad_line_share: float = ingest.DEFAULT_MAX_BAD_LINE_SHARE
    """The share of a file's lines (0 to 1) that may be skipped as unreadable (malformed JSON, a
    value of the wrong type, not UTF-8, a damaged row group) before the run fails; a file that
    yields no row fails it too."""

    @pydantic.model_validator(mode="after")
    def _in_range(self):
        """The library's own ranges (``ingest.raw_text.RANGES``), checked before the run."""
        if self.source is not None and not self.source.strip():
            raise ingest.IngestConfigError(
                f"source {self.source!r}: names no source. Leave it out to read "
                "LANCE_ASSETS_SOURCE, or name a file, folder or glob, synthetic[:ROWS] or "
                "hf:DATASET")
        ingest.check_settings(text_column=self.text_column,
                              rows_per_fragment=self.rows_per_fragment,
                              rows_per_commit=self.rows_per_commit,
                              max_doc_chars=self.max_doc_chars, max_new_rows=self.max_new_rows,
                              drop_columns=self.drop_columns,
                              max_bad_line_share=self.max_bad_line_share)
        return self


# The ingest schedule checks the source once a day by default (LANCE_ASSETS_INGEST_CRON): a
# raw_text not materialized for a day and an hour means the schedule is off or its runs fail.
# (Column assets follow raw_text only when it brings new rows, so a quiet source leaves them
# rightly untouched: their completeness is the `columns_written` check, not a clock.)
INGEST_FRESHNESS = dg.FreshnessPolicy.time_window(fail_window=timedelta(hours=25))


FILES_INGESTED = "files_ingested"


@dg.asset(
    group_name=GROUP, kinds={"lance", "python"}, code_version="2", pool=POOL, tags=TABLE_TAGS,
    metadata={"dagster/column_schema": RAW_TEXT_COLUMNS}, freshness_policy=INGEST_FRESHNESS,
    check_specs=[dg.AssetCheckSpec(
        FILES_INGESTED, asset="raw_text", blocking=False, automation_condition=CHECK_ON_ASSET_UPDATE,
        description="Every source file of the run was read: fails when a file could not be "
                    "read, changed since it was ingested, yielded no row or lost more than "
                    "max_bad_line_share of its lines, naming each with the reason and the fix "
                    "(the run fails too, after the rows of the other files are stored).")],
)
def raw_text(context: dg.AssetExecutionContext, config: RawTextConfig, lance_store: LanceStore):
    """Documents appended to the `corpus` Lance table: `id`, `text`, `n_chars`, `source` /
    `source_part` (the ingest watermark) and the FineWeb columns (`doc_id`, `url`, `dump`,
    `date`, `score`, `int_score`, `language`, `language_score`, `token_count`), and every other
    column the source brings, with its type (less `drop_columns`). Incremental and exactly-once:
    what is already in the table is skipped, a killed run resumes. A file that yields no row, or
    loses more than `max_bad_line_share` of its lines, fails the run once the other files'
    rows are stored."""
    from_config = config.source is not None
    source = config.source if from_config else lance_store.source
    try:
        report = ingest.ingest(lance_store.table, source, text_column=config.text_column,
                               rows_per_fragment=config.rows_per_fragment,
                               rows_per_commit=config.rows_per_commit,
                               max_doc_chars=config.max_doc_chars,
                               max_new_rows=config.max_new_rows,
                               drop_columns=config.drop_columns,
                               max_bad_line_share=config.max_bad_line_share,
                               source_label="raw_text's config source" if from_config else ENV,
                               log=context.log.info)
    except SourceError as exc:  # the source itself (a path that does not exist, a bad spec)
        raise dg.Failure(f"raw_text: {exc}", allow_retries=False) from None
    if report.nothing_new:
        context.log.info(f"nothing new in {source!r}")
    for warning in report.warnings:
        context.log.warning(warning)
    failed = {**report.files_failed, **report.files_refused}
    for path, why in failed.items():
        context.log.warning(f"not ingested: {path}: {why}")
    if not lance_store.table.exists():  # nothing was ever ingested: no table to report on
        why = [f"{k}: {v}" for k, v in sorted(failed.items())] + report.warnings
        raise dg.Failure(f"raw_text: no document of {source!r} was ingested, so there is no "
                         "table yet: " + ("; ".join(why) or "the source holds no document"))
    # the rows: the data files holding `text` change only when rows are appended (or compacted)
    version = column_data_version(context, lance_store.table, ["id", "text"])
    malformed = {k: v for k, v in report.rows_skipped.items()
                 if k.startswith(("malformed JSON", "wrong type", "bad lines"))}
    loss = report.loss()
    check = dg.AssetCheckResult(
        check_name=FILES_INGESTED, passed=loss is None,
        description=loss or "every file was read" + (
            f" ({sum(malformed.values())} unreadable line(s) skipped, named in "
            "rows_skipped_by_reason)" if malformed else ""),
        metadata={"files_failed": dg.MetadataValue.json(failed),
                  "malformed_lines": sum(malformed.values())})
    # the rows of the good files are committed: recorded as a materialization, then the run
    # fails, so that a file that lost lines is never a quiet success
    yield dg.MaterializeResult(data_version=version, check_results=[check], metadata={
        **table_metadata(lance_store.table, report.duration_s, rows_processed=report.rows_added,
                         columns=_with_source_columns(lance_store.table)),
        "summary": dg.MetadataValue.md(report.markdown()),
        "source": source,
        "nothing_new": report.nothing_new,
        "units_ingested": dg.MetadataValue.json(report.units_ingested),
        "units_with_nothing_new": len(report.units_already_present),
        "files_failed": dg.MetadataValue.json(failed),
        "columns_added": dg.MetadataValue.json(report.columns_added),
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
    if loss is not None:
        raise dg.Failure(f"raw_text: {loss}", allow_retries=False)


def _with_source_columns(table) -> dg.TableSchema:
    """``RAW_TEXT_COLUMNS`` and the columns the sources brought, as the table holds them."""
    key = SOURCE_COLUMN_KEY.encode()
    own = [f for f in table.newest().schema if f.metadata and key in f.metadata]
    return dg.TableSchema(columns=[*RAW_TEXT_COLUMNS.columns, *(dg.TableColumn(
        name=f.name, type=str(f.type),
        description=f"The source's own column, kept as read (first from {f.metadata[key].decode()}).")
        for f in own)])
