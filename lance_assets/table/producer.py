"""Column producers: the one contract every column asset is declared under.

A producer is a module-level ``PRODUCER = ColumnProducer(...)`` in a library file named after
its asset (``curation/detected_language.py`` makes ``detected_language``): its settings (a
dataclass of ``setting(default, help)``), the descriptions of its columns, and the column
groups it writes, in order, as typed steps. ``compute=`` (with ``fields=`` and an optional
``state=``) is the one-step case; the producer's fields are its steps' fields.

A :class:`Step` writes one group per fragment: ``compute(settings, state)`` returns the
picklable function from a fragment to its batches (a Ray task under ``executor: ray``). Its
``state(run, before)`` is built on the pinned version once the step before committed, from that
step's result (``before``, a typed value); its ``after(run, state, written)`` runs once its
write committed and returns the step's result. The last step's result is the run's report (a
``ColumnWriteReport``, or a subclass with the producer's own numbers); ``summary(table, report)``
turns it into the materialization's metadata. A state may return ``Skip(reason)``: nothing more
is written and ``produce`` returns it.

``produce(PRODUCER, table, Settings(...))`` is the library call, and the asset's: it pins one
version (``Table.pinned``), builds each state there and writes each group with that pinned
dataset (rows ingested meanwhile keep a null write marker for the next run). No producer pins
or calls ``write_columns`` itself. ``producers()`` finds every ``PRODUCER``; ``defs/columns.py``
makes each into its asset (docs/write-a-tagger.md). This module imports no Dagster.
"""

from __future__ import annotations

import importlib
import keyword
import pkgutil
import re
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
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
from lance_assets.table.settings import NoSettings, check_settings, setting

__all__ = ["ColumnProducer", "Run", "Skip", "Step", "produce", "producers", "setting"]

Log = Callable[[str], None]
NAME_RE = re.compile(r"^[a-z][a-z0-9_]{0,62}$")
# library packages that hold no producer (and import torch or run processes): not walked
NOT_PRODUCERS = ("lance_assets.defs", "lance_assets.train", "lance_assets.launch",
                 "lance_assets.definitions", "lance_assets.__main__")


@dataclass(frozen=True)
class Skip:
    """What a state returns when the run writes nothing (more), and why (no labels to learn
    from); ``produce`` returns it."""

    reason: str


@dataclass
class Run:
    """One run of a producer on its pinned version: what every state and hook gets."""

    table: Table
    pinned: lance.LanceDataset
    """The version this run pinned: its states and its writes belong to it."""
    settings: Any
    executor: str | None
    """As asked (None: ``LANCE_ASSETS_EXECUTOR``, else local); ``where`` resolves it."""
    fragments_per_commit: int | None
    log: Log

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
    """The group's fields, or ``fields(settings, state)`` when they depend on the settings
    (called with state None for the producer's declared fields)."""
    compute: Callable[[Any, Any], ComputeFn]
    """``compute(settings, state) -> fragment -> batches``: what ``write_columns`` runs per
    fragment (picklable for Ray; a compute holding a driver resource has ``close()``, called
    when its write ends)."""
    state: Callable[[Run, Any], Any] | None = None
    """``state(run, before)``: built on the pinned version from the step before's result
    (None for the first step); default: ``before`` itself."""
    after: Callable[[Run, Any, Any], Any] | None = None
    """``after(run, state, written)`` once the write committed: the step's result; default:
    ``written``, the write's ``ColumnWriteReport``."""
    each: bool = False
    """The state is a list, and the step writes one group per item (``fields`` and
    ``compute`` get the item; ``written`` is the list of reports): a column per evaluation set."""
    gpu: bool = False
    """Under Ray, give each task one GPU when the cluster has any."""
    waiting: Callable[[Any], Collection[int]] | None = None
    """``waiting(state)``: fragments of the pinned version left for the next run (their input
    column is not written yet)."""

    def fields_for(self, settings: Any, state: Any) -> list[pa.Field]:
        return list(self.fields(settings, state) if callable(self.fields) else self.fields)


