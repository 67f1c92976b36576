"""What ``diff A B`` compares: each side turned into one table version, the rules in force for it
and, for a run or an ablation arm, the documents it read.

A side is named the way a person names it: a snapshot tag, a version number, a training run
(``DATA/train/<run>``: its recorded tag and version, its ``read.json``), an ablation
(``<name>``: its tag) or an ablation arm (``<name>/<arm>``, or ``<name>/<arm>/seed-<n>`` for one
seed: the arm's rule set, what its seeds read). A run or arm whose snapshot a cleanup removed
raises ``DiffError`` naming the snapshot, who held it and the retention or request that
released it (the release note ``table.snapshots`` keeps, or ``forget``'s log), and what removed
its version: ``forget``'s own cleanup when its log lists the version, else ``table_maintenance``.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

import lance
import numpy as np

from lance_assets import keys, paths
from lance_assets.ablation.plan import SAFE_NAME_RE
from lance_assets.curation.rules import DEFAULT_RULES, stored_curation
from lance_assets.table import Table, VersionChoiceError, forget_log, get_json_config
from lance_assets.table.choice import RETENTION
from lance_assets.table.forget_journal import forgotten_ids
from lance_assets.table.forget_log import removed_by_forget
from lance_assets.table.maintenance import SNAPSHOT_PREFIX
from lance_assets.table.read_record import load as load_read_record
from lance_assets.table.read_record import rows_read
from lance_assets.table.snapshots import ABLATION_PREFIX, NO_REASON


class DiffError(ValueError):
    """A side that cannot be compared; the message names it, why, and what to give instead."""


@dataclass
class Side:
    """One side of a diff: a table version and what stands behind it."""

    ref: str  # as given
    kind: str  # version | tag | run | ablation | arm
    name: str
    version: int
    tag: str | None
    said: str  # how the version was chosen
    rules: dict[str, str]  # the rules in force (the defaults where none are recorded)
    rules_from: str
    tokenizer: dict | None = None  # the table config's tokenizer (name, sha256) at that version
    read: np.ndarray | None = field(default=None, repr=False)  # ids the run or arm read
    read_from: str = ""
    filter: str = ""  # a run's or arm's own training filter (recorded)
    dataset: lance.LanceDataset | None = field(default=None, repr=False, compare=False)
    branch: str | None = None  # a redacted snapshot's branch (``table.redact``)
    forgotten: np.ndarray | None = field(default=None, repr=False)  # ids forget redacted from it
    redacted_from: int | None = None  # the main line's version a redacted copy was made of

    @property
    def line_version(self) -> int:
        """Where it stands on the main line (a redacted copy: the version it was made of)."""
        return self.version if self.redacted_from is None else self.redacted_from

    def label(self) -> str:
        tag = f", tag {self.tag}" if self.tag else ""
        what = "" if self.kind in ("version", "tag") else f"{self.kind} {self.name}: "
        return f"{what}version {self.version}{tag}"

    def to_dict(self) -> dict:
        return {"ref": self.ref, "kind": self.kind, "name": self.name, "version": self.version,
                "tag": self.tag, "chosen": self.said, "rules_from": self.rules_from,
                "rules": self.rules, "tokenizer": self.tokenizer, "read_from": self.read_from,
                "documents_read": None if self.read is None else int(len(self.read)),
                "filter": self.filter, "branch": self.branch,
                "forgotten": 0 if self.forgotten is None else int(len(self.forgotten))}


def _json(path) -> dict | None:
    try:
        return json.loads(path.read_text()) if path.is_file() else None
    except (OSError, ValueError):
        return None


def _folders(folder) -> list:
    try:
        return sorted(p for p in folder.iterdir() if p.is_dir())
    except (FileNotFoundError, NotADirectoryError):
        return []


def _when(t) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(float(t)))


def removed_by(table: Table, version: int | None) -> str:
    """What removed ``version``: ``forget``'s cleanup (its log), else ``table_maintenance``'s,
    the only other step that removes versions."""
    return removed_by_forget(table, version) or (
        f"a cleanup then removed version {version} (table_maintenance removes the versions no "
        "tag names once they are older than keep_versions_hours)")


def _forgotten(table: Table, tag: str | None, version: int | None) -> str | None:
    """``forget``'s own log of the release of ``tag`` (or of a tag naming ``version``)."""
    for entry in forget_log.entries(table):
        released = entry.get("released") or {}
        hit = tag if tag in released else next(
            (t for t, v in released.items() if v == version), None)
        if hit:
            return (f"tag {hit} (version {released[hit]}) was released by `forget` at "
                    f"{entry.get('at', '?')}: it held documents being forgotten")
    return None


