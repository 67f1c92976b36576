"""Column producers: the one contract every column asset is declared under.

A column producer is a module-level ``PRODUCER = ColumnProducer(...)`` in one small library file
named after its asset (``curation/detected_language.py`` makes the ``detected_language``
asset). It declares data, and ``produce`` alone runs it: it pins one version (``Table.pinned``),
builds the declared state there, calls ``write_columns`` for each column group in order with
that same pinned dataset (so rows ingested meanwhile keep a null write marker for the next run),
runs the hooks declared after a write, and reports (``Produced``). No producer pins a version or
calls ``write_columns`` itself.

- ``fields`` and ``descriptions``: the Arrow fields it writes, each described (the UI's column
  schema and the table's documentation are the same text);
- either ``compute``, for one group written per fragment: ``compute(settings, state) ->
  fragment -> batches``, picklable, so a Ray task can run it;
- or ``steps``, for producers with cross-row state or several groups: an ordered tuple of
  :class:`Step` (or ``steps(run)`` returning one, when the groups depend on the settings: one
  column per evaluation set). Each step names its fields (or ``fields(settings, state)``), its
  optional ``state(run)`` built on the pinned version after the steps before it wrote (their
  reports, states and hook results are in ``run``), its ``compute(settings, state)``, and an
  optional ``after(run, state)`` hook on the pinned version once its write committed (the kept
  member election of the duplicate flags). A multi-step map/reduce plan (``dedup_flag``:
  hashes, then the group-by over them) is one step per group; the reduce is the state of the
  step that writes its result;
- ``state`` (optional, either form): table-wide state built once on the pinned version before
  any write (``state(run)``: the detector ``detected_language`` records, the head
  ``quality_score`` trains). A state may return :class:`Skip` to write nothing (no labels to
  learn from): the run reports why;
- ``settings``: a frozen dataclass of its knobs (``setting(default, help)``), which becomes the
  asset's run config next to the knobs every column asset has (executor, fragments per commit);
- ``summary(run)``: extra numbers for the materialization (plain values, ``Markdown``, ``Json``,
  ``FilePath``); ``reported(run)``: the columns a run reports when they are not the declared
  ``fields`` (per-set columns); ``overall(run)``: the report that stands for the run when not
  its last step's;
- ``deps``, ``group``, ``kinds``, ``reads`` (column lineage) and ``version``: the code version,
  which also feeds the data version (a new version marks everything downstream stale).

``produce`` runs a producer on a table; ``producers()`` finds every ``PRODUCER`` in the
package's library modules. The Dagster layer (``defs/columns.py``) turns each into its asset,
with the same pool, executor, automation condition, ``columns_written`` check, column schema
and metadata for all, so adding a column is one file and its test (docs/write-a-tagger.md).

This module imports no Dagster: the library declares, the definitions wire.
"""

from __future__ import annotations

import importlib
import keyword
import pkgutil
import re
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import MISSING, dataclass, field, fields, is_dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, Union

import lance
import pyarrow as pa

from lance_assets.progress import phase
from lance_assets.table.columns import (
    ColumnWriteReport,
    ComputeFn,
    pinned_rows_end,
    write_columns,
)
from lance_assets.table.executor import executor_name
from lance_assets.table.handle import Table

Log = Callable[[str], None]
NAME_RE = re.compile(r"^[a-z][a-z0-9_]{0,62}$")
# library packages that hold no producer (and import torch or run processes): not walked
NOT_PRODUCERS = ("lance_assets.defs", "lance_assets.train", "lance_assets.launch",
                 "lance_assets.definitions", "lance_assets.__main__")


# Metadata values a summary may hold besides plain numbers and strings (the Dagster layer shows
# them as Markdown, JSON or a path).
@dataclass(frozen=True)
class Markdown:
    text: str


@dataclass(frozen=True)
class Json:
    value: Any


@dataclass(frozen=True)
class FilePath:
    path: str


def setting(default: Any = MISSING, help: str = "", *, default_factory: Any = MISSING) -> Any:
    """A producer setting: a dataclass field with its help text (the run config's description)."""
    if not help:
        raise ValueError("a setting needs its help text: it is the run config's description")
    return field(default=default, default_factory=default_factory, metadata={"help": help})


@dataclass(frozen=True)
class NoSettings:
    """A producer without knobs of its own."""


