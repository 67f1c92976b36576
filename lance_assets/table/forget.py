"""Removing documents for good: ``forget``.

A delete alone removes rows from the newest version only: every older version, and above all
every tagged snapshot (training runs, ablations), still holds them, and so do the data files
until a compaction rewrites them. ``forget`` goes all the way:

1. **Find** the documents: the predicate (through the same parser as the curation rules, so it
   is data, never SQL pasted into a query) is evaluated on the newest version and on every
   tagged snapshot where its columns exist; their ids are what is forgotten.
2. **Account**: every tagged snapshot that holds one of them, the training run or ablation
   behind it (its folder, its checkpoints, how many of the documents its filter trained on).
3. **Refuse** while a training run still reads one of those snapshots (``Snapshots.using``),
   unless forced.
4. **Delete** the rows (by id, so the set cannot grow between steps), **release** the
   snapshots, **compact** every fragment that held them (the deleted rows are dropped from the
   rewritten files) and **clean up** every version older than now: the old data files go.
5. **Verify**: no version left on disk holds any of the ids, and say so.

The report goes to the run's metadata and to an append-only log (``<data>/forget.log.jsonl``).
It names the documents by id and count, never by text.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from pathlib import Path

import lance
import numpy as np

from lance_assets import paths, storage
from lance_assets.curation.predicate import PredicateError, safe_predicate
from lance_assets.curation.rules import lance_problem
from lance_assets.table import Table
from lance_assets.table.maintenance import (
    SNAPSHOT_PREFIX,
    MaintenanceReport,
    cleanup_versions,
    compact_table,
)

ABLATION_PREFIX = "ablation-"
LOG_NAME = "forget.log.jsonl"
ID_CHUNK = 2000


class ForgetError(ValueError):
    """A predicate that cannot be used, or a forget that must not run; the message says why."""


@dataclass
class Holder:
    """A tagged snapshot that held forgotten documents, and what stands behind it."""

    tag: str
    version: int
    rows: int  # forgotten documents in that version
    kind: str = "snapshot"  # run | ablation | snapshot
    name: str = ""  # the run or ablation
    folder: str | None = None
    trained_on: int | None = None  # of ``rows``, those its training filter kept (runs)
    checkpoints: list[str] = field(default_factory=list)
    in_use: bool = False


@dataclass
class ForgetReport:
    predicate: str
    ids: int = 0
    id_range: list[int] = field(default_factory=list)  # [smallest, largest]
    rows_deleted: int = 0
    holders: list[Holder] = field(default_factory=list)
    released: dict[str, int] = field(default_factory=dict)
    forced: bool = False
    versions_removed: int = 0
    bytes_reclaimed: int = 0
    versions_checked: int = 0
    still_readable: int = 0  # forgotten ids readable from some version after the cleanup
    version_after: int = 0
    duration_s: float = 0.0

    @property
    def runs(self) -> list[str]:
        return [h.name for h in self.holders if h.kind == "run"]

    def to_dict(self) -> dict:
        return {**asdict(self), "runs": self.runs}

    def markdown(self) -> str:
        lines = [f"Forgot **{self.ids:,} document(s)** matching `{self.predicate}` "
                 f"({self.rows_deleted:,} deleted from the newest version). "
                 f"{len(self.released)} snapshot(s) released; cleanup removed "
                 f"{self.versions_removed} version(s), {self.bytes_reclaimed / 1e6:,.1f} MB. "
                 f"Checked {self.versions_checked} version(s) left on disk: "
                 + ("none holds a forgotten document." if not self.still_readable else
                    f"**{self.still_readable} forgotten document(s) still readable**.")]
        if self.holders:
            lines.append("\n| snapshot | version | held | kind | name | trained on | "
                         "checkpoints |\n|---|---|---|---|---|---|---|")
            lines += [f"| `{h.tag}` | {h.version} | {h.rows} | {h.kind} | {h.name} | "
                      f"{'' if h.trained_on is None else h.trained_on} | {len(h.checkpoints)} |"
                      for h in self.holders]
        return "\n".join(lines)


def _id_filters(ids: np.ndarray) -> list[str]:
    """``id IN (...)`` filters over chunks of ``ids`` (integers only: nothing user-typed)."""
    return [f"id IN ({','.join(str(int(i)) for i in ids[lo:lo + ID_CHUNK])})"
            for lo in range(0, len(ids), ID_CHUNK)]


def _count(ds: lance.LanceDataset, filters: list[str], extra: str | None = None) -> int:
    return sum(ds.count_rows(filter=f if extra is None else f"({f}) AND ({extra})")
               for f in filters)


def _matching_ids(ds: lance.LanceDataset, where: str) -> np.ndarray | None:
    """Ids matching ``where`` in ``ds``, or None when the predicate does not apply there (a
    column it names is not in that version)."""
    try:
        pred = safe_predicate(where, ds.schema.names)
    except PredicateError:
        return None
    if lance_problem(ds, pred):
        return None
    return ds.to_table(columns=["id"], filter=pred.lance).column("id").to_numpy()


def _holder(table: Table, tag: str, version: int, rows: int) -> Holder:
    h = Holder(tag, version, rows)
    h.in_use = table.snapshots.in_use(tag)
    root = storage.location(table.root)
    if tag.startswith(SNAPSHOT_PREFIX):
        h.kind, h.name = "run", tag[len(SNAPSHOT_PREFIX):]
        folder = paths.run_dir(root, h.name)
        h.folder = str(folder)
        if folder.is_dir():
            h.checkpoints = sorted(str(p) for p in folder.iterdir()
                                   if p.name.startswith("ckpt_") and p.name.endswith(".pt"))
            summary = folder / "summary.json"
            if not summary.is_file() and storage.is_object_store(folder):
                h.in_use = True  # no lock there: a run without its summary may still train
    elif tag.startswith(ABLATION_PREFIX):
        h.kind, h.name = "ablation", tag[len(ABLATION_PREFIX):]
        h.folder = str(paths.ablation_dir(root, h.name))
    return h


def _trained_on(table: Table, h: Holder, ds: lance.LanceDataset, filters: list[str]) -> None:
    """How many of the forgotten documents the run's training filter kept (its summary)."""
    if h.kind != "run" or h.folder is None:
        return
    summary = storage.location(h.folder) / "summary.json"
    try:
        train_filter = json.loads(summary.read_text()).get("filter")
    except (FileNotFoundError, ValueError):
        return
    try:  # the filter is the run's own, validated when it trained; checked again all the same
        pred = safe_predicate(train_filter, ds.schema.names) if train_filter else None
    except PredicateError:
        return
    h.trained_on = _count(ds, filters, pred.lance if pred else None)