def release_story(table: Table, tag: str | None, version: int | None) -> str:
    """What became of a snapshot: the release note of ``tag`` (or of any tag that named
    ``version``) with the reason it gives; ``forget``'s log where the note gives none (a release
    by hand); else the retention rules in general."""
    snaps = table.snapshots
    notes = [n for n in ([snaps.released(tag)] if tag else []) if n]
    if not notes and version is not None:
        notes = [n for n in snaps.released_notes() if n.get("version") == version]
    note = notes[0] if notes else None
    if note is None or note.get("why") == NO_REASON:
        by_forget = _forgotten(table, note["tag"] if note else tag,
                               note["version"] if note else version)
        if by_forget:
            return by_forget
    if note:
        copy = (f" of branch {note['branch']}: the copy forget redacted, deleted with the tag"
                if note.get("branch") else "")
        return (f"tag {note['tag']} (version {note['version']}{copy}, held by "
                f"{note.get('owner', 'unknown')}, {note.get('kind', '?')}) was released at "
                f"{_when(note.get('released', 0))}: {note.get('why') or 'no reason recorded'}")
    return f"no release was recorded for it ({RETENTION})"


def _gone(table: Table, what: str, tag: str | None, version: int | None) -> DiffError:
    return DiffError(
        f"{what}: its snapshot (tag {tag or 'none'}, version {version}) can no longer be read: "
        f"{release_story(table, tag, version)}; {removed_by(table, version)}. Compare another "
        "run or version (python -m lance_assets diff --list), or train again to have a snapshot "
        "of today's table")


def _rules(ds: lance.LanceDataset) -> tuple[dict[str, str] | None, str]:
    try:
        curation = stored_curation(ds)
    except ValueError as err:
        raise DiffError(f"version {ds.version}: {err}") from None
    if curation is None:  # what training applies then (``curation_in_force``)
        return dict(DEFAULT_RULES), (f"the default rules: no curation recorded at version "
                                     f"{ds.version}")
    return dict(curation.rules), f"the curation rules in force at version {ds.version}"


def _side(table: Table, ref: str, kind: str, name: str, chosen, **extra) -> Side:
    ds = chosen.dataset
    rules, rules_from = _rules(ds)
    side = Side(ref=ref, kind=kind, name=name, version=ds.version, tag=chosen.tag,
                said=chosen.said, rules=rules, rules_from=rules_from,
                tokenizer=get_json_config(ds, keys.TOKENIZER_KEY), dataset=ds,
                branch=chosen.branch, forgotten=forgotten_ids(table, ds) if chosen.branch else None,
                redacted_from=next((int(r["version"]) for r in chosen.redactions
                                    if r.get("branch") is None), None))
    for k, v in extra.items():
        setattr(side, k, v)
    return side


def _run(table: Table, ref: str, name: str) -> Side | None:
    folder = paths.run_dir(table.root, name)
    summary = _json(folder / "summary.json")
    record = load_read_record(folder)
    if summary is None and record is None:
        return None
    info = summary or {}
    version = info.get("table_version", (record or {}).get("table_version"))
    tag = info.get("table_tag") or SNAPSHOT_PREFIX + name
    if version is None:
        return None
    try:
        chosen = table.choose(tag, version=int(version))
    except VersionChoiceError:
        raise _gone(table, f"training run {name}", tag, int(version)) from None
    read = rows_read(folder)
    how = ("read.json (finished run)" if summary else "read.json of a run without a summary "
           "(killed between checkpoints: it read up to its next checkpoint too)")
    return _side(table, ref, "run", name, chosen, read=read,
                 read_from=how if read is not None else "no read record",
                 filter=info.get("filter", ""))