@dataclass(frozen=True)
class Skip:
    """What a state returns when the run writes nothing, and why (no labels to learn from)."""

    reason: str


@dataclass
class Run:
    """One run of a producer on its pinned version: what every state and hook gets. The steps
    fill it in order, so a step's state reads what the steps before it wrote and built."""

    producer: ColumnProducer
    table: Table
    pinned: lance.LanceDataset
    """The version this run pinned: its state and its writes belong to it."""
    settings: Any
    executor: str | None
    """As asked (None: ``LANCE_ASSETS_EXECUTOR``, else local); ``where`` resolves it."""
    fragments_per_commit: int | None
    log: Log
    state: Any = None
    """The producer's own ``state``, built before the first write."""
    states: dict[str, Any] = field(default_factory=dict)
    """Each step's state, by step name."""
    reports: dict[str, ColumnWriteReport] = field(default_factory=dict)
    """Each step's ``write_columns`` report, by step name."""
    after: dict[str, Any] = field(default_factory=dict)
    """What each step's ``after`` hook returned, by step name."""
    report: ColumnWriteReport | None = None
    """The last step's report: the one whose numbers stand for the run."""
    skipped: str | None = None
    duration_s: float = 0.0

    @property
    def where(self) -> str:
        """``local`` or ``ray``."""
        return executor_name(self.executor)

    @cached_property
    def rows_end(self) -> int:
        """Where the pinned version's rows end: rows with ids from here on came later."""
        return pinned_rows_end(self.table, self.pinned)


FieldsOf = Union[Sequence[pa.Field], Callable[[Any, Any], Sequence[pa.Field]]]


@dataclass(frozen=True)
class Step:
    """One column group a producer writes on its pinned version (see the module docstring)."""

    fields: FieldsOf
    """The group's fields, or ``fields(settings, state)`` when they depend on them."""
    compute: Callable[[Any, Any], ComputeFn]
    """``compute(settings, state) -> fragment -> batches``: what ``write_columns`` runs per
    fragment (picklable for Ray; a compute holding a driver resource has ``close()``, called
    when its write ends)."""
    state: Callable[[Run], Any] | None = None
    """Built on the pinned version after the steps before it; default: the producer's state."""
    after: Callable[[Run, Any], Any] | None = None
    """``after(run, state)``, once the write committed; its value is ``run.after[name]``."""
    name: str = ""
    """The step's key in ``run``; default: its first field's name."""
    gpu: bool = False
    """Under Ray, give each task one GPU when the cluster has any."""
    waiting: Callable[[Any], Collection[int]] | None = None
    """``waiting(state)``: fragments of the pinned version left for the next run (their input
    column is not written yet)."""

    def __post_init__(self) -> None:
        if not self.name:
            if callable(self.fields):
                raise ValueError("a step whose fields depend on its state needs a name=")
            object.__setattr__(self, "name", self.fields[0].name)

    def fields_for(self, settings: Any, state: Any) -> list[pa.Field]:
        return list(self.fields(settings, state) if callable(self.fields) else self.fields)


@dataclass
class Produced:
    """What one run of a producer did."""

    write: ColumnWriteReport | None
    """The report whose numbers stand for the run (its last step's; ``duration_s``: the whole
    run, state included); None when nothing was computed (``skipped`` says why)."""
    summary: dict = field(default_factory=dict)
    """The producer's own numbers for the materialization."""
    fields: list[pa.Field] | None = None
    """The columns this run reports, when not the declared ``fields`` (per-set columns)."""
    descriptions: dict[str, str] | None = None
    """Descriptions of reported fields that are not among the declared ones."""
    owned: list[str] | None = None
    """The columns whose data files make the data version, when not the reported fields."""
    skipped: str | None = None
    run: Run | None = None
    """The run itself: every step's report, state and hook result (for library callers)."""


@dataclass
class Reported:
    """The columns a run reports, when they are not the declared ones (``reported``)."""

    fields: list[pa.Field]
    descriptions: dict[str, str] = field(default_factory=dict)
    owned: list[str] | None = None


def fixed(compute: ComputeFn) -> Callable[[Any, Any], ComputeFn]:
    """``compute`` for a producer whose per-fragment function needs neither settings nor state."""
    return _Fixed(compute)


@dataclass(frozen=True)
class _Fixed:
    fn: ComputeFn

    def __call__(self, settings: Any, state: Any) -> ComputeFn:
        return self.fn


