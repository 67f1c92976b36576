"""Which version a reader reads: the one place that turns "the newest", a version number or a
tag (a snapshot) into one pinned version (``Table.choose``).

A training run, its resumes, an ablation, the forensics and ``explain`` all ask the same
question, and the answer has to follow the rules the snapshots and the maintenance enforce:

- ``table_maintenance`` removes every version that no tag names once it is older than
  ``keep_versions_hours`` (never the newest), so a version number can be gone;
- a tag is held by a snapshot record and released by its owner, by the retention
  (``Snapshots.retention``: unnamed runs beyond the newest few, superseded ablations) or by
  ``forget``, so a tag can be gone, and the version it named with it;
- a run records the tag *and* the version it read: the tag may since have been moved to another
  version (a rerun under the same name), in which case the recorded version is read by number
  while a cleanup has not removed it.

Each failure is a :class:`VersionChoiceError` that names what was asked, why it cannot be read
and what to give instead.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import lance

from lance_assets.table.forget_log import removed_by_forget

if TYPE_CHECKING:
    from lance_assets.table.snapshots import Snapshot

RETENTION = ("table_maintenance removes the versions no tag names once they are older than "
             "keep_versions_hours (never the newest), and releases the tags of unnamed runs and "
             "ablations the retention no longer keeps")


class VersionChoiceError(ValueError):
    """A version, a tag or a snapshot that cannot be read; the message says which, why, and what
    to give instead."""


@dataclass(frozen=True)
class Chosen:
    """One version to read, and how it was chosen."""

    version: int
    tag: str | None  # the tag it was chosen through (None: a number, the newest, or a tag moved)
    said: str  # how it was chosen, in words ("version 7 (tag train-r1)")
    snapshot: Snapshot | None = None  # the tag's record (owner, kind, named) when it has one
    dataset: lance.LanceDataset | None = field(default=None, repr=False, compare=False)
    branch: str | None = None  # a redacted copy's branch (``redact``): read it through ``tag``
    redactions: tuple = ()  # what ``forget`` redacted from it (``redact.redactions``)

    @property
    def ref(self) -> int | str:
        """What opens it again: the version number, or the tag of a redacted copy."""
        return self.version if self.branch is None else self.tag


def choose(table, ref: int | str | None = None, *, version: int | None = None,
           or_newest: bool = False) -> Chosen:
    """See ``Table.choose`` (``table`` is that ``Table``)."""
    if isinstance(ref, bool) or not isinstance(ref, (int, str, type(None))):
        raise TypeError(f"table version {ref!r}: give a version number, a tag or None (the newest)")
    if isinstance(ref, int):
        if version is not None and version != ref:
            raise ValueError(f"version {ref} and version={version}: give one of them")
        return _number(table, ref, f"version {ref} (given)")
    if ref is None:
        if version is not None:
            return _number(table, version, f"version {version} (given)")
        newest = table.newest()
        return Chosen(newest.version, None, f"newest version {newest.version}", None, newest)
    snap = table.snapshots.get(ref)
    if snap is None and version is None and ref.isascii() and ref.isdigit():
        return _number(table, int(ref), f"version {int(ref)} (given)")  # "12" from a CLI or a config
    if snap is not None and snap.branch is not None:
        redacted = _redacted(table, ref, snap, version)
        if redacted is not None:
            return redacted
    if snap is not None and snap.branch is None and (version is None or snap.version == version):
        ds = _open(table, snap.version)
        if ds is None:
            raise VersionChoiceError(
                f"tag {ref!r} of {table.uri} names version {snap.version}, which cannot be read "
                f"(its files are gone). Give another tag ({_tags(table)}), a version that exists "
                "or none for the newest")
        owner = f", held by {snap.owner}" if snap.recorded else ""
        return Chosen(snap.version, ref, f"version {snap.version} (tag {ref}{owner})",
                      snap if snap.recorded else None, ds)
    if version is not None:  # a run's record: the tag moved or was released since
        why = (f"tag {ref} now names version {snap.version}" if snap is not None else
               f"tag {ref} was released")
        ds = _open(table, version)
        if ds is None:
            raise VersionChoiceError(
                f"version {version} of {table.uri}, which tag {ref!r} named, no longer exists: "
                f"{why} and a cleanup removed the version ({RETENTION}). Read another version "
                f"(its tags: {_tags(table)}) or make the data again (train or run the ablation "
                "again)")
        return Chosen(version, None, f"version {version} ({why})", None, ds)
    if or_newest:  # the caller holds the tag there next (a run's first start)
        newest = table.newest()
        return Chosen(newest.version, None, f"newest version {newest.version} (no tag {ref} yet)",
                      None, newest)
    raise VersionChoiceError(
        f"{table.uri} has no tag {ref!r} (its tags: {_tags(table)}): it was never made, or it was "
        f"released ({RETENTION}). Give one of its tags, a version number, or none for the newest")


def _redacted(table, ref: str, snap, version: int | None) -> Chosen | None:
    """The redacted copy ``ref`` names, when it is what was asked for: the tag alone, or the
    version a run recorded before ``forget`` redacted it (None: the tag moved since)."""
    from lance_assets.table.redact import redactions

    ds = _open(table, ref)
    if ds is None:
        raise VersionChoiceError(
            f"tag {ref!r} of {table.uri} names version {snap.version} of branch {snap.branch}, "
            f"which cannot be read (its files are gone). Give another tag ({_tags(table)}), a "
            "version that exists or none for the newest")
    done = tuple(redactions(ds))
    if version is not None and version != snap.version and not any(
            r.get("version") == version for r in done):
        return None
    owner = f", held by {snap.owner}" if snap.recorded else ""
    gone = sum(int(r.get("ids", 0)) for r in done)
    said = (f"version {snap.version} of branch {snap.branch} (tag {ref}{owner}: version "
            f"{done[0]['version'] if done else '?'} with the documents {len(done)} forget(s) "
            f"removed, {gone} id(s) asked)")
    return Chosen(snap.version, ref, said, snap if snap.recorded else None, ds, snap.branch, done)


def _number(table, version: int, said: str) -> Chosen:
    ds = _open(table, version) if version >= 0 else None
    if ds is not None:
        return Chosen(version, None, said, None, ds)
    newest = table.newest()
    known = sorted(int(v["version"]) for v in newest.versions())
    if 1 <= version < newest.version:  # versions count from 1
        why = f"no longer exists: {removed_by_forget(table, version) or RETENTION}"
    else:
        why = "does not exist"
    raise VersionChoiceError(
        f"table version {version} of {table.uri} {why}. Give a version that exists "
        f"({_ranges(known)}), one of its tags ({_tags(table)}) or none for the newest; hold a "
        "snapshot tag on a version to keep it (table.snapshots.hold)")


def _open(table, version: int | str) -> lance.LanceDataset | None:
    try:
        return table.open(version)
    except (OSError, ValueError, OverflowError):  # gone, never made, or not a version at all
        return None


def _tags(table) -> str:
    """The table's tags and their versions, for a message."""
    tags = table.snapshots.list()
    return ", ".join(f"{t} (version {s.version}" + (f" of branch {s.branch}" if s.branch else "")
                     + ")" for t, s in sorted(tags.items())) or "none"


def _ranges(numbers: list[int]) -> str:
    """``[1, 2, 3, 7]`` as ``1 to 3, 7``."""
    out: list[str] = []
    start = prev = None
    for n in numbers + [None]:
        if start is not None and (n is None or n != prev + 1):
            out.append(str(start) if start == prev else f"{start} to {prev}")
            start = None
        if n is not None and start is None:
            start = n
        prev = n
    return ", ".join(out) or "none"
