"""Training and validation data straight from the corpus table.

Packing and shuffling happen in the loader (``lancedb.streaming.StreamingDataset`` with
``pack_sequences``): documents that pass the SQL filter are shuffled into ``num_splits`` fixed
splits, joined with EOS and cut into blocks of ``seq_len + 1`` tokens. The validation split is a
frozen slice of ids (``id % val_mod = 0``), packed in storage order, identical every run.

The split is the trainer's own: the user's ``--filter`` is parsed and checked against the
table's columns (``lance_assets.curation.predicate``), then joined to the split's predicate as a
parsed tree, never by pasting text, so no filter can reach the other side of the split.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Union

import lancedb
import torch
from lancedb.streaming import StreamingDataLoader, StreamingDataset

from lance_assets import paths, storage
from lance_assets.curation.predicate import Predicate, PredicateError, safe_predicate
from lance_assets.keys import TOKENIZER_KEY
from lance_assets.table import Table


@dataclass(frozen=True)
class TableSnapshot:
    table: lancedb.table.Table
    version: int
    tokenizer: dict  # name, eos_id, pad_id, vocab_size, sha256


def as_table(where: Union[Table, str, os.PathLike], table_name: str | None = None) -> Table:
    """``where`` itself when it is a ``Table``; else ``where`` is the LanceDB folder (``DATA/lance``,
    what ``Table.db_dir`` names, possibly an object-store URI) that holds ``table_name``."""
    if isinstance(where, Table):
        return where
    db_dir = storage.location(where)
    table = Table.of(storage.uri_of(db_dir.parent), name=table_name or paths.TABLE_NAME)
    if storage.location(table.db_dir).name != db_dir.name:
        raise ValueError(f"{where}: not the LanceDB folder of a data root ({table.db_dir}); pass "
                         "a Table (lance_assets.table.Table.of(DATA))")
    return table


def resolve_version(table: Union[Table, str, os.PathLike], table_name: str | None = None,
                    tag: str | None = None) -> int:
    """The version ``tag`` names, or the newest version of the table. ``table``: a ``Table``, or
    the LanceDB folder that holds ``table_name``."""
    table = as_table(table, table_name)
    handle = table.lancedb_table()
    if tag is None:
        return handle.version
    tags = handle.to_lance().tags.list()
    if tag not in tags:
        raise KeyError(f"table {table.name!r} in {table.db_dir} has no tag {tag!r} (its tags: "
                       f"{', '.join(sorted(tags)) or 'none'})")
    return tags[tag]["version"]


def open_snapshot(table: Union[Table, str, os.PathLike], table_name: str | None = None,
                  version: int | None = None) -> TableSnapshot:
    """Open the table pinned at ``version`` (default: the newest) and read its tokenizer.

    ``table``: a ``Table``, or the LanceDB folder that holds ``table_name``; either may be on
    object storage. The connection holds no credentials (Lance reads them from the environment,
    see ``storage_options_for``), so the ``StreamingDataset`` state that DataLoader workers
    pickle carries none either."""
    table = as_table(table, table_name)
    handle = table.lancedb_table(version or None)
    if not version:  # pin the newest: the loader reads one version whatever lands meanwhile
        version = handle.version
        handle.checkout(version)
    raw = handle.to_lance().config().get(TOKENIZER_KEY)
    if raw is None or "input_ids" not in handle.schema.names:
        raise RuntimeError(
            f"table {table.name!r} in {table.db_dir} has no token columns; materialize "
            "`token_ids` first"
        )
    return TableSnapshot(table=handle, version=version, tokenizer=json.loads(raw))


@dataclass(frozen=True)
class Splits:
    train: Predicate
    val: Predicate


def splits(user_filter: str, val_mod: int, columns, eval_filter: str = "") -> Splits:
    """The training and validation predicates: the user's filter (checked against ``columns``;
    ``PredicateError`` names --filter otherwise) AND the trainer's own split.

    With ``eval_filter`` (checked the same way) the validation split is those documents alone,
    whatever the user's filter, and training keeps the user's filter AND NOT ``eval_filter``:
    runs with different filters then evaluate on the same held-out documents, none of which
    any of them trains on."""
    if not isinstance(val_mod, int) or val_mod < 2:
        raise ValueError(f"val_mod must be an integer >= 2, got {val_mod!r}")
    columns = list(columns)
    try:
        user = safe_predicate(user_filter, columns) if user_filter.strip() else None
    except PredicateError as e:
        raise PredicateError(f"--filter: {e}") from None
    has_tokens = safe_predicate("n_tokens > 0", columns)
    if eval_filter.strip():
        try:
            held_out = safe_predicate(eval_filter, columns)
        except PredicateError as e:
            raise PredicateError(f"--eval-filter: {e}") from None
        train = has_tokens.and_(held_out.negated())
        return Splits(train if user is None else user.and_(train), has_tokens.and_(held_out))
    train = safe_predicate(f"n_tokens > 0 AND id % {val_mod} != 0", columns)
    val = safe_predicate(f"n_tokens > 0 AND id % {val_mod} = 0", columns)
    if user is None:
        return Splits(train, val)
    return Splits(user.and_(train), user.and_(val))


class TooLittleData(RuntimeError):
    """The filter leaves less than one block per split."""


def count_blocks(snap: TableSnapshot, filter: str, block_len: int, num_splits: int) -> int:
    """Exact packed-block budget: (tokens + one EOS per document) // block_len, per split multiple."""
    tokens = 0
    scanner = snap.table.to_lance().scanner(columns=["n_tokens"], filter=filter)
    for batch in scanner.to_batches():
        col = batch.column(0)
        tokens += int(col.to_numpy(zero_copy_only=False).sum()) + len(col)
    blocks = tokens // block_len
    blocks -= blocks % num_splits
    if blocks == 0:
        raise TooLittleData(
            f"filter {filter!r} leaves fewer than {num_splits} blocks of {block_len} tokens; "
            "ingest more data, loosen the filter or shorten --seq-len"
        )
    return blocks