@dataclass(frozen=True)
class ColumnProducer:
    """One column asset, declared in the library (see the module docstring)."""

    name: str
    doc: str
    fields: Sequence[pa.Field]
    descriptions: Mapping[str, str]
    compute: Callable[[Any, Any], ComputeFn] | None = None
    steps: Sequence[Step] | Callable[[Run], Sequence[Step]] | None = None
    state: Callable[[Run], Any] | None = None
    summary: Callable[[Run], dict] | None = None
    reported: Callable[[Run], Reported] | None = None
    overall: Callable[[Run], ColumnWriteReport] | None = None
    """The report that stands for the run, when not its last step's (one that also counts an
    earlier step's fragments, with the producer's own numbers)."""
    settings: type = NoSettings
    reads: Mapping[str, Sequence[tuple[str, str]]] | Callable[[Any], Mapping] | None = None
    deps: tuple[str, ...] = ("raw_text",)
    group: str = "curation"
    kinds: tuple[str, ...] = ("lance", "python")
    version: str = "1"
    fragments_per_commit: int | None = None
    """The default of the ``fragments_per_commit`` setting (None: batched by time)."""
    not_computed: Callable[[lance.LanceDataset], str | None] | None = None
    """Why the columns may rightly be absent from a table (no labels to learn from), or None."""
    input_errors: tuple[type[Exception], ...] = ()
    """Errors that mean the settings or the user's files are wrong: the run fails with the
    message and without retries (retrying cannot help)."""

    def __post_init__(self) -> None:
        where = f"column producer {self.name!r}"
        if not NAME_RE.match(self.name) or keyword.iskeyword(self.name):
            raise ValueError(f"{where}: the name must be a lowercase identifier (it is the "
                             "asset's key and its file's name)")
        if (self.compute is None) == (self.steps is None):
            raise ValueError(f"{where}: declare exactly one of compute= (one group per "
                             "fragment) and steps= (groups written in order on one pinned "
                             "version)")
        if isinstance(self.steps, Sequence) and not (
                self.steps and all(isinstance(s, Step) for s in self.steps)):
            raise ValueError(f"{where}: steps= is a non-empty tuple of Step (or a function of "
                             "the run returning one)")
        if not self.fields:
            raise ValueError(f"{where}: declare the fields it writes")
        undescribed = [f.name for f in self.fields if not self.descriptions.get(f.name)]
        if undescribed:
            raise ValueError(f"{where}: columns {undescribed} have no description: add one to "
                             "its descriptions")
        if not (isinstance(self.settings, type) and is_dataclass(self.settings)):
            raise ValueError(f"{where}: settings= must be a dataclass (use setting(default, help))")
        for f in fields(self.settings):
            if not f.metadata.get("help"):
                raise ValueError(f"{where}: setting {f.name!r} has no help text: declare it with "
                                 "setting(default, help)")
            if f.name in ("executor", "fragments_per_commit"):
                raise ValueError(f"{where}: setting {f.name!r} is one every column asset has")
        if not self.doc.strip():
            raise ValueError(f"{where}: doc= is the asset's description in the UI: write it")

    @property
    def columns(self) -> list[str]:
        return [f.name for f in self.fields]

    def lineage(self, settings: Any = None) -> dict[str, list[tuple[str, str]]]:
        """``{column: [(asset, column) it is computed from]}``: by default, ``raw_text.text``."""
        reads = self.reads(settings if settings is not None else self.settings()) \
            if callable(self.reads) else self.reads
        if reads is None:
            return {c: [("raw_text", "text")] for c in self.columns}
        return {c: list(v) for c, v in reads.items()}

    def plan(self, run: Run) -> tuple[Step, ...]:
        """The steps of ``run``, in order (one ``compute`` is one step of the declared fields)."""
        if self.compute is not None:
            return (Step(fields=list(self.fields), compute=self.compute),)
        steps = self.steps(run) if callable(self.steps) else self.steps
        return tuple(steps or ())


