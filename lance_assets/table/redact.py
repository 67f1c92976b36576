"""Redacted snapshots: ``forget`` keeps every tagged snapshot that held a forgotten document, minus
exactly those documents, on a Lance branch, under the same tag.

A forget ``op`` makes its copies on one branch, ``redacted-<op>`` (``branch_name``), made once
from the newest main version after the forget's delete and rewrite there (a branch keeps its
parent version on disk while it lives: that version holds no forgotten row). Each tag ``T``
names its own version of the branch, made in phases:

1. **overwrite**: one commit whose fragments are those of the version ``T`` names (their files
   stay under the table's root: base 0), with that version's schema and table config and a
   ``lance_assets.redacted`` record (``redactions``). A fragment an earlier copy on the branch
   rewrote (same data files, same deletions) is taken rewritten (``shared_fragments``);
2. **delete**: the forgotten ids are deleted on the branch;
3. **rewrite**: the fragments that held one are rewritten without them (into
   ``tree/<branch>/data``); the record says which fragment each replaces (``shares``);
4. **tag**: ``T`` moves to the branch's version: same tag, same record (owner, retention);
5. **clean**: the branch's versions no tag names are removed.

A snapshot redacted before is redacted again on its own branch the same way. A kill before the
tag moves leaves no tag on a half-made copy: the next forget overwrites it again (a version a
tag names carries the op in its record once the tag moved). The main line's cleanup then
removes the version ``T`` named before (docs/reliability.md: what Lance keeps)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import lance
import numpy as np
from lance.file import LanceFileReader
from lance.optimize import Compaction

from lance_assets import storage

Table = Any  # lance_assets.table.Table (which imports this module through table.choice)

BRANCH_PREFIX = "redacted-"
REDACTED_KEY = "lance_assets.redacted"  # the branch's record: [{tag, version, branch, op, ...}]
PHASES = ("branch", "overwrite", "delete", "rewrite", "tag", "clean")


def branch_name(op: str) -> str:
    """The branch the forget ``op`` makes its redacted copies on (the same on a rerun)."""
    return f"{BRANCH_PREFIX}{op[:12]}"


def open_branch(table: Table, branch: str, version: int | None = None) -> lance.LanceDataset:
    """A branch's version (its newest by default)."""
    return table.newest().checkout_version((branch, version))


def redactions(ds: lance.LanceDataset) -> list[dict]:
    """The redactions a version carries, oldest first: ``{tag, version, branch, op, ids, rows,
    at}`` (``version``/``branch``: what the tag named before); empty for an unredacted one."""
    raw = ds.config().get(REDACTED_KEY)
    try:
        return list(json.loads(raw)) if raw else []
    except ValueError:
        return []


def versions_of(table: Table) -> list[tuple[str | None, int]]:
    """Every version on disk: the main line's (branch None), then every branch's."""
    newest = table.newest()
    out: list[tuple[str | None, int]] = [(None, int(v["version"])) for v in newest.versions()]
    for branch in sorted(newest.branches.list()):
        try:
            out += [(branch, int(v["version"])) for v in open_branch(table, branch).versions()]
        except (OSError, ValueError):
            continue  # deleted meanwhile
    return out


def data_path(uri: str, ds: lance.LanceDataset, data_file, branch: str | None = None) -> str:
    """Where a fragment's data file is: under a base path (base 0: the table's root ``uri``) or,
    with no base, under the folder of the branch ``ds`` is a version of (``tree/<branch>``)."""
    base_id = getattr(data_file, "base_id", None)
    if base_id is not None:
        root = storage.location(str(ds.base_paths()[base_id].path))
    elif branch is None:
        root = storage.location(uri)
    else:
        root = storage.location(uri) / "tree" / branch
    return storage.uri_of(root / "data" / data_file.path)


def fragment_key(meta, source_branch: str | None) -> str:
    """What a fragment is, as a copy's manifest names it: its data files (base, path) and its
    deletion file, wherever it was read (``source_branch``: None for the main line)."""
    d = meta.deletion_file
    return json.dumps({"files": [[f.base_id, f.path] for f in meta.files],
                       "deletion": None if d is None else [source_branch, meta.id, d.read_version,
                                                           d.id, str(d.file_type)]})


