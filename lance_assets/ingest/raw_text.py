"""Append a source's new documents to the corpus table, exactly once.

Rows are written in append commits of about ``rows_per_commit`` rows, ending on a part boundary.
Each row stores its unit's key (``source``) and part number (``source_part``): the highest
committed part per unit, read back from the table, is the watermark, committed atomically with
the rows. A run killed at any moment loses only its uncommitted parts; the next run ends with
exactly the rows (and ids) of an uninterrupted run.

Exactly-once between concurrent runs lives in the commit. Every ingest commit is a Lance
``Merge`` stating the whole fragment list as this writer read it plus its new fragments; Lance
rejects it (a retryable conflict) when anything changed the fragment list since. The retry
rebuilds on the newest version only if Lance's row-id counter (every row ever appended, deleted
ones included) is where the plan read it; if an append moved it, the plan is stale
(``StalePlan``): its files are removed and the ingest plans again. No clock is involved.

The lock only saves wasted work: ``<data>/lance/corpus.ingest.lock`` is held from reading the
watermark to the last commit, an ``flock`` on local disk or NFS (released when its holder dies),
an expiring lease on object storage (``storage.ObjectLease``).

Ids only grow over the table's life: the next id is the larger of the row-id counter
(``table.row_id_high_water``) and the largest stored id + 1; with the ``Merge`` fence an
ingested row's ``id`` equals its stable Lance row id. The first ingest creates the table empty
(the schema alone) before writing rows, so a kill leaves either no table or a valid one.
"""

from __future__ import annotations

import fcntl
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Optional

import duckdb
import lance
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from lance_assets import paths, storage
from lance_assets.ingest import columns as cols
from lance_assets.ingest.columns import SkipCounter, SourceError
from lance_assets.ingest.sources import ENV, SourceUnit, resolve
from lance_assets.progress import Progress, progress
from lance_assets.table import RAW_SCHEMA, Table, row_id_high_water
from lance_assets.table.maintenance import DEFAULT_ROWS_PER_FRAGMENT

DEFAULT_ROWS_PER_COMMIT = 50_000
DEFAULT_MAX_DOC_CHARS = 1_000_000
DEFAULT_MAX_BAD_LINE_SHARE = 0.01  # of a file's lines that may be unreadable before it fails
# Each setting's allowed range (the asset's run config is checked against the same).
INT32 = 2**31 - 1  # Lance counts a fragment's rows, and `n_chars` a document's, in 32 bits
RANGES = {"rows_per_fragment": (1, INT32), "rows_per_commit": (1, INT32),
          "max_doc_chars": (1, INT32), "max_new_rows": (1, 2**63 - 1)}


class IngestConfigError(ValueError):
    """A setting outside its allowed range; the message names it and the range."""


def check_settings(**values) -> None:
    """Every setting in ``values`` within ``RANGES`` (``max_new_rows`` may be None: no limit),
    ``text_column`` a column name; else ``IngestConfigError`` naming the first one that is
    not."""
    for name, value in values.items():
        if name == "drop_columns":
            try:
                cols.check_drop_columns(value, values.get("text_column", "text"))
            except SourceError as exc:
                raise IngestConfigError(str(exc)) from None
            continue
        if name == "max_bad_line_share":
            if isinstance(value, bool) or not isinstance(value, (int, float)) \
                    or not 0 <= value <= 1:
                raise IngestConfigError(
                    f"max_bad_line_share {value!r}: the share of a file's lines that may be "
                    "skipped as unreadable before the run fails, from 0 to 1 (default 0.01)")
            continue
        if name == "text_column":
            if not isinstance(value, str) or not value.strip():
                raise IngestConfigError(f"text_column {value!r}: the name of the source's text "
                                        "column, e.g. text")
            continue
        if name == "max_new_rows" and value is None:
            continue
        lo, hi = RANGES[name]
        if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
            raise IngestConfigError(f"{name} {value!r}: must be an integer from {lo:,} to {hi:,}"
                                    + (" (leave it out for no limit)"
                                       if name == "max_new_rows" else ""))


