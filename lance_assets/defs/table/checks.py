"""``columns_written``: one blocking check per column asset (made with the asset by
``defs/columns.py``): every row of the table holds written values of the columns the asset
declares, judged by the write markers (``corpus.columns``), so it holds whatever rewrote the
table since. It judges the version the asset's last run pinned: rows appended after it are
reported as pending (the next run writes them), not as a failure. When it fails, nothing
downstream of that asset runs in that run (training included), and the message says which
fragments to fill: materialize the asset again."""

from collections.abc import Callable

import dagster as dg
import lance

from lance_assets.defs.conditions import CHECK_ON_ASSET_UPDATE
from lance_assets.defs.metadata import PINNED_ROWS_END, PINNED_VERSION
from lance_assets.defs.resources import LanceStore
from lance_assets.table.columns import unwritten_rows

CHECK_NAME = "columns_written"


def declared_columns(asset: dg.AssetsDefinition) -> list[str]:
    """The columns an asset declares in its ``dagster/column_schema``."""
    value = asset.specs_by_key[asset.key].metadata.get("dagster/column_schema")
    schema = getattr(value, "schema", value)
    if schema is None:
        raise ValueError(f"{asset.key.to_user_string()} declares no dagster/column_schema: a "
                         "column asset lists the columns it writes (defs/metadata.column_schema)")
    return [c.name for c in schema.columns]


def last_pin(instance: dg.DagsterInstance, key: dg.AssetKey) -> tuple[int | None, int | None]:
    """(version, rows end) the asset's last materialization wrote on, or (None, None) when this
    instance has none (then every unwritten row counts: the strict reading)."""
    event = instance.get_latest_materialization_event(key)
    meta = event.asset_materialization.metadata if event and event.asset_materialization else {}
    version, end = meta.get(PINNED_VERSION), meta.get(PINNED_ROWS_END)
    return (getattr(version, "value", None),
            None if end is None else int(getattr(end, "value", end)))


def coverage_check(asset: dg.AssetsDefinition,
                   not_computed: Callable[[lance.LanceDataset], str | None] | None = None,
                   ) -> dg.AssetChecksDefinition:
    """The check of ``asset``; ``not_computed(ds)``: why its columns may rightly be absent from
    a table (a corpus without labels trains no quality model), or None when they are expected."""
    columns = declared_columns(asset)
    name = asset.key.to_user_string()

    @dg.asset_check(asset=asset.key, name=CHECK_NAME, blocking=True,
                    automation_condition=CHECK_ON_ASSET_UPDATE,
                    description=f"Every row holds written values of {', '.join(columns)} (none "
                                "left unwritten by a killed run, a concurrent compaction, or "
                                "rows ingested since).")
    def check(context: dg.AssetCheckExecutionContext,
              lance_store: LanceStore) -> dg.AssetCheckResult:
        ds = lance_store.table.newest()
        why_not = not_computed(ds) if not_computed else None
        if why_not:
            return dg.AssetCheckResult(passed=True, description=f"not expected: {why_not}",
                                       metadata={"rows": ds.count_rows(), "computed": False})
        pinned_version, rows_end = last_pin(context.instance, asset.key)
        cov = unwritten_rows(ds, columns, rows_end)
        pending = (f" {cov.pending_rows:,} row(s) appended after version {pinned_version}, which "
                   f"the last run of `{name}` pinned, wait for its next run."
                   if cov.pending_rows else "")
        if cov.complete:
            message = (f"all {cov.rows - cov.pending_rows:,} rows the last run was to write hold "
                       f"written {'+'.join(columns)}.{pending}")
        else:
            message = (f"{cov.unwritten_rows - cov.pending_rows:,} of {cov.rows:,} rows have no "
                       f"written {'+'.join(columns)} (fragments {cov.unwritten_fragments[:20]}"
                       f"{' ...' if len(cov.unwritten_fragments) > 20 else ''}): a run was "
                       f"killed, a compaction merged them in, or rows were deleted next to "
                       f"them. Materialize `{name}` again (after `table_maintenance` where rows "
                       f"were deleted); it computes only those fragments.{pending}")
        return dg.AssetCheckResult(
            passed=cov.complete, severity=dg.AssetCheckSeverity.ERROR, description=message,
            metadata={"rows": cov.rows, "unwritten_rows": cov.unwritten_rows,
                      "pending_rows": cov.pending_rows,
                      "unwritten_fragments": dg.MetadataValue.json(cov.unwritten_fragments[:100]),
                      "write_markers": dg.MetadataValue.json(cov.markers)})

    return check
