"""What a training run read: the documents its loader took from the table, not those its filter
allowed.

With every checkpoint (the final one included), rank 0 writes ``OUT/read.json``: for each epoch
so far, the stored shuffle permutation (``OUT/permutations``, the rows of every split in the
order the loader reads them) and, for the epoch in progress, how far each split has advanced
(``positions_consumed_per_split`` of the merged loader state). Every row before those positions
was read (its tokens trained on, or held in the packer's buffer at the checkpoint); no row after
them was. ``rows_read`` turns the record into the ids (equal to Lance's row ids, see
``ingest``), so ``forget`` and ``explain`` say "read by run X" for exactly those documents and
"kept by its filter, not read" for the rest.

A run killed between checkpoints read more than its last record says, up to its next
checkpoint: until a ``summary.json`` marks it finished, readers treat its filter as the bound.
"""

from __future__ import annotations

import json
import os

import numpy as np

from lance_assets import storage
from lance_assets.table.side import open_side_dataset

RECORD = "read.json"
FORMAT = 1


def write(out: storage.Location, *, table_version: int, step: int,
          epochs: list[dict], domains: dict | None = None) -> None:
    """``epochs``: ``{"epoch", "rows" (the permutation's rows dataset), "split_sizes",
    "positions" (None: every row of that epoch)}`` for every epoch so far (a mixture: every
    domain's, each naming its ``domain``); ``domains``: a mixture's tokens read per domain."""
    record = {"format": FORMAT, "table_version": table_version, "step": step, "epochs": epochs}
    if domains is not None:
        record["domains"] = domains
    storage.write_atomic(storage.location(out) / RECORD, json.dumps(record).encode())


def load(run: str | os.PathLike) -> dict | None:
    path = storage.location(run) / RECORD
    try:
        record = json.loads(path.read_text())
    except (FileNotFoundError, ValueError):
        return None
    return record if record.get("format") == FORMAT else None


def rows_read(run: str | os.PathLike) -> np.ndarray | None:
    """The sorted ids the run at folder ``run`` read, or None without a record."""
    record = load(run)
    if record is None:
        return None
    out = []
    for epoch in record["epochs"]:
        rows = open_side_dataset(epoch["rows"])
        positions = epoch.get("positions")
        if positions is None:
            out.append(rows.to_table(columns=["row_id"]).column(0).to_numpy())
            continue
        starts = np.concatenate([[0], np.cumsum(epoch["split_sizes"])[:-1]]).astype(np.int64)
        take = np.concatenate([np.arange(s, s + int(p), dtype=np.int64)
                               for s, p in zip(starts, positions)] or [np.empty(0, np.int64)])
        if len(take):
            out.append(rows.take(take, columns=["row_id"]).column(0).to_numpy())
    if not out:
        return np.empty(0, np.int64)
    return np.unique(np.concatenate(out).astype(np.int64))


def read_by(runs: list) -> np.ndarray | None:
    """The ids the runs in the folders ``runs`` read, together (sorted); None when one of them
    has no exact record: no ``summary.json`` (killed between checkpoints: it may have read up to
    its next one) or no ``read.json`` (from before records). ``forget`` and ``explain`` both
    answer "read by" with this, so they agree."""
    read = [np.empty(0, np.int64)]
    for run in runs:
        if not (storage.location(run) / "summary.json").is_file():
            return None
        got = rows_read(run)
        if got is None:
            return None
        read.append(got)
    return np.unique(np.concatenate(read)) if runs else None
