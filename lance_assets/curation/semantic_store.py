"""``semantic_dup``'s side store under the rule *no state outside a commit*.

The store (``vector_files.Store``: centroids and the document vectors grouped by cluster, in
files named by what they hold and never edited) is derived from the table's committed columns
(``id``, ``semantic_cluster``, ``semantic_rep``, ``semantic_vector``). What makes it a store is its
**state**: the generation in force, its clusters' file lists and counters. The state lives in a
side Lance dataset (``state.lance``, one row) and every change of it is a compare-and-swap
(``table.side.replace_side``): of two runs that read one state, one switches it and the other gets
``StoreMoved``, reads the new state and rebases, so no run's rows are lost and none is held twice,
whichever Dagster instance or process runs them.

Files are written before a state lists them and removed only after a switch away from them; a
generation's number is drawn at random, so two runs never write one folder. A run appends its
rows after its commit (``append``), so the store never holds a row the table does not.

**Checked against the table, repaired on any doubt.** Each run first compares the ids the state
holds (their count and an order-free digest) with the ids written at its pinned version. Any
difference (a run killed between its commit and its switch, deleted rows, an earlier release's
store) is repaired from the columns: missing rows added, deleted or doubled ones removed. A
store with a missing or short file is made again from the columns. ``forget`` resets it (an
empty state, then every file removed): the next run makes it again from the remaining rows.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import lance
import numpy as np
import pyarrow as pa

from lance_assets import keys, paths, storage
from lance_assets.curation import semantic_compare as cmp
from lance_assets.embeddings import int8_vectors as iv
from lance_assets.embeddings import vector_files as vf
from lance_assets.embeddings.embeddings import DIM
from lance_assets.table import Table, leaf_field_ids
from lance_assets.table import executor as executors
from lance_assets.table.side import (
    STATE_DATASET,
    SideMoved,
    read_state,
    reset_side_folder,
    switch_state,
)

LEGACY_STATE = "state.json"  # an earlier release's state file: adopted once, then removed
ORPHAN_AGE_S = 6 * 3600  # a generation no state lists, this old: a killed run's, removed


class StoreMoved(RuntimeError):
    """The state in force changed since this run read it (another run switched it)."""


@dataclass(frozen=True)
class Snapshot:
    """A state as read, with the side dataset's version it was read at (0: none yet)."""

    state: dict | None
    version: int


def id_digest(ids: np.ndarray) -> str:
    """An order-free digest of a multiset of ids: the sum of a 64-bit mix of each, mod 2**64."""
    h = np.asarray(ids, np.int64).astype(np.uint64)
    with np.errstate(over="ignore"):
        h = (h + np.uint64(0x9E3779B97F4A7C15)) * np.uint64(0xBF58476D1CE4E5B9)
        h ^= h >> np.uint64(31)
        h = h * np.uint64(0x94D049BB133111EB)
        h ^= h >> np.uint64(29)
        return f"{int(h.sum(dtype=np.uint64)):016x}"


