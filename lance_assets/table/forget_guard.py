"""What ``forget`` refuses before it changes anything, measured against every version on disk.

- **The share.** The documents the predicate matches in any version on disk, against the most
  live rows any version on disk holds: an operator's own delete in the newest version hides
  nothing from the count. More than ``max_share`` of them needs ``max_share`` raised; as many
  as the largest version holds, or every row of the newest version, needs ``allow_all``.
- **A user's snapshot.** ``forget`` releases every snapshot that holds one of the documents.
  The project's own (``train-<run>``, ``ablation-<name>``: ``snapshots.made_by_project``) go as
  they always have; a snapshot a user made by hand or named goes only when the forget names it
  (``--release TAG``). The journal keeps the names a forget was given, so a rerun that finishes
  it releases what the first run was allowed to, and nothing else.

A dry run reports the same figures and says which of these a forget would meet.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from lance_assets.table.snapshots import Snapshot, made_by_project

ForgetReport = Holder = Any  # ``forget``'s (which imports this module)

MAX_SHARE = 0.1  # of the most rows a version on disk holds: more needs max_share raised


class ForgetError(ValueError):
    """A predicate that cannot be used, or a forget that must not run or could not finish; the
    message says why and what to do."""


def made_by_hand(snap: Snapshot | None) -> bool:
    """A snapshot a user made by hand or named (no prefix of the project's own)."""
    return snap is not None and not made_by_project(snap)


def share_problem(report: ForgetReport, max_share: float, allow_all: bool) -> str | None:
    """Why a forget of what ``report`` counts is refused without a setting (None: it is not)."""
    if not report.ids:
        return None
    digest = f"forget ({report.predicate_sha256[:19]}…)"
    figures = (f"{report.ids:,} document(s) match in the versions on disk, {report.share:.0%} "
               f"of the {report.largest_rows:,} rows the largest version on disk holds (version "
               f"{report.largest_version}); {report.live:,} of them in the newest version's "
               f"{report.table_rows:,} rows")
    whole = report.ids >= report.largest_rows
    emptied = report.live and report.live == report.table_rows
    if (whole or emptied) and not allow_all:
        what = ("as many as the largest version holds: the whole table" if whole else
                "every row of the newest version")
        return (f"{digest}: {figures}. That is {what}. Check the predicate with --dry-run; to "
                "erase them all, pass --allow-all (allow_all in forget_job).")
    if report.share > max_share:
        return (f"{digest}: {figures}. That is more than --max-share {max_share:g}. Check the "
                f"predicate with --dry-run; to go on, pass --max-share "
                f"{min(1.0, report.share + 0.01):.2f} (max_share in forget_job).")
    return None


def not_released(holders: Iterable[Holder], release: Iterable[str]) -> list[Holder]:
    """The holders made or named by a user that ``release`` does not name."""
    named = set(release)
    return [h for h in holders if h.by_hand and h.tag not in named]


def release_problem(holders: Iterable[Holder], release: Iterable[str], who: str,
                    then: str = "Nothing was changed.") -> str | None:
    """Why the snapshots holding the documents cannot be released (a user's, not named)."""
    kept = not_released(holders, release)
    if not kept:
        return None
    return (f"{who}: snapshot(s) "
            + ", ".join(f"{h.tag} (version {h.version}, {h.rows:,} document(s))" for h in kept)
            + " were made or named by a user and hold documents being forgotten; forget "
            f"releases such a snapshot only when named. {then} To release them, pass "
            + " ".join(f"--release {h.tag}" for h in kept) + " (release in forget_job); to "
            "keep them, narrow the predicate (check it with --dry-run).")


def unknown_release(tags: Iterable[str], release: Iterable[str]) -> str | None:
    """A ``--release`` name that is no tag of the table."""
    known = set(tags)
    missing = [t for t in release if t not in known]
    if not missing:
        return None
    return (f"forget --release {missing[0]}: the table has no such tag (its tags: "
            f"{', '.join(sorted(known)) or 'none'}). Name a tag that holds documents being "
            "forgotten (python -m lance_assets forget --dry-run lists them).")
