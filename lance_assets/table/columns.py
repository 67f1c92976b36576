"""Add-only column writes, per fragment, checkpointed in groups of fragments.

A column group (e.g. ``input_ids`` + ``n_tokens``) is first added to the schema as all-null with
its write marker (a metadata-only commit; ``markers.py``). Then, for every fragment of the
pinned version whose rows do not all hold the group, the values are computed into a *new* data
file (``fragment_tasks.py``: here, or as Ray tasks) and attached to the fragment with a
``DataReplacement`` commit. Existing data files (``text`` above all) are never rewritten, a
rerun computes only fragments that lack the group, and a kill loses at most the fragments
computed since the last commit: a fixed number of fragments when the caller asks for one, else
batched by time and size (:class:`CommitPolicy`), so commits stay a small share of the run
however large the manifest grows.

Concurrent writers are expected (other column assets, a second run of this one, another Dagster
instance). Every commit goes through ``Table.commit``: when a concurrent write wins the race,
the group is rebased on the newest version. Fragments that meanwhile got the group from another
writer are dropped from the commit (their values are equal: every column is a deterministic
function of the table), and a fragment whose columns were dropped and re-added under new field
ids is computed again. A task that fails does not stop the others: their fragments are
committed and the write then fails naming the fragments that are left.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field

import lance
import pyarrow as pa
import pyarrow.compute as pc

from lance_assets.progress import phase, progress
from lance_assets.table import Table, leaf_field_ids
from lance_assets.table import executor as executors
from lance_assets.table.fragment_tasks import (
    ComputeFn,
    Staged,
    live_offsets,
    local_results,
    ray_results,
    rewritten_since,
    rows_still_live,
    spread,
    write_fragment_columns,
)
from lance_assets.table.markers import (
    Coverage,
    ensure_columns,
    fragments_missing,
    fragments_without_fields,
    incomplete_fragments,
    is_written_marker,
    marker_groups,
    markers_for,
    unwritten_rows,
    written_marker,
)

# what callers import from here: the write, and the markers and computes it is made of
__all__ = ["ColumnWriteReport", "CommitPolicy", "ComputeFn", "Coverage", "FragmentsFailedError",
           "Staged", "ensure_columns", "fragments_missing", "fragments_without_fields",
           "incomplete_fragments", "is_written_marker", "live_offsets", "marker_groups",
           "markers_for", "pinned_rows_end", "rows_still_live", "spread", "unwritten_rows",
           "write_columns", "written_marker"]


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
    pinned_version: int = 0  # the version whose rows (and table-wide state) this write used
    pinned_rows_end: int = 0  # rows with ids from here on arrived after the pin: pending
    fragments_pending: int = 0  # fragments without the group that are not the pinned version's
    fragments_with_deletions: int = 0  # written like the others: deleted rows hold nulls

    @property
    def nothing_to_do(self) -> bool:
        return not self.fragments_written



@dataclass
class CommitPolicy:
    """When the fragments computed since the last commit (the *group*) are committed.

    A fixed ``fragments`` count commits every that many fragments (what tests and callers that
    want a fixed checkpoint ask for). Unset, groups are batched by time and size: a group is
    committed once ``min_seconds`` of work have passed since the last commit *and* at least
    ``overhead_factor`` times that commit's own duration (every commit rewrites the manifest,
    which grows with the table, so this keeps commits under ~1/overhead_factor of the run),
    but never later than ``max_seconds``, or once it holds ``max_fragments``. So a kill loses
    at most one group: ``max(min_seconds, overhead_factor x last commit)`` of work, capped at
    ``max_seconds`` and ``max_fragments`` fragments."""

    fragments: int | None = None
    min_seconds: float = 2.0
    max_seconds: float = 120.0
    overhead_factor: float = 20.0
    max_fragments: int = 4096
    last_commit_s: float = 0.0
    last_commit_end: float = field(default_factory=time.perf_counter)

    def due(self, pending: int, now: float | None = None) -> bool:
        if pending == 0:
            return False
        if self.fragments is not None:
            return pending >= self.fragments
        since = (time.perf_counter() if now is None else now) - self.last_commit_end
        wait = min(self.max_seconds, max(self.min_seconds, self.overhead_factor * self.last_commit_s))
        return since >= wait or pending >= self.max_fragments

    def committed(self, started: float) -> None:
        self.last_commit_end = time.perf_counter()
        self.last_commit_s = self.last_commit_end - started


class FragmentsFailedError(RuntimeError):
    """Some fragments could not be computed; every other fragment was committed."""

    def __init__(self, uri: str, columns: list[str], failures: dict[int, BaseException],
                 report: ColumnWriteReport) -> None:
        self.failures, self.report = failures, report
        lines = "; ".join(f"fragment {fid}: {type(e).__name__}: {e}"
                          for fid, e in sorted(failures.items()))
        super().__init__(
            f"{'+'.join(columns)} of {uri}: {len(failures)} fragment(s) failed ({lines}). "
            f"{len(report.fragments_written)} other fragment(s) were committed; run again to "
            "compute only the fragments still missing.")


def pinned_rows_end(table: Table, pinned: lance.LanceDataset) -> int:
    """Where the pinned version's rows end: every row it holds has a smaller id, every row
    appended after it a larger or equal one (ids equal Lance's stable row ids, which only grow;
    see ``corpus.ingest``)."""
    end = table.next_row_id(pinned)
    if end:
        return end
    top = pc.max(pinned.to_table(columns=["id"]).column("id")).as_py()  # no stable row ids
    return 0 if top is None else top + 1


def write_columns(
    table: Table,
    fields: list[pa.Field],
    compute: ComputeFn,
    *,
    pinned: lance.LanceDataset | None = None,
    fragments_per_commit: int | None = None,
    executor: str | None = None,
    gpu: bool = False,
    log: Callable[[str], None] = print,
    waiting: Collection[int] = (),
) -> ColumnWriteReport:
    """Compute ``fields`` for every fragment of the ``pinned`` version (default: the newest now)
    that lacks them, and commit in groups. Fragments in ``waiting`` (ids) are left for the next
    run, counted as pending (a producer whose input column does not cover them yet).

    One version per step: a compute with table-wide state (duplicate hashes, a band index, a
    model's training rows) builds it from ``pinned``, and only ``pinned``'s fragments are
    written. Rows that arrived after it (new fragments, or a compaction that merged them with
    pinned rows) keep a null marker and are counted in ``fragments_pending``; the next run
    writes them against its own pinned version.

    ``fragments_per_commit``: a fixed group size; unset, groups are batched by time and size
    (:class:`CommitPolicy`).
    ``executor``: ``local`` or ``ray`` (default: ``LANCE_ASSETS_EXECUTOR``, else ``local``).
    ``gpu``: under Ray, give each task one GPU when the cluster has any."""
    start = time.perf_counter()
    where = executors.executor_name(executor)
    columns = [f.name for f in fields]
    pin = pinned if pinned is not None else table.newest()
    pin_rows = {f.fragment_id: f.physical_rows for f in pin.get_fragments()}
    desc = "+".join(columns)
    with phase(f"{desc}: finding the fragments to write", log, announce=False):
        ds = ensure_columns(table, fields)
        missing = fragments_missing(ds, columns)
    group = [*columns, written_marker(fields).name]  # what each new data file holds
    schema = pa.schema([ds.schema.field(c) for c in group])
    pinned_here = [f for f in missing if pin_rows.get(f.fragment_id) == f.physical_rows
                   and f.fragment_id not in waiting]
    # a fragment with deleted rows is written whole: its live rows' values, nulls at the
    # deleted positions (a delete never holds a column back, nor waits for a compaction)
    todo = pinned_here
    report = ColumnWriteReport(columns=columns, pinned_version=pin.version,
                               pinned_rows_end=pinned_rows_end(table, pin),
                               fragments_pending=len(missing) - len(pinned_here),
                               fragments_with_deletions=sum(
                                   f.metadata.deletion_file is not None for f in todo))
    report.fragments_already_done = len(ds.get_fragments()) - len(missing)
    if report.fragments_pending:
        log(f"{'+'.join(columns)}: {report.fragments_pending} fragment(s) arrived after version "
            f"{pin.version}, which this run pinned, or wait for an input column; the next run "
            "writes them")
    failures: dict[int, BaseException] = {}
    pending: dict[int, tuple[lance.fragment.DataFile, int]] = {}
    policy = CommitPolicy(fragments_per_commit)
    done = 0
    counted: dict[int, int] = {}  # rows counted so far within fragments still computing

    def on_rows(frag_id: int, rows: int) -> None:
        counted[frag_id] = counted.get(frag_id, 0) + rows
        bar.update(0, rows=rows)

    with progress(total=len(todo), desc=desc, unit="fragment", log=log,
                  rows_total=sum(f.physical_rows for f in todo)) as bar:
        if where == "ray" and todo:
            results = ray_results(table, ds.version, todo, schema, group, compute, gpu, log)
        else:  # rows are counted as the compute yields them, within each fragment
            results = local_results(table, todo, schema, group, compute, log, on_rows)

        def commit() -> None:
            nonlocal ds, done
            started = time.perf_counter()
            bar.note("committing")
            ds, committed = _commit_group(table, group, schema, compute, pending, log)
            bar.note("")
            policy.committed(started)
            report.commits += int(bool(committed))
            report.fragments_written.extend(committed)
            report.rows_written += sum(pending[f][1] for f in committed)
            report.fragments_already_done += len(pending) - len(committed)
            done += len(pending)
            pending.clear()
            log(f"{desc}: {done}/{len(todo)} fragments ({report.rows_written} rows) committed "
                f"at version {ds.version}")

        for frag_id, written, error in results:
            if error is not None:
                if rewritten_since(table, frag_id, log):
                    continue
                failures[frag_id] = error
                continue
            # the rest of its rows (all of them from a Ray task)
            bar.update(1, rows=max(0, written[1] - counted.pop(frag_id, 0)))
            pending[frag_id] = written
            if policy.due(len(pending)):
                commit()
        if pending:
            commit()
    report.version = ds.version
    report.total_rows = ds.count_rows()
    report.duration_s = time.perf_counter() - start
    if failures:
        raise FragmentsFailedError(table.uri, columns, failures, report)
    return report


def _commit_group(table: Table, columns: list[str], schema: pa.Schema, compute: ComputeFn,
                  written: dict, log: Callable[[str], None]) -> tuple[lance.LanceDataset, list[int]]:
    """Attach the written files with one ``DataReplacement`` commit, rebased on the newest
    version each attempt; returns the dataset and the fragments this commit filled."""

    def attempt(ds: lance.LanceDataset) -> tuple[lance.LanceDataset, list[int]]:
        want_ids = sorted(set().union(*(leaf_field_ids(ds, c) for c in columns)))
        live = {f.fragment_id: f for f in ds.get_fragments()}
        data_columns = [c for c in columns if not is_written_marker(c)]
        still_missing = {f.fragment_id for f in fragments_missing(ds, data_columns,
                                                                 among=written)}
        groups, filled = [], []
        for frag_id, (data_file, n_rows) in written.items():
            frag = live.get(frag_id)
            if frag is None or frag_id not in still_missing:
                continue  # gone, or filled meanwhile by a concurrent writer
            if frag.physical_rows != n_rows:  # rows deleted meanwhile stay deleted
                raise RuntimeError(f"fragment {frag_id} of {table.uri} changed while {columns} "
                                   "were computed for it; run the asset again")
            if sorted(data_file.fields) != want_ids:
                # the columns were dropped and added again (new field ids): recompute
                data_file = write_fragment_columns(table, frag, schema, columns, compute)
                written[frag_id] = (data_file, n_rows)
            groups.append(lance.LanceOperation.DataReplacementGroup(frag_id, data_file))
            filled.append(frag_id)
        if not groups:
            return ds, []
        ds = table.commit_operation(lance.LanceOperation.DataReplacement(groups), ds.version)
        return ds, filled

    return table.commit(f"{'+'.join(c for c in columns if not is_written_marker(c))} commit",
                        attempt, log=log)

