"""Training tokens/s of one node against two nodes of one process each (the local launcher).

    python -m benchmarks.multinode [--model tiny] [--steps 100] [--rows 3000]

Builds a synthetic, deduplicated, byte-tokenized table in a temp dir, then trains the same
model twice with the commands ``pretrained_model`` runs for ``launcher: local``: 1 node x 1
process (``torchrun --standalone``), then 2 nodes x 1 process (two torchrun agents on this
machine joined by a c10d rendezvous on 127.0.0.1). Each rank keeps the per-rank batch, so the
2-node run's global batch is twice as large. Prints each run's tokens/s (from its
summary.json: every rank's tokens over the training loop's wall time), and the ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import tempfile
from pathlib import Path

from lance_assets.curation import dedup_flag
from lance_assets.ingest.raw_text import ingest
from lance_assets.launch.torchrun import local_agent_commands, local_agent_threads
from lance_assets.table import Table
from lance_assets.table.producer import produce
from lance_assets.tokens import token_ids


def quiet(_msg: str) -> None:
    pass


def build_table(root: Path, rows: int) -> None:
    ingest(Table.of(root), f"synthetic:{rows}", log=quiet)
    produce(dedup_flag.PRODUCER, Table.of(root), log=quiet)
    produce(token_ids.PRODUCER, Table.of(root), token_ids.TokenIdsSettings(tokenizer="byte"), log=quiet)


def train(root: Path, out: Path, nnodes: int, args: argparse.Namespace) -> dict:
    argv = ["--data", str(root), "--out", str(out), "--model", args.model,
                    "--steps", str(args.steps), "--eval-every", "100000", "--ckpt-every",
                    "100000", "--log-every", "100000", "--filter", "NOT is_dup"]
    env = {**os.environ, **local_agent_threads(nnodes, 1, os.cpu_count())}
    procs = [subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
             for cmd in local_agent_commands(argv, nnodes=nnodes, nproc_per_node=1,
                                             rdzv_id=f"bench-{nnodes}")]
    for proc in procs:
        _, err = proc.communicate()
        if proc.returncode:
            raise SystemExit(err.decode()[-3000:])
    return json.loads((out / "summary.json").read_text())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="tiny")
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--rows", type=int, default=3000)
    args = p.parse_args()
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
          f"load average {os.getloadavg()[0]:.1f}")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "data"
        build_table(root, args.rows)
        runs = {}
        for nnodes in (1, 2):
            s = train(root, Path(tmp) / f"run{nnodes}", nnodes, args)
            runs[nnodes] = s
            print(f"{nnodes} node(s) x 1 process: {s['tokens_per_s']:,.0f} tokens/s "
                  f"(world {s['world_size']}, global batch {s['global_batch']}, "
                  f"{s['steps_requested']} steps in {s['train_seconds']} s)")
        print(f"2 nodes / 1 node: {runs[2]['tokens_per_s'] / runs[1]['tokens_per_s']:.2f}x")


if __name__ == "__main__":
    main()
