"""The corpus table over its lifetime: compaction, cleanup of old versions, index refresh, and
the snapshots (Lance tags) that training runs read. Safe at any moment, next to ingest, column
backfills and training, because of these rules:

- **Compaction never loses a value a writer has not written yet.** Every column group carries a
  write marker (``corpus.columns``), so rows a rewrite fills with nulls stay detectably unwritten
  and are refilled. Fragments whose groups are still being written are left out of compaction,
  so a backfill in flight keeps its fragments (those with deleted rows are compacted anyway).
- **Cleanup never removes a tagged version** (``error_if_tagged_old_versions=False``). Each
  training run tags the version it reads (``train-<run name>``), so its ranks, resume,
  ``samples`` and the forensics read it however aggressive the cleanup.
- **Compaction lands while ingest runs.** Lance rejects a ``Rewrite`` planned before an ingest's
  ``Merge``; here the rewritten files are kept and the commit rebuilt on the newest version for
  the groups whose fragments are unchanged (same data and deletion files). Groups changed
  meanwhile are dropped, their files removed, and planned again.
- **A fragment's ids ascend.** Lance appends a rewrite's new fragments after those it left
  alone, so a rewrite group is kept only when its fragments are consecutive in id order with
  ascending ranges (the column writers read a fragment's rows in id order); the others are left
  as they are and counted (``groups_left_out_of_order``).
- **Every step commits like any writer**: retried on the newest version when a concurrent commit
  wins (``Table.commit``), or when a cleanup removed the version it read.
- **Snapshots have owners** (``table.snapshots``): ``maintain`` releases what the retention no
  longer keeps and what ``release`` names before it cleans up, and counts the documents only
  the versions it removes read, in every version (``documents_dropped``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

import lance
import numpy as np
from lance.optimize import Compaction, RewriteResult

from lance_assets.progress import phase, progress
from lance_assets.table import Table, is_version_gone
from lance_assets.table.columns import incomplete_fragments
from lance_assets.table.snapshots import DEFAULT_KEEP_UNNAMED_RUNS, SnapshotError  # noqa: F401
from lance_assets.table.snapshots import RUN_PREFIX as SNAPSHOT_PREFIX

DEFAULT_ROWS_PER_FRAGMENT = 4096
"""Rows per fragment: what ingest writes (``ingest.raw_text`` takes it from here) and what
compaction aims for."""
DEFAULT_KEEP_VERSIONS_FOR = timedelta(days=1)
# Rounds of compaction planned again because fragments changed while they were rewritten.
MAX_COMPACTION_ROUNDS = 20


def snapshot_tag(run_name: str) -> str:
    """The tag of the table version the training run ``run_name`` reads."""
    return SNAPSHOT_PREFIX + run_name


@dataclass
class MaintenanceReport:
    version_before: int = 0
    version_after: int = 0
    fragments_before: int = 0
    fragments_after: int = 0
    fragments_removed: int = 0  # rewritten into the added ones
    fragments_added: int = 0
    fragments_left_out: int = 0  # not compacted: their column groups are still being written
    compaction_rounds: int = 0  # plans made (more than one: fragments changed meanwhile)
    rewrites_dropped: int = 0  # rewrite groups whose fragments changed while rewritten
    groups_left_out_of_order: int = 0  # merges that would mix ids out of order (docstring)
    bytes_reclaimed: int = 0
    data_files_removed: int = 0
    versions_removed: int = 0
    versions_kept: int = 0
    documents_dropped: int = 0  # read only by the versions the cleanup removes: gone for good
    largest_rows: int = 0  # the most rows a version on disk held: what it is a share of
    tags_kept: dict[str, int] = field(default_factory=dict)  # tag -> version
    tags_released: dict[str, int] = field(default_factory=dict)
    retention: dict[str, str] = field(default_factory=dict)  # tag -> why kept or released
    indexes: dict[str, dict] = field(default_factory=dict)  # name -> unindexed rows before/after
    duration_s: float = 0.0

    def markdown(self) -> str:
        lines = [
            f"Version {self.version_before} → {self.version_after}. Fragments "
            f"{self.fragments_before:,} → {self.fragments_after:,} ({self.fragments_removed:,} "
            f"compacted into {self.fragments_added:,}; {self.fragments_left_out:,} left out while "
            f"their columns are being written). Cleanup removed {self.versions_removed:,} "
            f"version(s) and {self.bytes_reclaimed / 1e6:,.1f} MB; {self.versions_kept:,} "
            f"version(s) kept; {self.documents_dropped:,} document(s) only the removed versions "
            f"read (deleted since) are gone for good, of the {self.largest_rows:,} rows the "
            "largest version held.",
        ]
        if self.tags_kept:
            lines.append("\n| tag kept | version | why |\n|---|---|---|")
            lines += [f"| `{t}` | {v} | {self.retention.get(t, '')} |"
                      for t, v in sorted(self.tags_kept.items())]
        if self.tags_released:
            lines.append("\n| tag released | version | why |\n|---|---|---|")
            lines += [f"| `{t}` | {v} | {self.retention.get(t, '')} |"
                      for t, v in sorted(self.tags_released.items())]
        if self.indexes:
            lines.append("\n| index | unindexed rows before | after |\n|---|---|---|")
            lines += [f"| `{n}` | {v['before']:,} | {v['after']:,} |"
                      for n, v in sorted(self.indexes.items())]
        return "\n".join(lines)


def _unindexed_rows(ds: lance.LanceDataset) -> dict[str, int]:
    out = {}
    for index in ds.describe_indices():
        out[index.name] = int(ds.stats.index_stats(index.name).get("num_unindexed_rows", 0))
    return out


def _rebased(result: RewriteResult, version: int) -> RewriteResult:
    """``result`` as if its rewrite had been planned on ``version``: Lance checks the commit
    against what landed after the result's read version, so a rewrite whose fragments are
    unchanged at ``version`` (checked by the caller) is judged only by what lands after it."""
    doc = json.loads(result.json())
    doc["read_version"] = version
    return RewriteResult.from_json(json.dumps(doc))


def _new_files(results: list[RewriteResult]) -> list[str]:
    """The data files that rewrites wrote (to remove when they are not committed)."""
    return [f.path for r in results for m in r.new_fragments for f in m.data_files()]


def _plan(ds: lance.LanceDataset, target_rows_per_fragment: int, include: set[int] | None,
          report: MaintenanceReport) -> list:
    """The rewrite groups of one compaction round on ``ds`` (see ``compact_table``)."""
    left_out = sorted(incomplete_fragments(ds) - (include or set()))
    report.fragments_left_out = len(left_out)
    # every deleted row is dropped (Lance's default waits for 10% of a fragment): column
    # writes need fragments without deletion files
    plan = Compaction.plan(ds, dict(
        target_rows_per_fragment=target_rows_per_fragment, materialize_deletions=True,
        materialize_deletions_threshold=0.0, excluded_fragment_ids=left_out))
    tasks = in_id_order(ds, plan.tasks) if plan.tasks else []
    report.groups_left_out_of_order = len(plan.tasks) - len(tasks)
    # a fragment with deleted rows in a group left out is rewritten alone: deleted rows
    # leave the data files (forget's promise), and one fragment keeps its own order
    merged = {f.id for t in tasks for f in t.fragments}
    every = [f.fragment_id for f in ds.get_fragments()]
    for task in plan.tasks:
        for frag in task.fragments:
            if frag.id in merged or frag.deletion_file is None:
                continue
            alone = Compaction.plan(ds, dict(
                target_rows_per_fragment=target_rows_per_fragment,
                materialize_deletions=True, materialize_deletions_threshold=0.0,
                excluded_fragment_ids=[f for f in every if f != frag.id]))
            tasks.extend(alone.tasks)
    return tasks


def compact_table(table: Table, *,
                  target_rows_per_fragment: int = DEFAULT_ROWS_PER_FRAGMENT,
                  include: set[int] | None = None, report: MaintenanceReport | None = None,
                  log: Callable[[str], None] = print) -> MaintenanceReport:
    """Merge small fragments and drop deleted rows (module docstring: the rewrite is committed on
    the newest version for the groups whose fragments did not change meanwhile).

    Fragments whose column groups are still being written are left out, unless ``include``
    names them (``forget`` must rewrite every fragment that held a forgotten row)."""
    report = report or MaintenanceReport()
    for _ in range(MAX_COMPACTION_ROUNDS):
        report.compaction_rounds += 1
        ds = table.newest()
        results: list[RewriteResult] = []
        try:
            tasks = _plan(ds, target_rows_per_fragment, include, report)
            if not tasks:
                return report
            rows = [sum(getattr(f, "physical_rows", 0) for f in task.fragments)
                    for task in tasks]
            with progress(len(tasks), "compaction: rewriting fragments", "group", log,
                          rows_total=sum(rows)) as bar:
                for task, n in zip(tasks, rows):
                    results.append(task.execute(ds))
                    bar.update(1, rows=n)
        except Exception as exc:
            if not is_version_gone(exc):
                raise
            # a cleanup with no retention removed files of the version being planned or
            # rewritten: what was rewritten is dropped, and the newest version planned again
            report.rewrites_dropped += len(results)
            table.remove_files(_new_files(results))
            log(f"compaction: version {ds.version} lost files to a cleanup while it was "
                "rewritten; planning again on the newest")
            continue

        def attempt(newest: lance.LanceDataset, results: list = results) -> tuple[list, list]:
            live = {f.fragment_id: f.metadata for f in newest.get_fragments()}
            same = [r for r in results
                    if all(live.get(o.id) == o for o in r.original_fragments)]
            changed = [r for r in results if not any(r is k for k in same)]
            if same:
                Compaction.commit(newest, [_rebased(r, newest.version) for r in same])
            return same, changed

        done, changed = table.commit("compaction", attempt, log=log)
        for r in done:
            report.fragments_removed += r.metrics.fragments_removed
            report.fragments_added += r.metrics.fragments_added
        if not changed:
            break
        report.rewrites_dropped += len(changed)
        table.remove_files(_new_files(changed))
        log(f"compaction: {len(changed)} rewrite group(s) dropped (their fragments changed while "
            "they were rewritten); planning those again")
    log(f"compaction: {report.fragments_removed} fragment(s) into {report.fragments_added}; "
        f"{report.fragments_left_out} left out while their columns are being written")
    return report


def id_ranges(ds: lance.LanceDataset) -> dict[int, tuple[int, int]]:
    """fragment id -> (smallest, largest) ``id`` of its live rows (fragments without rows left
    out)."""
    import pyarrow.compute as pc

    out = {}
    for frag in ds.get_fragments():
        ids = frag.to_table(columns=["id"]).column("id")
        if len(ids):
            lo, hi = pc.min_max(ids).values()
            out[frag.fragment_id] = (lo.as_py(), hi.as_py())
    return out


def in_id_order(ds: lance.LanceDataset, tasks: list) -> list:
    """The compaction tasks whose merged fragment keeps ids ascending and interleaves with no
    other fragment: its fragments, in merge order, have ascending ranges, and no fragment
    outside it holds an id between their first and last (module docstring)."""
    ranges = id_ranges(ds)
    kept = []
    for task in tasks:
        members = [f.id for f in task.fragments]
        spans = [ranges[m] for m in members if m in ranges]
        if any(a[1] >= b[0] for a, b in zip(spans, spans[1:])):
            continue  # merged in this order, ids would go down inside the new fragment
        if spans:
            lo, hi = spans[0][0], spans[-1][1]
            if any(r[0] <= hi and r[1] >= lo for f, r in ranges.items() if f not in members):
                continue  # another fragment's ids lie in between
        kept.append(task)
    return kept


def cleanup_versions(table: Table, keep_versions_for: timedelta, report: MaintenanceReport,
            log: Callable[[str], None] = print) -> None:
    """Remove untagged versions older than ``keep_versions_for`` (never the newest)."""
    stats = table.newest().cleanup_old_versions(older_than=keep_versions_for,
                                                error_if_tagged_old_versions=False)
    report.versions_removed += stats.old_versions
    report.bytes_reclaimed += stats.bytes_removed
    report.data_files_removed += stats.data_files_removed
    log(f"cleanup: {stats.old_versions} untagged version(s) older than "
        f"{keep_versions_for.total_seconds() / 3600:g} h removed, "
        f"{stats.bytes_removed / 1e6:.1f} MB")


def _id_fragments(ds: lance.LanceDataset) -> dict[tuple, object]:
    """A version's fragments by what their live ids depend on: the data file holding ``id`` and
    the deletion file (a column written since changes neither)."""
    id_field = ds.lance_schema.field("id").id()
    out = {}
    for frag in ds.get_fragments():
        meta = frag.metadata
        deletion = meta.deletion_file
        key = (next((f.path for f in meta.data_files() if id_field in f.fields), None),
               None if deletion is None else (deletion.id, deletion.read_version))
        out[key] = frag
    return out


def _older(stamp: datetime, keep: timedelta) -> bool:
    now = datetime.now(stamp.tzinfo) if stamp.tzinfo else datetime.now()
    return stamp <= now - keep


def dropped_by_cleanup(table: Table, keep_versions_for: timedelta,
                       releasing: Iterable[str] = ()) -> tuple[int, int]:
    """(documents that only the versions a cleanup would remove read, the most rows a version
    on disk holds). The cleanup keeps the newest version, the tagged ones (but ``releasing``)
    and those younger than ``keep_versions_for``. A fragment's ids are read once per state."""
    newest = table.newest()
    skip = set(releasing)
    tags = {t: i for t, i in newest.tags.list().items() if t not in skip}
    tagged = {int(i["version"]) for i in tags.values() if i.get("branch") is None}
    gone: dict[tuple, object] = {}
    kept: dict[tuple, object] = {}
    largest = 0
    for t in (t for t, i in tags.items() if i.get("branch")):  # redacted copies keep theirs
        kept.update(_id_fragments(table.open(t)))
    for v in newest.versions():
        number = int(v["version"])
        try:
            ds = newest if number == newest.version else table.open(number)
            largest = max(largest, ds.count_rows())
            frags = _id_fragments(ds)
        except Exception as exc:  # noqa: BLE001 - one a concurrent cleanup removed holds nothing
            if isinstance(exc, (OSError, ValueError)) or is_version_gone(exc):
                continue
            raise
        removed = (number != newest.version and number not in tagged
                   and _older(v["timestamp"], keep_versions_for))
        (gone if removed else kept).update(frags)
    ids = [_live_ids(gone[k]) for k in gone if k not in kept]
    left = np.unique(np.concatenate(ids)) if ids else np.zeros(0, np.int64)
    for frag in kept.values():  # a compaction or a delete since gave them other fragments
        if not len(left):
            break
        left = left[~np.isin(left, _live_ids(frag))]
    return int(len(left)), largest


