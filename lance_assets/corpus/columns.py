"""Add-only column writes, per fragment, checkpointed in groups.

A column group (e.g. ``input_ids`` + ``n_tokens``) is first added to the schema as all-null
(a metadata-only commit). Then, for every fragment whose data files do not yet hold the group,
the values are computed and written to a *new* data file, attached to the fragment with a
``DataReplacement`` commit. Existing data files (``text`` above all) are never rewritten, a
re-run computes only fragments that lack the group, and a kill loses at most the group of
fragments in flight.

Concurrent writers are expected (other column assets, a second run of this one, another
Dagster instance). Every commit goes through ``commit_retrying``: when a concurrent write wins
the race, the group is rebased on the newest version. Fragments that meanwhile got the group
from another writer are dropped from the commit (their values are equal: every column is a
deterministic function of the table), and a fragment whose columns were dropped and re-added
under new field ids is computed again.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Iterable

import lance
import pyarrow as pa
from lance.fragment import LanceFragment, write_fragments

from lance_assets.corpus.table import commit_retrying, leaf_field_ids

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

    def attempt() -> lance.LanceDataset:
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

    return commit_retrying(f"add columns {[f.name for f in fields]}", attempt)


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
        written: dict[int, tuple[lance.fragment.DataFile, int]] = {}
        for frag in group:
            written[frag.fragment_id] = (_write_fragment_columns(uri, frag, schema, columns,
                                                                 compute), frag.physical_rows)
        ds, committed = _commit_group(uri, columns, schema, compute, written, log)
        report.commits += int(bool(committed))
        report.fragments_written.extend(committed)
        report.rows_written += sum(written[f][1] for f in committed if f in written)
        report.fragments_already_done += len(group) - len(committed)
        log(
            f"{'+'.join(columns)}: {i + len(group)}/{len(todo)} fragments "
            f"({report.rows_written} rows) committed at version {ds.version}"
        )
    report.version = ds.version
    report.total_rows = ds.count_rows()
    report.duration_s = time.perf_counter() - start
    return report


def _write_fragment_columns(uri: str, frag: LanceFragment, schema: pa.Schema, columns: list[str],
                            compute: ComputeFn) -> "lance.fragment.DataFile":
    """Compute the group for ``frag`` into one new (uncommitted) data file."""
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
            f"computing {columns} for fragment {frag.fragment_id}: {got} values for {n_rows} rows"
        )
    reader = pa.RecordBatchReader.from_batches(
        schema, (b.select(columns).cast(schema) for b in batches)
    )
    new = write_fragments(reader, uri, schema=schema, max_rows_per_file=max(n_rows, 1))
    files = [f for m in new for f in m.data_files()]
    if len(files) != 1:
        raise RuntimeError(f"expected one data file for fragment {frag.fragment_id}")
    return files[0]


def _commit_group(uri: str, columns: list[str], schema: pa.Schema, compute: ComputeFn,
                  written: dict, log: Callable[[str], None]) -> tuple[lance.LanceDataset, list[int]]:
    """Attach the written files with one ``DataReplacement`` commit, rebased on the newest
    version each attempt; returns the dataset and the fragments this commit filled."""

    def attempt() -> tuple[lance.LanceDataset, list[int]]:
        ds = lance.dataset(uri)
        want_ids = sorted(set().union(*(leaf_field_ids(ds, c) for c in columns)))
        live = {f.fragment_id: f for f in ds.get_fragments()}
        still_missing = {f.fragment_id for f in fragments_missing(ds, columns)}
        groups, filled = [], []
        for frag_id, (data_file, n_rows) in written.items():
            frag = live.get(frag_id)
            if frag is None or frag_id not in still_missing:
                continue  # gone, or filled meanwhile by a concurrent writer
            if frag.physical_rows != n_rows or frag.metadata.deletion_file is not None:
                raise RuntimeError(f"fragment {frag_id} of {uri} changed while {columns} were "
                                   "computed for it; run the asset again")
            if sorted(data_file.fields) != want_ids:
                # the columns were dropped and added again (new field ids): recompute
                data_file = _write_fragment_columns(uri, frag, schema, columns, compute)
                written[frag_id] = (data_file, n_rows)
            groups.append(lance.LanceOperation.DataReplacementGroup(frag_id, data_file))
            filled.append(frag_id)
        if not groups:
            return ds, []
        ds = lance.LanceDataset.commit(uri, lance.LanceOperation.DataReplacement(groups),
                                       read_version=ds.version)
        return ds, filled

    return commit_retrying(f"{'+'.join(columns)} commit", attempt, log=log)
