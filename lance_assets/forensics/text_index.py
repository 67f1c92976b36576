"""The full-text (BM25) index on ``text``: Lance's inverted index, kept current as rows arrive.

The first run builds the index over the whole table; later runs add only the fragments appended
since (``optimize_indices``), so an ingest of new rows costs an index update, not a rebuild.
Column writes (``is_dup``, signals, tokens) replace other columns' data files and leave the
index's coverage of ``text`` intact.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import lance
import pyarrow as pa

from lance_assets.progress import phase
from lance_assets.table import Table

INDEX_NAME = "text_fts"


@dataclass
class TextIndexReport:
    action: str  # "created", "updated" or "up_to_date"
    indexed_rows: int
    unindexed_rows: int
    version: int
    duration_s: float

    @property
    def nothing_to_do(self) -> bool:
        return self.action == "up_to_date"


def _stats(ds: lance.LanceDataset) -> dict | None:
    if INDEX_NAME not in {i.name for i in ds.describe_indices()}:
        return None
    return ds.stats.index_stats(INDEX_NAME)


def text_index(table: Table,
               log: Callable[[str], None] | None = None) -> TextIndexReport:
    """Create the inverted index on ``text``, or add the rows appended since it was built. ``log``:
    progress lines while it builds."""
    start = time.perf_counter()
    ds = table.newest()
    stats = _stats(ds)
    if stats is None:
        with phase(f"text_index: building the full-text index of {ds.count_rows():,} rows", log):
            table.commit("text index", lambda ds: ds.create_scalar_index(
                "text", "INVERTED", name=INDEX_NAME, replace=True))
        action = "created"
    elif stats["num_unindexed_rows"] > 0:
        with phase(f"text_index: adding {stats['num_unindexed_rows']:,} rows to the full-text "
                   "index", log):
            table.commit("text index update", lambda ds: ds.optimize.optimize_indices(
                index_names=[INDEX_NAME]))
        action = "updated"
    else:
        action = "up_to_date"
    ds = table.newest()
    stats = ds.stats.index_stats(INDEX_NAME)
    return TextIndexReport(
        action=action, indexed_rows=stats["num_indexed_rows"],
        unindexed_rows=stats["num_unindexed_rows"],
        version=ds.version, duration_s=time.perf_counter() - start,
    )


def search(table: Table, query: str, *, filter: str | None = None,
           limit: int = 10, columns: tuple[str, ...] = ("id", "url", "text")) -> pa.Table:
    """The ``limit`` best BM25 matches for ``query`` (with ``_score``), optionally only among
    rows passing ``filter`` (e.g. the training filter)."""
    from lance_assets.curation.predicate import safe_predicate

    ds = table.newest()
    if filter is not None:
        filter = safe_predicate(filter, ds.schema.names).lance
    return ds.to_table(full_text_query=query, columns=list(columns), filter=filter,
                       prefilter=filter is not None, limit=limit)