@dataclass
class IngestReport:
    units_ingested: list[str] = field(default_factory=list)
    units_already_present: list[str] = field(default_factory=list)
    files_failed: dict[str, str] = field(default_factory=dict)
    # files that yielded no row, or lost more than max_bad_line_share of their lines
    files_refused: dict[str, str] = field(default_factory=dict)
    columns_added: list[str] = field(default_factory=list)  # source columns new to the table
    rows_added: int = 0
    bytes_added: int = 0
    rows_skipped: dict[str, int] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    lock_wait_s: float = 0.0
    commits: int = 0
    replans: int = 0  # plans found stale at commit time (another writer got there first)
    fragments_added: int = 0
    total_rows: int = 0
    version: int = 0
    duration_s: float = 0.0

    @property
    def nothing_new(self) -> bool:
        return self.rows_added == 0

    def markdown(self) -> str:
        lines = [
            f"**{self.rows_added:,} rows** ({self.bytes_added / 1e6:,.1f} MB of text) added from "
            f"{len(self.units_ingested)} source unit(s) in {self.commits} commit(s); "
            f"{len(self.units_already_present)} unit(s) had nothing new. "
            f"Table: {self.total_rows:,} rows, version {self.version}.",
        ]
        if self.rows_skipped:
            lines.append("\n| skipped because | rows |\n|---|---|")
            lines += [f"| {k} | {v:,} |" for k, v in sorted(self.rows_skipped.items())]
        for warning in self.warnings:
            lines.append(f"\n**Warning:** {warning}")
        failed = {**self.files_failed, **self.files_refused}
        if failed:
            lines.append("\n| file not ingested | why |\n|---|---|")
            lines += [f"| `{k}` | {v} |" for k, v in sorted(failed.items())]
        return "\n".join(lines)

    def loss(self) -> Optional[str]:
        """One message naming every file the run lost lines of beyond what is allowed (no row,
        over the share, unreadable), or None."""
        failed = {**self.files_failed, **self.files_refused}
        if not failed:
            return None
        return (f"{len(failed)} file(s) not ingested: "
                + "; ".join(f"{k}: {v}" for k, v in sorted(failed.items())))


# Object stores without a verified create-if-absent write (gs://, az://) have no ingest lock:
# ingest refuses to run there unless the operator promises one ingest at a time with this.
SINGLE_INGEST_ENV = "LANCE_ASSETS_SINGLE_INGEST"

_THREAD_LOCKS: dict[str, threading.Lock] = {}
_THREAD_LOCKS_GUARD = threading.Lock()


@dataclass
class HeldLock:
    """An ingest lock that is held: how long taking it took, and ``check()`` to call before each
    commit (a no-op for a kernel lock, which cannot be lost; ``LeaseLost`` for a lease that was)."""
    waited_s: float
    check: Callable[[], None]


@contextmanager
def ingest_lock(table: Table, log: Callable[[str], None] = print) -> Iterator[HeldLock]:
    """Exclusive right to ingest into ``table`` (see the module docstring)."""
    root = table.root
    path = paths.ingest_lock_path(root, table.name)
    if storage.is_object_store(path) and path.protocol not in storage.EXCLUSIVE_CREATE_SCHEMES:
        if os.environ.get(SINGLE_INGEST_ENV) != "1":
            raise storage.StorageConfigError(
                f"ingest into {root}: concurrent ingests are kept apart by a lease that needs a "
                "create-if-absent write, verified here only on S3. If only one ingest ever runs "
                f"at a time (e.g. one Dagster run of raw_text), set {SINGLE_INGEST_ENV}=1; "
                "see docs/object-storage.md.")
        log(f"{SINGLE_INGEST_ENV}=1: ingesting into {root} without a lock")
        yield HeldLock(0.0, lambda: None)
        return
    if storage.is_object_store(path):
        owner = f"ingest pid {os.getpid()} on {socket.gethostname()}"
        with storage.ObjectLease(path, owner, log=log) as lease:
            yield HeldLock(lease.waited_s, lease.check)
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with _THREAD_LOCKS_GUARD:  # flock is per open file: threads of one process need this too
        thread_lock = _THREAD_LOCKS.setdefault(str(path), threading.Lock())
    start = time.perf_counter()
    with thread_lock:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.pread(fd, 200, 0).decode("utf-8", "replace").strip() or "unknown"
                log(f"another ingest holds {path} ({holder}); waiting for it to finish")
                fcntl.flock(fd, fcntl.LOCK_EX)
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()} since "
                          f"{time.strftime('%Y-%m-%dT%H:%M:%S')}\n".encode(), 0)
            yield HeldLock(time.perf_counter() - start, lambda: None)
        finally:
            os.close(fd)  # releases the flock


