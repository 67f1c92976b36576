"""Is the Lance loader ever the bottleneck, and what are its worker processes worth?

    python -m benchmarks.train_loader [--models tiny small] [--steps 60]
    python -m benchmarks.train_loader --workers 0 1 2 4 [--seq-lens 1024 2048] [--corpora real synthetic-web]

Models (the first form): the same blocks are trained on twice in one process, once pulled from
``StreamingDataset`` (packing and shuffling on the fly, as in training) and once from a tensor
already in memory; prints tokens/s of both arms, their ratio and the loader arm's data-wait share.

Workers (``--workers``): one rank's loader as the trainer builds it (``data.train_loader``: the
run's stored permutation, ``--num-workers N``) on real long documents (the Python sources and docs
on this machine) and on FineWeb-shaped synthetic text, at each sequence length. Per worker count:
the loader alone (steady-state tokens/s after the first batch, tokens per CPU-second of the rank
and its workers together, the training thread's CPU share, first-batch latency; a step of 64
blocks read at a time, as the trainer does for batch 32 x accum 2), with the
library's thread defaults and with the reference recipe's (read batch 8, one read in flight, two
transform threads); then `tiny` trained from it against the same blocks from memory (the
in-memory control). Arms alternate in rounds and each reports its median.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import psutil
import torch

from benchmarks.build_packed_datasets import train_filter
from lance_assets.curation import dedup_flag
from lance_assets.ingest.raw_text import ingest
from lance_assets.progress import progress
from lance_assets.table import Table
from lance_assets.table.producer import produce
from lance_assets.tokens import token_ids
from lance_assets.train import data
from lance_assets.train.model import GPT, config_for

SHAPES = {"tiny": (128, 16), "small": (64, 4)}  # model -> (seq_len, batch) that fit 2 CPU cores


def build_table(root: Path, rows: int) -> None:
    quiet = lambda _m: None  # noqa: E731
    ingest(Table.of(root), f"synthetic:{rows}", log=quiet)
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


SPLITS = 16  # one rank of the reference's 8-GPU line: --num-splits 128 over 8 ranks
THREADS = {"default": {"read_batch_size": 64, "io_queue_depth": 4, "transform_parallelism": None},
           "reference": {"read_batch_size": 8, "io_queue_depth": 1, "transform_parallelism": 2}}


def build_corpus(root: Path, corpus: str, rows: int, real_bytes: int) -> None:
    quiet = lambda _m: None  # noqa: E731
    if corpus == "real":
        from benchmarks.tokenize_bench import build_corpus as local_texts

        source, _, _ = local_texts(root.parent / "real.parquet", real_bytes)
        ingest(Table.of(root), str(source), log=quiet)
    else:
        ingest(Table.of(root), f"synthetic-web:{rows}", log=quiet)
    produce(dedup_flag.PRODUCER, Table.of(root), log=quiet)
    produce(token_ids.PRODUCER, Table.of(root), token_ids.TokenIdsSettings(tokenizer="byte"), log=quiet)


def tree_cpu() -> float:
    """CPU seconds (user + system) of this process and every process under it now."""
    me = psutil.Process()
    total = sum(me.cpu_times()[:2])
    for child in me.children(recursive=True):
        try:
            total += sum(child.cpu_times()[:2])
        except psutil.NoSuchProcess:
            pass
    return total


STEP_BLOCKS = 64  # one rank's step of the reference's 8-GPU line: batch 32 x accum 2


def rank_loader(snap, seq_len: int, workers: int, threads: str, batch: int, permutations: Path,
                step_blocks: int = STEP_BLOCKS):
    """One rank's loader as the trainer opens it: a step's cycles read at a time."""
    block_len = seq_len + 1
    tfilter = train_filter(snap)
    ds = data.train_dataset(snap, filter=tfilter, block_len=block_len,
                            blocks_per_epoch=data.count_blocks(snap, tfilter, block_len, SPLITS),
                            num_splits=SPLITS, rank=0, world_size=1, seed=0, epoch=0,
                            permutations=permutations, **THREADS[threads])
    return data.train_loader(ds, batch, workers, splits_per_rank=SPLITS,
                             cycles=step_blocks // SPLITS)


def close(loader) -> None:
    if hasattr(loader, "close"):
        loader.close()


def loader_alone(snap, seq_len, workers, threads, blocks, permutations, step_blocks) -> dict:
    """The loader with no model: ``blocks`` blocks in batches of SPLITS. Rates are the steady
    state, after the first batch (whose latency includes starting the workers)."""
    wall0 = time.perf_counter()
    it = iter(rank_loader(snap, seq_len, workers, threads, SPLITS, permutations, step_blocks))
    next(it)
    first = time.perf_counter() - wall0
    cpu0, wall0, thread0 = tree_cpu(), time.perf_counter(), time.thread_time()
    tokens = 0
    while tokens < blocks * (seq_len + 1):
        tokens += next(it)["input_ids"].numel()
    wall, cpu = time.perf_counter() - wall0, tree_cpu() - cpu0  # workers still alive: counted
    thread = time.thread_time() - thread0
    close(it)
    return {"tok_s": tokens / wall, "tok_cpu_s": tokens / cpu, "thread_share": thread / wall,
            "first_s": first}


def training(snap, seq_len, workers, steps, batch, permutations, step_blocks) -> tuple[float, float]:
    """``tiny`` trained ``steps`` steps from the loader (reference threads): tokens/s, data-wait
    share."""
    torch.manual_seed(0)
    model = GPT(config_for("tiny", snap.tokenizer["vocab_size"], seq_len))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    it = iter(rank_loader(snap, seq_len, workers, "reference", batch, permutations, step_blocks))
    train_steps(model, opt, lambda: next(it)["input_ids"], 1, snap.tokenizer["pad_id"])  # warm
    secs, wait, tokens = train_steps(model, opt, lambda: next(it)["input_ids"], steps,
                                     snap.tokenizer["pad_id"])
    close(it)
    return tokens / secs, wait / secs


def in_memory(snap, seq_len, steps, batch, permutations) -> float:
    """The control: ``tiny`` on the same blocks, already in memory."""
    torch.manual_seed(0)
    model = GPT(config_for("tiny", snap.tokenizer["vocab_size"], seq_len))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    it = iter(rank_loader(snap, seq_len, 0, "reference", batch, permutations))
    held = iter([next(it)["input_ids"] for _ in range(steps + 1)])
    train_steps(model, opt, lambda: next(held), 1, snap.tokenizer["pad_id"])
    secs, _, tokens = train_steps(model, opt, lambda: next(held), steps, snap.tokenizer["pad_id"])
    return tokens / secs


def sweep_workers(args) -> None:
    print(f"# {platform.processor() or platform.machine()}, {psutil.cpu_count()} CPUs, load "
          f"average {psutil.getloadavg()[0]:.1f} at the start, torch {torch.__version__} "
          f"({torch.get_num_threads()} threads), one rank of {SPLITS} splits, {args.rounds} "
          "rounds (medians)")
    print("| corpus | seq | workers | threads | blocks per read | loader tok/s | tok per CPU-s | "
          "training thread CPU share | first batch s | tiny tok/s from it | in-memory tok/s | "
          "ratio | data-wait |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|", flush=True)
    arms = (len(args.workers) * len(args.threads) * len(args.step_blocks) + len(args.workers) + 1)
    total = len(args.corpora) * len(args.seq_lens) * args.rounds * arms
    log = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731 - stdout is the table
    with tempfile.TemporaryDirectory() as tmp, progress(total, "train_loader --workers",
                                                        unit="arm", log=log) as bar:
        for corpus in args.corpora:
            root = Path(tmp) / corpus / "data"
            build_corpus(root, corpus, args.rows, args.real_mb * 1_000_000)
            table = Table.of(root)
            snap = data.open_snapshot(table)
            perms = Path(tmp) / corpus / "permutations"
            for seq_len in args.seq_lens:
                blocks = args.tokens // (seq_len + 1)
                # store the permutation, and start the forkserver, before anything is timed
                close(iter(rank_loader(snap, seq_len, int(any(args.workers)), "reference", SPLITS,
                                       perms)))
                alone = {(w, t, b): [] for w in args.workers for t in args.threads
                         for b in args.step_blocks}
                trained = {w: [] for w in args.workers}
                control = []
                for r in range(args.rounds):
                    order = list(alone) if r % 2 == 0 else list(reversed(alone))
                    for w, t, b in order:
                        alone[w, t, b].append(loader_alone(snap, seq_len, w, t, blocks, perms, b))
                        bar.update(1)
                    for w in (args.workers if r % 2 == 0 else args.workers[::-1]):
                        trained[w].append(training(snap, seq_len, w, args.steps, args.batch, perms,
                                                   args.step_blocks[0]))
                        bar.update(1)
                    control.append(in_memory(snap, seq_len, args.steps, args.batch, perms))
                    bar.update(1)
                ctl = statistics.median(control)
                for (w, t, b), runs in alone.items():
                    med = {k: statistics.median(x[k] for x in runs) for k in runs[0]}
                    line = (f"| {corpus} | {seq_len} | {w} | {t} | {b} | {med['tok_s']:,.0f} | "
                            f"{med['tok_cpu_s']:,.0f} | {med['thread_share']:.0%} | "
                            f"{med['first_s']:.2f} |")
                    if t == "reference" and b == args.step_blocks[0]:
                        rate = statistics.median(x[0] for x in trained[w])
                        wait = statistics.median(x[1] for x in trained[w])
                        line += f" {rate:,.0f} | {ctl:,.0f} | {rate / ctl:.3f} | {wait:.1%} |"
                    else:
                        line += " | | | |"
                    print(line, flush=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="+", default=["tiny", "small"], choices=list(SHAPES))
    p.add_argument("--steps", type=int, default=20, help="timed steps per round for tiny (small: "
                   "a fifth); with --workers, tiny's timed steps per arm and round")
    p.add_argument("--rounds", type=int, default=5, help="alternating rounds per arm (median)")
    p.add_argument("--rows", type=int, default=4000, help="documents of the synthetic corpus")
    p.add_argument("--io-queue-depth", type=int, default=4)
    p.add_argument("--transform-parallelism", type=int, default=None)
    p.add_argument("--workers", nargs="+", type=int, default=None,
                   help="sweep the loader's worker processes instead of comparing models")
    p.add_argument("--seq-lens", nargs="+", type=int, default=[1024, 2048])
    p.add_argument("--corpora", nargs="+", default=["real", "synthetic-web"],
                   choices=["real", "synthetic-web"])
    p.add_argument("--threads", nargs="+", default=list(THREADS), choices=list(THREADS))
    p.add_argument("--tokens", type=int, default=1_600_000, help="tokens per loader-alone arm")
    p.add_argument("--batch", type=int, default=SPLITS, help="blocks per training step")
    p.add_argument("--step-blocks", nargs="+", type=int, default=[STEP_BLOCKS],
                   help="blocks read at a time (a step's; multiples of the 16 splits)")
    p.add_argument("--real-mb", type=int, default=12, help="MB of local text for the real corpus")
    args = p.parse_args(argv)
    if args.workers is not None:
        sweep_workers(args)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "data"
        build_table(root, args.rows)
        table = Table.of(root)
        snap = data.open_snapshot(table)
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