def forget(table: Table | str | Path, where: str, *, force: bool = False,
           log: Callable[[str], None] = print) -> ForgetReport:
    """Remove the documents ``where`` selects from every version on disk (module docstring)."""
    start = time.perf_counter()
    table = Table.of(table)
    newest = table.newest()
    try:
        pred = safe_predicate(where, newest.schema.names)
    except PredicateError as e:
        raise ForgetError(f"forget --where: {e}") from None
    problem = lance_problem(newest, pred)
    if problem:
        raise ForgetError(f"forget --where {where!r}: {problem}")
    report = ForgetReport(predicate=pred.source, forced=force)

    # 1. the documents: in the newest version and in every snapshot
    snaps = table.snapshots.list()
    found = [newest.to_table(columns=["id"], filter=pred.lance).column("id").to_numpy()]
    opened = {}
    for tag in snaps:
        opened[tag] = table.open(tag)
        got = _matching_ids(opened[tag], where)
        if got is not None:
            found.append(got)
    ids = np.unique(np.concatenate(found)).astype(np.int64)
    report.ids = len(ids)
    if len(ids):
        report.id_range = [int(ids[0]), int(ids[-1])]
    filters = _id_filters(ids)
    log(f"forget: {len(ids):,} document(s) match {pred.source!r}")

    # 2. who holds them
    for tag, snap in sorted(snaps.items()):
        if not filters:
            break
        rows = _count(opened[tag], filters)
        if rows:
            holder = _holder(table, tag, snap.version, rows)
            _trained_on(table, holder, opened[tag], filters)
            report.holders.append(holder)
    busy = [h.tag for h in report.holders if h.in_use]
    if busy and not force:
        raise ForgetError(
            f"forget {pred.source!r}: snapshot(s) {', '.join(busy)} hold some of the "
            f"{len(ids):,} document(s) and a running training run still reads them. Wait for it "
            "to finish (or cancel it), or pass force to release them anyway (the run then fails "
            "on its next read of a removed file).")

    # 3. delete, release, compact, clean up
    if filters:
        before = newest.count_rows()
        for f in filters:
            table.commit("forget: delete", lambda d, f=f: d.delete(f), log=log)
        report.rows_deleted = before - table.newest().count_rows()
    for h in report.holders:
        try:
            report.released[h.tag] = table.snapshots.release(h.tag)
        except ValueError:
            pass  # released meanwhile
        log(f"forget: released {h.tag} (version {h.version}, {h.rows} document(s))")
    holding = {f.fragment_id for f in table.newest().get_fragments()
               if f.metadata.deletion_file is not None}
    maint = MaintenanceReport()
    compact_table(table, include=holding, report=maint, log=log)
    cleanup_versions(table, timedelta(0), maint, log)
    report.versions_removed, report.bytes_reclaimed = maint.versions_removed, maint.bytes_reclaimed

    # 4. verify: no version left on disk reads any of them
    final = table.newest()
    report.version_after = final.version
    for v in final.versions():
        report.versions_checked += 1
        if filters:
            report.still_readable += _count(table.open(int(v["version"])), filters)
    report.duration_s = time.perf_counter() - start
    storage.append_text(storage.location(table.root) / LOG_NAME, json.dumps(
        {"at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), **report.to_dict()},
        sort_keys=True, default=str) + "\n")
    log(report.markdown())
    return report
