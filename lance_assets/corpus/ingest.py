"""Append a source's documents to the corpus table: one Lance append commit per source unit.

The ``source`` column carries the unit's key, so what has been ingested is read back from the
table itself (atomically committed with the rows): re-running with the same source adds nothing.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

import duckdb
import lance
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from lance_assets import paths
from lance_assets.corpus.sources import SkipCounter, SourceUnit, resolve
from lance_assets.corpus.table import RAW_SCHEMA

DEFAULT_ROWS_PER_FRAGMENT = 4096


@dataclass
class IngestReport:
    units_ingested: list[str] = field(default_factory=list)
    units_already_present: list[str] = field(default_factory=list)
    rows_added: int = 0
    bytes_added: int = 0
    rows_skipped: dict[str, int] = field(default_factory=dict)
    fragments_added: int = 0
    total_rows: int = 0
    version: int = 0
    duration_s: float = 0.0

    @property
    def nothing_new(self) -> bool:
        return not self.units_ingested


def _table_state(uri: str) -> tuple[int, set[str], int]:
    """(next id, source keys already ingested, fragment count) of the table at ``uri``."""
    if not Path(uri).exists():
        return 0, set(), 0
    ds = lance.dataset(uri)
    con = duckdb.connect()
    con.register("corpus", ds)
    max_id = con.execute("SELECT max(id) FROM corpus").fetchone()[0]
    keys = {row[0] for row in con.execute("SELECT DISTINCT source FROM corpus").fetchall()}
    return (-1 if max_id is None else max_id) + 1, keys, len(ds.get_fragments())


def _normalise(batch: pa.RecordBatch, key: str, first_id: int, skipped: SkipCounter) -> pa.RecordBatch:
    """Drop null / blank texts (counted) and lay the batch out in ``RAW_SCHEMA``."""
    text = batch.column("text")
    if pa.types.is_large_string(text.type):
        text = pc.cast(text, pa.string())
    null = pc.is_null(text)
    blank = pc.and_(pc.invert(null), pc.equal(pc.utf8_length(pc.utf8_trim_whitespace(text)), 0))
    skipped.add("null_text", pc.sum(null).as_py() or 0)
    skipped.add("empty_text", pc.sum(blank).as_py() or 0)
    keep = pc.invert(pc.or_(null, blank))
    batch = batch.filter(keep)
    text = pc.cast(batch.column("text"), pa.string())
    n = batch.num_rows

    def col(name: str, typ: pa.DataType) -> pa.Array:
        if name in batch.schema.names:
            return pc.cast(batch.column(name), typ)
        return pa.nulls(n, typ)

    return pa.RecordBatch.from_arrays(
        [
            pa.array(np.arange(first_id, first_id + n, dtype=np.int64)),
            col("doc_id", pa.string()),
            col("url", pa.string()),
            pa.array([key] * n, pa.string()),
            col("score", pa.float64()),
            pc.cast(pc.utf8_length(text), pa.int32()),
            text,
        ],
        schema=RAW_SCHEMA,
    )


def ingest(
    root: str | Path,
    source: str,
    *,
    text_column: str = "text",
    rows_per_fragment: int = DEFAULT_ROWS_PER_FRAGMENT,
    log: Callable[[str], None] = print,
) -> IngestReport:
    """Append every not-yet-ingested unit of ``source`` to the corpus table under ``root``."""
    start = time.perf_counter()
    uri = paths.table_uri(root)
    Path(uri).parent.mkdir(parents=True, exist_ok=True)
    units = resolve(source, text_column)  # validates every file first: a bad one writes nothing
    next_id, present, fragments_before = _table_state(uri)
    report = IngestReport()
    skipped = SkipCounter()
    for unit in units:
        if unit.key in present:
            report.units_already_present.append(unit.key)
            continue
        counter = {"rows": 0, "bytes": 0}

        def batches(unit: SourceUnit = unit) -> Iterator[pa.RecordBatch]:
            for raw in unit.read(skipped):
                out = _normalise(raw, unit.key, next_id + counter["rows"], skipped)
                counter["rows"] += out.num_rows
                counter["bytes"] += out.column("text").nbytes
                if out.num_rows:
                    yield out

        reader = pa.RecordBatchReader.from_batches(RAW_SCHEMA, batches())
        if Path(uri).exists():
            lance.write_dataset(reader, uri, mode="append", max_rows_per_file=rows_per_fragment)
        else:
            lance.write_dataset(
                reader, uri, mode="create", max_rows_per_file=rows_per_fragment,
                enable_stable_row_ids=True,
            )
        next_id += counter["rows"]
        report.units_ingested.append(unit.key)
        report.rows_added += counter["rows"]
        report.bytes_added += counter["bytes"]
        log(f"ingested {unit.key}: {counter['rows']} rows")
    report.rows_skipped = dict(skipped.counts)
    if Path(uri).exists():
        ds = lance.dataset(uri)
        report.total_rows = ds.count_rows()
        report.version = ds.version
        report.fragments_added = len(ds.get_fragments()) - fragments_before
    report.duration_s = time.perf_counter() - start
    return report