@dataclass(frozen=True)
class SideStore:
    """The store's files (``files``) and its state (a side Lance dataset next to them)."""

    uri: str

    @cached_property
    def files(self) -> vf.Store:
        return vf.Store(self.uri)

    @property
    def state_uri(self) -> str:
        return storage.uri_of(storage.location(self.uri) / STATE_DATASET)

    # -- the state
    def read(self) -> Snapshot:
        state, version = read_state(self.state_uri)
        if version == 0:  # the release before kept it in a file: adopted, removed on a switch
            try:
                state = json.loads(storage.read_bytes(storage.location(self.uri) / LEGACY_STATE))
            except (FileNotFoundError, ValueError):
                state = None
        return Snapshot(state if state and state.get("format") == vf.FORMAT else None, version)

    def load_state(self) -> dict | None:
        return self.read().state

    def switch(self, read: Snapshot, state: dict | None) -> Snapshot:
        """Make ``state`` the one in force if ``read`` still is (``StoreMoved`` if not)."""
        try:
            version = switch_state(self.state_uri, read.version, state)
        except SideMoved:
            raise StoreMoved(f"{self.uri}: another run switched the state meanwhile") from None
        if read.version == 0:
            self._remove_path(LEGACY_STATE)
        return Snapshot(state, version)

    # -- the ids it holds
    def cluster_ids(self, state: dict) -> dict[str, np.ndarray]:
        """Each cluster's stored ids (its files' id sections only); ``FileNotFoundError`` or
        ``RuntimeError`` for a file that is missing or short."""
        out = {}
        for c, entries in state["segments"].items():
            parts = [np.zeros(0, np.int64)]
            for e in entries:
                rel, rows, start = e[0], int(e[1]), int(e[2])
                path = self.files.file(int(state["generation"]), rel)
                got = storage.read_ranges(path, [(8 * start, 8 * (start + rows))])[0]
                if len(got) != 8 * rows:
                    self.files._short(path, vf.file_rows(rel)[2])
                parts.append(np.frombuffer(got, "<i8"))
            out[c] = np.concatenate(parts)
        return out

    def ids(self, state: dict) -> np.ndarray:
        return np.concatenate([np.zeros(0, np.int64), *self.cluster_ids(state).values()])

    # -- removing files
    def _remove_path(self, rel: str) -> None:
        path = storage.location(self.uri) / rel
        try:
            if storage.is_object_store(path):
                if path.exists():
                    path.fs.rm_file(path.path)
            else:
                path.unlink(missing_ok=True)
        except FileNotFoundError:
            pass

    def remove_generation(self, generation: int) -> int:
        return storage.remove_tree(storage.location(self.uri) / f"g{generation}")

    def remove_orphans(self, state: dict, older_than_s: float = ORPHAN_AGE_S) -> int:
        """Local stores: generations no state lists and nobody wrote to for ``older_than_s`` (a
        run killed before its switch) are removed; a younger one may be a run's in flight."""
        root = storage.location(self.uri)
        if storage.is_object_store(root) or not root.exists():
            return 0
        removed = 0
        for p in root.iterdir():
            if not (p.name.startswith("g") and p.name[1:].isdigit()) or \
                    int(p.name[1:]) == int(state["generation"]):
                continue
            newest = max((f.stat().st_mtime for f in p.rglob("*") if f.is_file()), default=0.0)
            if time.time() - newest > older_than_s:
                removed += storage.remove_tree(p)
        return removed

    def reset(self, log: Callable[[str], None] = print) -> int:
        """``forget``: an empty state in force, then every file of the store removed."""
        return reset_side_folder(self.uri, STATE_DATASET, log)


def side_store(table: Table) -> SideStore:
    return SideStore(storage.uri_of(paths.semantic_dup_dir(table.root)))


def new_generation() -> int:
    """A generation number no other run draws (random: two runs never write one folder)."""
    return secrets.randbits(62)


# ---------------------------------------------------------------------------- checking

def written_ids(ds: lance.LanceDataset) -> np.ndarray:
    """The ids with a written ``semantic_cluster`` at ``ds`` (rows compared), sorted."""
    if keys.SEMANTIC_CLUSTER not in ds.schema.names:
        return np.zeros(0, np.int64)
    t = ds.to_table(columns=["id"], filter=f"{keys.SEMANTIC_CLUSTER} IS NOT NULL")
    return np.sort(t.column("id").to_numpy())


def table_entries(ds: lance.LanceDataset) -> dict[int, list]:
    """Per fragment holding the semantic columns: their data files and its deletion file, from
    the manifest alone. While these are as the store last saw them, the written rows are too
    (a write, a delete, a compaction changes them)."""
    if keys.SEMANTIC_CLUSTER not in ds.schema.names:
        return {}
    fields = leaf_field_ids(ds, keys.SEMANTIC_CLUSTER)
    out = {}
    for frag in ds.get_fragments():
        meta = frag.metadata
        files = sorted(f.path for f in meta.data_files() if fields & set(f.fields))
        if files:
            d = meta.deletion_file
            out[frag.fragment_id] = [files, None if d is None else [d.id, d.read_version]]
    return out


def signature(entries: dict[int, list]) -> str:
    return hashlib.sha256(json.dumps(sorted(entries.items())).encode()).hexdigest()[:32]


def _columns(ds: lance.LanceDataset, ids: np.ndarray) -> pa.Table:
    """``id``, ``semantic_cluster``, ``semantic_rep``, ``semantic_dup``, ``semantic_vector`` of
    the written rows ``ids``, by id."""
    cols = ["id", keys.SEMANTIC_CLUSTER, keys.SEMANTIC_REP, keys.SEMANTIC_DUP,
            keys.SEMANTIC_VECTOR]
    parts = []
    for batch in ds.to_batches(columns=cols, filter=f"{keys.SEMANTIC_CLUSTER} IS NOT NULL"):
        keep = np.isin(batch.column("id").to_numpy(zero_copy_only=False), ids)
        if keep.any():
            parts.append(pa.Table.from_batches([batch]).filter(pa.array(keep)))
    if not parts:
        return pa.table({c: pa.array([], ds.schema.field(c).type) for c in cols})
    return pa.concat_tables(parts).sort_by("id")


