"""Add-only column writes, per fragment, checkpointed in groups.

A column group (e.g. ``input_ids`` + ``n_tokens``) is first added to the schema as all-null
(a metadata-only commit). Then, for every fragment whose data files do not yet hold the group,
the values are computed and written to a *new* data file, attached to the fragment with a
``DataReplacement`` commit. Existing data files (``text`` above all) are never rewritten, a
re-run computes only fragments that lack the group, and a kill loses at most the group of
fragments in flight: the fragments computed since the last commit. A group is a fixed number
of fragments when the caller asks for one, else it is batched by time and size
(:class:`CommitPolicy`: at least 2 s of work and 20x the last commit's own time, at most
120 s), so commits stay a small share of the run however large the manifest grows.

Concurrent writers are expected (other column assets, a second run of this one, another
Dagster instance). Every commit goes through ``commit_retrying``: when a concurrent write wins
the race, the group is rebased on the newest version. Fragments that meanwhile got the group
from another writer are dropped from the commit (their values are equal: every column is a
deterministic function of the table), and a fragment whose columns were dropped and re-added
under new field ids is computed again.

Where the values are computed is the executor's choice (``corpus.executor``): in this process
(``local``, the default), or as one Ray task per fragment (``ray``) that opens the table by URI,
computes and writes the fragment's new data file and hands its metadata back. Either way this
process (the driver) makes every commit, as results arrive, so a failed task or a killed driver
leaves only unfinished fragments to redo. A task that fails does not stop the others: their
fragments are committed and the write then fails naming the fragments that are left.

A compute is therefore picklable: a module-level function, a ``functools.partial`` or a small
dataclass, never a closure over a live dataset. A compute whose fragments depend on the ones
before it (near-duplicates) is a :class:`Staged` one: its costly part runs as tasks, its
order-dependent rest in the driver, in fragment order.

Completeness is judged by values, so it survives any rewrite of the table. Every group carries a
*write marker*, a bool column (``_written_<first column>``) added with the group and written as
true in the same data file as the group's values. A row whose marker is null was never written
by us, whatever the data files look like: Lance's compaction (``compact_files``, lancedb's
``optimize``) merges fragments into new data files that list every column and store nulls for
the values not written yet, and those rows keep a null marker. A fragment with such a row
counts as missing, and the next run computes it again (values are deterministic, so the rows
already written get the same values) and replaces the group's columns in that fragment. So no
unwritten value can become a stored null unnoticed: ``unwritten_rows`` counts them (the
coverage checks), and the writer refills them.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Collection, Iterable, Iterator
from dataclasses import dataclass, field
from functools import lru_cache, partial
from typing import Any

import lance
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from lance.fragment import LanceFragment

from lance_assets.progress import phase, progress
from lance_assets.table import Table, leaf_field_ids
from lance_assets.table import executor as executors

# compute(fragment) -> batches holding exactly the group's columns, one row per fragment row
ComputeFn = Callable[[LanceFragment], Iterable[pa.RecordBatch]]


@dataclass
class Staged:
    """A compute in two parts: ``parallel(fragment) -> payload`` depends on that fragment only
    (the costly part: a Ray task under the ``ray`` executor), ``ordered(fragment, payload) ->
    batches`` may depend on every fragment before it (run in the driver, in fragment order)."""

    parallel: Callable[[LanceFragment], Any]
    ordered: Callable[[LanceFragment, Any], Iterable[pa.RecordBatch]]

    def __call__(self, frag: LanceFragment) -> Iterable[pa.RecordBatch]:
        return self.ordered(frag, self.parallel(frag))


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


# Write markers: one bool column per group, true on every row whose group values were written.
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


def ensure_columns(table: Table | str, fields: list[pa.Field]) -> lance.LanceDataset:
    """Add ``fields`` and their write marker to the schema as all-null columns if missing (no
    data is written). A marker whose group lost a column (dropped, e.g. to recompute it) no
    longer vouches for the group: it is dropped and added again, all null."""
    table = Table.of(table)
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


def _fragments_without_fields(frags: list[LanceFragment], field_ids: set[int]) -> set[int]:
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
        todo |= _fragments_without_fields(frags, field_ids)
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
            if frag.fragment_id in _fragments_without_fields([frag], field_ids):
                counts[frag.fragment_id] = frag.count_rows()
    pending = 0
    if rows_end is not None and counts:
        unwritten = [f for f in frags if f.fragment_id in counts]
        nulls = " OR ".join(f"`{m}` IS NULL" for m in markers) if markers and not bare else "true"
        pending = ds.scanner(columns=["id"], fragments=unwritten,
                             filter=f"({nulls}) AND id >= {int(rows_end)}").count_rows()
    return Coverage(columns, rows, sum(counts.values()), sorted(counts), markers, pending)


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
    table: Table | str,
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
    table = Table.of(table)
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
            results = _ray_results(table, ds.version, todo, schema, group, compute, gpu, log)
        else:  # rows are counted as the compute yields them, within each fragment
            results = _local_results(table, todo, schema, group, compute, log, on_rows)

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
                if _rewritten_since(table, frag_id, log):
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


def _rewritten_since(table: Table, frag_id: int, log: Callable[[str], None]) -> bool:
    """True when ``frag_id`` is no longer in the table: a compaction rewrote it while it was
    being computed (and a cleanup may have removed its files). Its rows now live in another
    fragment, unwritten there, which the next run computes."""
    if any(f.fragment_id == frag_id for f in table.newest().get_fragments()):
        return False
    log(f"fragment {frag_id} was compacted while it was computed; its rows are written by "
        "the next run")
    return True


def _local_results(table: Table, todo: list[LanceFragment], schema: pa.Schema,
                   group: list[str], compute: ComputeFn, log: Callable[[str], None],
                   on_rows: Callable[[int, int], None] | None = None,
                   ) -> Iterator[tuple[int, Any, BaseException | None]]:
    for frag in todo:
        counter = None if on_rows is None else partial(on_rows, frag.fragment_id)
        try:
            data_file = _write_fragment_columns(table, frag, schema, group, compute, counter)
        except Exception:
            if _rewritten_since(table, frag.fragment_id, log):
                continue
            raise
        yield frag.fragment_id, (data_file, frag.physical_rows), None


@dataclass(frozen=True)
class _FragmentJob:
    """What a Ray task needs besides the fragment id (pickled once, shared by every task)."""

    table: Table
    version: int
    schema: pa.Schema
    columns: list[str]
    compute: Any


@lru_cache(maxsize=4)
def _open(table: Table, version: int) -> lance.LanceDataset:
    """The table at the version the driver planned on (credentials: the worker's environment)."""
    return table.open(version)


def _fragment_task(job: _FragmentJob, frag_id: int) -> tuple[lance.fragment.DataFile, int]:
    """Runs in a Ray worker: write ``frag_id``'s new data file; the driver commits it."""
    frag = _open(job.table, job.version).get_fragment(frag_id)
    data_file = _write_fragment_columns(job.table, frag, job.schema, job.columns, job.compute)
    return data_file, frag.physical_rows


@dataclass(frozen=True)
class BoundFragment:
    """A fragment id with the compute bound to it (``compute.bind(fragment_id)``)."""

    fragment_id: int
    compute: Any


def _bound_fragment_task(job: _FragmentJob, key: BoundFragment) -> tuple[lance.fragment.DataFile,
                                                                          int]:
    """Runs in a Ray worker: ``_fragment_task`` with the fragment's own bound compute."""
    frag = _open(job.table, job.version).get_fragment(key.fragment_id)
    data_file = _write_fragment_columns(job.table, frag, job.schema, job.columns, key.compute)
    return data_file, frag.physical_rows


def _payload_task(job: _FragmentJob, frag_id: int) -> Any:
    """Runs in a Ray worker: the parallel part of a ``Staged`` compute for ``frag_id``."""
    return job.compute(_open(job.table, job.version).get_fragment(frag_id))


def _ray_results(table: Table, version: int, todo: list[LanceFragment], schema: pa.Schema,
                 columns: list[str], compute: ComputeFn, gpu: bool,
                 log: Callable[[str], None]) -> Iterator[tuple[int, Any, BaseException | None]]:
    """(fragment id, (data file, rows) or None, error or None) as Ray tasks finish.

    A ``Staged`` compute: its parallel part as tasks, its ordered part here in fragment order;
    after a failed fragment, the fragments behind it are left for the next run (their values
    depend on it). A compute with ``in_order = True`` runs whole as tasks but is committed in
    fragment order, stopping at the first failure the same way (what is committed is always a
    prefix). A compute with ``bind(fragment_id)`` gives each task that fragment's compute only."""
    executors.ensure_ray(log)
    num_gpus = 1 if gpu and executors.cluster_gpus() else 0
    by_id = {f.fragment_id: f for f in todo}
    staged = isinstance(compute, Staged)
    in_order = staged or getattr(compute, "in_order", False)
    bind = None if staged else getattr(compute, "bind", None)
    if bind is not None:
        # each task gets its own fragment's compute (e.g. only its object references: a task
        # that received every fragment's would borrow them all, fragments x tasks in all)
        job = _FragmentJob(table, version, schema, columns, None)
        keys: list = [BoundFragment(f, bind(f)) for f in by_id]
        fn: Callable = _bound_fragment_task
    else:
        job = _FragmentJob(table, version, schema, columns,
                           compute.parallel if staged else compute)
        keys, fn = list(by_id), _payload_task if staged else _fragment_task
    tasks = executors.ray_map(fn, job, keys, ordered=in_order, num_gpus=num_gpus)
    for result in tasks:
        if isinstance(result.key, BoundFragment):
            result.key = result.key.fragment_id
        if result.error is not None:
            yield result.key, None, result.error
            if in_order:
                tasks.close()  # cancels the tasks behind it
                return
            continue
        if not staged:
            yield result.key, result.value, None
            continue
        frag = by_id[result.key]
        try:
            data_file = _write_fragment_columns(
                table, frag, schema, columns,
                lambda f, payload=result.value: compute.ordered(f, payload))
        except Exception as exc:  # noqa: BLE001 - reported with its fragment, like a task's
            yield result.key, None, exc
            tasks.close()
            return
        yield result.key, (data_file, frag.physical_rows), None


def _write_fragment_columns(table: Table, frag: LanceFragment, schema: pa.Schema,
                            columns: list[str], compute: ComputeFn,
                            on_rows: Callable[[int], None] | None = None,
                            ) -> lance.fragment.DataFile:
    """Compute the group for ``frag`` into one new (uncommitted) data file; its write marker
    (``columns`` holds it last) is true on every row. ``on_rows``: told the rows of each batch
    as the compute yields it (progress within the fragment).

    A data file covers every physical row of its fragment. Computes read the fragment, and so
    see its live rows only: on a fragment with deleted rows their values are placed at the
    live rows' offsets and the deleted offsets hold nulls (rows no version shows)."""
    n_rows = frag.physical_rows
    batches = []
    for batch in compute(frag):
        batches.append(batch)
        if on_rows is not None:
            on_rows(batch.num_rows)
    got = sum(b.num_rows for b in batches)
    if got != n_rows:
        live = live_offsets(frag) if frag.metadata.deletion_file is not None else None
        if live is None or got != len(live):
            raise RuntimeError(f"computing {columns} for fragment {frag.fragment_id}: {got} "
                               f"values for {n_rows if live is None else len(live)} rows")
        batches = spread(batches, live, n_rows, schema)

    def with_markers(b: pa.RecordBatch) -> pa.RecordBatch:
        marked = pa.array(np.ones(b.num_rows, dtype=bool))
        return pa.RecordBatch.from_arrays(
            [marked if is_written_marker(c) else b.column(c) for c in columns],
            names=columns).cast(schema)

    reader = pa.RecordBatchReader.from_batches(schema, (with_markers(b) for b in batches))
    new = table.write_fragments(reader, schema, max_rows_per_file=max(n_rows, 1))
    files = [f for m in new for f in m.data_files()]
    if len(files) != 1:
        raise RuntimeError(f"expected one data file for fragment {frag.fragment_id}")
    return files[0]


def live_offsets(frag: LanceFragment) -> np.ndarray:
    """The offsets (in the fragment's data files) of ``frag``'s rows that are not deleted."""
    addr = frag.to_table(columns=[], with_row_address=True).column("_rowaddr")
    return (addr.to_numpy(zero_copy_only=False) & 0xFFFFFFFF).astype(np.int64)


def spread(batches: list[pa.RecordBatch], offsets: np.ndarray, n_rows: int,
           schema: pa.Schema) -> list[pa.RecordBatch]:
    """The values of ``batches`` (one per live row, in order) at ``offsets`` of ``n_rows``
    rows, nulls elsewhere (``schema``: the group, for a fragment with no live row)."""
    if batches:
        values = pa.Table.from_batches(batches).combine_chunks()
    else:
        values = pa.table({f.name: pa.nulls(0, f.type) for f in schema
                           if not is_written_marker(f.name)})
    index = np.full(n_rows, -1, dtype=np.int64)
    index[offsets] = np.arange(len(offsets))
    return values.take(pa.array(index, mask=index < 0)).to_batches()


def rows_still_live(frag: LanceFragment, ids: np.ndarray) -> np.ndarray | None:
    """For a compute planned on an earlier view of ``frag`` (its rows' ``ids`` then): the
    positions in ``ids`` of the rows ``frag`` shows now, or None when it shows them all. A
    delete since the plan only removes rows; anything else is an error."""
    if frag.count_rows() == len(ids):
        return None
    live = frag.to_table(columns=["id"]).column("id").to_numpy(zero_copy_only=False)
    order = np.argsort(ids, kind="stable")
    at = order[np.minimum(np.searchsorted(ids, live, sorter=order), max(len(ids) - 1, 0))]
    if len(ids) == 0 or not np.array_equal(ids[at], live):
        raise RuntimeError(f"fragment {frag.fragment_id} holds rows its plan did not see; run "
                           "the asset again")
    return at


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
                data_file = _write_fragment_columns(table, frag, schema, columns, compute)
                written[frag_id] = (data_file, n_rows)
            groups.append(lance.LanceOperation.DataReplacementGroup(frag_id, data_file))
            filled.append(frag_id)
        if not groups:
            return ds, []
        ds = table.commit_operation(lance.LanceOperation.DataReplacement(groups), ds.version)
        return ds, filled

    return table.commit(f"{'+'.join(c for c in columns if not is_written_marker(c))} commit",
                        attempt, log=log)