def _ensure_table(table: Table, log: Callable[[str], None]) -> None:
    """Create the table, empty, unless a version is committed. Of two first ingests racing to
    create it (no lock, or a stalled lease holder), one creates it; the other goes on."""
    if table.exists():
        return
    if storage.location(table.uri).exists():
        log(f"{table.uri} holds files of a first ingest that was killed before its commit; "
            "creating the table over them")
    table.create(RAW_SCHEMA)


class StalePlan(RuntimeError):
    """Another writer moved the watermark or the next id this ingest planned on."""


@dataclass
class TableState:
    """What an ingest plans on: the next id, the highest committed part per source key, and
    Lance's row-id counter when it read them (only an append moves it: while it is unchanged,
    no row was added since, so neither the next id nor any watermark can have moved)."""

    next_id: int = 0
    parts: dict[str, int] = field(default_factory=dict)
    row_counter: int = 0

    @classmethod
    def of(cls, ds: lance.LanceDataset) -> TableState:
        con = duckdb.connect()
        con.register("corpus", ds)
        max_id = con.execute("SELECT max(id) FROM corpus").fetchone()[0]
        parts = dict(con.execute(
            "SELECT source, max(source_part) FROM corpus GROUP BY source").fetchall())
        counter = row_id_high_water(ds)
        next_id = max(counter, (-1 if max_id is None else max_id) + 1)
        return cls(next_id, parts, counter)


def _table_state(table: Table, log: Callable[[str], None]) -> TableState:
    """The plan's facts, read from one version (again from the newest if a cleanup removes
    that version's files while they are read)."""
    if not table.exists():
        return TableState()
    return table.pinned(TableState.of, what="ingest plan", log=log)


def _append(table: Table, reader: pa.RecordBatchReader, rows_per_fragment: int,
            log: Callable[[str], None], state: TableState, unit_key: str,
            check_lock: Callable[[], None] = lambda: None,
            before_commit: Callable[[], None] = lambda: None) -> int:
    """Write the rows as new fragments, then commit them with one ``Merge`` that lists the
    table's fragments as read (see the module docstring), on the newest version each attempt,
    and only while no row was appended since ``state`` was read. Returns the row-id counter
    after the commit. ``check_lock`` runs before each attempt; ``before_commit`` once the rows
    are written (it may refuse them: ``Refused``, and they are removed)."""
    check_lock()
    _ensure_table(table, log)
    fragments = table.write_fragments(reader, reader.schema, max_rows_per_file=rows_per_fragment)

    def attempt(ds: lance.LanceDataset) -> int:
        check_lock()
        counter = row_id_high_water(ds)
        if counter != state.row_counter:  # rows were appended since the plan
            raise StalePlan(
                f"{unit_key}: planned at part {state.parts.get(unit_key, -1) + 1} and id "
                f"{state.next_id} when {state.row_counter} rows had ever been appended; "
                f"{counter} have now")
        op = lance.LanceOperation.Merge([f.metadata for f in ds.get_fragments()] + fragments,
                                        ds.lance_schema)
        return row_id_high_water(table.commit_operation(op, ds.version))

    try:
        before_commit()
        return table.commit("append", attempt, log=log)
    except (StalePlan, Refused):
        # raised before any commit of them could land (a lost race is a definite "not
        # committed"): these files are this writer's alone, and nothing will reference them
        table.remove_files([f.path for m in fragments for f in m.data_files()])
        raise