def shared_fragments(table: Table, branch: str) -> dict[str, object]:
    """The rewritten fragments the versions of ``branch`` that a tag names hold, by the key
    (``fragment_key``) of the fragment each replaces: a copy of a snapshot with that same
    fragment takes them as they are."""
    from lance.fragment import FragmentMetadata

    out: dict[str, object] = {}
    for info in table.newest().tags.list().values():
        if info.get("branch") != branch:
            continue
        try:
            ds = open_branch(table, branch, int(info["version"]))
        except (OSError, ValueError):
            continue
        present = {json.dumps([[f.base_id, f.path] for f in m.files])
                   for m in (frag.metadata for frag in ds.get_fragments())
                   if m.deletion_file is None}
        for record in redactions(ds):
            for key, raw in (record.get("shares") or {}).items():
                meta = FragmentMetadata.from_json(raw)
                if json.dumps([[f.base_id, f.path] for f in meta.files]) in present:
                    out[key] = meta
    return out


def _rebased(table: Table, ds: lance.LanceDataset, branch: str | None, target: str,
             shared: dict[str, object]) -> tuple[list, list[str], list[int]]:
    """``ds``'s fragment metadata as the copy's manifest on ``target`` must name it (files with
    no base read on the main line are the table root's: base 0), each replaced by its rewritten
    fragment where ``shared`` has one; without deletion files (an overwrite takes none); the
    key of each; and the ids those deletion files hid (deleted again on the branch)."""
    out, keys, hidden = [], [], []
    id_field = ds.lance_schema.field("id").id()
    for frag in ds.get_fragments():
        meta = frag.metadata
        data = next(f for f in meta.data_files() if id_field in f.fields)
        where = data_path(table.uri, ds, data, branch)
        if branch != target:
            for f in meta.files:
                if f.base_id is None:
                    f.base_id = 0
        key = fragment_key(meta, branch)
        keys.append(key)
        if key in shared:
            out.append(shared[key])
            continue
        if meta.deletion_file is not None:
            every = LanceFileReader(where, columns=["id"],
                                    storage_options=table.storage_options).read_all().to_table()
            live = frag.to_table(columns=["id"]).column("id").to_numpy()
            hidden += np.setdiff1d(every.column("id").to_numpy(), live).tolist()
            meta.deletion_file = None
        out.append(meta)
    return out, keys, hidden


def _rewrite(ds: lance.LanceDataset, fragments: set[int]) -> tuple[int, int, dict[int, list]]:
    """Rewrite ``fragments`` of the branch version ``ds`` without their deleted rows (each alone:
    no other fragment is touched); (fragments rewritten, files written, the data file paths
    each rewritten fragment id now reads)."""
    every = [f.fragment_id for f in ds.get_fragments()]
    results, made = [], {}
    for fid in sorted(fragments):
        plan = Compaction.plan(ds, dict(materialize_deletions=True,
                                        materialize_deletions_threshold=0.0,
                                        excluded_fragment_ids=[f for f in every if f != fid]))
        for task in plan.tasks:
            got = task.execute(ds)
            results.append(got)
            made[fid] = [f.path for m in got.new_fragments for f in m.files]
    if results:
        Compaction.commit(ds, results)
    files = sum(len(m.data_files()) for r in results for m in r.new_fragments)
    return sum(r.metrics.fragments_removed for r in results), files, made


