"""nanogpt against modern at equal tokens, on real text: validation bits-per-byte and tokens/s.

    python -m benchmarks.arch_ab [--mb 12] [--seeds 1 2 3] [--presets tiny:600 mini:200]

Builds the corpus the tokenizer benchmark uses (``benchmarks.tokenize_bench.build_corpus``: the
Python sources and docs installed on this machine, real text, offline), ingests it, flags
duplicates, trains the project's BPE on it (``--vocab`` ids) and tokenizes it. Then, for every
preset (``NAME:STEPS``, global batch ``--batch-size`` x ``--seq-len`` tokens a step) and seed,
trains both arms with ``python -m lance_assets.train`` on the same blocks in the same order
(one loader seed), alternating which arm goes first so a noisy neighbour on the machine hits
both alike, and reads each run's ``summary.json``. Prints a Markdown table and the ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.tokenize_bench import build_corpus
from lance_assets.curation import dedup_flag
from lance_assets.ingest.raw_text import ingest
from lance_assets.table import Table
from lance_assets.table.producer import produce
from lance_assets.tokens import bpe, token_ids

ARCHS = ("nanogpt", "modern")


def prepare(work: Path, mb: float, vocab: int) -> Path:
    root = work / "data"
    if Table.of(root).exists():
        return root
    quiet = lambda _m: None  # noqa: E731
    source, docs, nbytes = build_corpus(work / "corpus" / "local_text.parquet", int(mb * 1e6))
    print(f"# corpus: {docs:,} local text files, {nbytes / 1e6:.1f} MB")
    ingest(Table.of(root), str(source), log=quiet)
    produce(dedup_flag.PRODUCER, Table.of(root), log=quiet)
    bpe.train_bpe(Table.of(root), vocab_size=vocab, max_train_bytes=int(mb * 1e6), log=quiet)
    produce(token_ids.PRODUCER, Table.of(root), log=quiet)
    return root


def run(root: Path, out: Path, arch: str, preset: str, steps: int, seed: int, args) -> dict:
    cmd = [sys.executable, "-m", "lance_assets.train", "--data", str(root), "--out", str(out),
           "--arch", arch, "--model", preset, "--steps", str(steps), "--seed", str(seed),
           "--seq-len", str(args.seq_len), "--batch-size", str(args.batch_size),
           "--warmup", str(max(1, steps // 10)), "--eval-every", str(steps),
           "--eval-blocks", str(args.eval_blocks), "--ckpt-every", str(steps),
           "--log-every", str(steps), "--filter", "NOT is_dup"]
    subprocess.run(cmd, check=True, capture_output=True, env={**os.environ, "LANCE_LOG": "error"})
    return json.loads((out / "summary.json").read_text())


def train_curve(run_dir: Path) -> list[tuple[float, float]]:
    """(seconds of training so far, loss) per step, from the run's metrics.jsonl."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "loss" in r]
    curve, clock, tokens = [], 0.0, 0
    for r in rows:
        clock += (r["tokens"] - tokens) / r["tokens_per_s"]
        tokens = r["tokens"]
        curve.append((clock, r["loss"]))
    return curve


def loss_at(curve: list[tuple[float, float]], seconds: float, window: int = 25) -> float:
    """Mean train loss of the ``window`` steps ending at ``seconds`` of training."""
    upto = [loss for clock, loss in curve if clock <= seconds] or [curve[0][1]]
    return statistics.mean(upto[-window:])


def report(work: Path, presets: list[str], seeds: list[int]) -> None:
    print("\n| preset | arch | params (M) | tokens | seeds | val bpb, mean ± sd | tokens/s, median "
          "| train loss at nanogpt's wall-clock, mean |")
    print("|---|---|---|---|---|---|---|---|")
    for preset in presets:
        runs = {arch: [json.loads((work / f"{preset}-{arch}-{seed}" / "summary.json").read_text())
                       for seed in seeds] for arch in ARCHS}
        budget = {seed: train_curve(work / f"{preset}-nanogpt-{seed}")[-1][0] for seed in seeds}
        for arch in ARCHS:
            bpb = [r["val_bpb"] for r in runs[arch]]
            sd = statistics.stdev(bpb) if len(bpb) > 1 else 0.0
            at_clock = statistics.mean(loss_at(train_curve(work / f"{preset}-{arch}-{seed}"),
                                               budget[seed]) for seed in seeds)
            print(f"| {preset} | {arch} | {runs[arch][0]['params_m']} | "
                  f"{runs[arch][0]['tokens_seen']:,} | {len(bpb)} | {statistics.mean(bpb):.4f} ± "
                  f"{sd:.4f} | {statistics.median(r['tokens_per_s'] for r in runs[arch]):,.0f} | "
                  f"{at_clock:.3f} |")
    for preset in presets:
        summaries = {arch: [json.loads((work / f"{preset}-{arch}-{seed}" / "summary.json")
                                       .read_text()) for seed in seeds] for arch in ARCHS}
        bpb = [statistics.mean(r["val_bpb"] for r in summaries[arch]) for arch in ARCHS]
        speed = [statistics.median(r["tokens_per_s"] for r in summaries[arch]) for arch in ARCHS]
        print(f"{preset}: modern / nanogpt val bpb at equal tokens {bpb[1] / bpb[0]:.3f}, "
              f"tokens/s {speed[1] / speed[0]:.2f}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mb", type=float, default=12, help="real text to build the corpus from (MB)")
    p.add_argument("--vocab", type=int, default=4096, help="BPE ids")
    p.add_argument("--presets", nargs="+", default=["tiny:600", "mini:200"],
                   help="model presets and their optimizer steps, NAME:STEPS")
    p.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3])
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--eval-blocks", type=int, default=128)
    p.add_argument("--work", default=None, help="working folder (default: a temp dir)")
    p.add_argument("--report-only", action="store_true",
                   help="print the table from the runs already in --work")
    args = p.parse_args(argv)
    work = Path(args.work or tempfile.mkdtemp(prefix="arch_ab_"))
    t0 = time.perf_counter()
    root = prepare(work, args.mb, args.vocab)
    print(f"# {platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads; data ready in {time.perf_counter() - t0:.0f}s; "
          f"work {work}")
    for spec in args.presets if not args.report_only else []:
        preset, steps = spec.split(":")
        for i, seed in enumerate(args.seeds):
            for arch in ARCHS if i % 2 == 0 else ARCHS[::-1]:
                s = run(root, work / f"{preset}-{arch}-{seed}", arch, preset, int(steps), seed, args)
                print(f"# {preset} {arch} seed {seed}: val bpb {s['val_bpb']}, "
                      f"{s['tokens_per_s']:,.0f} tok/s, {s['tokens_seen']:,} tokens", flush=True)
    report(work, [spec.split(":")[0] for spec in args.presets], args.seeds)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