def produce(producer: ColumnProducer, table: Table | str, settings: Any = None, *,
            executor: str | None = None, fragments_per_commit: int | None = None,
            log: Log = print, summarize: bool = True) -> Produced:
    """Run ``producer`` on ``table`` (a ``Table`` or a data root): pin the newest version, build
    its state there, and write each step's columns for that version's fragments that lack them,
    in order, with the same pinned dataset; then report. A cleanup that removes the pinned
    version underneath starts the run again on the newest (``Table.pinned``): what was
    committed is kept, so the steps before find nothing left to do.

    ``summarize``: add the producer's summary (numbers for the asset's metadata, read from the
    newest version after the writes); the library's own entry points leave it out."""
    table = Table.of(table)
    settings = producer.settings() if settings is None else settings
    if fragments_per_commit is None:
        fragments_per_commit = producer.fragments_per_commit
    table.newest()  # a clear error when raw_text has not run yet
    started = time.perf_counter()

    def run_on(ds: lance.LanceDataset) -> Run:
        run = Run(producer, table, ds, settings, executor, fragments_per_commit, log)
        if producer.state is not None:
            with phase(f"{producer.name}: table-wide state", log, announce=False):
                run.state = producer.state(run)
        if isinstance(run.state, Skip):
            run.skipped = run.state.reason
            return run
        for step in producer.plan(run):
            state = run.state
            if step.state is not None:
                with phase(f"{producer.name}: {step.name}: state", log, announce=False):
                    state = step.state(run)
            if isinstance(state, Skip):
                run.skipped = state.reason
                break
            run.states[step.name] = state
            _write_step(run, step, state)
            if step.after is not None:
                with phase(f"{producer.name}: {step.name}: after the write", log, announce=False):
                    run.after[step.name] = step.after(run, state)
        return run

    run = table.pinned(run_on, what=producer.name, log=log)
    run.duration_s = time.perf_counter() - started
    if run.report is None:
        return Produced(write=None, skipped=run.skipped or "no step wrote anything", run=run)
    if producer.overall is not None:
        run.report = producer.overall(run)
    run.report.duration_s = run.duration_s  # what the asset reports: the whole run
    summary = {}
    if producer.summary is not None and summarize:
        with phase(f"{producer.name}: summary", log, announce=False):
            summary = producer.summary(run)
    reported = producer.reported(run) if producer.reported is not None else None
    return Produced(write=run.report, summary=summary, skipped=run.skipped, run=run,
                    fields=reported.fields if reported else None,
                    descriptions=reported.descriptions if reported else None,
                    owned=reported.owned if reported else None)


def _write_step(run: Run, step: Step, state: Any) -> None:
    """``write_columns`` for one step on the run's pinned version; its report goes into ``run``."""
    compute = step.compute(run.settings, state)
    try:
        report = write_columns(run.table, step.fields_for(run.settings, state), compute,
                               pinned=run.pinned, fragments_per_commit=run.fragments_per_commit,
                               executor=run.executor, gpu=step.gpu, log=run.log,
                               waiting=step.waiting(state) if step.waiting is not None else ())
    finally:
        close = getattr(compute, "close", None)
        if callable(close):
            close()
    run.reports[step.name] = run.report = report


def producers(package: str = "lance_assets") -> list[ColumnProducer]:
    """Every ``PRODUCER`` of the library modules under ``package``, by name. Nothing is
    registered by hand: a new producer file is found where it lies."""
    found: dict[str, tuple[ColumnProducer, str]] = {}
    for name in _library_modules(package):
        producer = getattr(importlib.import_module(name), "PRODUCER", None)
        if not isinstance(producer, ColumnProducer):
            continue
        if producer.name in found:
            raise ValueError(f"two column producers are named {producer.name!r}: "
                             f"{found[producer.name][1]} and {name}; rename one")
        found[producer.name] = (producer, name)
    return [p for p, _ in sorted(found.values(), key=lambda pm: pm[0].name)]


def _library_modules(package: str) -> list[str]:
    """The modules of ``package`` and its subpackages that mention ``PRODUCER`` in their source
    (read, not imported: the forensics and trainer modules stay unloaded), those of
    ``NOT_PRODUCERS`` and private ones (``_x``, ``__main__``) left out."""
    out = []
    for info in pkgutil.iter_modules(importlib.import_module(package).__path__, prefix=f"{package}."):
        if info.name.startswith(NOT_PRODUCERS) or info.name.rpartition(".")[2].startswith("_"):
            continue
        if info.ispkg:
            out.extend(_library_modules(info.name))
            continue
        spec = info.module_finder.find_spec(info.name)
        origin = Path(spec.origin) if spec is not None and spec.origin else None
        if origin is None or "PRODUCER" in origin.read_text(encoding="utf-8", errors="replace"):
            out.append(info.name)
    return out
