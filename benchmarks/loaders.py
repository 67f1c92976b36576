"""Loader A/B: on-the-fly Lance packing against pre-packed Parquet, pre-shuffled Parquet,
MosaicML MDS and a Lance blocks table, all on the same blocks, in one process tree.

    make bench-loaders          # = scripts/mds_venv.sh, then this module
    python -m benchmarks.loaders [--rows 6000] [--steps 150] [--loader-blocks 4000]

Builds a fresh table (synthetic corpus, byte tokens), makes the pre-packed copies of epoch 0
(``build_packed_datasets``), then for every arm, each in its own subprocess: the loader alone
(tokens/s, first-batch latency, peak RSS) and `tiny` training for a fixed number of steps through
the trainer's step function (``benchmarks.train_arm``: tokens/s, data-wait share). Ratios are
against the Lance on-the-fly arm. The MDS arm needs ``.venv-mds`` (mosaicml-streaming pins
numpy<2.2); when it exists every arm's subprocess runs there, so all arms share one torch.
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

ROOT = Path(__file__).resolve().parents[1]
ARMS = ["off", "lance", "parquet-random", "parquet-seq", "mosaic"]
LABELS = {"off": "Lance corpus, packed on the fly", "lance": "Lance blocks table",
          "parquet-random": "pre-packed Parquet, random take",
          "parquet-seq": "pre-shuffled Parquet, sequential", "mosaic": "MosaicML MDS"}

CHILD = """
import json, resource, sys, time
from benchmarks.train_arm import arm_batches
arm, data_dir, packed, blocks, batch, seq_len = sys.argv[1:7]
blocks, batch, seq_len = int(blocks), int(batch), int(seq_len)
t0 = time.perf_counter()
first = None
seen = 0
for b in arm_batches(arm, data_dir, packed, batch, seq_len):
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
    """The last stdout line of ``cmd`` (run from the repository, where ``benchmarks`` imports)."""
    out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True, cwd=ROOT)
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
    from benchmarks.build_packed_datasets import MDS_PYTHON, build
    from benchmarks.train_loader import build_table

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
            trained = run_json([python, "-m", "benchmarks.train_arm", arm, str(root),
                                str(Path(tmp) / "packed"), str(args.steps), str(args.batch_size),
                                str(args.seq_len)], env)
            rows[arm] = {**loader, "train_tok_s": trained["tokens_per_s"],
                         "wait": trained["data_wait_share"]}
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
            ratio = r['tokens_per_s'] / ref['tokens_per_s']
            print(f"| {LABELS[arm]} | {r['tokens_per_s']:,.0f} | {ratio:.2f} | "
                  f"{r['first_batch_s']:.2f} | {r['rss_mb']:,.0f} | {r['train_tok_s']:,.0f} | "
                  f"{r['train_tok_s'] / ref['train_tok_s']:.2f} | {r['wait']:.1%} | {extra} |")
        best = max(r["train_tok_s"] for a, r in rows.items() if a != "off")
        print(f"\non-the-fly / best pre-packed training tokens/s: {ref['train_tok_s'] / best:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
