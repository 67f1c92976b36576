"""Materialization metadata shared by the assets that write the corpus table: the table's state,
the columns the asset produces (each with its description) and the upstream columns they were
computed from.

An asset reports ``dagster/column_schema`` for exactly the columns it writes, not the whole
table, so the UI shows which asset owns which column. The descriptions are declared once in the
library, next to the columns' Arrow fields (``DESCRIPTIONS`` dicts), and the same
``column_schema`` is put on the asset definition so the UI lists the columns before the first
run.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import dagster as dg
import pyarrow as pa

from lance_assets.curation.profile import null_counts
from lance_assets.table import Table
from lance_assets.table.columns import ColumnWriteReport
from lance_assets.table.fingerprint import columns_fingerprint, digest, index_state

# {"is_dup": [("raw_text", "text")]}: a produced column -> the (asset, column) pairs it reads
Lineage = Mapping[str, list[tuple[str, str]]]


def column_schema(fields: Iterable[pa.Field], descriptions: Mapping[str, str]) -> dg.TableSchema:
    """The columns ``fields`` with their types and descriptions."""
    fields = list(fields)
    undescribed = [f.name for f in fields if not descriptions.get(f.name)]
    if undescribed:
        raise ValueError(f"columns {undescribed} have no description: add one to the DESCRIPTIONS "
                         "next to their Arrow fields in the library")
    return dg.TableSchema(columns=[
        dg.TableColumn(name=f.name, type=str(f.type), description=descriptions[f.name])
        for f in fields])


def lineage(derived: Lineage) -> dg.TableColumnLineage:
    """``{"is_dup": [("raw_text", "text")]}`` -> Dagster column lineage."""
    return dg.TableColumnLineage(deps_by_column={
        col: [dg.TableColumnDep(asset_key=dg.AssetKey(asset), column_name=src)
              for asset, src in deps]
        for col, deps in derived.items()
    })


def table_metadata(table: Table, duration_s: float, *, rows_processed: int,
                   columns: dg.TableSchema, derived_from: Lineage | None = None) -> dict:
    """The table after a write (rows, version, fragments), the ``columns`` the asset produced,
    what they were computed from, and the write's speed."""
    ds = table.newest()
    out = {
        "dagster/row_count": ds.count_rows(),
        "dagster/column_schema": columns,
        "dagster/uri": table.uri,
        "lance/table_version": ds.version,
        "lance/fragments": len(ds.get_fragments()),
        "duration_s": round(duration_s, 3),
        "rows_per_s": round(rows_processed / duration_s, 1) if duration_s > 0 else 0.0,
    }
    if derived_from:
        out["dagster/column_lineage"] = lineage(derived_from)
    return out


PINNED_VERSION = "lance/pinned_version"
PINNED_ROWS_END = "lance/pinned_rows_end"


def column_write_metadata(table: Table, report: ColumnWriteReport, columns: dg.TableSchema,
                          derived_from: Lineage) -> dict:
    """``table_metadata`` plus what a ``write_columns`` run did: fragments written now, already
    done before, rows written (``nothing_to_do`` on a re-run that found nothing missing), and
    the share of the table's rows where each of the asset's columns is null."""
    return {
        **table_metadata(table, report.duration_s, rows_processed=report.rows_written,
                         columns=columns, derived_from=derived_from),
        "nothing_to_do": report.nothing_to_do,
        "fragments_written": len(report.fragments_written),
        "fragments_already_done": report.fragments_already_done,
        "rows_written": report.rows_written,
        # the version whose rows this run wrote; rows from `pinned_rows_end` on came later
        PINNED_VERSION: report.pinned_version,
        PINNED_ROWS_END: report.pinned_rows_end,
        "fragments_pending": report.fragments_pending,
        "fragments_with_deletions": report.fragments_with_deletions,
        **null_share_metadata(table, [c.name for c in columns.columns]),
    }


def null_share_metadata(table: Table, columns: list[str]) -> dict[str, float]:
    """``null_share/<column>``: nulls / rows, a number Dagster plots across materializations
    (rows a writer has not reached yet count as null)."""
    ds = table.newest()
    rows = ds.count_rows()
    present = [c for c in columns if c in ds.schema.names]
    return {f"null_share/{c}": round(n / rows, 6) if rows else 0.0
            for c, n in null_counts(ds, present).items()}


# Data versions: what the UI's "stale" marks compare. An asset's data version names the Lance
# table version it wrote or read and a fingerprint of its own output in the table
# (``table/fingerprint.py``): "v12-3f9a2c1b0e11". A run that changed nothing reports the data
# version it had, even when other writers moved the table on since, so nothing downstream is
# marked stale (or re-run by automation) by a no-op.
DATA_VERSION_TAG = "dagster/data_version"  # where Dagster keeps a materialization's data version


def data_version(context: dg.AssetExecutionContext, version: int | None,
                 fingerprint: str) -> dg.DataVersion:
    """``v<version>-<fingerprint>``, or the previous materialization's data version when that
    one already had this fingerprint (on this instance; a fresh instance starts over)."""
    previous = context.instance.get_latest_materialization_event(context.asset_key)
    materialization = previous.asset_materialization if previous is not None else None
    seen = (materialization.tags or {}).get(DATA_VERSION_TAG, "") if materialization else ""
    if seen.endswith(f"-{fingerprint}"):
        return dg.DataVersion(seen)
    return dg.DataVersion(f"v{version}-{fingerprint}")


def column_data_version(context: dg.AssetExecutionContext, table: Table,
                        columns: dg.TableSchema | Iterable[str], salt: str = "") -> dg.DataVersion:
    """The data version of a column asset: the table version now and the data files that hold
    its ``columns`` (changed only by writes of these columns); ``salt``: the producer's version,
    so a new version of the code that wrote the same files is a new data version."""
    names = [c.name for c in columns.columns] if isinstance(columns, dg.TableSchema) else list(columns)
    ds = table.newest()
    fingerprint = columns_fingerprint(ds, names)
    return data_version(context, ds.version, digest([salt, fingerprint]) if salt else fingerprint)


def index_data_version(context: dg.AssetExecutionContext, table: Table,
                       index: str) -> dg.DataVersion:
    """The data version of an index asset: the table version the index was last updated at and
    its segments (a table without the index: the version read)."""
    ds = table.newest()
    updated_at, fp = index_state(ds, index)
    return data_version(context, updated_at if updated_at is not None else ds.version, fp)



def materialization_history(instance: dg.DagsterInstance, key: dg.AssetKey,
                            limit: int = 50) -> list[dict]:
    """The metadata values of ``key``'s latest ``limit`` materializations on this instance,
    newest first: what checks compare a new result with."""
    records = instance.fetch_materializations(key, limit=limit).records
    return [{k: v.value for k, v in r.asset_materialization.metadata.items()}
            for r in records if r.asset_materialization is not None]