def redact(table: Table, tag: str, op: str, ids: np.ndarray, filters: list[str],
           journal_phase: Callable[[str, dict], None],
           holds: Callable[[lance.LanceDataset, object, str], bool], held: list | None = None,
           log: Callable[[str], None] = print) -> dict | None:
    """Make ``tag``'s redacted copy for the forget ``op`` (module docstring); each phase goes to
    the journal through ``journal_phase(phase, detail)``; ``holds(ds, fragment, branch)``:
    whether a fragment's data files keep a forgotten id; ``held``: the ids the ``held`` phase
    recorded (a rerun's). None when ``tag`` no longer exists (released meanwhile)."""
    start = time.perf_counter()
    root = table.newest()
    info = root.tags.list().get(tag)
    if info is None:
        return None
    before = {"version": int(info["version"]), "branch": info.get("branch")}
    if held is None:  # before any change: the forgotten ids this snapshot reads (by id only)
        source = table.open(tag)
        cols = ["id"] + (["n_tokens"] if "n_tokens" in source.schema.names else [])
        got = [source.to_table(columns=cols, filter=f) for f in filters]
        held = sorted(int(i) for t in got for i in t.column("id").to_pylist())
        tokens = sum(int(n or 0) for t in got if "n_tokens" in t.column_names
                     for n in t.column("n_tokens").to_pylist())
        journal_phase("held", {"ids": held, "tokens": tokens, "version": before["version"],
                               "branch": before["branch"]})
    name = before["branch"] or branch_name(op)
    if not name.startswith(BRANCH_PREFIX):
        raise ValueError(f"forget: tag {tag} names version {before['version']} of branch {name}, "
                         "which forget did not make; move the tag to the main line or release "
                         "it (--release), then run forget again (it finishes this one)")
    if before["branch"] is None and name not in root.branches.list():
        root.create_branch(name)
        journal_phase("branch", {"branch": name, "parent": root.version, "tag": tag})
    tagged = open_branch(table, name, before["version"]) if before["branch"] else None
    if tagged is not None and any(r.get("op") == op for r in redactions(tagged)):
        branch, first = tagged, next(r for r in redactions(tagged) if r.get("op") == op)
        deleted = rewritten = files = 0  # moved by this forget before a kill: only clean
    else:
        branch, keys = _copy(table, tag, name, op, ids, before, journal_phase)
        rows = branch.count_rows()
        for f in filters:
            branch.delete(f)
        branch = open_branch(table, name)
        deleted = rows - branch.count_rows()
        journal_phase("delete", {"branch": name, "rows": deleted, "version": branch.version})
        order = [f.fragment_id for f in branch.get_fragments()]
        held_frags = {f.fragment_id for f in branch.get_fragments()
                      if f.metadata.deletion_file is not None and holds(branch, f, name)}
        rewritten, files, made = _rewrite(branch, held_frags)
        branch = _shares(table, name, {keys[order.index(fid)]: paths
                                       for fid, paths in made.items()})
        journal_phase("rewrite", {"branch": name, "fragments": rewritten, "files": files,
                                  "fragments_total": len(branch.get_fragments()),
                                  "version": branch.version})
        first = before
        table.newest().tags.update(tag, (name, branch.version))
    detail = {"branch": name, "version": branch.version, "from_version": first["version"],
              "from_branch": first.get("branch"), "rows_deleted": deleted,
              "fragments_rewritten": rewritten, "files_written": files,
              "fragments_total": len(branch.get_fragments()),
              "seconds": round(time.perf_counter() - start, 3)}
    journal_phase("tag", detail)
    removed = clean_branch(table, name, delete_unverified=True)
    journal_phase("clean", {"branch": name, "versions_removed": removed})
    log(f"forget: redacted {tag} (version {first['version']}"
        + (f" of branch {first['branch']}" if first.get("branch") else "") + f"): the tag names "
        f"version {branch.version} of branch {name}; {rewritten} of its "
        f"{detail['fragments_total']} fragment(s) rewritten")
    return detail


def clean_branch(table: Table, branch: str, delete_unverified: bool = False) -> int:
    """Remove the versions of ``branch`` that no tag names (its newest stays), and the files
    only they referenced; how many versions went."""
    ds = open_branch(table, branch)
    return int(ds.cleanup_old_versions(older_than=timedelta(0), error_if_tagged_old_versions=False,
                                       delete_unverified=delete_unverified).old_versions)


def _shares(table: Table, name: str, made: dict[str, list]) -> lance.LanceDataset:
    """Record on the branch, with this copy's redaction, the fragment each rewritten one
    replaces (``shared_fragments`` reads it back); the branch's newest version."""
    branch = open_branch(table, name)
    if not made:
        return branch
    shares = {}
    for frag in branch.get_fragments():
        paths = [f.path for f in frag.metadata.files]
        key = next((k for k, v in made.items() if v == paths), None)
        if key is not None:
            shares[key] = json.dumps(frag.metadata.to_json())
    record = redactions(branch)
    record[-1] = {**record[-1], "shares": shares}
    branch.update_config({REDACTED_KEY: json.dumps(record)})
    return open_branch(table, name)


def _copy(table: Table, tag: str, name: str, op: str, ids: np.ndarray, before: dict,
          journal_phase: Callable[[str, dict], None]) -> tuple[lance.LanceDataset, list[str]]:
    """Step 2 of the module docstring: a version of the branch ``name`` holding the version
    ``tag`` names, with its schema, its config and the redaction's record; that version, and
    the key (``fragment_key``) of the fragment each of its fragments was copied from."""
    source = table.open(tag)
    branch = open_branch(table, name)
    record = redactions(source) + [{**before, "tag": tag, "op": op, "ids": int(len(ids)),
                                    "at": time.time()}]
    fragments, keys, hidden = _rebased(table, source, before["branch"], name,
                                       shared_fragments(table, name))
    branch = lance.LanceDataset.commit(
        branch, lance.LanceOperation.Overwrite(source.lance_schema, fragments),
        read_version=branch.version)
    for lo in range(0, len(hidden), 2000):  # what the version's deletion files hid, again
        branch.delete(f"id IN ({','.join(str(int(i)) for i in hidden[lo:lo + 2000])})")
    branch = open_branch(table, name)
    branch.update_config({**source.config(), REDACTED_KEY: json.dumps(record)}, replace=True)
    branch = open_branch(table, name)
    journal_phase("overwrite", {"branch": name, "version": branch.version})
    return branch, keys