def _vectors(t: pa.Table) -> np.ndarray:
    return t.column(keys.SEMANTIC_VECTOR).combine_chunks().flatten().to_numpy(
        zero_copy_only=False).reshape(-1, DIM).astype(np.int8)


def _homes(side: SideStore, state: dict, cluster: np.ndarray, vecs: np.ndarray) -> np.ndarray:
    """Rows' clusters in ``state``: the one they were written in while it is of this
    generation, else their nearest centroid."""
    local = cluster - int(state["first_cluster"])
    inside = (local >= 0) & (local < int(state["clusters"]))
    home = np.where(inside, local, 0)
    if (~inside).any():
        x, inv = iv.as_unit(vecs[~inside])
        home[~inside] = iv.nearest(x * inv[:, None], side.files.centroids(state))[0][:, 0]
    return home


def made_again(side: SideStore, ds: lance.LanceDataset, log: Callable[[str], None]
               ) -> dict | None:
    """A state holding every written row, as one cluster (the run then trains the clusters
    again): the store when it is missing, was reset by ``forget`` or cannot be read."""
    t = _columns(ds, written_ids(ds))
    if t.num_rows == 0:
        return None
    ids, vecs = t.column("id").to_numpy(), _vectors(t)
    gen = new_generation()
    x, inv = iv.as_unit(vecs)
    mean = (x * inv[:, None]).sum(axis=0)
    side.files.save_centroids(gen, (mean / max(np.linalg.norm(mean), 1e-12))[None, :])
    cluster = t.column(keys.SEMANTIC_CLUSTER).to_numpy()
    entry = side.files.write_segment(gen, 0, ids, t.column(keys.SEMANTIC_REP).to_numpy(), vecs)
    log(f"semantic_dup: no side store; made again from the {len(ids)} rows written")
    return {"format": vf.FORMAT, "generation": gen, "first_cluster": int(cluster.max()) + 1,
            "clusters": 1, "segments": {"0": [entry]}, "rows": len(ids), "digest": id_digest(ids),
            "flagged": _flagged(t), "table_sig": signature(table_entries(ds)),
            "trained_rows": 0, "trained_through": -1, "trained_distance": 0.0, "since_rows": 0,
            "since_distance": 0.0}


def _flagged(t: pa.Table) -> int:
    return int(np.sum(t.column(keys.SEMANTIC_DUP).to_numpy(zero_copy_only=False)))


def _flags(ds: lance.LanceDataset, ids: np.ndarray) -> int:
    """How many of the written rows ``ids`` are flagged (their ``semantic_dup`` only)."""
    t = ds.to_table(columns=["id", keys.SEMANTIC_DUP],
                    filter=f"{keys.SEMANTIC_CLUSTER} IS NOT NULL")
    keep = np.isin(t.column("id").to_numpy(), ids)
    return int(np.sum(t.column(keys.SEMANTIC_DUP).to_numpy(zero_copy_only=False)[keep]))


def after_commit(ds: lance.LanceDataset, entries: dict[int, list], pinned: dict[int, object],
                 committed: list[int]) -> str | None:
    """The signature of the table as the store knows it after a run appended the rows it
    committed: the pinned version's entries, those fragments' taken from ``ds`` (read after the
    commit). None (the next run checks the rows) when one of them was deleted from meanwhile."""
    now = table_entries(ds)
    out = dict(entries)
    for f in committed:
        if f not in now or now[f][1] != pinned.get(f):
            return None
        out[f] = now[f]
    return signature(out)


def current(side: SideStore, table: Table, snap: Snapshot) -> dict | None:
    """For a run whose pinned version has no row written: ``snap``'s state when it belongs to
    the table as it is (every row it holds is written in the newest version: another first run
    made it meanwhile), else None (a store left from columns dropped since)."""
    state = snap.state
    if state is None or not int(state["rows"]):
        return state
    try:
        held = side.ids(state)
    except (FileNotFoundError, RuntimeError):
        return None
    return state if np.isin(held, written_ids(table.newest())).all() else None


