"""Training and validation data straight from the corpus table.

Packing and shuffling happen in the loader (``lancedb.streaming.StreamingDataset`` with
``pack_sequences``): documents that pass the SQL filter are shuffled into ``num_splits`` fixed
splits, joined with EOS and cut into blocks of ``seq_len + 1`` tokens. The validation split is a
frozen slice of ids (``id % val_mod = 0``), packed in storage order, identical every run.

The split is the trainer's own: the user's ``--filter`` is parsed and checked against the
table's columns (``lance_assets.curation.predicate``), then joined to the split's predicate as a
parsed tree, never by pasting text, so no filter can reach the other side of the split.

The shuffle permutation (which document goes to which split, in which order) is built once per
run and epoch and stored under the run's folder; every rank reads from it only the rows of its
own splits, a batch at a time, so a rank's memory for the shuffle does not grow with the corpus
(``SharedPermutationDataset``). The order is the one ``StreamingDataset`` would build itself.
``StreamingDataset`` takes no outside permutation, so the dataset that reads the stored one
lives in ``streaming_adapter.py``: the one module that relies on lancedb's internals, and
says which.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass

import lancedb
import numpy as np
import pyarrow as pa
import torch
from lancedb.permutation import permutation_builder
from lancedb.streaming import StreamingDataLoader, StreamingDataset

from lance_assets import storage
from lance_assets.keys import TOKENIZER_KEY
from lance_assets.table import Table
from lance_assets.table.forget_journal import gone
from lance_assets.table.side import open_side_dataset, write_side_dataset
from lance_assets.train.split import Splits, splits  # noqa: F401 (the loader's API)
from lance_assets.train.streaming_adapter import PermutationError, SharedPermutationDataset, permutation_seed
from lance_assets.train.workers import InOrderBatches


@dataclass(frozen=True)
class TableSnapshot:
    table: lancedb.table.Table
    version: int
    tokenizer: dict  # name, eos_id, pad_id, vocab_size, sha256
    ref: int | str | None = None  # what opens it again: the version, or a redacted copy's tag
    redacted: dict | None = None  # what forget took from it (``table.redact.gone``)


def resolve_version(table: Table, tag: str | None = None) -> int:
    """The version ``tag`` names, or the newest version of the table."""
    return table.choose(tag).version


def open_snapshot(table: Table, version: int | None = None,
                  tag: str | None = None) -> TableSnapshot:
    """Open the table pinned at ``version`` (default: the newest) and read its tokenizer. With
    the run's ``tag``: a version ``forget`` redacted since (``table.redact``) is read through
    the tag, on the copy that keeps every row but the forgotten ones.

    The table may be on object storage. The connection holds no credentials (Lance reads them
    from the environment, see ``storage_options_for``), so the ``StreamingDataset`` state that
    DataLoader workers pickle carries none either."""
    # pin the newest when no version is given: the loader reads one version whatever lands
    version = version or table.choose().version
    ref, redacted = version, None
    if tag is not None:
        chosen = table.choose(tag, version=version)
        if chosen.branch is not None:
            ref, version, redacted = tag, chosen.version, gone(table, chosen.dataset)
    handle = table.lancedb_table(ref)
    raw = handle.to_lance().config().get(TOKENIZER_KEY)
    if raw is None or "input_ids" not in handle.schema.names:
        raise RuntimeError(
            f"table {table.name!r} in {table.db_dir} has no token columns; materialize "
            "`token_ids` first"
        )
    return TableSnapshot(table=handle, version=version, tokenizer=json.loads(raw), ref=ref,
                         redacted=redacted)


def redacted_since(table: Table, snap: TableSnapshot, version: int) -> dict:
    """What ``forget`` took from the redacted copy ``snap`` reads since ``version`` (a
    checkpoint's): the redactions made of that version or a later one."""
    return gone(table, snap.table.to_lance(), since=version)


def across_redaction(state: dict | None, blocks_per_epoch: int) -> dict | None:
    """A packed loader state saved before ``forget`` redacted the run's snapshot, made to resume
    on the copy: the epoch keeps its position (the rows consumed of each split), its length is
    the copy's (``blocks_per_epoch``), and the part-filled blocks the state carried are dropped
    (they may hold a forgotten document's tokens). The rest of the epoch follows the copy's own
    shuffle (its permutation is built for the copy's version)."""
    if not state or "pack_buffers" not in state:
        return state
    return {**state, "blocks_per_epoch": blocks_per_epoch, "pack_buffers": {}}


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


# ---- one shuffle permutation per run and epoch, stored once, read by every rank

PERMUTATION_FORMAT = 1
PERMUTATION_WAIT_S = 3600.0
"""How long a rank waits for rank 0 to store the epoch's permutation before giving up."""


@dataclass(frozen=True)
class PermutationKey:
    """Everything that decides a permutation: the same key gives the same order."""

    table_version: int
    filter: str
    seed: int  # the run's shuffle seed; the epoch is mixed in as StreamingDataset does
    epoch: int
    num_splits: int

    def folder(self, root: storage.Location) -> storage.Location:
        """``root/<digest of version, filter, seed, splits>/epoch-<n>``: another filter or seed
        in the same run folder gets a folder of its own instead of a refusal."""
        run = {k: v for k, v in asdict(self).items() if k != "epoch"}
        digest = hashlib.sha256(json.dumps([PERMUTATION_FORMAT, run], sort_keys=True).encode())
        return storage.location(root) / digest.hexdigest()[:16] / f"epoch-{self.epoch}"


class StoredPermutation:
    """A permutation stored as a Lance dataset (``row_id``, ``split_id``; rows sorted by split,
    each split in its shuffled order). Pickles as its location and split sizes; each process
    opens the dataset itself and reads only the positions it asks for."""

    name = "permutation"

    def __init__(self, uri: str, key: PermutationKey, split_sizes: list[int]):
        self.uri, self.key, self.split_sizes = uri, key, list(split_sizes)
        self.split_starts = np.concatenate([[0], np.cumsum(self.split_sizes)[:-1]]).tolist()
        self._rows, self._pid = None, None

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_rows": None, "_pid": None}

    def rows(self):
        """The stored dataset, opened once per process."""
        if self._rows is None or self._pid != os.getpid():
            self._rows = open_side_dataset(self.uri)
            self._pid = os.getpid()
        return self._rows

    def row_ids(self, split: int, positions: list[int]) -> pa.Array:
        """The base table's row ids at ``positions`` of ``split``, in that order."""
        start = self.split_starts[split]
        return self.rows().take([start + p for p in positions], columns=["row_id"]).column(0)


_PERMUTATION_SCHEMA = pa.schema([("row_id", pa.uint64()), ("split_id", pa.uint64())])


def _manifest(folder: storage.Location) -> storage.Location:
    return folder / "permutation.json"


def open_permutation(snap: TableSnapshot, key: PermutationKey,
                     root: storage.Location) -> StoredPermutation | None:
    """The stored permutation for ``key`` under ``root``, checked; None when none was stored.

    The manifest is written last, atomically, after the rows: a build killed at any point
    leaves no manifest (and a ``rows-*.lance`` folder nothing reads), so it is never used."""
    folder = key.folder(root)
    manifest = _manifest(folder)
    try:
        raw = storage.read_bytes(manifest)
    except FileNotFoundError:
        return None
    fix = f"delete {folder} and rerun: rank 0 rebuilds it"
    try:
        m = json.loads(raw)
        recorded = PermutationKey(**m["key"])
        sizes, rows_name = [int(n) for n in m["split_sizes"]], str(m["rows"])
    except (ValueError, KeyError, TypeError) as e:
        raise PermutationError(f"{manifest}: unreadable permutation manifest ({e}); {fix}") from None
    if m.get("format") != PERMUTATION_FORMAT or recorded != key:
        raise PermutationError(f"{manifest}: built for {recorded} (format {m.get('format')}), this "
                               f"run reads {key} (format {PERMUTATION_FORMAT}); {fix}")
    uri = storage.uri_of(folder / rows_name)
    try:
        rows = open_side_dataset(uri)
    except Exception as e:  # noqa: BLE001 - any failure to open is a damaged permutation
        raise PermutationError(f"{uri}: cannot open the stored permutation ({e}); {fix}") from None
    schema = pa.schema([rows.schema.field(n) for n in rows.schema.names])
    if not schema.remove_metadata().equals(_PERMUTATION_SCHEMA, check_metadata=False):
        raise PermutationError(f"{uri}: schema {schema} is not (row_id uint64, split_id uint64); {fix}")
    counts = np.zeros(key.num_splits, dtype=np.int64)
    last = 0
    for batch in rows.to_batches(columns=["split_id"], scan_in_order=True):
        ids = batch.column(0).to_numpy()
        if len(ids) and (ids.max() >= key.num_splits or ids[0] < last or np.any(np.diff(ids) < 0)):
            raise PermutationError(f"{uri}: split ids out of range 0..{key.num_splits - 1} or out "
                                   f"of order; {fix}")
        if len(ids):
            last = int(ids[-1])
        counts += np.bincount(ids.astype(np.int64), minlength=key.num_splits)
    expected = snap.table.to_lance().count_rows(filter=key.filter)
    expected -= expected % key.num_splits
    if counts.tolist() != sizes or int(counts.sum()) != expected:
        raise PermutationError(f"{uri}: {int(counts.sum())} rows in splits {counts.tolist()}, the "
                               f"manifest says {sizes} and the filter leaves {expected} on table "
                               f"version {key.table_version}; {fix}")
    return StoredPermutation(uri, key, sizes)


def stored_rows(key: PermutationKey, root: storage.Location) -> tuple[str, list[int]] | None:
    """Where ``key``'s stored permutation keeps its rows, and its split sizes, read from its
    manifest alone (the run that reads it checked it when it opened it); None when none was
    stored."""
    folder = key.folder(root)
    try:
        m = json.loads(storage.read_bytes(_manifest(folder)))
    except FileNotFoundError:
        return None
    return storage.uri_of(folder / str(m["rows"])), [int(n) for n in m["split_sizes"]]


def build_permutation(snap: TableSnapshot, key: PermutationKey,
                      root: storage.Location) -> StoredPermutation:
    """Build ``key``'s permutation exactly as ``StreamingDataset`` would (same builder calls)
    and store it under ``root``: the rows under a fresh name, then the manifest that names
    them (the commit point). Rebuilding is safe: the same key gives the same rows."""
    if snap.version != key.table_version:
        raise ValueError(f"snapshot at version {snap.version}, key for {key.table_version}")
    perm = permutation_builder(snap.table).filter(key.filter).split_random(
        fixed=key.num_splits, seed=permutation_seed(key.seed, key.epoch), clump_size=None).execute()
    table = perm.to_arrow().select(["row_id", "split_id"]).cast(_PERMUTATION_SCHEMA)
    del perm
    split = table.column("split_id").to_numpy()
    if np.any(np.diff(split.astype(np.int64)) < 0):  # readers need each split contiguous
        table = table.take(np.argsort(split, kind="stable"))
    sizes = np.bincount(split.astype(np.int64), minlength=key.num_splits).tolist()
    folder = key.folder(root)
    rows_name = f"rows-{secrets.token_hex(8)}.lance"
    uri = storage.uri_of(folder / rows_name)
    write_side_dataset(table, uri)
    del table
    manifest = {"format": PERMUTATION_FORMAT, "key": asdict(key), "rows": rows_name,
                "split_sizes": sizes, "lancedb": lancedb.__version__}
    storage.write_atomic(_manifest(folder), json.dumps(manifest, indent=1).encode())
    stored = open_permutation(snap, key, root)
    assert stored is not None
    return stored


def shared_permutation(snap: TableSnapshot, key: PermutationKey, root: storage.Location, *,
                       build: bool, wait_s: float = PERMUTATION_WAIT_S) -> StoredPermutation:
    """The run's permutation for ``key``: opened when stored, else built by the one process
    with ``build`` (rank 0) while the others wait for its manifest. It carries what opens the
    run's version (``table_ref``: a redacted copy's tag), for the loader's workers."""
    stored = _shared_permutation(snap, key, root, build=build, wait_s=wait_s)
    stored.table_ref = snap.ref
    return stored


def _shared_permutation(snap: TableSnapshot, key: PermutationKey, root: storage.Location, *,
                        build: bool, wait_s: float) -> StoredPermutation:
    stored = open_permutation(snap, key, root)
    if stored is not None:
        return stored
    if build:
        return build_permutation(snap, key, root)
    deadline, pause = time.monotonic() + wait_s, 0.05
    while time.monotonic() < deadline:
        time.sleep(pause)
        pause = min(1.0, pause * 2)
        stored = open_permutation(snap, key, root)
        if stored is not None:
            return stored
    raise PermutationError(f"no permutation at {_manifest(key.folder(root))} after {wait_s:.0f} s: "
                           "rank 0 stores it; check that rank 0 is alive and that every rank sees "
                           "the same run folder (--out on shared storage)")


def train_dataset(snap: TableSnapshot, *, filter: str, block_len: int, blocks_per_epoch: int,
                  num_splits: int, rank: int, world_size: int, seed: int, epoch: int,
                  pack: bool = True, read_batch_size: int = 64, io_queue_depth: int = 4,
                  transform_parallelism: int | None = None,
                  transform_queue_depth: int | None = None,
                  permutations: storage.Location | None = None) -> StreamingDataset:
    """This rank's training dataset. With ``permutations`` (a folder of the run) the epoch's
    shuffle permutation is the one stored there (rank 0 builds it once, see
    ``shared_permutation``); without, the dataset builds its own in this process."""
    common = dict(
        columns=["input_ids"], filter=filter, shuffle=True, shuffle_seed=seed, epoch=epoch,
        num_splits=num_splits, rank=rank, world_size=world_size, read_batch_size=read_batch_size,
        io_queue_depth=io_queue_depth, transform_parallelism=transform_parallelism,
        transform_queue_depth=transform_queue_depth,
    )
    make = StreamingDataset
    if permutations is not None:
        key = PermutationKey(snap.version, filter, seed, epoch, num_splits)
        stored = shared_permutation(snap, key, permutations, build=rank == 0)
        make = lambda table, **kw: SharedPermutationDataset(table, permutation=stored, **kw)  # noqa: E731
    eos, pad = snap.tokenizer["eos_id"], snap.tokenizer["pad_id"]
    if pack:
        return make(snap.table, pack_sequences=block_len, eos_id=eos, pad_id=pad,
                    blocks_per_epoch=blocks_per_epoch, **common)
    return make(snap.table, transform=TruncateOrPad(block_len, eos, pad), **common)


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


def train_loader(dataset: StreamingDataset, batch_size: int, num_workers: int = 0, *,
                 splits_per_rank: int | None = None, start_method: str = "forkserver",
                 cycles: int = 1, first_cycles: int | None = None):
    """This rank's batches: read in this process, or by ``num_workers`` worker processes started
    by ``start_method``, in the same order either way; with ``cycles``, read that many cycles of
    the rank's splits at a time, ``first_cycles`` first (``workers.InOrderBatches``)."""
    if num_workers == 0 and cycles == 1 and not first_cycles:
        return StreamingDataLoader(dataset, batch_size=batch_size)
    if splits_per_rank is None:
        raise ValueError("train_loader with workers or cycles needs splits_per_rank "
                         "(num_splits // world_size)")
    return InOrderBatches(dataset, batch_size, splits_per_rank=splits_per_rank,
                          num_workers=num_workers, start_method=start_method, cycles=cycles,
                          first_cycles=first_cycles)


class TrainBatches:
    """This rank's training blocks, ``batch_size`` at a time, epoch after epoch (each epoch
    reshuffled); ``state_dict()`` is the loader position a checkpoint resumes from."""

    def __init__(self, snap: TableSnapshot, *, epoch: int, state: dict | None, batch_size: int,
                 num_workers: int = 0, start_method: str = "forkserver", grad_accum: int = 1,
                 **dataset_kw):
        self.snap, self.epoch, self.dataset_kw = snap, epoch, dataset_kw
        self.batch_size, self.num_workers, self.start_method = batch_size, num_workers, start_method
        self.grad_accum = grad_accum
        self._it: Iterator | None = None
        self._micro = 0  # micro-batches handed out: created at a step boundary
        self._open(state)

    def _open(self, state: dict | None) -> None:
        self.close()
        self.dataset = train_dataset(self.snap, epoch=self.epoch, **self.dataset_kw)
        if state is not None:
            self.dataset.load_state_dict(state)
        own = self.dataset_kw["num_splits"] // self.dataset_kw.get("world_size", 1)
        step = self.batch_size * self.grad_accum  # read a step at a time when it is whole cycles
        cycles = step // own if step % own == 0 else 1
        # an epoch that opens in the middle of a step reads the rest of that step first
        rest = (self.grad_accum - self._micro % self.grad_accum) % self.grad_accum
        first = rest * self.batch_size // own if rest * self.batch_size % own == 0 else None
        self._it = iter(train_loader(self.dataset, self.batch_size, self.num_workers,
                                     splits_per_rank=own, start_method=self.start_method,
                                     cycles=cycles, first_cycles=first))

    def close(self) -> None:
        """Stop this epoch's worker processes, if any."""
        if isinstance(self._it, InOrderBatches):
            self._it.close()

    def __iter__(self) -> TrainBatches:
        return self

    def __next__(self) -> torch.Tensor:
        try:
            blocks = next(self._it)["input_ids"]
        except StopIteration:
            self.epoch += 1
            self._open(None)
            blocks = next(self._it)["input_ids"]
        self._micro += 1
        return blocks

    def state_dict(self) -> dict:
        if isinstance(self._it, InOrderBatches) and self._it.holding:
            raise RuntimeError(f"{self._it.holding} blocks read but not yet trained on: save at a "
                               "step boundary (batch size x grad accum a multiple of the splits "
                               "per rank)")
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
