"""Which rows a diff reads, and reading them: the cost follows the change.

The table is written with Lance's stable row ids, and Lance keeps for every row the version
that created it and the version that last rewrote one of its values
(``_row_created_at_version``, ``_row_last_updated_at_version``: a column write, ingest, an
update; a compaction keeps both). Both live in the manifest, so reading them reads no data file.
Between an older version ``lo`` and a newer ``hi``:

- a row of ``hi`` created or last written after ``lo`` may differ (or be new): *changed*;
- a row of ``lo`` that ``hi`` lacks was deleted or forgotten: *removed*;
- every other row of ``hi`` holds, in every column both versions have, the values it held at
  ``lo``, whatever compaction did to the files in between;
- a changed row whose fragment holds, for every column the diff reads, the very data files it
  held at ``lo`` was rewritten only in other columns (a new tagger's): it is left out too.

The other rows can still move in or out of the training set when a rule changed: each side's
changed rules are evaluated on every row (reading only the columns those rules name), and the
rows where a verdict differs are read too (*flipped*). The diff then reads, from each version,
only the fragments that hold a changed, removed or flipped row, and keeps only those rows.

Where the tracking cannot be trusted (a table without stable row ids, a version whose row
versions Lance cannot read, a row of ``hi`` older than ``lo`` that ``lo`` lacks: a ``restore``
in between) the diff reads every row of both versions instead, one scan of the columns it
needs from each, and says why. Rows are compared by ``id``, never by address.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import lance
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from lance_assets.progress import progress
from lance_assets.table import leaf_field_ids

ROWID = "_rowid"
CREATED = "_row_created_at_version"
UPDATED = "_row_last_updated_at_version"
ADDRESS = "_rowaddr"
ROW_VERSIONS = "row versions"
FULL_SCAN = "full scan"


@dataclass
class Plan:
    """What to read from each side: ``rows[side]`` the row ids (stable Lance row ids) to read
    whole, or None for every row; ``moved[side]`` the rows removed or only moved by a changed
    rule (their verdicts, not the columns compared by value)."""

    mode: str  # ROW_VERSIONS | FULL_SCAN
    why: str
    rows: dict[str, np.ndarray | None] = field(default_factory=dict)
    changed: int = 0
    removed: int = 0
    flipped: int = 0
    moved: dict[str, np.ndarray] = field(default_factory=dict)


@dataclass
class Cost:
    """What reading one side cost (bytes: everything the diff read from that version, the row
    versions and the changed rules' columns included)."""

    rows_read: int = 0
    rows_total: int = 0
    fragments_total: int = 0
    bytes_read: int = 0
    seconds: float = 0.0
    fragments: set[int] = field(default_factory=set)  # the fragments scanned

    def to_dict(self) -> dict:
        return {"rows_read": self.rows_read, "rows_total": self.rows_total,
                "fragments_read": len(self.fragments), "fragments_total": self.fragments_total,
                "bytes_read": self.bytes_read, "seconds": round(self.seconds, 4)}


def read_bytes(ds: lance.LanceDataset) -> int:
    """Bytes ``ds`` (this dataset object) read since the last call."""
    return int(ds.io_stats_incremental().read_bytes)


def _ids(ds: lance.LanceDataset, columns: list[str]) -> pa.Table:
    return ds.to_table(columns=columns)


def member(values: np.ndarray, sorted_set: np.ndarray) -> np.ndarray:
    """``values`` found in the ascending array ``sorted_set`` (by binary search: numpy's hashed
    set operations take seconds on a million row ids)."""
    if not len(sorted_set):
        return np.zeros(len(values), bool)
    at = np.searchsorted(sorted_set, values)
    at[at == len(sorted_set)] = 0
    return sorted_set[at] == values


def same_files(lo: lance.LanceDataset, hi: lance.LanceDataset, columns: set[str]) -> set[int]:
    """Fragments of ``hi`` that hold, for every one of ``columns``, the data files the same
    fragment held at ``lo`` (same rows, same files): a write of another column (a new tagger)
    rewrote none of the values the diff reads there."""
    def files(ds: lance.LanceDataset) -> dict[int, tuple[int, dict[int, str]]]:
        fields = set()
        for c in columns & set(ds.schema.names):
            fields |= leaf_field_ids(ds, c)
        out = {}
        for frag in ds.get_fragments():
            meta, held = frag.metadata, {}
            for data in meta.data_files():
                hit = [f for f in data.fields if f in fields]
                if hit:
                    path = data.path
                    held.update((f, path) for f in hit)
            out[frag.fragment_id] = (meta.physical_rows, held)
        return out

    before, after = files(lo), files(hi)
    return {f for f, held in after.items() if before.get(f) == held and held[1]}


def tracked_changes(lo: lance.LanceDataset, hi: lance.LanceDataset, columns: set[str],
                    lo_version: int | None = None
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray] | str:
    """(changed row ids of ``hi``, removed row ids of ``lo``, every row id of ``hi``) from the
    row versions, less the rows of fragments whose data files for ``columns`` (what the diff
    reads) are those of ``lo``; or the reason the row versions cannot be trusted.
    ``lo_version``: the main line's version ``lo`` stands for (a redacted copy's: the version
    forget redacted; its rows keep their row versions)."""
    if not (lo.has_stable_row_ids and hi.has_stable_row_ids):
        return "the table has no stable row ids"
    try:
        meta = _ids(hi, [ROWID, ADDRESS, CREATED, UPDATED])
        old = _ids(lo, [ROWID]).column(0).to_numpy()
    except Exception as err:  # noqa: BLE001 - Lance's own reason, reported
        return f"Lance cannot read the row versions ({str(err).splitlines()[0][:200]})"
    rid = meta.column(ROWID).to_numpy()
    created = meta.column(CREATED).to_numpy().astype(np.int64)
    updated = meta.column(UPDATED).to_numpy().astype(np.int64)
    line = lo.version if lo_version is None else lo_version
    new = created > line
    old = np.sort(old)
    if not member(rid[~new], old).all():
        return (f"rows of version {hi.version} created before version {line} are missing "
                f"from it: the history between them is not one line (a restore)")
    changed = new | (updated > line)
    unchanged_files = same_files(lo, hi, columns)
    if unchanged_files:
        frag = (meta.column(ADDRESS).to_numpy() >> 32).astype(np.int64)
        changed &= new | ~member(frag, np.array(sorted(unchanged_files), np.int64))
    every = np.sort(rid)
    return np.sort(rid[changed]), old[~member(old, every)], every


def verdicts(ds: lance.LanceDataset, predicates: list[str]) -> pa.Table:
    """Each checked predicate (Lance SQL from the predicate parser) on every row, with its row
    id; NULL stays NULL."""
    cols = {f"v{i}": f"({p})" for i, p in enumerate(predicates)}
    return ds.to_table(columns=cols, with_row_id=True)


def read_rows(ds: lance.LanceDataset, rows: np.ndarray | None, projections: dict[str, str],
              cost: Cost, log: Callable[[str], None] | None = None) -> pa.Table:
    """``projections`` (alias -> SQL over ``ds``'s columns) of the rows ``rows`` (every row
    when None), with ``_rowid``: only the fragments holding them are scanned."""
    start = time.perf_counter()
    frags = ds.get_fragments()
    cost.fragments_total = len(frags)
    cost.rows_total = ds.count_rows()
    wanted = None
    if rows is not None:
        addr = ds.to_table(columns=[ROWID, ADDRESS])
        hold = pc.is_in(addr.column(ROWID), pa.array(rows, pa.uint64()))
        ids = set(np.unique(pc.filter(addr.column(ADDRESS), hold).to_numpy() >> 32).tolist())
        wanted = [f for f in frags if f.fragment_id in ids]
    todo = frags if wanted is None else wanted
    total = sum(f.count_rows() for f in todo)
    batches = []
    # a line every LOG_EVERY_S (rows done, rate, time left) while a long read runs; none for
    # a short one
    with progress(None, f"diff: reading version {ds.version}", "batch", log,
                  rows_total=total) as bar:
        if todo:
            scan = ds.scanner(columns=projections, with_row_id=True, fragments=todo)
            for batch in scan.to_batches():
                if rows is not None:
                    batch = batch.filter(pc.is_in(batch.column(ROWID), pa.array(rows, pa.uint64())))
                batches.append(batch)
                bar.update(0, rows=batch.num_rows)
    if batches:
        out = pa.Table.from_batches(batches)
    else:
        out = ds.to_table(columns=projections, with_row_id=True, limit=0)
    cost.fragments.update(f.fragment_id for f in todo)
    cost.rows_read += out.num_rows
    cost.seconds += time.perf_counter() - start
    return out
