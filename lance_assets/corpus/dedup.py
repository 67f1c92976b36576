"""Exact duplicates on whitespace-normalised text: the ``is_dup`` column.

A document is a duplicate when an earlier document (smaller ``id``) has the same text after
runs of whitespace are collapsed to one space and the ends trimmed. First occurrences keep
``is_dup = false``; because ids only grow, values already written never change.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Iterator

import duckdb
import lance
import numpy as np
import pyarrow as pa

from lance_assets import keys, paths
from lance_assets.corpus.columns import ColumnWriteReport, write_columns

IS_DUP = pa.field(keys.IS_DUP, pa.bool_())
DESCRIPTIONS = {IS_DUP.name: "True when the whitespace-normalised text appeared at a smaller id."}
# RE2 (DuckDB) and Python agree on this explicit class; `\s` differs between them.
WHITESPACE_RUN = r"[ \t\n\r\f\v]+"
NORMALISED_HASH_SQL = f"md5(trim(regexp_replace(text, '{WHITESPACE_RUN}', ' ', 'g')))"


def normalise(text: str) -> str:
    """The Python twin of the SQL normalisation (used by tests and tools)."""
    import re

    return re.sub(WHITESPACE_RUN, " ", text).strip(" ")


def _first_ids(con: duckdb.DuckDBPyConnection, ds: lance.LanceDataset) -> None:
    """Materialise ``firsts(h, first_id)``: the smallest id per normalised-text hash."""
    con.register("corpus", ds)
    con.execute(
        f"CREATE OR REPLACE TEMP TABLE firsts AS "
        f"SELECT {NORMALISED_HASH_SQL} AS h, min(id) AS first_id FROM corpus GROUP BY h"
    )


def dedup_flag(
    root: str | Path, *, fragments_per_commit: int = 4, log: Callable[[str], None] = print
) -> ColumnWriteReport:
    """Write ``is_dup`` for every fragment that lacks it."""
    uri = paths.table_uri(root)
    ds = lance.dataset(uri)
    con = duckdb.connect()
    # DuckDB spills to disk past this, so the hash table never needs the corpus in memory.
    con.execute("SET memory_limit = '2GB'")
    _first_ids(con, ds)

    def compute(frag) -> Iterator[pa.RecordBatch]:
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

    return write_columns(uri, [IS_DUP], compute, fragments_per_commit=fragments_per_commit, log=log)