class Refused(Exception):
    """A file that lost more of its lines than allowed: its rows are not committed."""


def _valid_utf8(text: pa.Array, skipped: SkipCounter, lines: Optional[pa.Array] = None,
                where: str = "") -> pa.Array:
    """Text as ``string``; entries that are not UTF-8 become null (counted, and named by their
    line where it is known)."""
    if pa.types.is_string(text.type):
        try:
            text.validate(full=True)
            return text
        except pa.ArrowInvalid:
            text = text.cast(pa.binary())
    elif pa.types.is_large_string(text.type) or pa.types.is_large_binary(text.type):
        text = text.cast(pa.large_binary()).cast(pa.binary())
    try:
        return text.cast(pa.string())
    except pa.ArrowInvalid:
        out = []
        numbers = lines.to_pylist() if lines is not None else [None] * len(text)
        for value, line in zip(text.to_pylist(), numbers):
            try:
                out.append(None if value is None else value.decode("utf-8"))
            except UnicodeDecodeError:
                skipped.add("not_utf8", 1)
                skipped.bad += 1
                if len(skipped.first_bad) < cols.MAX_LINES_NAMED:
                    skipped.first_bad.append(f"not UTF-8: {where} line {line}")
                out.append(None)
        return pa.array(out, pa.string())


def normalise(batch: pa.RecordBatch, key: str, part: int, first_id: int, skipped: SkipCounter,
              max_doc_chars: int, schema: pa.Schema = RAW_SCHEMA, where: str = ""
              ) -> pa.RecordBatch:
    """Drop null / blank / oversized texts (counted) and lay the batch out in ``schema``
    (``RAW_SCHEMA`` and the source's own columns)."""
    raw_text = batch.column("text")
    skipped.add("null_text", raw_text.null_count)  # before decoding: not_utf8 is counted apart
    lines = batch.column(cols.LINE) if cols.LINE in batch.schema.names else None
    text = _valid_utf8(raw_text, skipped, lines, where)
    null = pc.is_null(text)
    length = pc.utf8_length(text)
    blank = pc.and_kleene(pc.invert(null), pc.equal(pc.utf8_length(pc.utf8_trim_whitespace(text)), 0))
    too_long = pc.and_kleene(pc.invert(null), pc.greater(length, max_doc_chars))
    skipped.add("empty_text", pc.sum(blank).as_py() or 0)
    skipped.add(f"longer_than_{max_doc_chars}_chars", pc.sum(too_long).as_py() or 0)
    keep = pc.fill_null(pc.invert(pc.or_kleene(pc.or_kleene(null, blank), too_long)), False)
    batch = batch.set_column(batch.schema.get_field_index("text"), "text", text).filter(keep)
    n = batch.num_rows
    names = batch.schema.names

    def col(f: pa.Field) -> pa.Array:
        if f.name == "id":
            return pa.array(np.arange(first_id, first_id + n, dtype=np.int64))
        if f.name == "source":
            return pa.array([key] * n, pa.string())
        if f.name == "source_part":
            return pa.array(np.full(n, part, dtype=np.int32))
        if f.name == "n_chars":
            return pc.cast(pc.utf8_length(batch.column("text")), pa.int32())
        if f.name in names:
            return pc.cast(batch.column(f.name), f.type)
        return pa.nulls(n, f.type)

    return pa.RecordBatch.from_arrays([col(f) for f in schema], schema=schema)


class _Parts:
    """A part-ordered batch stream that hands out one commit's worth at a time."""

    def __init__(self, it: Iterator[tuple[int, pa.RecordBatch]]):
        self._it = it
        self._pending: Optional[tuple[int, pa.RecordBatch]] = None
        self.exhausted = False

    def _next(self) -> Optional[tuple[int, pa.RecordBatch]]:
        if self._pending is not None:
            item, self._pending = self._pending, None
            return item
        try:
            return next(self._it)
        except StopIteration:
            self.exhausted = True
            return None

    def push_back(self, item: tuple[int, pa.RecordBatch]) -> None:
        self._pending = item
        self.exhausted = False

    def commit_group(self, rows_per_commit: int) -> Iterator[tuple[int, pa.RecordBatch]]:
        """Batches until ``rows_per_commit`` rows are reached, then to the end of that part."""
        rows, last_part = 0, None
        while True:
            item = self._next()
            if item is None:
                return
            part, batch = item
            if rows >= rows_per_commit and part != last_part:
                self._pending = item
                return
            rows += batch.num_rows
            last_part = part
            yield item


