"""``table_maintenance``: compaction, cleanup of old versions and index refresh of the corpus
table, safe next to ingest, column backfills and training (``corpus.maintenance``)."""

from datetime import timedelta

import dagster as dg

from lance_assets.defs.common import POOL, RAW_TEXT, TABLE_TAGS
from lance_assets.defs.common import TABLE_GROUP as GROUP
from lance_assets.defs.config import RunConfig
from lance_assets.defs.metadata import data_version
from lance_assets.defs.resources import LanceStore
from lance_assets.ingest import raw_text as ingest
from lance_assets.table import maintenance
from lance_assets.table.fingerprint import digest


class MaintenanceConfig(RunConfig):
    compact: bool = True
    """Merge small fragments and drop deleted rows (fragments whose columns are still being
    written are left for a later run)."""
    target_rows_per_fragment: int = ingest.DEFAULT_ROWS_PER_FRAGMENT
    """Fragments below this many rows are merged with their neighbours up to it. Fragments are
    the unit of column writes (and of Ray tasks), so keep it near ingest's fragment size."""
    cleanup: bool = True
    """Remove table versions older than `keep_versions_hours` that no tag names."""
    keep_versions_hours: float = maintenance.DEFAULT_KEEP_VERSIONS_FOR / timedelta(hours=1)
    """Untagged versions younger than this stay (0: keep only the newest and the tagged ones).
    Training runs tag the version they read, so their ranks, resume, samples and forensics are
    never affected."""
    optimize_indexes: bool = True
    """Fold rows appended since the last index build into the full-text and vector indexes."""
    release_snapshots: list[str] = []
    """Snapshot tags to release first (`train-<run name>`, `ablation-...`): the cleanup may then
    remove those versions. The run's checkpoints can no longer resume on them."""
    apply_retention: bool = True
    """Release the snapshots the retention policy no longer keeps: unnamed training runs beyond
    the newest `keep_unnamed_runs` of their asset, unnamed ablations a newer one superseded.
    Named runs and ablations, and tags made by hand, are kept until released."""
    keep_unnamed_runs: int = maintenance.DEFAULT_KEEP_UNNAMED_RUNS
    """How many unnamed training runs (no `run_name`) of an asset keep their snapshot."""


@dg.asset(deps=[RAW_TEXT], group_name=GROUP, kinds={"lance"}, code_version="1", pool=POOL,
          tags=TABLE_TAGS)
def table_maintenance(context: dg.AssetExecutionContext, config: MaintenanceConfig,
                      lance_store: LanceStore):
    """Upkeep of the `corpus` table: compacts small fragments (never a fragment whose columns
    are still being written, and no compaction can turn an unwritten value into a stored null:
    writers refill such rows), removes old versions but never one a tag names (training
    snapshots `train-<run>`), and folds new rows into the full-text and vector indexes. Safe at
    any moment, next to ingest, backfills and training."""
    report = maintenance.maintain(
        lance_store.table, compact=config.compact,
        target_rows_per_fragment=config.target_rows_per_fragment, cleanup=config.cleanup,
        keep_versions_for=timedelta(hours=config.keep_versions_hours),
        optimize_indexes=config.optimize_indexes, release=config.release_snapshots,
        retention=config.apply_retention, keep_unnamed_runs=config.keep_unnamed_runs,
        log=context.log.info)
    # what it leaves behind: the fragment layout and the kept snapshots at the version it wrote
    version = data_version(context, report.version_after,
                           digest([report.fragments_after, sorted(report.tags_kept.items())]))
    return dg.MaterializeResult(data_version=version, metadata={
        "dagster/uri": lance_store.table_uri,
        "lance/table_version": report.version_after,
        "summary": dg.MetadataValue.md(report.markdown()),
        "fragments_before": report.fragments_before,
        "fragments_after": report.fragments_after,
        "fragments_compacted": report.fragments_removed,
        "fragments_left_out": report.fragments_left_out,
        "bytes_reclaimed": report.bytes_reclaimed,
        "data_files_removed": report.data_files_removed,
        "versions_removed": report.versions_removed,
        "versions_kept": report.versions_kept,
        "documents_dropped": report.documents_dropped,  # only removed versions read them
        "largest_rows": report.largest_rows,
        "tags_kept": dg.MetadataValue.json(report.tags_kept),
        "tags_released": dg.MetadataValue.json(report.tags_released),
        "retention": dg.MetadataValue.json(report.retention),
        "compaction_rounds": report.compaction_rounds,
        "rewrites_dropped": report.rewrites_dropped,
        "indexes": dg.MetadataValue.json(report.indexes),
        "duration_s": round(report.duration_s, 3),
    })
