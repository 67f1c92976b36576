"""Where a column group's values are computed: one new data file per fragment.

A compute is a picklable function from a fragment to record batches of exactly the group's
columns (a module-level function, a ``functools.partial``, a small dataclass; never a closure
over a live dataset). ``local_results`` runs it in this process; ``ray_results`` as one Ray task
per fragment that opens the table by URI, writes the fragment's new data file and hands its
metadata back. Either way the driver (``columns.write_columns``) makes every commit. A compute
whose fragments depend on the ones before it (near-duplicates) is :class:`Staged`: its costly
part runs as tasks, its order-dependent rest in the driver, in fragment order. A data file
covers every physical row of its fragment: on a fragment with deleted rows the computed values
sit at the live rows' offsets and the deleted offsets hold nulls.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from functools import lru_cache, partial
from typing import Any

import lance
import numpy as np
import pyarrow as pa
from lance.fragment import LanceFragment

from lance_assets.table import Table
from lance_assets.table import executor as executors
from lance_assets.table.markers import is_written_marker

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


def rewritten_since(table: Table, frag_id: int, log: Callable[[str], None]) -> bool:
    """True when ``frag_id`` is no longer in the table: a compaction rewrote it while it was
    being computed (and a cleanup may have removed its files). Its rows now live in another
    fragment, unwritten there, which the next run computes."""
    if any(f.fragment_id == frag_id for f in table.newest().get_fragments()):
        return False
    log(f"fragment {frag_id} was compacted while it was computed; its rows are written by "
        "the next run")
    return True


def local_results(table: Table, todo: list[LanceFragment], schema: pa.Schema,
                   group: list[str], compute: ComputeFn, log: Callable[[str], None],
                   on_rows: Callable[[int, int], None] | None = None,
                   ) -> Iterator[tuple[int, Any, BaseException | None]]:
    for frag in todo:
        counter = None if on_rows is None else partial(on_rows, frag.fragment_id)
        try:
            data_file = write_fragment_columns(table, frag, schema, group, compute, counter)
        except Exception:
            if rewritten_since(table, frag.fragment_id, log):
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
    data_file = write_fragment_columns(job.table, frag, job.schema, job.columns, job.compute)
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
    data_file = write_fragment_columns(job.table, frag, job.schema, job.columns, key.compute)
    return data_file, frag.physical_rows


def _payload_task(job: _FragmentJob, frag_id: int) -> Any:
    """Runs in a Ray worker: the parallel part of a ``Staged`` compute for ``frag_id``."""
    return job.compute(_open(job.table, job.version).get_fragment(frag_id))


def ray_results(table: Table, version: int, todo: list[LanceFragment], schema: pa.Schema,
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
            data_file = write_fragment_columns(
                table, frag, schema, columns,
                lambda f, payload=result.value: compute.ordered(f, payload))
        except Exception as exc:  # noqa: BLE001 - reported with its fragment, like a task's
            yield result.key, None, exc
            tasks.close()
            return
        yield result.key, (data_file, frag.physical_rows), None


def write_fragment_columns(table: Table, frag: LanceFragment, schema: pa.Schema,
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

