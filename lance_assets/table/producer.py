"""Column producers: the one contract every column asset is declared under.

A column producer is a module-level ``PRODUCER = ColumnProducer(...)`` in one small library file
named after its asset (``curation/detected_language.py`` makes the ``detected_language``
asset). It declares:

- ``fields`` and ``descriptions``: the Arrow fields it writes, each described (the UI's column
  schema and the table's documentation are the same text);
- ``compute``: the per-fragment function (``compute(settings, state) -> fragment -> batches``,
  picklable, so a Ray task can run it), and optionally ``state``: table-wide state built once
  on the pinned version (``state(table, pinned, settings, log)``: the duplicate ids of
  ``dedup_flag``, say); or, for a producer that is not one group of columns written per
  fragment (per-set columns, a trained head), ``write(table, settings, options) -> Produced``,
  which must still pin one version and write through ``write_columns``;
- ``settings``: a frozen dataclass of its knobs (``setting(default, help)``), which becomes the
  asset's run config next to the knobs every column asset has (executor, fragments per commit);
- ``summary``: extra numbers for the materialization (plain values, ``Markdown``, ``Json``,
  ``FilePath``);
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
from collections.abc import Callable, Mapping, Sequence
from dataclasses import MISSING, dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any

import lance
import pyarrow as pa

from lance_assets.progress import phase
from lance_assets.table.columns import ColumnWriteReport, ComputeFn, write_columns
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
class WriteOptions:
    """How to write, the same for every producer: where per-fragment work runs (``local`` or
    ``ray``), how many fragments per commit (None: batched by time), and where progress goes."""

    executor: str | None = None
    fragments_per_commit: int | None = None
    log: Log = print


@dataclass
class Produced:
    """What one run of a producer did."""

    write: ColumnWriteReport | None
    """The ``write_columns`` report (for a producer that writes several groups: the one whose
    numbers stand for the run); None when nothing was computed (``skipped`` says why)."""
    summary: dict = field(default_factory=dict)
    """The producer's own numbers for the materialization."""
    fields: list[pa.Field] | None = None
    """The columns this run reports, when not the declared ``fields`` (per-set columns)."""
    descriptions: dict[str, str] | None = None
    """Descriptions of reported fields that are not among the declared ones."""
    owned: list[str] | None = None
    """The columns whose data files make the data version, when not the reported fields."""
    skipped: str | None = None


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
    state: Callable[[Table, lance.LanceDataset, Any, Log], Any] | None = None
    write: Callable[[Table, Any, WriteOptions], Produced] | None = None
    summary: Callable[[Table, ColumnWriteReport, Any], dict] | None = None
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
        if (self.compute is None) == (self.write is None):
            raise ValueError(f"{where}: declare exactly one of compute= (per fragment) and "
                             "write= (a whole write on one pinned version)")
        if self.state is not None and self.compute is None:
            raise ValueError(f"{where}: state= feeds compute=; a write= producer builds its own")
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


def produce(producer: ColumnProducer, table: Table | str, settings: Any = None, *,
            executor: str | None = None, fragments_per_commit: int | None = None,
            log: Log = print, summarize: bool = True) -> Produced:
    """Run ``producer`` on ``table`` (a ``Table`` or a data root): pin the newest version, build
    its state there, and write its columns for that version's fragments that lack them.
    ``summarize``: add the producer's summary (numbers for the asset's metadata, read from the
    newest version after the write); the library's own entry points leave it out."""
    table = Table.of(table)
    settings = producer.settings() if settings is None else settings
    if fragments_per_commit is None:
        fragments_per_commit = producer.fragments_per_commit
    table.newest()  # a clear error when raw_text has not run yet
    options = WriteOptions(executor=executor, fragments_per_commit=fragments_per_commit, log=log)
    if producer.write is not None:
        return producer.write(table, settings, options)

    def run(ds: lance.LanceDataset) -> ColumnWriteReport:
        state = None
        if producer.state:
            with phase(f"{producer.name}: table-wide state", log, announce=False):
                state = producer.state(table, ds, settings, log)
        return write_columns(table, list(producer.fields), producer.compute(settings, state),
                             pinned=ds, fragments_per_commit=fragments_per_commit,
                             executor=executor, log=log)

    report = table.pinned(run, what=producer.name, log=log)
    summary = {}
    if producer.summary and summarize:
        with phase(f"{producer.name}: summary", log, announce=False):
            summary = producer.summary(table, report, settings)
    return Produced(write=report, summary=summary)


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
