"""Loader A/B: on-the-fly Lance packing against pre-packed Parquet, pre-shuffled Parquet,
MosaicML MDS and a Lance blocks table, all on the same blocks, in one process tree.

    make bench-loaders          # = scripts/mds_venv.sh, then this module
    python -m lance_assets.bench.loaders [--rows 6000] [--steps 150] [--loader-blocks 4000]

Builds a fresh table (synthetic corpus, byte tokens), makes the pre-packed copies of epoch 0
(``build_packed_datasets``), then for every arm, each in its own subprocess: the loader alone
(tokens/s, first-batch latency, peak RSS) and `tiny` training for a fixed number of steps
(tokens/s, data-wait share). Ratios are against the Lance on-the-fly arm. The MDS arm needs
``.venv-mds`` (mosaicml-streaming pins numpy<2.2); when it exists every arm's subprocess runs
there, so all arms share one torch.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ARMS = ["off", "lance", "parquet-random", "parquet-seq", "mosaic"]
LABELS = {"off": "Lance corpus, packed on the fly", "lance": "Lance blocks table",
          "parquet-random": "pre-packed Parquet, random take",
          "parquet-seq": "pre-shuffled Parquet, sequential", "mosaic": "MosaicML MDS"}

CHILD = """
import json, resource, sys, time
arm, data_dir, packed, blocks, batch, seq_len = sys.argv[1:7]
blocks, batch, seq_len = int(blocks), int(batch), int(seq_len)
t0 = time.perf_counter()
if arm == "off":
    from lance_assets.train import data
    snap = data.open_snapshot(data_dir + "/lance", "corpus")
    f = data.train_filter("NOT is_dup", 20)
    n = data.count_blocks(snap, f, seq_len + 1, 8)
    ds = data.train_dataset(snap, filter=f, block_len=seq_len + 1, blocks_per_epoch=n, num_splits=8,
                            rank=0, world_size=1, seed=1337, epoch=0)
    it = (b["input_ids"] for b in data.train_loader(ds, batch))
else:
    from lance_assets.train.blocks import iter_blocks
    it = iter_blocks(arm, packed, batch=batch, seed=1337)
first = None
seen = 0
for b in it:
    if first is None:
        first = time.perf_counter() - t0
        t1 = time.perf_counter()
    seen += b.shape[0]
    if seen >= blocks:
        break
wall = time.perf_counter() - t1
print(json.dumps({"tokens_per_s": (seen - batch) * (seq_len + 1) / wall, "first_batch_s": first,
                  "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def run_json(cmd: list[str], env: dict) -> dict:
    out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=6000)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--steps", type=int, default=150, help="tiny training steps per arm")
    p.add_argument("--loader-blocks", type=int, default=4000, help="blocks pulled, loader alone")
    p.add_argument("--arms", nargs="+", default=ARMS, choices=ARMS)
    args = p.parse_args(argv)
    env = {**os.environ, "LANCE_LOG": "error"}
    from lance_assets.bench.build_packed_datasets import MDS_PYTHON, build
    from lance_assets.bench.train_loader import build_table

    # Every arm runs in the MDS environment when it exists, so all arms share one torch.
    python = str(MDS_PYTHON) if MDS_PYTHON.exists() else sys.executable
    arms = args.arms
    if not MDS_PYTHON.exists():
        arms = [a for a in args.arms if a != "mosaic"]
        print("# MDS arm left out: build .venv-mds first (scripts/mds_venv.sh, or make bench-loaders)")

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "data"
        t0 = time.perf_counter()
        build_table(root, args.rows)
        manifest = build(str(root), Path(tmp) / "packed", seq_len=args.seq_len,
                         mds="mosaic" in arms)
        torch_version = subprocess.run([python, "-c", "import torch; print(torch.__version__)"],
                                       capture_output=True, text=True, check=True).stdout.strip()
        print(f"# {platform.machine()}, {os.cpu_count()} cores, arms on torch {torch_version}, "
              f"{manifest['n_blocks']} blocks of {manifest['block_len']} tokens "
              f"(table + copies built in {time.perf_counter() - t0:.0f}s)")
        rows = {}
        for arm in arms:
            loader = run_json([python, "-c", CHILD, arm, str(root), str(Path(tmp) / "packed"),
                               str(args.loader_blocks), str(args.batch_size), str(args.seq_len)], env)
            out = Path(tmp) / f"train-{arm}"
            cmd = [python, "-m", "lance_assets.train", "--data", str(root), "--out", str(out),
                   "--steps", str(args.steps), "--seq-len", str(args.seq_len),
                   "--batch-size", str(args.batch_size), "--eval-every", "1000000",
                   "--ckpt-every", "1000000", "--log-every", "1000000", "--blocks-mode", arm]
            if arm != "off":
                cmd += ["--blocks-path", str(Path(tmp) / "packed")]
            subprocess.run(cmd, env=env, check=True, capture_output=True)
            summary = json.loads((out / "summary.json").read_text())
            rows[arm] = {**loader, "train_tok_s": summary["tokens_per_s"],
                         "wait": summary["data_wait_share"]}
            print(f"# {arm}: done", flush=True)
        ref = rows["off"]
        sizes = manifest["bytes_on_disk"]
        key = {"lance": "lance", "parquet-random": "parquet", "parquet-seq": "parquet_shuffled",
               "mosaic": "mds"}
        print("\n| arm | loader alone tok/s | vs on-the-fly | first batch s | peak RSS MB | "
              "tiny training tok/s | vs on-the-fly | data-wait share | extra copy on disk |")
        print("|---|---|---|---|---|---|---|---|---|")
        for arm, r in rows.items():
            extra = "none" if arm == "off" else f"{sizes[key[arm]] / 1e6:.1f} MB"
            print(f"| {LABELS[arm]} | {r['tokens_per_s']:,.0f} | {r['tokens_per_s'] / ref['tokens_per_s']:.2f} | "
                  f"{r['first_batch_s']:.2f} | {r['rss_mb']:,.0f} | {r['train_tok_s']:,.0f} | "
                  f"{r['train_tok_s'] / ref['train_tok_s']:.2f} | {r['wait']:.1%} | {extra} |")
        best = max(r["train_tok_s"] for a, r in rows.items() if a != "off")
        print(f"\non-the-fly / best pre-packed training tokens/s: {ref['train_tok_s'] / best:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
