"""Add-only column writes, per fragment, checkpointed in groups.

A column group (e.g. ``input_ids`` + ``n_tokens``) is first added to the schema as all-null
(a metadata-only commit). Then, for every fragment whose data files do not yet hold the group,
the values are computed and written to a *new* data file, attached to the fragment with a
``DataReplacement`` commit. Existing data files (``text`` above all) are never rewritten, a
re-run computes only fragments that lack the group, and a kill loses at most the group of
fragments in flight.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Iterable

import lance
import pyarrow as pa
from lance.fragment import LanceFragment, write_fragments

# compute(fragment) -> batches holding exactly the group's columns, one row per fragment row
ComputeFn = Callable[[LanceFragment], Iterable[pa.RecordBatch]]


@dataclass
class ColumnWriteReport:
    columns: list[str]
    fragments_written: list[int] = field(default_factory=list)
    fragments_already_done: int = 0
    rows_written: int = 0
    commits: int = 0
    version: int = 0
    total_rows: int = 0
    duration_s: float = 0.0

    @property
    def nothing_to_do(self) -> bool:
        return not self.fragments_written


def ensure_columns(uri: str, fields: list[pa.Field]) -> lance.LanceDataset:
    """Add ``fields`` to the schema as all-null columns if missing (no data is written)."""
    ds = lance.dataset(uri)
    missing = []
    for f in fields:
        if f.name in ds.schema.names:
            existing = ds.schema.field(f.name).type
            if existing != f.type:
                raise ValueError(
                    f"Column {f.name!r} already exists in {uri} with type {existing}, not "
                    f"{f.type}. Write the new values to a new column name instead."
                )
        else:
            missing.append(f.with_nullable(True))
    if missing:
        ds.add_columns(pa.schema(missing))
        ds = lance.dataset(uri)
    return ds


def leaf_field_ids(ds: lance.LanceDataset, column: str) -> set[int]:
    """Ids of the leaf fields of ``column``: what a data file lists (a list's item, not the list)."""

    def leaves(f) -> set[int]:
        kids = f.children()
        return {f.id()} if not kids else set().union(*(leaves(k) for k in kids))

    return leaves(ds.lance_schema.field(column))


def fragments_missing(ds: lance.LanceDataset, columns: list[str]) -> list[LanceFragment]:
    """Fragments whose data files do not yet hold every one of ``columns``."""
    field_ids = set().union(*(leaf_field_ids(ds, c) for c in columns))
    todo = []
    for frag in ds.get_fragments():
        held = {fid for f in frag.metadata.data_files() for fid in f.fields}
        if not field_ids <= held:
            todo.append(frag)
    return todo


def write_columns(
    uri: str,
    fields: list[pa.Field],
    compute: ComputeFn,
    *,
    fragments_per_commit: int = 4,
    log: Callable[[str], None] = print,
) -> ColumnWriteReport:
    """Compute ``fields`` for every fragment that lacks them and commit in groups."""
    start = time.perf_counter()
    columns = [f.name for f in fields]
    ds = ensure_columns(uri, fields)
    schema = pa.schema([ds.schema.field(c) for c in columns])
    todo = fragments_missing(ds, columns)
    report = ColumnWriteReport(columns=columns)
    report.fragments_already_done = len(ds.get_fragments()) - len(todo)
    for i in range(0, len(todo), fragments_per_commit):
        group = todo[i : i + fragments_per_commit]
        replacements = []
        for frag in group:
            if frag.metadata.deletion_file is not None:
                raise ValueError(
                    f"Fragment {frag.fragment_id} of {uri} has deleted rows; column writes need "
                    "whole fragments. Compact the table (lance optimize.compact_files) first."
                )
            n_rows = frag.physical_rows
            batches = list(compute(frag))
            got = sum(b.num_rows for b in batches)
            if got != n_rows:
                raise RuntimeError(
                    f"computing {columns} for fragment {frag.fragment_id}: {got} values for "
                    f"{n_rows} rows"
                )
            reader = pa.RecordBatchReader.from_batches(
                schema, (b.select(columns).cast(schema) for b in batches)
            )
            new = write_fragments(reader, uri, schema=schema, max_rows_per_file=max(n_rows, 1))
            files = [f for m in new for f in m.data_files()]
            if len(files) != 1:
                raise RuntimeError(f"expected one data file for fragment {frag.fragment_id}")
            replacements.append(lance.LanceOperation.DataReplacementGroup(frag.fragment_id, files[0]))
            report.rows_written += n_rows
        ds = lance.LanceDataset.commit(
            uri, lance.LanceOperation.DataReplacement(replacements), read_version=ds.version
        )
        report.commits += 1
        report.fragments_written.extend(f.fragment_id for f in group)
        log(
            f"{'+'.join(columns)}: {len(report.fragments_written)}/{len(todo)} fragments "
            f"({report.rows_written} rows) committed at version {ds.version}"
        )
    report.version = ds.version
    report.total_rows = ds.count_rows()
    report.duration_s = time.perf_counter() - start
    return report