def reconcile(side: SideStore, ds: lance.LanceDataset, snap: Snapshot,
              log: Callable[[str], None]) -> tuple[Snapshot, int, int]:
    """The store made to hold every row written at ``ds`` (the pinned version), and no row
    deleted there: (the snapshot in force after, rows added, rows removed). Rows written after
    ``ds`` by other runs stay. ``StoreMoved`` when another run switched meanwhile."""
    state = snap.state
    sig = signature(table_entries(ds))
    if state is not None and state.get("table_sig") == sig:
        return snap, 0, 0  # no write, delete or rewrite since the store was known whole
    written = written_ids(ds)
    if state is None:
        if not len(written):
            return snap, 0, 0
        done = side.switch(snap, made_again(side, ds, log))
        side.remove_orphans(done.state, older_than_s=0)  # a store of another format, if any
        return done, len(written), 0
    if state.get("digest") == id_digest(written) and int(state["rows"]) == len(written):
        return side.switch(snap, {**state, "table_sig": sig}), 0, 0
    try:
        by_cluster = side.cluster_ids(state)
    except (FileNotFoundError, RuntimeError) as exc:
        log(f"semantic_dup: the side store cannot be read ({str(exc).splitlines()[0][:200]}); "
            "making it again from the table's columns")
        return side.switch(snap, made_again(side, ds, log)), len(written), 0
    live = np.sort(ds.to_table(columns=["id"]).column("id").to_numpy())
    top = live[-1] if len(live) else -1
    seen = np.zeros(0, np.int64)
    keep_ids: dict[str, np.ndarray] = {}
    for c in sorted(by_cluster, key=int):  # deleted at ``ds`` (later rows stay), or doubled
        ids = np.unique(by_cluster[c])
        ok = ~((ids <= top) & ~np.isin(ids, live)) & ~np.isin(ids, seen)
        keep_ids[c] = ids[ok]
        seen = np.union1d(seen, ids[ok])
    changed = [c for c in by_cluster if len(keep_ids[c]) != len(by_cluster[c])]
    missing = np.setdiff1d(written, seen)
    removed = sum(len(v) for v in by_cluster.values()) - len(seen)
    if not (changed or len(missing)):  # it holds rows written after ``ds``: they stay
        return side.switch(snap, {**state, "rows": len(seen), "digest": id_digest(seen)}), 0, 0
    gen = int(state["generation"])
    segments = {c: [list(e) for e in v] for c, v in state["segments"].items()}
    for c in changed:
        ids, reps, vecs = side.files.read_cluster(state, int(c))
        _, first = np.unique(ids, return_index=True)
        keep = np.zeros(len(ids), bool)
        keep[first] = True
        keep &= np.isin(ids, keep_ids[c])
        segments[c] = [side.files.write_segment(gen, int(c), ids[keep], reps[keep],
                                                vecs[keep])] if keep.any() else []
    flagged = _flags(ds, seen) if changed else int(state.get("flagged", 0))
    if len(missing):
        t = _columns(ds, missing)
        flagged += _flagged(t)
        ids, vecs = t.column("id").to_numpy(), _vectors(t)
        home = _homes(side, state, t.column(keys.SEMANTIC_CLUSTER).to_numpy(), vecs)
        reps = t.column(keys.SEMANTIC_REP).to_numpy()
        for c in np.unique(home).tolist():
            sel = home == c
            segments[str(c)] = side.files.append(gen, c, segments.get(str(c), []), ids[sel],
                                                 reps[sel], vecs[sel])
    segments = {c: v for c, v in segments.items() if v}
    held = np.concatenate([seen, missing])
    after = {**state, "segments": segments, "rows": len(held), "digest": id_digest(held),
             "flagged": flagged, "table_sig": sig if len(held) == len(written) else None}
    done = side.switch(snap, after)
    side.files.remove_replaced(state, after)
    if len(missing):
        log(f"semantic_dup: {len(missing)} row(s) committed by an earlier run added to the store")
    if removed:
        log(f"semantic_dup: {removed} deleted or doubled row(s) removed from the store")
    return done, len(missing), removed


# ---------------------------------------------------------------------------- appending

MAX_RESTARTS = 20  # appends rebased because another run switched the store


@dataclass
class Appending:
    """What the store append after the write needs from the comparison."""

    tasks: Any
    side: SideStore
    snap: Snapshot
    state_ref: Any
    probes: int
    groups: list
    frags: list
    entries: dict  # the pinned version's fragments holding the columns (``table_entries``)
    deletions: dict  # fragment -> its deletion file at the pinned version
    payloads: dict
    homes: dict
    resolved: Any
    drift: np.ndarray
    batch: Any


def store_group(store: vf.Store, state: dict, lo: int, hi: int, batch: tuple,
                resolved: cmp.Resolved) -> tuple:
    """One group of clusters: the new rows homed there appended to the store. Returns the
    clusters' segment lists and (rows, flagged) appended."""
    ids, vecs, near, _ = batch
    homes = near[:, 0] if len(near) else np.zeros(0, np.int64)
    sel = (homes >= lo) & (homes < hi)
    at = np.searchsorted(resolved.ids, ids[sel])
    out = store.append_run(state["generation"], state["segments"], homes[sel], ids[sel],
                           resolved.rep[at], vecs[sel])
    return out, np.array([int(sel.sum()), int(resolved.dup[at].sum())], np.int64)