def _live_ids(frag) -> np.ndarray:
    """A fragment's live ids; none when a concurrent cleanup removed its files meanwhile."""
    try:
        return frag.to_table(columns=["id"]).column("id").to_numpy()
    except Exception as exc:  # noqa: BLE001 - re-raised unless its version went away
        if isinstance(exc, (OSError, ValueError)) or is_version_gone(exc):
            return np.zeros(0, np.int64)
        raise


def maintain(
    table: Table,
    *,
    compact: bool = True,
    target_rows_per_fragment: int = DEFAULT_ROWS_PER_FRAGMENT,
    cleanup: bool = True,
    keep_versions_for: timedelta = DEFAULT_KEEP_VERSIONS_FOR,
    optimize_indexes: bool = True,
    release: list[str] | tuple[str, ...] = (),
    retention: bool = True,
    keep_unnamed_runs: int = DEFAULT_KEEP_UNNAMED_RUNS,
    log: Callable[[str], None] = print,
) -> MaintenanceReport:
    """Release the ``release`` tags and those the retention policy no longer keeps, compact,
    optimize the indexes, then remove old versions.

    ``target_rows_per_fragment``: fragments below it are merged with their neighbours up to it
    (fragments are the unit of column writes, so the default is ingest's fragment size);
    deleted rows are dropped for good. ``keep_versions_for``: untagged versions younger than
    this stay (in-flight readers and writers use recent versions); tagged ones always stay.
    ``retention``: apply the snapshot policy (``table.snapshots``), keeping the newest
    ``keep_unnamed_runs`` unnamed training runs per owner. A ``release`` naming no tag of the
    table is refused before anything is released."""
    start = time.perf_counter()
    ds = table.newest()
    report = MaintenanceReport(version_before=ds.version,
                               fragments_before=len(ds.get_fragments()))
    snapshots = table.snapshots
    missing = [t for t in release if t not in ds.tags.list()]
    if missing:
        raise SnapshotError(f"release_snapshots: {table.uri} has no tag {missing[0]!r} (its "
                            f"tags: {', '.join(sorted(ds.tags.list())) or 'none'}); nothing was "
                            "released or changed")
    policy = snapshots.retention(keep_unnamed_runs) if retention else None
    if cleanup:
        releasing = [*release, *(policy.release if policy else ())]
        report.documents_dropped, report.largest_rows = dropped_by_cleanup(
            table, keep_versions_for, releasing)
        log(f"cleanup: {report.documents_dropped:,} document(s) only the versions it removes "
            f"read (deleted since) go for good, of the {report.largest_rows:,} rows the largest "
            "version on disk holds")
    for tag in release:
        report.tags_released[tag] = snapshots.release(
            tag, "released on request (table_maintenance's release_snapshots)")
        report.retention[tag] = "released on request"
        log(f"released snapshot {tag} (version {report.tags_released[tag]})")
    if policy is not None:
        report.retention.update(policy.keep)
        for tag, why in policy.release.items():
            try:
                report.tags_released[tag] = snapshots.release(
                    tag, f"table_maintenance's retention: {why}")
            except SnapshotError:
                continue  # released meanwhile by another maintenance
            report.retention[tag] = why
            log(f"released snapshot {tag} (version {report.tags_released[tag]}): {why}")

    if compact:
        compact_table(table, target_rows_per_fragment=target_rows_per_fragment, report=report, log=log)

    if optimize_indexes:
        before = _unindexed_rows(table.newest())
        if any(before.values()):
            with phase(f"maintenance: adding {sum(before.values()):,} rows to the indexes", log):
                table.commit("optimize indexes", lambda d: d.optimize.optimize_indices(), log=log)
        after = _unindexed_rows(table.newest())
        report.indexes = {name: {"before": before[name], "after": after.get(name, 0)}
                          for name in before}

    if cleanup:
        with phase("maintenance: removing old versions", log, announce=False):
            cleanup_versions(table, keep_versions_for, report, log)

    ds = table.newest()
    report.version_after = ds.version
    report.fragments_after = len(ds.get_fragments())
    report.versions_kept = len(ds.versions())
    report.tags_kept = {t: info["version"] for t, info in ds.tags.list().items()}
    report.duration_s = time.perf_counter() - start
    return report


