"""Pre-packed block loaders: the controls of the loader A/B (``benchmarks/loaders.py``).

Training packs and shuffles in the loader, straight from the corpus table. These arms read the
same blocks from copies made ahead of time by ``python -m benchmarks.build_packed_datasets``
(a folder with ``manifest.json``), and feed the trainer's step function in the benchmark:

- ``parquet-random``: uncompressed Parquet of int32 blocks in loader order, random take per batch;
- ``parquet-seq``: the pre-shuffled Parquet copy, read sequentially;
- ``lance``: a Lance table of blocks, random take per batch;
- ``mosaic``: MosaicML MDS shards through ``streaming.StreamingDataset`` (its own environment).

Each yields ``(batch, block_len)`` int64 tensors, rank-strided, reshuffled per epoch with
``seed + epoch``. They exist to be measured, not to train production models.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch

MODES = ("lance", "mosaic", "parquet-random", "parquet-seq")


def read_manifest(path: str | Path) -> dict:
    manifest = Path(path) / "manifest.json"
    if not manifest.is_file():
        raise FileNotFoundError(
            f"{manifest} not found: build the copies first with "
            "`python -m benchmarks.build_packed_datasets --out DIR`")
    return json.loads(manifest.read_text())


def _batches_of(order: np.ndarray, batch: int, rank: int, world: int,
                drop_last: bool) -> Iterator[np.ndarray]:
    mine = order[rank::world]
    stop = len(mine) - batch + 1 if drop_last else len(mine)
    for i in range(0, max(stop, 0), batch):
        yield mine[i : i + batch]


def _to_tensor(column) -> torch.Tensor:
    """A (fixed-size) list<int32> Arrow column -> (rows, block_len) int64 tensor."""
    import pyarrow as pa

    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    width = column.type.list_size
    flat = column.flatten().to_numpy(zero_copy_only=False)
    return torch.from_numpy(flat.reshape(-1, width).astype(np.int64))


def iter_blocks(mode: str, path: str | Path, *, batch: int, rank: int = 0, world: int = 1,
                seed: int = 0, epoch: int = 0, drop_last: bool = True) -> Iterator[torch.Tensor]:
    """One epoch of ``mode``'s blocks for this rank, ``batch`` at a time (the short last batch
    is dropped unless ``drop_last=False``)."""
    root = Path(path)
    m = read_manifest(root)
    n = m["n_blocks"]
    order = np.random.default_rng(seed + epoch).permutation(n)
    if mode == "parquet-random":
        import pyarrow.dataset as pads

        ds = pads.dataset(root / m["files"]["parquet"])
        for idx in _batches_of(order, batch, rank, world, drop_last):
            yield _to_tensor(ds.take(np.sort(idx)).column("input_ids"))[np.argsort(np.argsort(idx))]
    elif mode == "lance":
        import lance

        ds = lance.dataset(root / m["files"]["lance"])
        for idx in _batches_of(order, batch, rank, world, drop_last):
            yield _to_tensor(ds.take(np.sort(idx), columns=["input_ids"]).column("input_ids"))[
                np.argsort(np.argsort(idx))]
    elif mode == "parquet-seq":
        import pyarrow.parquet as pq

        # Shuffled once, offline: read in file order, rank-strided by row group.
        pf = pq.ParquetFile(root / m["files"]["parquet_shuffled"])
        groups = list(range(pf.num_row_groups))
        np.random.default_rng(seed + epoch).shuffle(groups)
        pending: list[torch.Tensor] = []
        have = 0
        for rg in groups[rank::world]:
            pending.append(_to_tensor(pf.read_row_group(rg, columns=["input_ids"]).column(0)))
            have += len(pending[-1])
            while have >= batch:
                stacked = torch.cat(pending)
                yield stacked[:batch]
                pending, have = [stacked[batch:]], have - batch
        if have and not drop_last:
            yield torch.cat(pending)
    elif mode == "mosaic":
        from streaming import StreamingDataset  # the separate MDS environment (scripts/mds_venv.sh)
        from torch.utils.data import DataLoader

        ds = StreamingDataset(local=str(root / m["files"]["mds"]), shuffle=True,
                              shuffle_seed=seed + epoch, batch_size=batch, num_canonical_nodes=1)
        loader = DataLoader(ds, batch_size=batch, num_workers=0,
                            collate_fn=lambda rows: torch.from_numpy(
                                np.stack([r["input_ids"] for r in rows]).astype(np.int64)))
        for blocks in loader:
            if len(blocks) == batch or not drop_last:
                yield blocks
    else:
        raise ValueError(f"pre-packed arm {mode!r}: choose one of {', '.join(MODES)}")