@dataclass(frozen=True, init=False)
class ColumnProducer:
    """One column asset, declared in the library (see the module docstring)."""

    name: str
    doc: str
    """The asset's description in the UI."""
    steps: tuple[Step, ...]
    descriptions: Mapping[str, str]
    """Every declared column's description: the UI's column schema and the table's docs."""
    settings: type
    summary: Callable[[Table, Any], dict] | None
    """``summary(table, report)``: the producer's numbers for the materialization (plain
    values, or ``Markdown``, ``Json``, ``FilePath`` of ``lance_assets.markdown``)."""
    reads: Mapping[str, Sequence[tuple[str, str]]] | Callable[[Any], Mapping] | None
    """Column lineage, ``{column: [(asset, column)]}`` (or a function of the settings);
    default: every column from ``raw_text.text``."""
    deps: tuple[str, ...]
    group: str
    kinds: tuple[str, ...]
    version: str
    """The code version; it also feeds the data version (a new one marks downstream stale)."""
    fragments_per_commit: int | None
    """The default of the ``fragments_per_commit`` setting (None: batched by time)."""
    not_computed: Callable[[lance.LanceDataset], str | None] | None
    """Why the columns may rightly be absent from a table (no labels to learn from), or None."""

    def __init__(self, *, name: str, doc: str, descriptions: Mapping[str, str],
                 steps: Sequence[Step] | None = None, fields: Sequence[pa.Field] | None = None,
                 compute: Callable[[Any, Any], ComputeFn] | None = None,
                 state: Callable[[Run, Any], Any] | None = None, settings: type = NoSettings,
                 summary: Callable[[Table, Any], dict] | None = None,
                 reads: Mapping | Callable[[Any], Mapping] | None = None,
                 deps: tuple[str, ...] = ("raw_text",), group: str = "curation",
                 kinds: tuple[str, ...] = ("lance", "python"), version: str = "1",
                 fragments_per_commit: int | None = None,
                 not_computed: Callable[[lance.LanceDataset], str | None] | None = None) -> None:
        where = f"column producer {name!r}"
        if not NAME_RE.match(name) or keyword.iskeyword(name):
            raise ValueError(f"{where}: the name must be a lowercase identifier (it is the "
                             "asset's key and its file's name)")
        if (compute is None) == (steps is None):
            raise ValueError(f"{where}: declare exactly one of compute= (with fields=: one group "
                             "per fragment) and steps= (groups written in order on one pinned "
                             "version)")
        if compute is not None:
            steps = (Step(fields=list(fields or ()), compute=compute, state=state),)
        elif fields is not None or state is not None:
            raise ValueError(f"{where}: fields= and state= go with compute=; with steps=, each "
                             "Step declares its own")
        steps = tuple(steps)
        if not steps or not all(isinstance(s, Step) for s in steps):
            raise ValueError(f"{where}: steps= is a non-empty tuple of Step")
        if steps[-1].each and steps[-1].after is None:
            raise ValueError(f"{where}: the last step writes one group per item: give it an "
                             "after= that returns the run's report")
        check_settings(settings, where)
        if not doc.strip():
            raise ValueError(f"{where}: doc= is the asset's description in the UI: write it")
        for attr, value in [("name", name), ("doc", doc), ("steps", steps),
                            ("descriptions", descriptions), ("settings", settings),
                            ("summary", summary), ("reads", reads), ("deps", tuple(deps)),
                            ("group", group), ("kinds", tuple(kinds)), ("version", version),
                            ("fragments_per_commit", fragments_per_commit),
                            ("not_computed", not_computed)]:
            object.__setattr__(self, attr, value)
        declared = self.fields
        if not declared:
            raise ValueError(f"{where}: declare the fields it writes")
        undescribed = [f.name for f in declared if not descriptions.get(f.name)]
        if undescribed:
            raise ValueError(f"{where}: columns {undescribed} have no description: add one to "
                             "its descriptions")

    @property
    def fields(self) -> list[pa.Field]:
        """The declared columns: every step's fields at the default settings (a step that
        writes one group per item writes columns named by the data, declared by none)."""
        settings = self.settings()
        return [f for s in self.steps if not s.each for f in s.fields_for(settings, None)]

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


def produce(producer: ColumnProducer, table: Table, settings: Any = None, *,
            executor: str | None = None, fragments_per_commit: int | None = None,
            log: Log = print) -> Any:
    """Run ``producer`` on ``table`` with ``settings`` (default: the defaults): pin the newest
    version and run the steps in order on it, each writing its group for the fragments of that
    version that lack it. Returns the run's report (the last step's result), or the ``Skip`` a
    state returned. A cleanup that removes the pinned version underneath starts the run again
    on the newest (``Table.pinned``): what was committed is kept, so the steps before find
    nothing left to do."""
    if not isinstance(table, Table):
        raise TypeError(f"produce({producer.name}): table is a Table (Table.of(data root), "
                        f"once, where the root comes in), not {type(table).__name__}")
    settings = producer.settings() if settings is None else settings
    if not isinstance(settings, producer.settings):
        raise TypeError(f"produce({producer.name}): settings are a {producer.settings.__name__}, "
                        f"not a {type(settings).__name__}")
    if fragments_per_commit is None:
        fragments_per_commit = producer.fragments_per_commit
    table.newest()  # a clear error when raw_text has not run yet
    started = time.perf_counter()

    def run_on(ds: lance.LanceDataset) -> Any:
        run = Run(table, ds, settings, executor, fragments_per_commit, log)
        result = None
        for i, step in enumerate(producer.steps, 1):
            label = producer.name if len(producer.steps) == 1 else \
                f"{producer.name} (step {i}/{len(producer.steps)})"
            result = _run_step(run, step, result, label)
            if isinstance(result, Skip):
                break
        return result

    report = table.pinned(run_on, what=producer.name, log=log)
    if isinstance(report, Skip):
        log(f"{producer.name}: nothing written: {report.reason}")
        return report
    if not isinstance(report, ColumnWriteReport):
        raise TypeError(f"{producer.name}: the last step's result is the run's report, a "
                        f"ColumnWriteReport (or a subclass), not {type(report).__name__}")
    report.duration_s = time.perf_counter() - started  # what the asset reports: the whole run
    return report


def _run_step(run: Run, step: Step, before: Any, label: str) -> Any:
    """One step on the run's pinned version: its state from ``before``, its write (one per
    item for ``each``), then ``after``; returns its result."""
    state = before
    if step.state is not None:
        with phase(f"{label}: state", run.log, announce=False):
            state = step.state(run, before)
    if isinstance(state, Skip):
        return state
    written = [_write(run, step, item) for item in state] if step.each \
        else _write(run, step, state)
    if step.after is None:
        return written
    with phase(f"{label}: after the write", run.log, announce=False):
        return step.after(run, state, written)


def _write(run: Run, step: Step, state: Any) -> ColumnWriteReport:
    """``write_columns`` for one group on the run's pinned version."""
    compute = step.compute(run.settings, state)
    try:
        return write_columns(run.table, step.fields_for(run.settings, state), compute,
                             pinned=run.pinned, fragments_per_commit=run.fragments_per_commit,
                             executor=run.executor, gpu=step.gpu, log=run.log,
                             waiting=step.waiting(state) if step.waiting is not None else ())
    finally:
        close = getattr(compute, "close", None)
        if callable(close):
            close()


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
