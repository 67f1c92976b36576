"""Tagged versions of the corpus table, each with who holds it and until when.

A training run, a curation ablation or a user pins the version it reads with a Lance tag, so no
cleanup removes that version while someone needs it. A tag alone says nothing about whether it
is still needed, so every tag made here has a record next to the table
(``<data>/lance/corpus.snapshots/<tag>.json``): its owner (the asset or tool that made it), its
kind, whether a user named it, and when it was made. ``retention`` turns the records into a
decision that ``table_maintenance`` applies:

- an **unnamed training run** (the run folder is the Dagster run id) is kept while it is among
  the newest ``keep_unnamed_runs`` unnamed runs of its owner;
- an **unnamed ablation** (keyed by the data it compares on) is kept until a newer unnamed
  ablation supersedes it;
- a **named** snapshot (a ``run_name``, an ablation ``name``, a tag made by hand) is kept until
  it is released (``release``, ``table_maintenance``'s ``release_snapshots``, ``forget``);
- a tag without a record (made by hand, or by an older version of this project) is kept.
  Tags ``train-*`` and ``ablation-*`` are the project's (``made_by_project``); no step releases
  any other unless given its name (``forget --release``, ``release_snapshots``).

The record is written after the tag and removed after it, so a process killed in between leaves
at worst a tag without a record, which is kept: retention never releases what it cannot account
for. A release leaves a note (``<tag>.json`` under ``released/``: who held it and why it was
released) so that a reader who asks for the snapshot later is told what became of it; the note
decides nothing.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field

from lance_assets import storage

RUN = "run"
ABLATION = "ablation"
MANUAL = "manual"
RUN_PREFIX = "train-"  # a training run's tag: train-<run name>
ABLATION_PREFIX = "ablation-"  # an ablation's tag (a mixture search's: ablation-mixture-<name>)
PROJECT_PREFIXES = (RUN_PREFIX, ABLATION_PREFIX)
DEFAULT_KEEP_UNNAMED_RUNS = 3
RELEASED = "released"  # the folder of release notes, next to the records
NO_REASON = "released by hand or by forget (no reason given)"  # a note's reason when none is
_TAG = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,200}$")


class SnapshotError(ValueError):
    """A snapshot tag that cannot be made or released; the message says what happened."""


@dataclass
class Snapshot:
    tag: str
    version: int
    owner: str = "unknown"  # the asset or tool that holds it
    kind: str = MANUAL  # run | ablation | manual
    named: bool = True  # named by a user: kept until released
    created: float = 0.0  # unix time; orders snapshots of one owner, decides nothing else
    recorded: bool = False  # a record exists (tags made elsewhere have none)
    branch: str | None = None  # the branch ``version`` is on: a redacted copy (``redact``)

    def to_dict(self) -> dict:
        return asdict(self)


def made_by_project(snap: Snapshot) -> bool:
    """Whether ``snap`` is one the project makes for a training run or an ablation: its tag's
    prefix says so (a run killed between tagging and recording leaves no record). Any other tag
    was made or named by a user."""
    return snap.tag.startswith(PROJECT_PREFIXES)


@dataclass
class Retention:
    """What the policy keeps and releases, with the reason for each tag."""

    keep: dict[str, str] = field(default_factory=dict)  # tag -> why
    release: dict[str, str] = field(default_factory=dict)


class Snapshots:
    """The table's tags and their records (``Table.snapshots``; ``table`` is that ``Table``)."""

    def __init__(self, table) -> None:
        self.table = table
        self.folder = storage.location(table.db_dir) / f"{table.name}.snapshots"

    # -- reading
    def _record(self, tag: str) -> dict | None:
        try:
            return json.loads((self.folder / f"{tag}.json").read_text())
        except (FileNotFoundError, ValueError):
            return None

    def _snapshot(self, tag: str, info: dict) -> Snapshot:
        rec = self._record(tag)
        snap = Snapshot(tag, int(info["version"]), branch=info.get("branch"))
        if rec:
            snap.owner = rec.get("owner", snap.owner)
            snap.kind = rec.get("kind", snap.kind)
            snap.named = bool(rec.get("named", True))
            snap.created = float(rec.get("created", 0.0))
            snap.recorded = True
        return snap

    def list(self) -> dict[str, Snapshot]:
        return {tag: self._snapshot(tag, info)
                for tag, info in self.table.newest().tags.list().items()}

    def get(self, tag: str) -> Snapshot | None:
        """The snapshot ``tag`` names (its version and record), or None when there is no such
        tag; reads only that tag's record."""
        info = self.table.newest().tags.list().get(tag)
        return None if info is None else self._snapshot(tag, info)

    def version(self, tag: str) -> int | None:
        """The version ``tag`` names, or None when there is no such tag."""
        info = self.table.newest().tags.list().get(tag)
        return None if info is None else int(info["version"])

    def branch_of(self, tag: str, version: int) -> str | None:
        """The branch of the redacted copy ``tag`` names when it names ``version`` there (a
        rerun pinned through the tag reads and holds that copy), else None."""
        snap = self.get(tag)
        return snap.branch if snap is not None and snap.version == version else None

    # -- holding and releasing
    def hold(self, tag: str, version: int, *, owner: str, kind: str = MANUAL,
             named: bool = True, branch: str | None = None) -> int:
        """Point ``tag`` at ``version`` (created, or moved there) and record who holds it;
        ``branch``: the branch ``version`` is on (a redacted copy a resume reads again)."""
        if not _TAG.match(tag):
            raise SnapshotError(f"{tag!r} is not a valid snapshot tag: use letters, digits, '.', "
                                "'_' and '-' (at most 200 characters)")

        def attempt(ds) -> int:
            current = ds.tags.list().get(tag)
            if current is not None:
                if (current["version"], current.get("branch")) != (version, branch):
                    ds.tags.update(tag, version if branch is None else (branch, version))
                    moved_off.append(current.get("branch"))
                return version
            try:
                ds.tags.create(tag, version)
            except (ValueError, OSError) as exc:
                now = self.table.newest()
                if tag in now.tags.list():  # created meanwhile by a concurrent run: move it
                    if now.tags.list()[tag]["version"] != version:
                        now.tags.update(tag, version)
                    return version
                if version not in {int(v["version"]) for v in now.versions()}:
                    raise SnapshotError(
                        f"cannot tag version {version} of {self.table.uri} as {tag!r}: that "
                        "version no longer exists (a cleanup of old versions removed it before "
                        f"it was tagged). Newest version: {now.version}. Run again: the run "
                        "pins the newest version.") from None
                raise SnapshotError(f"cannot tag version {version} of {self.table.uri} as "
                                    f"{tag!r}: {str(exc).splitlines()[0][:300]}") from exc
            return version

        moved_off: list[str | None] = []
        self.table.commit(f"tag {tag}", attempt)
        for old in moved_off:
            self.drop_branch(old)
        storage.write_atomic(self.folder / f"{tag}.json", json.dumps({
            "tag": tag, "version": version, "owner": owner, "kind": kind, "named": named,
            "created": time.time()}, sort_keys=True).encode())
        return version

    def release(self, tag: str, why: str = "") -> int:
        """Delete ``tag`` and its record, leaving a note of the release (``why``: the retention
        rule or request that released it); returns the version it named. The next cleanup may
        remove that version (unless another tag names it, or it is the newest)."""
        ds = self.table.newest()
        tags = ds.tags.list()
        if tag not in tags:
            raise SnapshotError(f"{self.table.uri} has no tag {tag!r}; its tags: "
                                f"{', '.join(sorted(tags)) or 'none'}")
        snap = self._snapshot(tag, tags[tag])
        storage.write_atomic(self.folder / RELEASED / f"{tag}.json", json.dumps({
            **snap.to_dict(), "released": time.time(),
            "why": why or NO_REASON},
            sort_keys=True).encode())
        try:
            ds.tags.delete(tag)
        except (ValueError, OSError):
            if tag in self.table.newest().tags.list():
                raise
        self.drop_branch(snap.branch)
        record = self.folder / f"{tag}.json"
        if storage.is_object_store(record):
            if record.exists():
                record.fs.rm_file(record.path)
        else:
            record.unlink(missing_ok=True)
        return int(tags[tag]["version"])

    def drop_branch(self, branch: str | None) -> None:
        """Delete a redacted copy's branch (``redact``) once no tag names it: its files go with
        it, and the main line's cleanup no longer keeps the version it was made from. While
        other tags name versions of it, only the versions no tag names go (and the files only
        they referenced)."""
        from lance_assets.table.redact import BRANCH_PREFIX, clean_branch

        ds = self.table.newest()
        if not branch or not branch.startswith(BRANCH_PREFIX):
            return
        if any(t.get("branch") == branch for t in ds.tags.list().values()):
            clean_branch(self.table, branch)
            return
        try:
            ds.branches.delete(branch)
        except (ValueError, OSError):
            if branch in self.table.newest().branches.list():
                raise

    def released(self, tag: str) -> dict | None:
        """The note ``release`` left for ``tag`` (its version, owner, when and why), or None."""
        try:
            return json.loads((self.folder / RELEASED / f"{tag}.json").read_text())
        except (FileNotFoundError, ValueError):
            return None

    def released_notes(self) -> list[dict]:
        """Every release note, newest first."""
        folder = self.folder / RELEASED
        notes = []
        try:
            paths = [p for p in folder.iterdir() if p.name.endswith(".json")]
        except (FileNotFoundError, NotADirectoryError):
            return []
        for path in paths:
            try:
                notes.append(json.loads(path.read_text()))
            except (FileNotFoundError, ValueError):
                continue
        return sorted(notes, key=lambda n: -float(n.get("released", 0)))

    # -- in use
    @contextmanager
    def using(self, tag: str) -> Iterator[None]:
        """Mark ``tag`` as read by a running process (a training run) while the block runs:
        ``forget`` refuses to release it unless forced. A kernel lock (``flock``) on a file next
        to the record, so a killed process holds nothing. Object storage has no such lock:
        there, a snapshot counts as in use while its run folder has no ``summary.json``."""
        path = self.folder / f"{tag}.inuse"
        if storage.is_object_store(path):
            yield
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)
            yield
        finally:
            os.close(fd)

    def in_use(self, tag: str) -> bool:
        """True while a process holds ``using(tag)`` (local data roots)."""
        path = self.folder / f"{tag}.inuse"
        if storage.is_object_store(path) or not path.exists():
            return False
        fd = os.open(path, os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return False
        except BlockingIOError:
            return True
        finally:
            os.close(fd)

    # -- the policy
    def retention(self, keep_unnamed_runs: int = DEFAULT_KEEP_UNNAMED_RUNS) -> Retention:
        """Which tags the policy (module docstring) keeps and which it releases."""
        out = Retention()
        by_owner: dict[tuple[str, str], list[Snapshot]] = {}
        for snap in self.list().values():
            if not snap.recorded:
                out.keep[snap.tag] = "no record of who holds it: kept until released"
            elif snap.named:
                out.keep[snap.tag] = f"named ({snap.owner}): kept until released"
            else:
                by_owner.setdefault((snap.owner, snap.kind), []).append(snap)
        for (owner, kind), snaps in by_owner.items():
            snaps.sort(key=lambda s: (s.created, s.version), reverse=True)
            keep = 1 if kind == ABLATION else max(0, keep_unnamed_runs)
            for i, snap in enumerate(snaps):
                if i < keep:
                    out.keep[snap.tag] = (f"one of the newest {keep} unnamed {kind}(s) of {owner}"
                                          if kind != ABLATION else
                                          f"the newest unnamed ablation of {owner}")
                else:
                    out.release[snap.tag] = (f"older than the newest {keep} unnamed {kind}(s) "
                                             f"of {owner}" if kind != ABLATION else
                                             f"superseded by {snaps[0].tag}")
        return out
