"""Which rows forensics looks at: the table version the model trained on.

``DATA/train/LATEST`` names the newest run's final checkpoint; the run's ``summary.json`` (or the
checkpoint itself) records ``table_version``, the snapshot tag that keeps that version from being
cleaned up (``train-<run name>``) and the training ``filter``. Rows are append-only and ids only
grow (deletions included), so the rows of that version are exactly ``id <= max_id`` of that
version in any later version, where the ``embedding`` column and the indexes may have been added
since. Token ids are read at the pinned version itself, opened through the run's tag.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

import lance

from lance_assets import paths, storage
from lance_assets.table import Table, VersionChoiceError


@dataclass(frozen=True)
class Pin:
    version: int  # the table version read for tokens and for which rows exist
    max_id: int  # largest id at that version (-1: empty)
    train_filter: str | None  # SQL the model's training documents passed (None: not known)
    checkpoint: str | None
    source: str  # where the version came from, in words
    tag: str | None = None  # the snapshot tag that protects the version from cleanup

    def rows_filter(self, training_only: bool = False, latest_max_id: int | None = None) -> str | None:
        """SQL selecting the pinned rows (only the training documents with ``training_only``),
        or None when that is every row of the table."""
        parts = []
        if latest_max_id is None or latest_max_id > self.max_id:
            parts.append(f"id <= {self.max_id}")
        if training_only and self.train_filter:
            parts.append(f"({self.train_filter})")
        return " AND ".join(parts) or None

    def to_dict(self) -> dict:
        return asdict(self)


def max_id(ds: lance.LanceDataset) -> int:
    best = -1
    for batch in ds.to_batches(columns=["id"]):
        col = batch.column(0).to_numpy(zero_copy_only=False)
        if len(col):
            best = max(best, int(col.max()))
    return best


def model_run(table: Table) -> dict | None:
    """``{checkpoint, table_version, filter}`` of the newest model trained on ``table``'s data
    root, or None."""
    pointer = paths.latest_checkpoint_pointer(table.root)
    if not pointer.is_file():
        return None
    ckpt = storage.location(pointer.read_text().strip())
    summary = ckpt.parent / "summary.json"
    if summary.is_file():
        info = json.loads(summary.read_text())
        if "table_version" in info:
            return {"checkpoint": str(ckpt), "table_version": int(info["table_version"]),
                    "filter": info.get("filter"), "table_tag": info.get("table_tag") or None}
    if ckpt.is_file():
        # a checkpoint is a file someone may have handed us: loaded weights-only, never run
        from lance_assets.train.checkpoint import load

        state = load(ckpt)
        return {"checkpoint": str(ckpt), "table_version": int(state["table_version"]),
                "filter": state.get("filter"), "table_tag": state.get("table_tag")}
    raise FileNotFoundError(
        f"{pointer} names {ckpt}, which does not exist and has no summary.json beside it; "
        "materialize `pretrained_model` again, or pass an explicit table version")


def resolve_pin(table: Table, version: int | None = None) -> Pin:
    """The pinned rows: ``version`` when given, else the newest model's, else the newest table."""
    if version is not None:
        given = table.choose(version)
        return Pin(given.version, max_id(given.dataset), None, None,
                   f"table version {version} (given)")
    run = model_run(table)
    if run is None:
        latest = table.choose()
        return Pin(latest.version, max_id(latest.dataset), None, None,
                   f"newest table version {latest.version} (no trained model: DATA/train/LATEST "
                   "is missing)")
    v, tag = run["table_version"], run.get("table_tag")
    pinned = open_snapshot(table, v, tag)
    return Pin(v, max_id(pinned), run["filter"], run["checkpoint"],
               f"table version {v}" + (f" (tag {tag})" if tag else "")
               + f", which {run['checkpoint']} trained on", tag)


def open_snapshot(table: Table, version: int, tag: str | None) -> lance.LanceDataset:
    """The version a run trained on, through its tag while the tag still names that version
    (``Table.choose``); a clear error when a cleanup removed it."""
    try:
        return table.choose(tag, version=version).dataset
    except VersionChoiceError as e:
        raise FileNotFoundError(
            f"{table.uri}: table version {version}, which the newest model trained on, no longer "
            "exists" + (f" (its snapshot tag {tag} was released and a cleanup removed it)"
                        if tag else " (a cleanup removed it)")
            + f" ({str(e).rstrip('.')}). Train again, then make the samples and this report "
            "(dagster asset materialize -m lance_assets.definitions --select "
            "'pretrained_model*'), or pin a version that exists (forensics --version)") from None
