"""The corpus table over its lifetime: compaction, cleanup of old versions, index refresh, and
the snapshots (Lance tags) that training runs read.

Safe at any moment, next to ingest, column backfills and training, because of three rules:

- **Compaction never loses a value a writer has not written yet.** Every column group carries a
  write marker (``corpus.columns``), so rows that a rewrite fills with nulls stay detectably
  unwritten and the writers refill them, whoever compacted (this module, ``compact_files`` or
  lancedb's ``optimize``). This module goes further and leaves out of compaction the fragments
  whose groups are still being written (a marker is null), so a backfill in flight keeps its
  fragments and nothing is computed twice; fragments with deleted rows are compacted anyway,
  since column writes need whole fragments.
- **Cleanup never removes a tagged version.** ``cleanup_old_versions`` runs with
  ``error_if_tagged_old_versions=False``: Lance keeps every tagged version and the files it
  references, and removes the other versions older than ``keep_versions_for`` (never the
  newest). Each training run tags the version it reads (``train-<run name>``), so its ranks,
  its resume, ``samples`` and the forensics read it however aggressive the cleanup. A release
  (``release_snapshot``) deletes the tag; the next cleanup may then remove that version.
- **Every step commits like any writer**: retried on the newest version when a concurrent
  commit wins (``table.commit_retrying``); a writer whose read version a cleanup removed is
  retried the same way.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

import lance

from lance_assets import paths
from lance_assets.corpus.columns import incomplete_fragments
from lance_assets.corpus.ingest import DEFAULT_ROWS_PER_FRAGMENT
from lance_assets.table import commit_retrying, open_table

SNAPSHOT_PREFIX = "train-"
DEFAULT_KEEP_VERSIONS_FOR = timedelta(days=1)


def snapshot_tag(run_name: str) -> str:
    """The tag of the table version the training run ``run_name`` reads."""
    return SNAPSHOT_PREFIX + run_name


def snapshot_version(uri: str, tag: str) -> int | None:
    """The version ``tag`` names, or None when there is no such tag."""
    tags = lance.dataset(uri).tags.list()
    return tags[tag]["version"] if tag in tags else None


def tag_snapshot(uri: str, tag: str, version: int) -> int:
    """Point ``tag`` at ``version`` (created, or moved there); returns ``version``."""

    def attempt() -> int:
        ds = lance.dataset(uri)
        current = ds.tags.list().get(tag)
        if current is None:
            try:
                ds.tags.create(tag, version)
            except ValueError:  # created meanwhile by a concurrent run: move it below
                ds = lance.dataset(uri)
                ds.tags.update(tag, version)
        elif current["version"] != version:
            ds.tags.update(tag, version)
        return version

    return commit_retrying(f"tag {tag}", attempt)


class SnapshotError(ValueError):
    """A snapshot tag that cannot be released; the message names it and what exists."""


def release_snapshot(uri: str, tag: str) -> int:
    """Delete ``tag``; returns the version it named. The next cleanup may remove that version
    (unless another tag names it, or it is the newest)."""
    tags = lance.dataset(uri).tags.list()
    if tag not in tags:
        raise SnapshotError(f"{uri} has no tag {tag!r}; its tags: "
                            f"{', '.join(sorted(tags)) or 'none'}")
    lance.dataset(uri).tags.delete(tag)
    return tags[tag]["version"]


@dataclass
class MaintenanceReport:
    version_before: int = 0
    version_after: int = 0
    fragments_before: int = 0
    fragments_after: int = 0
    fragments_removed: int = 0  # rewritten into the added ones
    fragments_added: int = 0
    fragments_left_out: int = 0  # not compacted: their column groups are still being written
    bytes_reclaimed: int = 0
    data_files_removed: int = 0
    versions_removed: int = 0
    versions_kept: int = 0
    tags_kept: dict[str, int] = field(default_factory=dict)  # tag -> version
    tags_released: dict[str, int] = field(default_factory=dict)
    indexes: dict[str, dict] = field(default_factory=dict)  # name -> unindexed rows before/after
    duration_s: float = 0.0

    def markdown(self) -> str:
        lines = [
            f"Version {self.version_before} → {self.version_after}. Fragments "
            f"{self.fragments_before:,} → {self.fragments_after:,} ({self.fragments_removed:,} "
            f"compacted into {self.fragments_added:,}; {self.fragments_left_out:,} left out while "
            f"their columns are being written). Cleanup removed {self.versions_removed:,} "
            f"version(s) and {self.bytes_reclaimed / 1e6:,.1f} MB; {self.versions_kept:,} "
            f"version(s) kept.",
        ]
        if self.tags_kept:
            lines.append("\n| tag kept | version |\n|---|---|")
            lines += [f"| `{t}` | {v} |" for t, v in sorted(self.tags_kept.items())]
        if self.tags_released:
            lines.append("\n| tag released | version |\n|---|---|")
            lines += [f"| `{t}` | {v} |" for t, v in sorted(self.tags_released.items())]
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


def maintain(
    root: str | Path,
    *,
    compact: bool = True,
    target_rows_per_fragment: int = DEFAULT_ROWS_PER_FRAGMENT,
    cleanup: bool = True,
    keep_versions_for: timedelta = DEFAULT_KEEP_VERSIONS_FOR,
    optimize_indexes: bool = True,
    release: list[str] | tuple[str, ...] = (),
    log: Callable[[str], None] = print,
) -> MaintenanceReport:
    """Release the ``release`` tags, compact, optimize the indexes, then remove old versions.

    ``target_rows_per_fragment``: fragments below it are merged with their neighbours up to it
    (fragments are the unit of column writes, so the default is ingest's fragment size);
    deleted rows are dropped for good. ``keep_versions_for``: untagged versions younger than
    this stay (in-flight readers and writers use recent versions); tagged ones always stay."""
    start = time.perf_counter()
    uri = paths.table_uri(root)
    ds = open_table(root)
    report = MaintenanceReport(version_before=ds.version,
                               fragments_before=len(ds.get_fragments()))
    for tag in release:
        report.tags_released[tag] = release_snapshot(uri, tag)
        log(f"released snapshot {tag} (version {report.tags_released[tag]})")

    if compact:

        def compaction() -> tuple:
            current = lance.dataset(uri)
            left_out = sorted(incomplete_fragments(current))
            # every deleted row is dropped (Lance's default waits for 10% of a fragment):
            # column writes need fragments without deletion files
            metrics = current.optimize.compact_files(
                target_rows_per_fragment=target_rows_per_fragment, materialize_deletions=True,
                materialize_deletions_threshold=0.0, excluded_fragment_ids=left_out)
            return metrics, len(left_out)

        metrics, report.fragments_left_out = commit_retrying("compaction", compaction, log=log)
        report.fragments_removed = metrics.fragments_removed
        report.fragments_added = metrics.fragments_added
        log(f"compaction: {metrics.fragments_removed} fragment(s) into "
            f"{metrics.fragments_added}; {report.fragments_left_out} left out while their "
            "columns are being written")

    if optimize_indexes:
        before = _unindexed_rows(lance.dataset(uri))
        if any(before.values()):
            commit_retrying("optimize indexes",
                            lambda: lance.dataset(uri).optimize.optimize_indices(), log=log)
        after = _unindexed_rows(lance.dataset(uri))
        report.indexes = {name: {"before": before[name], "after": after.get(name, 0)}
                          for name in before}

    if cleanup:
        stats = lance.dataset(uri).cleanup_old_versions(
            older_than=keep_versions_for, error_if_tagged_old_versions=False)
        report.versions_removed = stats.old_versions
        report.bytes_reclaimed = stats.bytes_removed
        report.data_files_removed = stats.data_files_removed
        log(f"cleanup: {stats.old_versions} untagged version(s) older than "
            f"{keep_versions_for.total_seconds() / 3600:g} h removed, "
            f"{stats.bytes_removed / 1e6:.1f} MB")

    ds = lance.dataset(uri)
    report.version_after = ds.version
    report.fragments_after = len(ds.get_fragments())
    report.versions_kept = len(ds.versions())
    report.tags_kept = {t: info["version"] for t, info in ds.tags.list().items()}
    report.duration_s = time.perf_counter() - start
    return report
