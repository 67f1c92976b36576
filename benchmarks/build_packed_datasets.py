"""Pre-packed copies of one epoch of training blocks: the controls of the loader A/B.

    python -m benchmarks.build_packed_datasets --data ./data --out data/packed --seq-len 128

The blocks are exactly those the trainer's on-the-fly loader yields in epoch 0 (same table
version, filter, ``num_splits``, seed and block length), written as:
- ``blocks.parquet``: uncompressed Parquet, one fixed-size int32 list per block, loader order;
- ``blocks_shuffled.parquet``: the same blocks, shuffled once (seeded), for sequential reads;
- ``blocks.lance``: a Lance table of the blocks;
- ``mds/``: MosaicML MDS shards, written by ``mosaicml-streaming``'s own ``MDSWriter`` in its own
  environment (``scripts/mds_venv.sh``); left out with a note when that environment is missing.
``manifest.json`` records the source, the sizes on disk and how many extra copies of the token
data now exist.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import time
from pathlib import Path

import lance
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from lance_assets.table import Table
from lance_assets.train import data

ROOT = Path(__file__).resolve().parents[1]  # the repository (benchmarks/ is not installed)
MDS_PYTHON = ROOT / ".venv-mds" / "bin" / "python"
ROW_GROUP_BLOCKS = 256

MDS_WRITER = """
import sys, numpy as np, pyarrow.parquet as pq
from streaming import MDSWriter
src, out, width = sys.argv[1], sys.argv[2], int(sys.argv[3])
with MDSWriter(out=out, columns={"input_ids": "ndarray:int32:" + str(width)}, compression=None,
               size_limit=1 << 26) as writer:
    for batch in pq.ParquetFile(src).iter_batches(batch_size=1024):
        flat = batch.column(0).flatten().to_numpy().reshape(-1, width)
        for row in flat:
            writer.write({"input_ids": np.ascontiguousarray(row, dtype=np.int32)})
"""


def train_filter(snap: data.TableSnapshot, filter: str = "NOT is_dup", val_mod: int = 20) -> str:
    """The trainer's training predicate (its own validation split excluded), for Lance."""
    return data.splits(filter, val_mod, snap.table.schema.names).train.lance


def epoch_blocks(data_dir: str, *, seq_len: int, filter: str = "NOT is_dup", val_mod: int = 20,
                 num_splits: int = 8, seed: int = 1337, table_version: int | None = None
                 ) -> tuple[np.ndarray, dict]:
    """Epoch 0 of the on-the-fly loader, as an (n_blocks, seq_len + 1) int32 array."""
    table = Table.of(data_dir)
    snap = data.open_snapshot(table, table_version)
    block_len = seq_len + 1
    tfilter = train_filter(snap, filter, val_mod)
    n = data.count_blocks(snap, tfilter, block_len, num_splits)
    ds = data.train_dataset(snap, filter=tfilter, block_len=block_len, blocks_per_epoch=n,
                            num_splits=num_splits, rank=0, world_size=1, seed=seed, epoch=0)
    blocks = np.stack([item["input_ids"].numpy().astype(np.int32) for item in ds])
    source = {"table_version": snap.version, "filter": tfilter, "num_splits": num_splits,
              "seed": seed, "epoch": 0, "tokenizer": snap.tokenizer}
    return blocks, source


def _size(path: Path) -> int:
    return path.stat().st_size if path.is_file() else sum(
        p.stat().st_size for p in path.rglob("*") if p.is_file())


def build(data_dir: str, out: str | Path, *, seq_len: int = 128, seed: int = 1337,
          num_splits: int = 8, filter: str = "NOT is_dup", mds: bool = True) -> dict:
    out = Path(out)
    for old in ("blocks.parquet", "blocks_shuffled.parquet", "blocks.lance", "mds", "manifest.json"):
        target = out / old
        shutil.rmtree(target) if target.is_dir() else target.unlink(missing_ok=True)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    blocks, source = epoch_blocks(data_dir, seq_len=seq_len, filter=filter,
                                  num_splits=num_splits, seed=seed)
    width = blocks.shape[1]
    column = pa.FixedSizeListArray.from_arrays(pa.array(blocks.reshape(-1)), width)
    table = pa.table({"input_ids": column})
    files = {"parquet": "blocks.parquet", "parquet_shuffled": "blocks_shuffled.parquet",
             "lance": "blocks.lance"}
    pq.write_table(table, out / files["parquet"], compression="none", use_dictionary=False,
                   row_group_size=ROW_GROUP_BLOCKS)
    perm = np.random.default_rng(seed).permutation(len(blocks))
    pq.write_table(table.take(perm), out / files["parquet_shuffled"], compression="none",
                   use_dictionary=False, row_group_size=ROW_GROUP_BLOCKS)
    lance.write_dataset(table, out / files["lance"], mode="overwrite")
    notes = []
    if mds and MDS_PYTHON.exists():
        files["mds"] = "mds"
        subprocess.run([str(MDS_PYTHON), "-c", MDS_WRITER, str(out / files["parquet"]),
                        str(out / "mds"), str(width)], check=True)
    elif mds:
        notes.append(f"MDS left out: {MDS_PYTHON} missing (make it with scripts/mds_venv.sh)")
    sizes = {k: _size(out / v) for k, v in files.items()}
    manifest = {
        "n_blocks": int(len(blocks)), "block_len": int(width), "source": source,
        "files": files, "bytes_on_disk": sizes,
        "token_bytes": int(blocks.nbytes), "extra_copies": len(files),
        "build_seconds": round(time.perf_counter() - t0, 2), "notes": notes,
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2))
    return manifest


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default="./data")
    p.add_argument("--out", required=True)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--seed", type=int, default=1337)
    p.add_argument("--num-splits", type=int, default=8)
    p.add_argument("--filter", default="NOT is_dup")
    p.add_argument("--no-mds", action="store_true")
    args = p.parse_args(argv)
    m = build(args.data, args.out, seq_len=args.seq_len, seed=args.seed, num_splits=args.num_splits,
              filter=args.filter, mds=not args.no_mds)
    print(json.dumps({k: m[k] for k in ("n_blocks", "block_len", "bytes_on_disk", "extra_copies",
                                        "build_seconds", "notes")}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