def append(table: Table, a: Appending, written: list[int], log: Callable[[str], None]) -> None:
    """The rows of the fragments this run committed (``written``) appended to the store and
    switched in. When another run switched it since it was read, the append is rebased on the
    state in force: the rows it already holds or that the table no longer has are left out, the
    rest homed in its clusters."""
    tasks, side, snap, resolved = a.tasks, a.side, a.snap, a.resolved
    committed = [f for f in a.frags if f in set(written)]
    if committed != a.frags:
        batch = tasks(cmp.gather, len(committed), *[a.payloads[f] for f in committed],
                      *[a.homes[f] for f in committed])[0]
    else:
        batch = a.batch
    drift, rebased = a.drift, False
    state, state_ref, groups = snap.state, a.state_ref, a.groups
    for _ in range(MAX_RESTARTS):
        appended = [tasks(store_group, side.files, state_ref, lo, hi, batch, resolved, returns=2)
                    for lo, hi in (groups if tasks.ray else [(0, int(state["clusters"]))])]
        # (a file per group's task under Ray; one file locally)
        segments, added = dict(state["segments"]), np.zeros(2, np.int64)
        for got in tasks.get([out[0] for out in appended]):
            segments.update(got)
        added += np.sum(tasks.get([out[1] for out in appended]) or [np.zeros(2, np.int64)], axis=0)
        ids = executors.value_of(batch)[0]
        after = {**state, "segments": segments, "rows": int(state["rows"]) + int(added[0]),
                 "digest": _digest_plus(state["digest"], ids),
                 "flagged": int(state.get("flagged", 0)) + int(added[1]),
                 "since_rows": int(state["since_rows"]) + int(drift[0]),
                 "since_distance": float(state["since_distance"]) + float(drift[1]),
                 "table_sig": None if rebased else after_commit(
                     table.newest(), a.entries, a.deletions, committed)}
        try:
            side.switch(snap, after)
            side.files.remove_replaced(state, after)
            return
        except StoreMoved:
            side.files.remove_replaced(after, state)  # this attempt's files: never in force
        snap = side.read()
        if snap.state is None:
            log("semantic_dup: the side store was reset meanwhile (forget); the next run "
                "makes it again from the table's columns")
            return
        state, rebased = snap.state, True  # the next run checks the rows against the table
        batch, drift = _rebased(table, side, state, executors.value_of(batch), a.probes)
        state_ref = tasks.put(state)
        groups = cmp.cut(int(state["clusters"]), len(a.groups))
        log("semantic_dup: another run switched the side store; appending on its state")
    raise RuntimeError(f"semantic_dup of {table.uri}: the side store kept changing under "
                       f"{MAX_RESTARTS} appends (other runs); the next run adds these rows")


def deletion_of(frag) -> list | None:
    d = frag.metadata.deletion_file
    return None if d is None else [d.id, d.read_version]


def _digest_plus(digest: str, ids: np.ndarray) -> str:
    """The digest of a multiset of ids with ``ids`` added."""
    total = (int(digest, 16) + int(id_digest(ids), 16)) % (1 << 64)
    return f"{total:016x}"


def _rebased(table: Table, side: SideStore, state: dict, batch: list,
              probes: int) -> tuple[list, np.ndarray]:
    """``batch`` (ids, vectors, probes, 1 / norms) without the rows ``state`` holds or the
    newest table lacks (deleted, forgotten), homed in ``state``'s clusters; and its drift."""
    ids, vecs = batch[0], batch[1]
    if len(ids):
        live = table.newest().to_table(
            columns=["id"], filter=f"id >= {int(ids.min())} AND id <= {int(ids.max())}")
        keep = np.isin(ids, live.column("id").to_numpy()) & ~np.isin(ids, side.ids(state))
        ids, vecs = ids[keep], vecs[keep]
    x, inv = iv.as_unit(vecs)
    near, best = iv.nearest(x * inv[:, None], side.files.centroids(state), probes) \
        if len(ids) else (np.zeros((0, probes), np.int64), np.zeros(0, np.float32))
    since = ids > int(state["trained_through"])
    drift = np.array([float(since.sum()), float((1.0 - best[since]).sum())])
    return [ids, vecs, near, iv.inv_norms(vecs)], drift
