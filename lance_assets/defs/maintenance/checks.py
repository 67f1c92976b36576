"""``columns_written``: one blocking check per column asset (``COLUMN_ASSETS`` in
``defs/common.py``): every row of the table holds written values of the columns the asset
declares, judged by the write markers (``corpus.columns``), so it holds whatever rewrote the
table since. When it fails, nothing downstream of that asset runs in that run (training
included), and the message says which fragments to fill: materialize the asset again."""

from collections.abc import Iterable

import dagster as dg

from lance_assets.corpus import quality_model
from lance_assets.corpus.columns import unwritten_rows
from lance_assets.defs.common import COLUMN_ASSETS, QUALITY_SCORE
from lance_assets.defs.conditions import CHECK_ON_ASSET_UPDATE
from lance_assets.defs.resources import LanceStore

CHECK_NAME = "columns_written"
# Column assets that may rightly write nothing on some tables: the reason, or None when the
# columns are expected (a corpus without labels trains no quality model).
NOT_COMPUTED = {QUALITY_SCORE: quality_model.not_computed}


def declared_columns(asset: dg.AssetsDefinition) -> list[str]:
    """The columns an asset declares in its ``dagster/column_schema``."""
    value = asset.specs_by_key[asset.key].metadata.get("dagster/column_schema")
    schema = getattr(value, "schema", value)
    if schema is None:
        raise ValueError(f"{asset.key.to_user_string()} declares no dagster/column_schema: a "
                         "column asset lists the columns it writes (defs/metadata.column_schema)")
    return [c.name for c in schema.columns]


def coverage_check(asset: dg.AssetsDefinition) -> dg.AssetChecksDefinition:
    columns = declared_columns(asset)
    name = asset.key.to_user_string()

    @dg.asset_check(asset=asset.key, name=CHECK_NAME, blocking=True,
                    automation_condition=CHECK_ON_ASSET_UPDATE,
                    description=f"Every row holds written values of {', '.join(columns)} (none "
                                "left unwritten by a killed run, a concurrent compaction, or "
                                "rows ingested since).")
    def check(lance_store: LanceStore) -> dg.AssetCheckResult:
        ds = lance_store.table.newest()
        why_not = NOT_COMPUTED[asset.key](ds) if asset.key in NOT_COMPUTED else None
        if why_not:
            return dg.AssetCheckResult(passed=True, description=f"not expected: {why_not}",
                                       metadata={"rows": ds.count_rows(), "computed": False})
        cov = unwritten_rows(ds, columns)
        if cov.complete:
            message = f"all {cov.rows:,} rows hold written {'+'.join(columns)}"
        else:
            message = (f"{cov.unwritten_rows:,} of {cov.rows:,} rows have no written "
                       f"{'+'.join(columns)} (fragments {cov.unwritten_fragments[:20]}"
                       f"{' ...' if len(cov.unwritten_fragments) > 20 else ''}): a run was "
                       f"killed, a compaction merged them in, or rows were ingested since. "
                       f"Materialize `{name}` again; it computes only those fragments.")
        return dg.AssetCheckResult(
            passed=cov.complete, severity=dg.AssetCheckSeverity.ERROR, description=message,
            metadata={"rows": cov.rows, "unwritten_rows": cov.unwritten_rows,
                      "unwritten_fragments": dg.MetadataValue.json(cov.unwritten_fragments[:100]),
                      "write_markers": dg.MetadataValue.json(cov.markers)})

    return check


def coverage_checks(assets: Iterable[dg.AssetsDefinition]) -> list[dg.AssetChecksDefinition]:
    """A ``columns_written`` check for every asset of ``assets`` listed in ``COLUMN_ASSETS``."""
    by_key = {a.key: a for a in assets}
    missing = [k.to_user_string() for k in COLUMN_ASSETS if k not in by_key]
    if missing:
        raise ValueError(f"COLUMN_ASSETS names {missing}, which are not among the definitions' "
                         "assets: register the asset in lance_assets/definitions.py")
    return [coverage_check(by_key[k]) for k in COLUMN_ASSETS]
