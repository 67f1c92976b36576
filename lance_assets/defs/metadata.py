"""Materialization metadata shared by the column assets."""

from __future__ import annotations

import dagster as dg
import lance
import pyarrow as pa

from lance_assets.markdown import table


def column_schema(schema: pa.Schema) -> dg.TableSchema:
    return dg.TableSchema(columns=[dg.TableColumn(name=f.name, type=str(f.type)) for f in schema])


def lineage(derived: dict[str, list[tuple[str, str]]]) -> dg.TableColumnLineage:
    """``{"is_dup": [("raw_text", "text")]}`` -> Dagster column lineage."""
    return dg.TableColumnLineage(deps_by_column={
        col: [dg.TableColumnDep(asset_key=dg.AssetKey(asset), column_name=src) for asset, src in deps]
        for col, deps in derived.items()
    })


def table_metadata(uri: str, duration_s: float, *, rows_processed: int) -> dict:
    ds = lance.dataset(uri)
    return {
        "dagster/row_count": ds.count_rows(),
        "dagster/column_schema": column_schema(ds.schema),
        "dagster/uri": uri,
        "lance/table_version": ds.version,
        "lance/fragments": len(ds.get_fragments()),
        "duration_s": round(duration_s, 3),
        "rows_per_s": round(rows_processed / duration_s, 1) if duration_s > 0 else 0.0,
    }


markdown_table = table  # shared with the library's reports
