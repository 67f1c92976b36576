"""Exact duplicates on whitespace-normalised text: the ``is_dup`` column.

A document is a duplicate when an earlier document (smaller ``id``) has the same text after
runs of whitespace are collapsed to one space and the ends trimmed. First occurrences keep
``is_dup = false``; because ids only grow, values already written never change.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import duckdb
import lance
import numpy as np
import pyarrow as pa

from lance_assets import keys, paths
from lance_assets.corpus.columns import ColumnWriteReport, write_columns
from lance_assets.corpus.table import open_table

IS_DUP = pa.field(keys.IS_DUP, pa.bool_())
DESCRIPTIONS = {IS_DUP.name: "True when the whitespace-normalised text appeared at a smaller id."}
# RE2 (DuckDB) and Python agree on this explicit class; `\s` differs between them.
WHITESPACE_RUN = r"[ \t\n\r\f\v]+"
NORMALISED_HASH_SQL = f"md5(trim(regexp_replace(text, '{WHITESPACE_RUN}', ' ', 'g')))"


def normalise(text: str) -> str:
    """The Python twin of the SQL normalisation (used by tests and tools)."""
    import re

    return re.sub(WHITESPACE_RUN, " ", text).strip(" ")


def first_ids(ds: lance.LanceDataset) -> pa.Table:
    """``(h, first_id)``: the smallest id per normalised-text hash, over the whole table."""
    con = duckdb.connect()
    # DuckDB spills to disk past this, so the hash table never needs the corpus in memory.
    con.execute("SET memory_limit = '2GB'")
    con.register("corpus", ds)
    return con.sql(
        f"SELECT {NORMALISED_HASH_SQL} AS h, min(id) AS first_id FROM corpus GROUP BY h"
    ).to_arrow_table()


@dataclass(frozen=True)
class DupFlags:
    """``is_dup`` of one fragment: its rows joined with ``firsts`` on the normalised hash.
    Picklable (an Arrow table), so a Ray task can run it; shared through the object store."""

    firsts: pa.Table

    def __call__(self, frag) -> Iterator[pa.RecordBatch]:
        con = _connection(self.firsts)
        part = frag.to_table(columns=["id", "text"])
        part = part.append_column("pos", pa.array(np.arange(part.num_rows, dtype=np.int64)))
        con.register("part", part)
        out = con.sql(
            f"SELECT p.id > f.first_id AS is_dup FROM part p "
            f"JOIN firsts f ON f.h = {NORMALISED_HASH_SQL.replace('text', 'p.text')} "
            f"ORDER BY p.pos"
        ).to_arrow_table()
        con.unregister("part")
        yield from out.to_batches()


_CONNECTIONS: dict[int, duckdb.DuckDBPyConnection] = {}


def _connection(firsts: pa.Table) -> duckdb.DuckDBPyConnection:
    """One DuckDB connection per ``firsts`` table per process, holding it as a native table
    (scanned faster than Arrow for every fragment's join). Keyed by identity: the connection
    keeps ``firsts`` alive, so its id is not reused while the entry exists."""
    key = id(firsts)
    if key not in _CONNECTIONS:
        _CONNECTIONS.clear()  # a new run: drop the previous run's table
        con = duckdb.connect()
        con.execute("SET memory_limit = '2GB'")
        con.register("firsts_arrow", firsts)
        con.execute("CREATE TEMP TABLE firsts AS SELECT * FROM firsts_arrow")
        _CONNECTIONS[key] = con
    return _CONNECTIONS[key]


def dedup_flag(
    root: str | Path, *, fragments_per_commit: int = 4, executor: str | None = None,
    log: Callable[[str], None] = print,
) -> ColumnWriteReport:
    """Write ``is_dup`` for every fragment that lacks it."""
    uri = paths.table_uri(root)
    compute = DupFlags(first_ids(open_table(root)))
    return write_columns(uri, [IS_DUP], compute, fragments_per_commit=fragments_per_commit,
                         executor=executor, log=log)
