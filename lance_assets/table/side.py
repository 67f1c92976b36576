"""Lance datasets kept beside the corpus table that are not it: a training run's stored shuffle
permutation, ``semantic_dup``'s state, ``forget``'s journal. Opened and written by URI here,
next to ``Table`` (the only code that opens the corpus), so every by-path open of a Lance dataset
lives in this package; credentials come from the environment (``storage.storage_options_for``),
never from the caller.

Two ways to keep state in one, both under Lance's own conflict resolution: ``replace_side`` (a
compare-and-swap: an ``Overwrite`` committed against the version it was read from, so of two
writers that read one version one wins and the other gets ``SideMoved``) and ``append_side``
(appends never conflict with one another)."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import timedelta

import lance
import pyarrow as pa

from lance_assets import storage
from lance_assets.table import core

STATE_DATASET = "state.lance"  # a side store's state: one row, ``state`` (JSON, or null)


class SideMoved(RuntimeError):
    """The side dataset changed since the version its writer read: read it again, rebase."""


def open_side_dataset(uri: str) -> lance.LanceDataset:
    """The side dataset at ``uri`` (its newest version)."""
    return lance.dataset(uri, storage_options=storage.storage_options_for(uri))


def write_side_dataset(table: pa.Table, uri: str) -> None:
    """Write ``table`` as a new dataset at ``uri`` (a fresh name: never over an existing one)."""
    lance.write_dataset(table, uri, storage_options=storage.storage_options_for(uri))


def read_side(uri: str) -> tuple[pa.Table | None, int]:
    """The newest version's rows and its number; ``(None, 0)`` when nothing is committed yet."""
    if not core.has_committed_version(uri):
        return None, 0
    ds = open_side_dataset(uri)
    return ds.to_table(), ds.version


def replace_side(uri: str, table: pa.Table, read_version: int) -> int:
    """Make ``table`` the side dataset's content, only if its newest version is still
    ``read_version`` (0: nothing committed yet); else ``SideMoved``. Returns the new version."""
    opts = storage.storage_options_for(uri)
    try:
        if read_version == 0:
            return lance.write_dataset(table, uri, mode="create", storage_options=opts).version
        from lance.fragment import write_fragments

        fragments = write_fragments(table, uri, schema=table.schema, storage_options=opts)
        op = lance.LanceOperation.Overwrite(table.schema, fragments)
        return lance.LanceDataset.commit(uri, op, read_version=read_version,
                                         storage_options=opts).version
    except (OSError, ValueError) as exc:  # CommitConflictError is an OSError
        if read_side_version(uri) != read_version:
            raise SideMoved(f"{uri}: changed since version {read_version}") from exc
        raise


def read_state(uri: str) -> tuple[dict | None, int]:
    """A one-row state dataset (``STATE_DATASET``): its state (None when null or none) and the
    version it was read at (0: nothing committed yet)."""
    table, version = read_side(uri)
    raw = [] if table is None else table.column("state").to_pylist()
    return (json.loads(raw[0]) if raw and raw[0] else None), version


def switch_state(uri: str, read_version: int, state: dict | None) -> int:
    """Make ``state`` (None: null) the one in force if ``read_version`` still is; else
    ``SideMoved``. Returns the new version."""
    text = None if state is None else json.dumps(state, sort_keys=True)
    return replace_side(uri, pa.table({"state": pa.array([text], pa.string())}), read_version)


def read_side_version(uri: str) -> int:
    return open_side_dataset(uri).version if core.has_committed_version(uri) else 0


def append_side(uri: str, table: pa.Table) -> None:
    """Append ``table``'s rows (the dataset is made by the first append; two first appends at
    once: the loser appends to what the winner made)."""
    opts = storage.storage_options_for(uri)
    for _ in range(core.MAX_COMMIT_ATTEMPTS):
        mode = "append" if core.has_committed_version(uri) else "create"
        try:
            lance.write_dataset(table, uri, mode=mode, storage_options=opts)
            return
        except (OSError, ValueError):
            if mode == "append" or not core.has_committed_version(uri):
                raise


def cleanup_side(uri: str) -> None:
    """Remove every version but the newest (and the files only they reference)."""
    if core.has_committed_version(uri):
        open_side_dataset(uri).cleanup_old_versions(older_than=timedelta(0))


def reset_side_folder(uri: str, state: str = STATE_DATASET,
                      log: Callable[[str], None] = print) -> int:
    """Empty a side store kept in the folder ``uri`` (``forget``: ``semantic_dup``'s holds
    document vectors): a null state is switched in against whatever is in force (so a writer
    that read the old one fails its own switch and reads again), then every other file of the
    folder is removed. Returns how many files went."""
    if not storage.location(uri).exists():
        return 0
    state_uri = storage.uri_of(storage.location(uri) / state)
    for _ in range(core.MAX_COMMIT_ATTEMPTS):
        try:
            switch_state(state_uri, read_side_version(state_uri), None)
            break
        except SideMoved:
            continue
    removed = 0
    root = storage.location(uri)
    for p in list(root.iterdir()) if root.exists() else []:
        if p.name != state:
            removed += storage.remove_tree(p) if p.is_dir() else _remove_file(p)
    cleanup_side(state_uri)
    if removed:
        log(f"{uri}: {removed} file(s) removed; made again from the table's columns")
    return removed


def _remove_file(path) -> int:
    try:
        if storage.is_object_store(path):
            path.fs.rm_file(path.path)
        else:
            path.unlink()
        return 1
    except FileNotFoundError:
        return 0


def holds_files(uri: str, state: str = STATE_DATASET) -> list[str]:
    """Files of a side store folder other than its state dataset (empty after a reset)."""
    root = storage.location(uri)
    if not root.exists():
        return []
    return sorted(str(p) for p in root.rglob("*") if p.is_file()
                  and state not in p.relative_to(root).parts)
