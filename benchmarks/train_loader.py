"""Is the Lance loader ever the bottleneck? Training tokens/s fed by the loader vs in-memory tensors.

    python -m benchmarks.train_loader [--models tiny small] [--steps 60]

For each model, the same blocks are trained on twice in one process: once pulled from
``StreamingDataset`` (packing and shuffling on the fly, as in training) and once from a tensor
already in memory. Prints tokens/s of both arms, their ratio, and the share of step time the
loader arm spent waiting for data.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.build_packed_datasets import train_filter
from lance_assets.curation import dedup_flag
from lance_assets.ingest.raw_text import ingest
from lance_assets.table import Table
from lance_assets.table.producer import produce
from lance_assets.tokens import token_ids
from lance_assets.train import data
from lance_assets.train.model import GPT, config_for

SHAPES = {"tiny": (128, 16), "small": (64, 4)}  # model -> (seq_len, batch) that fit 2 CPU cores


def build_table(root: Path, rows: int) -> None:
    quiet = lambda _m: None  # noqa: E731
    ingest(root, f"synthetic:{rows}", log=quiet)
    produce(dedup_flag.PRODUCER, Table.of(root), log=quiet)
    produce(token_ids.PRODUCER, Table.of(root), token_ids.TokenIdsSettings(tokenizer="byte"), log=quiet)


def train_steps(model, opt, next_blocks, steps: int, pad_id: int) -> tuple[float, float, int]:
    """(seconds, seconds waiting for data, tokens) for ``steps`` optimizer steps."""
    wait = 0.0
    tokens = 0
    start = time.perf_counter()
    for _ in range(steps):
        t0 = time.perf_counter()
        blocks = next_blocks()
        wait += time.perf_counter() - t0
        x, y = data.inputs_and_targets(blocks, pad_id)
        _, loss = model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        tokens += int((y != -1).sum())
    return time.perf_counter() - start, wait, tokens


def bench_model(snap, name: str, steps: int, warmup: int, loader_kw: dict, rounds: int) -> dict:
    """Both arms built side by side, then timed in alternating rounds (median of each arm), so
    a noisy neighbour on the machine hits both arms alike."""
    seq_len, batch = SHAPES[name]
    block_len = seq_len + 1
    tfilter = train_filter(snap)
    bpe = data.count_blocks(snap, tfilter, block_len, 8)
    pad = snap.tokenizer["pad_id"]
    arms = {}
    for arm in ("lance", "memory"):
        torch.manual_seed(0)
        model = GPT(config_for(name, snap.tokenizer["vocab_size"], seq_len))
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        ds = data.train_dataset(snap, filter=tfilter, block_len=block_len, blocks_per_epoch=bpe,
                                num_splits=8, rank=0, world_size=1, seed=0, epoch=0, **loader_kw)
        it = iter(data.train_loader(ds, batch))
        if arm == "lance":
            next_blocks = lambda it=it: next(it)["input_ids"]  # noqa: E731
        else:
            held = iter([next(it)["input_ids"] for _ in range(warmup + steps * rounds)])
            next_blocks = lambda held=held: next(held)  # noqa: E731
        train_steps(model, opt, next_blocks, warmup, pad)
        arms[arm] = (model, opt, next_blocks, [], [])
    for r in range(rounds):
        for arm in (("lance", "memory") if r % 2 == 0 else ("memory", "lance")):
            model, opt, next_blocks, rates, waits = arms[arm]
            secs, wait, tokens = train_steps(model, opt, next_blocks, steps, pad)
            rates.append(tokens / secs)
            waits.append(wait / secs)
    lance_rate = statistics.median(arms["lance"][3])
    memory_rate = statistics.median(arms["memory"][3])
    return {
        "model": name, "seq_len": seq_len, "batch": batch, "steps": steps * rounds,
        "lance_tok_s": lance_rate, "memory_tok_s": memory_rate, "ratio": lance_rate / memory_rate,
        "data_wait_share": statistics.median(arms["lance"][4]),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="+", default=["tiny", "small"], choices=list(SHAPES))
    p.add_argument("--steps", type=int, default=20, help="timed steps per round for tiny (small: a fifth)")
    p.add_argument("--rounds", type=int, default=5, help="alternating rounds per arm (median)")
    p.add_argument("--rows", type=int, default=4000)
    p.add_argument("--io-queue-depth", type=int, default=4)
    p.add_argument("--transform-parallelism", type=int, default=None)
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "data"
        build_table(root, args.rows)
        table = Table.of(root)
        snap = data.open_snapshot(table.db_dir, table.name)
        print(f"# {platform.processor() or platform.machine()}, {torch.get_num_threads()} torch threads, "
              f"torch {torch.__version__}, io_queue_depth {args.io_queue_depth}, "
              f"transform_parallelism {args.transform_parallelism or 'default (cpu count)'}")
        print("| model | seq x batch | timed steps | Lance loader tok/s | in-memory tok/s | ratio "
              "| data-wait share |")
        print("|---|---|---|---|---|---|---|")
        for name in args.models:
            steps = args.steps if name == "tiny" else max(2, args.steps // 5)
            loader_kw = {"io_queue_depth": args.io_queue_depth,
                         "transform_parallelism": args.transform_parallelism}
            r = bench_model(snap, name, steps, warmup=max(2, steps // 10), loader_kw=loader_kw,
                            rounds=args.rounds)
            print(f"| {r['model']} | {r['seq_len']} x {r['batch']} | {r['steps']} | "
                  f"{r['lance_tok_s']:,.0f} | {r['memory_tok_s']:,.0f} | {r['ratio']:.3f} | "
                  f"{r['data_wait_share']:.2%} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
