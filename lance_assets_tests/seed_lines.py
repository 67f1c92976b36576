"""The reference recipes' command lines as the suite runs them: the equivalents docs/seeds.md
lists, scaled down only in sizes. ``test_seeds.py`` checks the page against these lines (the
same program and flags, values differing only for SIZES) and runs most of them;
``test_resume.py`` runs the 8-GPU line and its half-world resume on 2 CPU ranks."""

from __future__ import annotations

SIZES = {"--rows", "--steps", "--epochs", "--seq-len", "--seq-lens", "--model",
         "--nproc-per-node", "--eval-blocks", "--eval-every", "--ckpt-every", "--log-every",
         "--warmup", "--lr-total-steps", "--lr", "--min-lr", "--batch-size", "--val-mod",
         "--tokens", "--rounds"}
"""Flags whose values the suite scales down (rows, steps, sequence length, model preset, and what
follows from them: the schedule, the evaluation, the batch of a smaller world); the suite may
also add them."""

SPEED_ONLY = {"--read-batch-size", "--io-queue-depth", "--transform-parallelism",
              "--transform-queue-depth"}
"""Loader flags that change how fast blocks come, never which or in what order: the suite may add
them to a line that leaves them at their defaults."""

CPU_ONLY_LEFT_OUT = {"--compile"}
"""Flags the suite leaves out on CPU: compiling costs minutes on 2 cores
(``scripts/gpu_check.sh`` runs ``--compile`` on a GPU)."""

RUN_FOLDER = {"--data", "--out"}
"""Flags that name folders: the page shows the defaults' places, the suite its temporary ones."""

# 1. LLM pretraining on one table: the laptop smoke test (ingest, curate, byte tokens, train)
SMOKE_SOURCE = "synthetic:2000"  # the reference: 5,000 rows
SMOKE_MATERIALIZE = ["dagster", "asset", "materialize", "-m", "lance_assets.definitions",
                     "--select", "raw_text,dedup_flag,near_dup,quality_signals,text_index,"
                                 "corpus_profile,token_ids",
                     "--config-json", '{"ops": {"token_ids": {"config": {"tokenizer": "byte"}}}}']
SMOKE_TRAIN = ["python", "-m", "lance_assets.train", "--model", "tiny", "--pack", "--seq-len",
               "64", "--steps", "20"]

# the single-GPU line and the two ablation lines of the reference's README
_SMALL = ["--seq-len", "32", "--eval-every", "1000", "--eval-blocks", "4"]
SINGLE_GPU = ["python", "-m", "lance_assets.train", "--model", "tiny", "--batch-size", "8",
              "--epochs", "0.001", *_SMALL]
MIN_SCORE_3 = ["python", "-m", "lance_assets.train", "--filter", "NOT is_dup AND score >= 3",
               "--batch-size", "8", "--steps", "2", *_SMALL]
MIN_SCORE_0 = ["python", "-m", "lance_assets.train", "--filter", "NOT is_dup AND score >= 0",
               "--batch-size", "8", "--steps", "2", *_SMALL]

# runs/train_small.sh, the 8-GPU line, on 2 CPU ranks; runs/resume_demo.sh's half-world resume
def _torchrun(nproc: int) -> list[str]:
    return ["torchrun", "--standalone", "--nproc-per-node", str(nproc), "-m", "lance_assets.train"]


_LOADER = ["--pack", "--seq-len", "16", "--epochs", "1", "--steps", "10", "--lr", "5e-3",
           "--warmup", "3", "--lr-total-steps", "10", "--num-splits", "128",
           "--read-batch-size", "8", "--io-queue-depth", "1", "--transform-parallelism", "2",
           "--transform-queue-depth", "16", "--num-workers", "2", "--ckpt-every", "3",
           "--eval-every", "1500", "--eval-blocks", "8", "--log-every", "50"]
EIGHT_GPU_LINE = _torchrun(2) + ["--model", "tiny", "--batch-size", "32", "--grad-accum", "2",
                                 *_LOADER]
HALF_WORLD_LINE = _torchrun(1) + ["--model", "tiny", "--batch-size", "64", "--grad-accum", "2",
                                  *_LOADER, "--resume", "auto"]

# the loader-only probe of runs/bench_small.sh, on this project's loader benchmark
BENCH_LOADER = ["python", "-m", "benchmarks.train_loader", "--workers", "0", "--seq-lens", "64",
                "--threads", "reference", "--corpora", "synthetic-web", "--rows", "300",
                "--tokens", "20000", "--steps", "1", "--rounds", "1"]

# 2. The long-run recipe: BPE tokens, bf16, accumulation, cosine with warm-up, the validation
# split, a checkpoint every N steps, Ctrl-C flushes one, --resume auto continues
LONG_RUN = ["python", "-m", "lance_assets.train", "--model", "tiny", "--dtype", "bfloat16",
            "--pack", "--seq-len", "32", "--batch-size", "8", "--grad-accum", "2", "--epochs", "1",
            "--steps", "12", "--lr", "5e-3", "--min-lr", "3e-4", "--warmup", "3",
            "--lr-total-steps", "12", "--num-splits", "8", "--num-workers", "2", "--val-mod", "20",
            "--eval-every", "6", "--eval-blocks", "8", "--ckpt-every", "2"]


def split(argv: list[str]) -> tuple[list[str], list[str], list[str]]:
    """(program, the launcher's own arguments, the program's arguments): ``torchrun --standalone
    --nproc-per-node 2 -m lance_assets.train --steps 3`` -> (``torchrun -m lance_assets.train``,
    ``--standalone --nproc-per-node 2``, ``--steps 3``); ``dagster asset materialize ...`` and
    ``python -m module ...`` have no launcher arguments."""
    if argv[0] == "dagster":
        return argv[:3], [], argv[3:]
    at = argv.index("-m")
    return [argv[0], "-m", argv[at + 1]], argv[1:at], argv[at + 2:]


def trainer_argv(argv: list[str]) -> list[str]:
    return split(argv)[2]


def flags(args: list[str]) -> dict[str, str | None]:
    """``--flag`` -> its value (None for a switch) in ``args``."""
    out: dict[str, str | None] = {}
    for i, arg in enumerate(args):
        if arg.startswith("--"):
            value = args[i + 1] if i + 1 < len(args) and not args[i + 1].startswith("--") else None
            out[arg] = value
    return out
