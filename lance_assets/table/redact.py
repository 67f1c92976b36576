"""Redacted snapshots: ``forget`` keeps every tagged snapshot that held a forgotten document, minus
exactly those documents, on a Lance branch of its own, under the same tag.

For a tag ``T`` and a forget ``op`` the copy is made on the branch ``redacted-<op>-<T>``
(``branch_name``: a rerun finds its own half-made branch):

1. **branch**: the branch is made from the newest version of the main line, after the forget
   deleted and rewrote the rows there (a branch keeps its parent version on disk while it
   lives: that version holds no forgotten row);
2. **overwrite**: one commit on the branch whose fragments are those of the version ``T``
   names (their data files stay where they are, under the table's root: base 0) and whose
   schema and table config are that version's (its tokenizer, rules, settings), plus a
   ``lance_assets.redacted`` record of what was redacted (``redactions``);
3. **delete**: the forgotten ids are deleted on the branch;
4. **rewrite**: the fragments that held one are rewritten without them (their new files are
   the branch's own, under ``tree/<branch>/data``); every other fragment stays shared;
5. **tag**: ``T`` is moved to the branch's version: same tag, same record (owner, retention);
6. **clean**: the branch's older versions are removed.

A snapshot redacted before is redacted again in place (steps 3 to 6 on its own branch). A kill
before step 5 leaves no tag on a half-made copy: the next forget drops a branch it had not
finished copying and starts again, or goes on (a delete of deleted ids and a rewrite of
rewritten fragments change nothing). The main line's cleanup then removes the version ``T``
named before and the files only it referenced (docs/reliability.md: what Lance keeps)."""

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


def branch_name(op: str, tag: str) -> str:
    """The branch the forget ``op`` makes ``tag``'s redacted copy on (the same on a rerun)."""
    return f"{BRANCH_PREFIX}{op[:12]}-{tag}"


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


def _rebased(table: Table, ds: lance.LanceDataset) -> tuple[list, list[int]]:
    """``ds``'s fragment metadata as a branch's manifest must name it (files with no base are the
    table root's: base 0), without deletion files (an overwrite takes none), and the ids those
    deletion files hid (deleted again on the branch)."""
    out, hidden = [], []
    id_field = ds.lance_schema.field("id").id()
    for frag in ds.get_fragments():
        meta = frag.metadata
        if meta.deletion_file is not None:
            data = next(f for f in meta.data_files() if id_field in f.fields)
            every = LanceFileReader(data_path(table.uri, ds, data), columns=["id"],
                                    storage_options=table.storage_options).read_all().to_table()
            live = frag.to_table(columns=["id"]).column("id").to_numpy()
            hidden += np.setdiff1d(every.column("id").to_numpy(), live).tolist()
            meta.deletion_file = None
        for f in meta.files:
            if f.base_id is None:
                f.base_id = 0
        out.append(meta)
    return out, hidden


def _rewrite(ds: lance.LanceDataset, fragments: set[int]) -> tuple[lance.LanceDataset, int, int]:
    """Rewrite ``fragments`` of the branch version ``ds`` without their deleted rows (each alone:
    no other fragment is touched); (newest, fragments rewritten, files written)."""
    every = [f.fragment_id for f in ds.get_fragments()]
    results = []
    for fid in sorted(fragments):
        plan = Compaction.plan(ds, dict(materialize_deletions=True,
                                        materialize_deletions_threshold=0.0,
                                        excluded_fragment_ids=[f for f in every if f != fid]))
        results += [task.execute(ds) for task in plan.tasks]
    if results:
        Compaction.commit(ds, results)
    files = sum(len(m.data_files()) for r in results for m in r.new_fragments)
    return ds, sum(r.metrics.fragments_removed for r in results), files


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
    name = before["branch"]
    if name is None:  # its first redaction: a copy on a branch of its own
        name = branch_name(op, tag)
        if name in root.branches.list():  # a copy a killed forget left half-made: start again
            root.branches.delete(name)
            log(f"forget: dropped the half-made redacted copy of {tag} (branch {name})")
        _copy(table, tag, name, op, ids, before, journal_phase)
    elif not name.startswith(BRANCH_PREFIX):
        raise ValueError(f"forget: tag {tag} names version {before['version']} of branch {name}, "
                         "which forget did not make; move the tag to the main line or release "
                         "it (--release), then run forget again (it finishes this one)")
    else:  # a copy made by an earlier forget: redacted again in place (no tag shares it)
        branch = open_branch(table, name)
        if not any(r.get("op") == op for r in redactions(branch)):
            record = redactions(branch) + [{**before, "tag": tag, "op": op, "ids": int(len(ids)),
                                            "at": time.time()}]
            branch.update_config({REDACTED_KEY: json.dumps(record)})
    branch = open_branch(table, name)
    rows = branch.count_rows()
    for f in filters:
        branch.delete(f)
    branch = open_branch(table, name)
    deleted = rows - branch.count_rows()
    journal_phase("delete", {"branch": name, "rows": deleted, "version": branch.version})
    held = {f.fragment_id for f in branch.get_fragments()
            if f.metadata.deletion_file is not None and holds(branch, f, name)}
    _, rewritten, files = _rewrite(branch, held)
    branch = open_branch(table, name)
    journal_phase("rewrite", {"branch": name, "fragments": rewritten, "files": files,
                              "fragments_total": len(branch.get_fragments()),
                              "version": branch.version})
    first = next((r for r in redactions(branch) if r.get("op") == op), before)
    if (before["branch"], before["version"]) != (name, branch.version):
        table.newest().tags.update(tag, (name, branch.version))
    detail = {"branch": name, "version": branch.version, "from_version": first["version"],
              "from_branch": first.get("branch"), "rows_deleted": deleted,
              "fragments_rewritten": rewritten, "files_written": files,
              "fragments_total": len(branch.get_fragments()),
              "seconds": round(time.perf_counter() - start, 3)}
    journal_phase("tag", detail)
    stats = branch.cleanup_old_versions(older_than=timedelta(0), error_if_tagged_old_versions=False,
                                        delete_unverified=True)
    journal_phase("clean", {"branch": name, "versions_removed": stats.old_versions})
    log(f"forget: redacted {tag} (version {first['version']}"
        + (f" of branch {first['branch']}" if first.get("branch") else "") + f"): the tag names "
        f"version {branch.version} of branch {name}; {rewritten} of its "
        f"{detail['fragments_total']} fragment(s) rewritten")
    return detail


def _copy(table: Table, tag: str, name: str, op: str, ids: np.ndarray, before: dict,
          journal_phase: Callable[[str, dict], None]) -> None:
    """Steps 1 and 2 of the module docstring: the branch ``name``, holding the version ``tag``
    names with its schema, its config and the redaction's record."""
    source = table.open(tag)
    root = table.newest()
    branch = root.create_branch(name)
    journal_phase("branch", {"branch": name, "parent": root.version, "tag": tag})
    record = [{**before, "tag": tag, "op": op, "ids": int(len(ids)), "at": time.time()}]
    fragments, hidden = _rebased(table, source)
    branch = lance.LanceDataset.commit(
        branch, lance.LanceOperation.Overwrite(source.lance_schema, fragments),
        read_version=branch.version)
    for lo in range(0, len(hidden), 2000):  # what the version's deletion files hid, again
        branch.delete(f"id IN ({','.join(str(int(i)) for i in hidden[lo:lo + 2000])})")
    branch = open_branch(table, name)
    branch.update_config({**source.config(), REDACTED_KEY: json.dumps(record)}, replace=True)
    journal_phase("overwrite", {"branch": name, "version": open_branch(table, name).version})