def _ablation(table: Table, ref: str, name: str, arm: str | None, seed: str | None) -> Side | None:
    base = paths.ablation_dir(table.root, name)
    plan = _json(base / "plan.json")
    if not plan or "arms" not in plan:
        return None
    tag, version = plan.get("tag") or ABLATION_PREFIX + name, plan.get("version")
    what = f"ablation {name}" + (f", arm {arm}" if arm else "")
    arms = {a.get("name"): a for a in plan["arms"]}
    if arm is not None and arm not in arms:
        raise DiffError(f"{ref}: ablation {name} has no arm {arm!r}; its arms: "
                        f"{', '.join(sorted(map(str, arms)))}")
    try:
        chosen = table.choose(tag, version=None if version is None else int(version))
    except VersionChoiceError:
        raise _gone(table, what, tag, version) from None
    if arm is None:
        return _side(table, ref, "ablation", name, chosen)
    spec = arms[arm]
    prefix = SAFE_NAME_RE.sub("_", arm) + "-"
    runs = [s for f in _folders(base) if f.name.startswith(prefix)
            for s in _folders(f) if s.name.startswith("seed-") and (seed is None or s.name == seed)]
    if seed is not None and not runs:
        raise DiffError(f"{ref}: arm {arm} of ablation {name} has no run {seed}")
    reads = [r for r in (rows_read(s) for s in runs) if r is not None]
    side = _side(table, ref, "arm", f"{name}/{arm}" + (f"/{seed}" if seed else ""), chosen,
                 read=np.unique(np.concatenate(reads)) if reads else None,
                 read_from=(f"read.json of {len(reads)} run(s) ({seed or 'every seed'})"
                            if reads else "no read record"),
                 filter=spec.get("train_filter", ""))
    side.rules = dict(spec.get("rules") or {})
    side.rules_from = f"arm {arm}'s rule set (ablation {name})"
    return side


def resolve(table: Table, ref: str | int) -> Side:
    """``ref`` as one side (module docstring); ``DiffError`` naming what there is instead."""
    text = str(ref).strip()
    if not text:
        raise DiffError("an empty side: give a tag, a version number, a training run or an "
                        "ablation arm (python -m lance_assets diff --list)")
    snap = table.snapshots.get(text)
    if snap is not None:
        if text.startswith(SNAPSHOT_PREFIX):
            run = _run(table, text, text[len(SNAPSHOT_PREFIX):])
            if run is not None and run.tag == text:
                return run
        if text.startswith(ABLATION_PREFIX):
            abl = _ablation(table, text, text[len(ABLATION_PREFIX):], None, None)
            if abl is not None:
                return abl
        try:
            return _side(table, text, "tag", text, table.choose(text))
        except VersionChoiceError:
            raise _gone(table, f"tag {text}", text, snap.version) from None
    if text.isascii() and text.isdigit():
        try:
            return _side(table, text, "version", f"version {int(text)}", table.choose(int(text)))
        except VersionChoiceError as err:
            by_forget = removed_by_forget(table, int(text))
            if by_forget:
                raise DiffError(f"table version {text} of {table.uri} no longer exists: "
                                f"{by_forget}. Compare a version that exists or a tag (python -m "
                                "lance_assets diff --list)") from None
            story = release_story(table, None, int(text))
            raise DiffError(f"{err}" + (f" ({story})" if "no release" not in story else "")
                            ) from None
    if "/" not in text:
        run = _run(table, text, text)
        if run is not None:
            return run
        abl = _ablation(table, text, text, None, None)
        if abl is not None:
            return abl
    else:
        parts = text.split("/")
        if len(parts) in (2, 3) and all(parts):
            abl = _ablation(table, text, parts[0], parts[1], parts[2] if len(parts) == 3 else None)
            if abl is not None:
                return abl
    note = table.snapshots.released(text) or table.snapshots.released(SNAPSHOT_PREFIX + text)
    if note:
        raise _gone(table, text, note["tag"], note["version"])
    raise DiffError(f"{text!r} names no tag, version, training run or ablation arm of "
                    f"{table.uri}. {listing(table)}")


def listing(table: Table) -> str:
    """What can be compared, in words."""
    tags = table.snapshots.list()
    runs = [p.name for p in _folders(paths.train_dir(table.root))
            if (p / "summary.json").is_file() or (p / "read.json").is_file()]
    ablations = [f"{p.name} ({', '.join(str(a.get('name')) for a in plan.get('arms', []))})"
                 for p in _folders(paths.ablation_dir(table.root, "x").parent)
                 if (plan := _json(p / "plan.json"))]
    newest = table.newest()
    versions = sorted(int(v["version"]) for v in newest.versions())
    named = ", ".join(f"{t} (version {s.version}" + (f" of {s.branch}: redacted by forget"
                                                      if s.branch else "") + ")"
                      for t, s in sorted(tags.items())) or "none"
    return (f"Tags: {named}. "
            f"Training runs: {', '.join(runs) or 'none'}. "
            f"Ablations (arms): {'; '.join(ablations) or 'none'}. "
            f"Versions on disk: {len(versions)} ({versions[0]} to {versions[-1]}).")