def rebuild_indexes(table: Table, log: Callable[[str], None]) -> list[dict]:
    """Build every index in force again over the table as it is now, with the same kind and
    parameters: an index keeps what it was built from (BM25's token dictionary and postings,
    a vector index's centroids and codes) even after its rows are deleted and remapped."""
    ds = table.newest()
    out = []
    for desc in ds.describe_indices():
        name, column = desc.name, desc.field_names[0]
        stats = ds.stats.index_stats(name)
        kind = str(stats.get("index_type", ""))
        detail = (stats.get("indices") or [{}])[0]
        if kind.upper().startswith("IVF"):
            kwargs = {"metric": detail.get("metric_type", "l2"),
                      "num_partitions": int(detail.get("num_partitions") or 1)}
            sub = detail.get("sub_index") or {}
            if "num_sub_vectors" in sub and "PQ" in kind.upper():
                kwargs["num_sub_vectors"] = int(sub["num_sub_vectors"])

            def build(d, column=column, kind=kind, name=name, kwargs=kwargs):
                return d.create_index(column, kind.upper(), name=name, replace=True, **kwargs)
        else:
            scalar = "INVERTED" if kind.lower() == "inverted" else kind.upper()

            def build(d, column=column, scalar=scalar, name=name):
                return d.create_scalar_index(column, scalar, name=name, replace=True)
        table.commit(f"forget: rebuild index {name}", build, log=log)
        rows = next(d.num_rows_indexed for d in table.newest().describe_indices() if d.name == name)
        out.append({"name": name, "type": kind, "column": column, "rows": rows})
        log(f"forget: index {name} rebuilt over {rows:,} rows")
    return out