def count_rows(snap: TableSnapshot, filter: str, num_splits: int) -> int:
    """Documents per epoch without packing (the loader drops the remainder of ``num_splits``)."""
    rows = snap.table.to_lance().count_rows(filter=filter)
    if rows < num_splits:
        raise TooLittleData(f"filter {filter!r} leaves {rows} documents, fewer than the "
                            f"{num_splits} splits; ingest more data or loosen the filter")
    return rows - rows % num_splits


class TruncateOrPad:
    """Unpacked mode: one document per sequence, EOS-terminated, cut or PAD-filled to block_len."""

    def __init__(self, block_len: int, eos_id: int, pad_id: int):
        self.block_len, self.eos_id, self.pad_id = block_len, eos_id, pad_id

    def __call__(self, batch):
        out = []
        for ids in batch.column("input_ids").to_pylist():
            seq = (ids + [self.eos_id])[: self.block_len]
            seq += [self.pad_id] * (self.block_len - len(seq))
            out.append({"input_ids": torch.tensor(seq, dtype=torch.long)})
        return out


def train_dataset(snap: TableSnapshot, *, filter: str, block_len: int, blocks_per_epoch: int,
                  num_splits: int, rank: int, world_size: int, seed: int, epoch: int,
                  pack: bool = True, read_batch_size: int = 64, io_queue_depth: int = 4,
                  transform_parallelism: int | None = None,
                  transform_queue_depth: int | None = None) -> StreamingDataset:
    common = dict(
        columns=["input_ids"], filter=filter, shuffle=True, shuffle_seed=seed, epoch=epoch,
        num_splits=num_splits, rank=rank, world_size=world_size, read_batch_size=read_batch_size,
        io_queue_depth=io_queue_depth, transform_parallelism=transform_parallelism,
        transform_queue_depth=transform_queue_depth,
    )
    eos, pad = snap.tokenizer["eos_id"], snap.tokenizer["pad_id"]
    if pack:
        return StreamingDataset(snap.table, pack_sequences=block_len, eos_id=eos, pad_id=pad,
                                blocks_per_epoch=blocks_per_epoch, **common)
    return StreamingDataset(snap.table, transform=TruncateOrPad(block_len, eos, pad), **common)


def tokens_per_byte(snap: TableSnapshot, filter: str) -> float | None:
    """Tokens (one EOS per document included) per UTF-8 byte of the split, for bits-per-byte.

    From ``n_bytes`` when the table has it; for the byte tokenizer bytes are tokens.
    """
    names = snap.table.schema.names
    if "n_bytes" in names:
        column = "n_bytes"
    elif snap.tokenizer["name"] == "byte":
        column = "n_tokens"
    else:
        return None
    columns = ["n_tokens"] if column == "n_tokens" else ["n_tokens", column]
    tokens = n_bytes = 0
    for batch in snap.table.to_lance().scanner(columns=columns, filter=filter).to_batches():
        t = batch.column(0).to_numpy(zero_copy_only=False)
        tokens += int(t.sum()) + len(t)
        n_bytes += int(batch.column(len(columns) - 1).to_numpy(zero_copy_only=False).sum())
    return tokens / n_bytes if n_bytes else None