def ingest(
    table: Table,
    source: str,
    *,
    text_column: str = "text",
    rows_per_fragment: int = DEFAULT_ROWS_PER_FRAGMENT,
    rows_per_commit: int = DEFAULT_ROWS_PER_COMMIT,
    max_doc_chars: int = DEFAULT_MAX_DOC_CHARS,
    hf_data_files: Optional[list[str]] = None,
    max_new_rows: Optional[int] = None,
    drop_columns: Sequence[str] = (),
    max_bad_line_share: float = DEFAULT_MAX_BAD_LINE_SHARE,
    source_label: str = ENV,
    log: Callable[[str], None] = print,
) -> IngestReport:
    """Append what is new in ``source`` to ``table``, with every column the source brings
    (less ``drop_columns``).

    A file that cannot be read (corrupt, wrong schema, a column of another type than the
    table's) is left out and reported in ``files_failed``; a file that yields no row, or whose
    unreadable lines are more than ``max_bad_line_share`` of the lines read, in
    ``files_refused`` (its rows of that commit are not stored, so the file fixed is read anew).
    The others still ingest, and nothing already stored changes. With ``max_new_rows`` the run
    stops at the first commit boundary past that many rows (for endless streams such as ``hf:``
    sources); the next run continues from there. ``source_label`` names where ``source`` came
    from in messages.
    """
    check_settings(text_column=text_column, rows_per_fragment=rows_per_fragment,
                   rows_per_commit=rows_per_commit, max_doc_chars=max_doc_chars,
                   max_new_rows=max_new_rows, drop_columns=list(drop_columns),
                   max_bad_line_share=max_bad_line_share)
    start = time.perf_counter()
    report = IngestReport()
    rows_by_unit: dict[str, int] = {}
    opts = _Options(text_column, tuple(drop_columns), float(max_bad_line_share), source_label,
                    rows_per_fragment, rows_per_commit, max_doc_chars, max_new_rows)
    with ingest_lock(table, log) as held:
        report.lock_wait_s = held.waited_s
        fragments_before = len(table.newest().get_fragments()) if table.exists() else 0
        skipped = SkipCounter()
        for _ in range(MAX_REPLANS):
            try:
                _ingest_planned(table, source, opts, hf_data_files, skipped, report,
                                rows_by_unit, log, held.check)
                break
            except StalePlan as stale:
                report.replans += 1
                log(f"another ingest committed first ({stale}); planning again from the table "
                    "as it is now")
        else:
            raise RuntimeError(f"ingest into {table.uri}: the plan went stale {MAX_REPLANS} times in "
                               "a row (other ingests kept committing first); run it again")
        report.units_ingested = [k for k, n in rows_by_unit.items() if n]
        report.units_already_present = [k for k, n in rows_by_unit.items() if not n]
        report.rows_skipped = dict(skipped.counts)
        if table.exists():
            ds = table.newest()
            report.total_rows = ds.count_rows()
            report.version = ds.version
            report.fragments_added = len(ds.get_fragments()) - fragments_before
    report.duration_s = time.perf_counter() - start
    return report


# Plans found stale in one ingest before it gives up (each one means another writer committed).
MAX_REPLANS = 20


@dataclass(frozen=True)
class _Options:
    text_column: str
    drop_columns: tuple[str, ...]
    max_bad_line_share: float
    source_label: str
    rows_per_fragment: int
    rows_per_commit: int
    max_doc_chars: int
    max_new_rows: Optional[int]


