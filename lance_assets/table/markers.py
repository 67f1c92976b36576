"""Write markers: which rows of a column group hold written values, judged by value.

Every group carries a *write marker*, a bool column (``_written_<first column>``) added with the
group and written as true in the same data file as the group's values. A row whose marker is
null was never written by us, whatever the data files look like: Lance's compaction
(``compact_files``, lancedb's ``optimize``) merges fragments into new data files that list every
column and store nulls for the values not written yet, and those rows keep a null marker. A
fragment with such a row counts as missing (``fragments_missing``), and the next run computes it
again (values are deterministic, so the rows already written get the same values). So no
unwritten value can become a stored null unnoticed: ``unwritten_rows`` counts them (the
coverage checks), and the writer refills them. Columns written before markers existed are judged
by the data files that hold them, and adopted (marked) when a write finds them.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass

import lance
import numpy as np
import pyarrow as pa
from lance.fragment import LanceFragment

from lance_assets.table import Table, leaf_field_ids

WRITTEN_PREFIX = "_written_"
WRITTEN_KEY = "lance_assets.written"  # the marker field's metadata: its group's columns (JSON)


def written_marker(fields: list[pa.Field]) -> pa.Field:
    """The write marker of the group ``fields`` (named after its first column)."""
    columns = [f.name for f in fields]
    return pa.field(WRITTEN_PREFIX + columns[0], pa.bool_(),
                    metadata={WRITTEN_KEY: json.dumps(columns)})


def is_written_marker(name: str) -> bool:
    return name.startswith(WRITTEN_PREFIX)


def marker_groups(ds: lance.LanceDataset) -> dict[str, list[str]]:
    """``{marker column: the columns of its group}`` for every write marker in the schema."""
    out = {}
    for f in ds.schema:
        meta = f.metadata or {}
        if is_written_marker(f.name) and WRITTEN_KEY.encode() in meta:
            out[f.name] = json.loads(meta[WRITTEN_KEY.encode()])
    return out


def markers_for(ds: lance.LanceDataset, columns: list[str]) -> tuple[list[str], list[str]]:
    """(the markers vouching for ``columns``, the columns no marker covers: written before
    markers existed, or not by ``write_columns``)."""
    groups = marker_groups(ds)
    markers, bare = [], []
    for c in columns:
        marker = next((m for m, group in groups.items() if c in group), None)
        if marker is None:
            bare.append(c)
        elif marker not in markers:
            markers.append(marker)
    return markers, bare


def ensure_columns(table: Table, fields: list[pa.Field]) -> lance.LanceDataset:
    """Add ``fields`` and their write marker to the schema as all-null columns if missing (no
    data is written). A marker whose group lost a column (dropped, e.g. to recompute it) no
    longer vouches for the group: it is dropped and added again, all null."""
    uri = table.uri
    marker = written_marker(fields)

    def attempt(ds: lance.LanceDataset) -> lance.LanceDataset:
        wanted = [f.name for f in fields]
        for other, group in marker_groups(ds).items():
            shared = [c for c in wanted if c in group]
            if shared and group != wanted and all(c in ds.schema.names for c in group):
                # its data files hold these columns together with others: a file of this group
                # could replace none of them (and its marker would vouch for the wrong group)
                raise ValueError(
                    f"Column(s) {shared} of {uri} were written as part of the group {group} "
                    f"(marker {other!r}), not as {wanted}. Write a group with the same columns "
                    "every time, or write the new values under new column names.")
        for f in fields:
            if f.name in ds.schema.names:
                existing = ds.schema.field(f.name).type
                if existing != f.type:
                    raise ValueError(
                        f"Column {f.name!r} already exists in {uri} with type {existing}, not "
                        f"{f.type}. Write the new values to a new column name instead."
                    )
        if marker.name in ds.schema.names and (
                any(f.name not in ds.schema.names for f in fields)
                or marker_groups(ds).get(marker.name) != [f.name for f in fields]):
            ds.drop_columns([marker.name])
            ds = table.newest()
        missing = [f.with_nullable(True) for f in [*fields, marker]
                   if f.name not in ds.schema.names]
        if missing:
            ds.add_columns(pa.schema(missing))
            ds = table.newest()
        return ds

    table.commit(f"add columns {[f.name for f in fields]}", attempt)
    return table.commit(f"mark {marker.name}", lambda ds: _adopt_unmarked(table, ds, fields, marker))


def _adopt_unmarked(table: Table, ds: lance.LanceDataset, fields: list[pa.Field],
                    marker: pa.Field) -> lance.LanceDataset:
    """Mark as written the fragments whose group a ``write_columns`` from before write markers
    wrote: the group's values sit in data files of their own (a rewrite would have merged them
    with other columns, and those fragments are computed again instead). Only a marker file is
    written for them, so a table from before markers is not recomputed."""
    group_ids = set().union(*(leaf_field_ids(ds, f.name) for f in fields))
    marker_ids = leaf_field_ids(ds, marker.name)
    schema = pa.schema([ds.schema.field(marker.name)])
    groups = []
    for frag in ds.get_fragments():
        files = [{i for i in f.fields if i >= 0} for f in frag.metadata.data_files()]
        if any(marker_ids & f for f in files):
            continue
        holding = [f for f in files if group_ids & f]
        if not holding or not group_ids <= set().union(*holding) \
                or any(not f <= group_ids for f in holding):
            continue
        n = frag.physical_rows
        new = table.write_fragments(pa.table([pa.array(np.ones(n, dtype=bool))], schema=schema),
                                    schema, max_rows_per_file=max(n, 1))
        groups.append(lance.LanceOperation.DataReplacementGroup(
            frag.fragment_id, new[0].data_files()[0]))
    if not groups:
        return ds
    return table.commit_operation(lance.LanceOperation.DataReplacement(groups), ds.version)


def fragments_without_fields(frags: list[LanceFragment], field_ids: set[int]) -> set[int]:
    out = set()
    for frag in frags:
        held = {fid for f in frag.metadata.data_files() for fid in f.fields}
        if not field_ids <= held:
            out.add(frag.fragment_id)
    return out


def _fragments_with_null(ds: lance.LanceDataset, frags: list[LanceFragment],
                         markers: list[str]) -> dict[int, int]:
    """``{fragment id: rows}`` of the rows in ``frags`` whose markers are null.

    Read from the metadata where it decides: a fragment with no data file holding a marker was
    never written; a marker in a data file holding exactly its group (how ``write_columns``
    writes it, true on every row) is written. Only a marker in a data file that a rewrite
    merged with other columns is read, to find its nulls."""
    if not frags or not markers:
        return {}
    groups = marker_groups(ds)
    marker_ids = {m: leaf_field_ids(ds, m) for m in markers}
    own_file = {m: marker_ids[m].union(*(leaf_field_ids(ds, c) for c in groups.get(m, [])))
                for m in markers}
    out: dict[int, int] = {}
    to_scan: dict[tuple[str, ...], list[LanceFragment]] = {}
    for frag in frags:
        files = [{i for i in f.fields if i >= 0} for f in frag.metadata.data_files()]
        scan = []
        for m in markers:
            holding = [f for f in files if marker_ids[m] & f]
            if not holding:
                out[frag.fragment_id] = frag.count_rows()
                break
            if any(f != own_file[m] for f in holding):
                scan.append(m)
        else:
            if scan:
                to_scan.setdefault(tuple(scan), []).append(frag)
    for scan_markers, scan_frags in to_scan.items():
        where = " OR ".join(f"`{m}` IS NULL" for m in scan_markers)
        scanner = ds.scanner(columns=list(scan_markers[:1]), filter=where, fragments=scan_frags,
                             with_row_address=True)
        for batch in scanner.to_batches():
            frag_ids, counts = np.unique(
                batch.column("_rowaddr").to_numpy(zero_copy_only=False) >> 32,
                return_counts=True)
            for fid, n in zip(frag_ids.tolist(), counts.tolist()):
                out[fid] = out.get(fid, 0) + n
    return out


def fragments_missing(ds: lance.LanceDataset, columns: list[str],
                      among: Iterable[int] | None = None) -> list[LanceFragment]:
    """Fragments (of ``among``, default all) with a row whose ``columns`` were not written:
    its write marker is null. Columns without a marker (written before markers existed) are
    missing where no data file of the fragment holds them."""
    frags = ds.get_fragments()
    if among is not None:
        wanted = set(among)
        frags = [f for f in frags if f.fragment_id in wanted]
    markers, bare = markers_for(ds, columns)
    todo = set(_fragments_with_null(ds, frags, markers))
    if bare:
        field_ids = set().union(*(leaf_field_ids(ds, c) for c in bare))
        todo |= fragments_without_fields(frags, field_ids)
    return [f for f in frags if f.fragment_id in todo]


def incomplete_fragments(ds: lance.LanceDataset) -> set[int]:
    """Fragments where a column group is unwritten on some row (a write marker is null)."""
    return set(_fragments_with_null(ds, ds.get_fragments(), list(marker_groups(ds))))


@dataclass
class Coverage:
    """How many rows of the table hold written values of some columns."""

    columns: list[str]
    rows: int
    unwritten_rows: int
    unwritten_fragments: list[int]
    markers: list[str]
    pending_rows: int = 0  # of the unwritten rows, those appended after the writer's pin

    @property
    def complete(self) -> bool:
        """Every row the writer was asked to write is written (pending rows aside)."""
        return self.unwritten_rows - self.pending_rows == 0


def unwritten_rows(ds: lance.LanceDataset, columns: list[str],
                   rows_end: int | None = None) -> Coverage:
    """The rows whose ``columns`` were never written (whatever the data files store there).

    ``rows_end``: where the version the last writer pinned ended (``ColumnWriteReport.
    pinned_rows_end``); unwritten rows with ids from there on arrived after that pin and are
    counted as ``pending_rows``, for the next run, not as a failure of the last one."""
    rows = ds.count_rows()
    missing_cols = [c for c in columns if c not in ds.schema.names]
    if missing_cols:
        return Coverage(columns, rows, rows, [f.fragment_id for f in ds.get_fragments()], [])
    markers, bare = markers_for(ds, columns)
    frags = ds.get_fragments()
    counts = _fragments_with_null(ds, frags, markers)
    if bare:
        field_ids = set().union(*(leaf_field_ids(ds, c) for c in bare))
        for frag in frags:
            if frag.fragment_id in fragments_without_fields([frag], field_ids):
                counts[frag.fragment_id] = frag.count_rows()
    pending = 0
    if rows_end is not None and counts:
        unwritten = [f for f in frags if f.fragment_id in counts]
        nulls = " OR ".join(f"`{m}` IS NULL" for m in markers) if markers and not bare else "true"
        pending = ds.scanner(columns=["id"], fragments=unwritten,
                             filter=f"({nulls}) AND id >= {int(rows_end)}").count_rows()
    return Coverage(columns, rows, sum(counts.values()), sorted(counts), markers, pending)