def train_loader(dataset: StreamingDataset, batch_size: int, num_workers: int = 0):
    return StreamingDataLoader(dataset, batch_size=batch_size, num_workers=num_workers)


class TrainBatches:
    """This rank's training blocks, ``batch_size`` at a time, epoch after epoch (each epoch
    reshuffled); ``state_dict()`` is the loader position a checkpoint resumes from."""

    def __init__(self, snap: TableSnapshot, *, epoch: int, state: dict | None, batch_size: int,
                 num_workers: int = 0, **dataset_kw):
        self.snap, self.epoch, self.dataset_kw = snap, epoch, dataset_kw
        self.batch_size, self.num_workers = batch_size, num_workers
        self._open(state)

    def _open(self, state: dict | None) -> None:
        self.dataset = train_dataset(self.snap, epoch=self.epoch, **self.dataset_kw)
        if state is not None:
            self.dataset.load_state_dict(state)
        self._it: Iterator = iter(train_loader(self.dataset, self.batch_size, self.num_workers))

    def __iter__(self) -> TrainBatches:
        return self

    def __next__(self) -> torch.Tensor:
        try:
            return next(self._it)["input_ids"]
        except StopIteration:
            self.epoch += 1
            self._open(None)
            return next(self._it)["input_ids"]

    def state_dict(self) -> dict:
        return self.dataset.state_dict()

    @staticmethod
    def merge_state_dicts(states: list[dict]) -> dict:
        return StreamingDataset.merge_state_dicts(states)


VAL_SCAN_PER_BLOCK = 32
"""The validation blocks are a systematic sample of the held-out token stream: every k-th of
at most this many packed blocks per block kept, so they cover many documents (a few long ones
would otherwise fill every block, and the held-out error is counted over documents)."""


@dataclass(frozen=True)
class ValBlocks:
    blocks: torch.Tensor  # (n, block_len) packed blocks, in stream order
    first_doc: torch.Tensor  # (n,) the stream's index of the document each block starts in

    def __len__(self) -> int:
        return len(self.blocks)


def val_blocks(snap: TableSnapshot, *, filter: str, block_len: int, max_blocks: int) -> ValBlocks:
    """``max_blocks`` validation blocks (fewer when the split holds fewer), packed in storage
    order and sampled evenly from its first ``max_blocks x VAL_SCAN_PER_BLOCK`` blocks: the same
    blocks every run, spread over the split's documents."""
    total = count_blocks(snap, filter, block_len, 1)
    scan = min(total, max_blocks * VAL_SCAN_PER_BLOCK)
    stride = max(1, scan // max_blocks)
    ds = StreamingDataset(
        snap.table, columns=["input_ids"], filter=filter, shuffle=False, num_splits=1,
        pack_sequences=block_len, eos_id=snap.tokenizer["eos_id"],
        pad_id=snap.tokenizer["pad_id"], blocks_per_epoch=scan,
    )
    eos = snap.tokenizer["eos_id"]
    kept, first_doc, docs_before = [], [], 0
    for i, item in enumerate(ds):
        block = item["input_ids"]
        if i % stride == 0 and len(kept) < max_blocks:
            kept.append(block)
            first_doc.append(docs_before)
        docs_before += int((block == eos).sum())
    return ValBlocks(torch.stack(kept), torch.tensor(first_doc, dtype=torch.long))


def document_index(val: ValBlocks, eos_id: int) -> torch.Tensor:
    """For every target position of the blocks (``[:, 1:]``), the stream index of the document it
    belongs to: an EOS closes its document, so it counts for the one before it."""
    eos = (val.blocks == eos_id).long()
    within = torch.cumsum(eos, 1) - eos  # EOS strictly before each position in its block
    return (val.first_doc[:, None] + within)[:, 1:]


def inputs_and_targets(blocks: torch.Tensor, pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Next-token pairs from packed blocks; PAD positions are left out of the loss (-1)."""
    x = blocks[:, :-1]
    y = blocks[:, 1:].clone()
    y[y == pad_id] = -1
    return x, y