def _ingest_planned(table: Table, source: str, opts: _Options,
                    hf_data_files: Optional[list[str]], skipped: SkipCounter,
                    report: IngestReport, rows_by_unit: dict[str, int],
                    log: Callable[[str], None], check_lock: Callable[[], None]) -> None:
    """One plan: read the watermark and next id, then commit every unit's new parts on it
    (``StalePlan`` when another writer moved them first)."""
    state = _table_state(table, log)
    resolved = resolve(source, opts.text_column, hf_data_files=hf_data_files,
                       stored_keys=state.parts.keys(), label=opts.source_label)
    report.files_failed.update(resolved.bad_files)
    if resolved.warning and resolved.warning not in report.warnings:
        report.warnings.append(resolved.warning)
        log(resolved.warning)
    for path, why in resolved.bad_files.items():
        log(f"skipping {path}: {why}")
    columns = cols.TableColumns(table)
    with progress(len(resolved.units), "raw_text", "source unit", log) as bar:
        for unit in resolved.units:
            if opts.max_new_rows is not None and report.rows_added >= opts.max_new_rows:
                break
            rows_by_unit.setdefault(unit.key, 0)
            done = state.parts.get(unit.key, -1)
            if unit.n_parts is not None and done >= unit.n_parts - 1:
                bar.update(1)
                continue
            unit_skipped = SkipCounter(kinds=columns.kinds())
            try:
                rows_by_unit[unit.key] += _ingest_unit(
                    table, unit, done + 1, state, unit_skipped, opts, columns, report, log,
                    check_lock, bar)
            finally:
                skipped.merge(unit_skipped)
            bar.update(1)


def _judge(unit: SourceUnit, skipped: SkipCounter, stored: bool, from_line: Optional[int],
           opts: _Options, at_end: bool) -> Optional[str]:
    """Why ``unit`` lost more than it may (None: it did not): more than ``max_bad_line_share``
    of the lines read were unreadable, or (``at_end``) none of its lines gave a row although
    some were more than blank. ``stored``: rows of it are committed, up to ``from_line``."""
    lines, bad = skipped.lines, skipped.bad
    over = bad > opts.max_bad_line_share * lines
    blank = skipped.counts.get("empty_text", 0)
    if not over and not (at_end and not stored and lines > blank):
        return None
    named = "; ".join(r.replace(f"{unit.where} ", "") for r in skipped.first_bad[:5])
    why = (f"{bad:,} of {lines:,} lines read are unreadable ({bad / lines:.1%}; "
           f"max_bad_line_share is {opts.max_bad_line_share:.0%})" if over else
           f"none of its {lines:,} lines gave a row ("
           + ", ".join(f"{k.split(':')[0]}: {v}" for k, v in sorted(skipped.counts.items())
                       if not k.startswith(("malformed JSON:", "wrong type:", "bad lines:")))
           + (f", unreadable: {bad}" if bad else "") + ")")
    where = f"line {from_line}" if from_line else "the first line not stored"
    return (f"{why}{'; first: ' + named if named else ''}. "
            + ("None of its rows were stored: fix those lines (or leave a column out with "
               "drop_columns, or raise max_bad_line_share in raw_text's config) and run again; "
               "a fixed file is read anew" if not stored else
               f"Its rows before {where} are stored, the rest are not: the file is known by its "
               f"content and cannot change, so put its lines from {where} on, fixed, in a new "
               "file (or raise max_bad_line_share in raw_text's config)"))


