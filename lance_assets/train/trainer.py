"""Pretrain a compact GPT on the corpus table: the trainer's entry point.

    python -m lance_assets.train --data ./data --steps 300
    torchrun --standalone --nproc-per-node 2 -m lance_assets.train --data ./data --steps 300

Under Dagster Pipes (the ``pretrained_model`` asset) rank 0 streams logs and reports the final
metrics as the asset's materialization; every rank otherwise runs exactly the same code.
SIGINT/SIGTERM finish the current step, write a checkpoint and exit; ``--resume auto``
continues, on any world size that divides ``--num-splits`` (keep the global batch:
world size x --batch-size x --grad-accum).

``train`` is the edge: it resolves the device, the world, the data root and the one ``Table``
the run reads, and hands them down. ``_train`` is the run as a short sequence of named parts:
what to resume, the data, the model (``train.setup``), the loader, the loop (``train.loop``:
steps, validation passes from ``train.evaluation``, records and checkpoints from
``train.run``) and the summary (``train.summary``).
"""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path

import torch

from lance_assets import paths, storage
from lance_assets.curation.predicate import PredicateError
from lance_assets.curation.rules import RuleError
from lance_assets.table import Table
from lance_assets.train import checkpoint, config
from lance_assets.train.collectives import Collectives, launched_by_torchrun
from lance_assets.train.config import ConfigError, TrainConfig, data_root, parse_args
from lance_assets.train.data import redacted_since
from lance_assets.train.loop import StopFlag, train_loop
from lance_assets.train.run import Reporter, Run, git_commit, peak_flops
from lance_assets.train.setup import (
    TrainError,
    build_model,
    distribute,
    load_data,
    restore,
    resume_checkpoint,
    train_batches,
)
from lance_assets.train.summary import finish


def train(cfg: TrainConfig) -> dict:
    """One training run; returns the summary (also written to OUT/summary.json)."""
    world = int(os.environ.get("WORLD_SIZE", 1)) if launched_by_torchrun() else 1
    config.check_world(cfg, world)
    if torch.cuda.is_available():
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    root = data_root(cfg)
    table = Table.of(storage.uri_of(root), name=cfg.table)  # the run's one table handle
    out = storage.location(cfg.out) if cfg.out else paths.run_dir(root, "manual")
    stop = StopFlag()
    comm = Collectives.start(device)
    with contextlib.ExitStack() as stack:
        stack.callback(comm.close)
        report = Reporter(comm.rank, stack)
        return _train(cfg, comm, device, table, root, out, stop, report)


def _train(cfg: TrainConfig, comm: Collectives, device: torch.device, table: Table, root: Path,
           out: Path, stop: StopFlag, report: Reporter) -> dict:
    """The run, step by step: what to resume, the data, the model and its optimizers (restored
    on resume), the loader, the loop, the summary."""
    resume_path, ckpt = resume_checkpoint(cfg, out, report.log)
    run_data = load_data(cfg, table, ckpt, comm)
    net = build_model(cfg, device, run_data.tok["vocab_size"])
    progress = restore(net, ckpt, resume_path, report.log, comm.world)
    gone = run_data.snap.redacted
    if ckpt and gone and int(ckpt["table_version"]) != run_data.snap.version:
        # what went since this checkpoint's version, not what earlier resumes already read
        gone = redacted_since(table, run_data.snap, int(ckpt["table_version"]))
        run_data.redacted = {**gone, "from_step": progress.step}
        report.log(f"table: forget redacted the run's snapshot {run_data.table_tag} (version "
                   f"{ckpt['table_version']}) since this checkpoint: from step {progress.step} "
                   f"the run reads its copy (version {run_data.snap.version}), "
                   f"{gone['documents']:,} document(s) and {gone['tokens']:,} token(s) gone")
    step_model = distribute(net.model, cfg, comm, device)
    batches = train_batches(cfg, run_data, progress, comm, out)
    run = Run(cfg, comm, device, root, out, report, run_data, net, batches, progress,
              flops_per_token=net.model.flops_per_token(), peak=peak_flops(device),
              commit=git_commit())
    try:
        loop = train_loop(run, step_model, stop)
    finally:
        batches.close()  # the loader's workers stop here, not at interpreter exit
    return finish(run, loop)


USER_ERRORS = (TrainError, ConfigError, PredicateError, RuleError, checkpoint.CheckpointError)


def main(argv: list[str] | None = None) -> int:
    """The CLI: a user's mistake prints one line and exits 2; a bug keeps its traceback."""
    cfg = parse_args(argv, description=__doc__)
    try:
        train(cfg)
    except USER_ERRORS as e:
        if int(os.environ.get("RANK", 0)) == 0:
            print(f"python -m lance_assets.train: error: {e}", file=sys.stderr, flush=True)
        return 2
    return 0
