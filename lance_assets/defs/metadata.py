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
import lance
import pyarrow as pa

from lance_assets.corpus.columns import ColumnWriteReport

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


def table_metadata(uri: str, duration_s: float, *, rows_processed: int,
                   columns: dg.TableSchema, derived_from: Lineage | None = None) -> dict:
    """The table after a write (rows, version, fragments), the ``columns`` the asset produced,
    what they were computed from, and the write's speed."""
    ds = lance.dataset(uri)
    out = {
        "dagster/row_count": ds.count_rows(),
        "dagster/column_schema": columns,
        "dagster/uri": uri,
        "lance/table_version": ds.version,
        "lance/fragments": len(ds.get_fragments()),
        "duration_s": round(duration_s, 3),
        "rows_per_s": round(rows_processed / duration_s, 1) if duration_s > 0 else 0.0,
    }
    if derived_from:
        out["dagster/column_lineage"] = lineage(derived_from)
    return out


def column_write_metadata(uri: str, report: ColumnWriteReport, columns: dg.TableSchema,
                          derived_from: Lineage) -> dict:
    """``table_metadata`` plus what a ``write_columns`` run did: fragments written now, already
    done before, rows written (``nothing_to_do`` on a re-run that found nothing missing)."""
    return {
        **table_metadata(uri, report.duration_s, rows_processed=report.rows_written,
                         columns=columns, derived_from=derived_from),
        "nothing_to_do": report.nothing_to_do,
        "fragments_written": len(report.fragments_written),
        "fragments_already_done": report.fragments_already_done,
        "rows_written": report.rows_written,
    }
