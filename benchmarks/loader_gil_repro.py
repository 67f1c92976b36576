"""Why more loader threads can be slower: a sweep of StreamingDataset's thread knobs (CPU only).

    python -m benchmarks.loader_gil_repro [--rows 20000] [--blocks 3000]

Builds its own synthetic, byte-tokenized table, then for each (io_queue_depth,
transform_parallelism) pulls packed blocks as fast as it can and prints tokens/s, the CPU share
of the packer (the consuming thread, which joins and cuts the token lists under the GIL), the
whole process's CPU use, and the mean raw-batch queue depth (fetched, not yet transformed).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

from benchmarks.build_packed_datasets import train_filter
from benchmarks.train_loader import build_table
from lance_assets.table import Table
from lance_assets.train import data


def measure(snap, *, io_queue_depth: int, transform_parallelism: int, blocks: int,
            block_len: int) -> dict:
    tfilter = train_filter(snap)
    bpe = data.count_blocks(snap, tfilter, block_len, 8)
    ds = data.train_dataset(snap, filter=tfilter, block_len=block_len, blocks_per_epoch=bpe,
                            num_splits=8, rank=0, world_size=1, seed=0, epoch=0,
                            io_queue_depth=io_queue_depth,
                            transform_parallelism=transform_parallelism)
    depths = []
    cpu0, thread0, wall0 = os.times(), time.thread_time(), time.perf_counter()
    n = 0
    for n, _block in enumerate(ds, start=1):
        if n % 64 == 0:
            depths.append(ds.raw_queue_depth)
        if n >= blocks:
            break
    wall = time.perf_counter() - wall0
    cpu1 = os.times()
    process_cpu = (cpu1.user - cpu0.user) + (cpu1.system - cpu0.system)
    return {
        "tokens_per_s": n * block_len / wall,
        "packer_cpu_share": (time.thread_time() - thread0) / wall,
        "process_cores_busy": process_cpu / wall,
        "raw_queue_depth": statistics.mean(depths) if depths else 0.0,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=20_000)
    p.add_argument("--blocks", type=int, default=3_000, help="blocks pulled per setting")
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--io", type=int, nargs="+", default=[1, 2, 4, 8])
    p.add_argument("--tp", type=int, nargs="+", default=[1, 2, 4, 8])
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "data"
        build_table(root, args.rows)
        table = Table.of(root)
        snap = data.open_snapshot(table)
        print(f"# {os.cpu_count()} cores; {args.blocks} blocks of {args.seq_len + 1} tokens per "
              "setting; 8 splits")
        print("| io_queue_depth | transform_parallelism | tokens/s | packer thread CPU share | "
              "process cores busy | mean raw-queue depth |")
        print("|---|---|---|---|---|---|")
        for io in args.io:
            for tp in args.tp:
                r = measure(snap, io_queue_depth=io, transform_parallelism=tp, blocks=args.blocks,
                            block_len=args.seq_len + 1)
                print(f"| {io} | {tp} | {r['tokens_per_s']:,.0f} | {r['packer_cpu_share']:.0%} | "
                      f"{r['process_cores_busy']:.2f} | {r['raw_queue_depth']:.1f} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