def _ingest_unit(table: Table, unit: SourceUnit, first_part: int, state: TableState,
                 skipped: SkipCounter, opts: _Options, columns: cols.TableColumns,
                 report: IngestReport, log: Callable[[str], None],
                 check_lock: Callable[[], None] = lambda: None,
                 bar: Optional[Progress] = None) -> int:
    """Commit ``unit``'s parts from ``first_part`` on, with ids from ``state.next_id``; returns
    the rows committed (counted on ``bar`` as each commit lands) and keeps ``state`` current.

    Each commit group is judged before it is committed (``_judge``): a unit over its share of
    unreadable lines is refused (``files_refused``) and its group's rows removed. A group ends
    where a part brings a column the table lacks, which is added before the next group. A read
    error stops this unit (its earlier commits stay) and is reported in ``files_failed``.
    """

    def selected() -> Iterator[tuple[int, pa.RecordBatch]]:
        for part, raw in unit.read(first_part, skipped):
            batch = cols.select_columns(raw, unit.where, opts.text_column, skipped,
                                        opts.drop_columns, columns.reserved)
            yield part, cols.conform(batch, columns.types, unit.where, skipped, unit.typed)

    parts = _Parts(selected())
    committed = 0
    added: list[str] = []  # columns this unit brought to the table
    stored_through = None  # the last line read by this run's committed groups

    def rest_from() -> Optional[int]:
        """The first line after what is committed: where a refused rest of the file begins."""
        return skipped.first_line if stored_through is None else stored_through + 1
    try:
        while not parts.exhausted:
            if opts.max_new_rows is not None and report.rows_added >= opts.max_new_rows:
                break
            group = parts.commit_group(opts.rows_per_commit)
            head = next(group, None)
            if head is None:
                continue
            counter = {"rows": 0, "bytes": 0, "last_part": None, "last_line": None}
            new = columns.new_in(head[1], unit.where)
            if new:
                _ensure_table(table, log)
                columns.add(table, new, log)
                added += [f.name for f in new]
                skipped.kinds.update(columns.kinds())
            schema = columns.schema()

            # consumed within this iteration; bound explicitly all the same
            def batches(counter=counter, head=head, group=group, schema=schema
                        ) -> Iterator[pa.RecordBatch]:
                for part, raw in _chain(head, group):
                    if counter["last_part"] is not None and columns.new_in(raw, unit.where):
                        if part == counter["last_part"]:  # a part is committed whole
                            raise SourceError(f"part {part} brings a column its first batch "
                                              "did not have; write the file again")
                        parts.push_back((part, raw))  # a new column: it starts the next group
                        return
                    out = normalise(raw, unit.key, part, state.next_id + counter["rows"],
                                    skipped, opts.max_doc_chars, schema, unit.where)
                    counter["rows"] += out.num_rows
                    counter["bytes"] += out.column("text").nbytes
                    counter["last_part"] = part
                    if cols.LINE in raw.schema.names and raw.num_rows:
                        counter["last_line"] = pc.max(raw.column(cols.LINE)).as_py()
                    if out.num_rows:
                        yield out

            stream = batches()
            first = next(stream, None)
            if first is None:
                continue  # nothing to write in this group: no commit, no new version

            rest = rest_from()  # this group's lines are not stored yet

            def judge(stored=committed > 0 or first_part > 0, line=rest) -> None:
                why = _judge(unit, skipped, stored, line, opts, at_end=False)
                if why is not None:
                    raise Refused(why)

            reader = pa.RecordBatchReader.from_batches(schema, _chain(first, stream))
            state.row_counter = _append(table, reader, opts.rows_per_fragment, log, state,
                                        unit.key, check_lock, judge)
            state.next_id += counter["rows"]
            state.parts[unit.key] = counter["last_part"]
            committed += counter["rows"]
            stored_through = counter["last_line"] or stored_through
            report.rows_added += counter["rows"]
            report.bytes_added += counter["bytes"]
            report.commits += 1
            if bar is not None:
                bar.update(0, rows=counter["rows"])
            log(f"{unit.key}: committed {counter['rows']:,} rows through part {counter['last_part']}")
        why = _judge(unit, skipped, committed > 0 or first_part > 0, rest_from(), opts,
                     at_end=True)
        if why is not None:
            raise Refused(why)
    except Refused as refused:
        report.files_refused[unit.where] = str(refused)
        log(f"not ingested: {unit.where}: {refused}")
    except (SourceError, pa.ArrowException, OSError, UnicodeDecodeError) as exc:
        report.files_failed[unit.where] = f"{exc} (rows committed before the error are kept)"
        log(f"stopped reading {unit.where}: {exc}")
    if added and not committed:  # no stored row holds them: the file fixed brings them again
        columns.drop(table, added, log)
        added = []
    report.columns_added += added
    return committed


def _chain(first, rest: Iterator) -> Iterator:
    yield first
    yield from rest
