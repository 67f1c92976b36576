"""What ``forget`` refuses before it changes anything, measured against every version on disk.

- **The share.** The documents the predicate matches in any version on disk, against the most
  live rows any version on disk holds: an operator's own delete in the newest version hides
  nothing from the count. More than ``max_share`` of them needs ``max_share`` raised; as many
  as the largest version holds, or every row of the newest version, needs ``allow_all``.
- **Snapshots.** ``forget`` redacts every tagged snapshot that holds one of the documents
  (``redact``): the project's own (``snapshots.made_by_project``) and a user's alike keep every
  other row under the same tag, so nothing but the documents asked for is destroyed and no
  consent beyond the forget's is needed. A snapshot goes as a whole only when the forget names
  it (``--release TAG``, checked by ``unknown_release``); the journal keeps the names, so a
  rerun that finishes it releases what the first run was told to, and nothing else.

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


def unknown_release(tags: Iterable[str], release: Iterable[str]) -> str | None:
    """A ``--release`` name that is no tag of the table."""
    known = set(tags)
    missing = [t for t in release if t not in known]
    if not missing:
        return None
    return (f"forget --release {missing[0]}: the table has no such tag (its tags: "
            f"{', '.join(sorted(known)) or 'none'}). Name a tag that holds documents being "
            "forgotten (python -m lance_assets forget --dry-run lists them).")
