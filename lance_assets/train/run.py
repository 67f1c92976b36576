"""A running training run: its parts, its voice and its records.

``Reporter`` is rank 0's voice (Dagster Pipes when launched by the asset, stdout otherwise).
``Run`` holds the run's parts and does what the loop does once in a while: a validation pass,
a line in ``OUT/metrics.jsonl``, a checkpoint (every rank's loader state merged, resumable on any
world size dividing ``--num-splits``) and ``OUT/read.json``, the documents read up to it.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from lance_assets import storage
from lance_assets.train import checkpoint, data, mixture, read_record
from lance_assets.train.collectives import Collectives
from lance_assets.train.config import TrainConfig
from lance_assets.train.evaluation import Evaluation, evaluate
from lance_assets.train.setup import Net, Progress, RunData

# Dense bf16 peak FLOP/s per device, for MFU (matched against torch.cuda.get_device_name()).
PEAK_FLOPS = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "L40S": 362e12, "L4": 121e12,
              "A10": 125e12, "RTX 4090": 165e12, "V100": 125e12, "T4": 65e12}


class Reporter:
    """Rank 0's voice: Dagster Pipes when launched by the asset, stdout otherwise.

    Every torchrun agent of a multi-node run inherits the Pipes environment, so only the
    global rank 0 (``rank`` is the global rank) opens the Pipes session and reports: the
    launcher reads one stream of messages. ``resume_hint`` says how to continue an interrupted
    run in the words of whoever launched it (the launcher may pass its own as a Pipes extra).
    """

    def __init__(self, rank: int, stack: contextlib.ExitStack):
        self.rank = rank
        self.pipes = None
        self.resume_hint = "continue with --resume auto and the same --out"
        if rank == 0 and os.environ.get("DAGSTER_PIPES_CONTEXT"):
            from dagster_pipes import open_dagster_pipes

            self.pipes = stack.enter_context(open_dagster_pipes())
            self.resume_hint = self.pipes.extras.get("resume_hint") or self.resume_hint

    def log(self, msg: str) -> None:
        if self.rank != 0:
            return
        if self.pipes is not None:
            self.pipes.log.info(msg)  # the run's event log; stdout would only repeat it
        else:
            print(msg, flush=True)

    def materialize(self, metadata: dict) -> None:
        if self.pipes is not None:
            self.pipes.report_asset_materialization(metadata=metadata)


def git_commit() -> str | None:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                              cwd=Path(__file__).parent, timeout=5).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def peak_flops(device: torch.device) -> float | None:
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((v for k, v in PEAK_FLOPS.items() if k in name), None)



@dataclass
class Run:
    """One run's parts, and what the loop does once in a while with them."""

    cfg: TrainConfig
    comm: Collectives
    device: torch.device
    root: Path
    out: Path
    report: Reporter
    run_data: RunData
    net: Net
    batches: data.TrainBatches | mixture.MixtureBatches
    progress: Progress
    # figures computed once
    flops_per_token: float
    peak: float | None
    commit: str | None
    loader: dict | None = None  # the newest checkpoint's merged loader state (rank 0)

    def mfu(self, tokens: int, seconds: float) -> float | None:
        if not (self.peak and seconds):
            return None
        return self.flops_per_token * tokens / seconds / (self.peak * self.comm.world)

    def bpb(self, loss: float | None) -> float | None:
        if loss is None or not self.run_data.val_tokens_per_byte:
            return None
        return loss * self.run_data.val_tokens_per_byte / math.log(2)

    def validate(self) -> Evaluation:
        tok = self.run_data.tok
        return evaluate(self.net.model, self.run_data.val, tok["pad_id"], self.comm,
                        self.cfg.batch_size, self.net.autocast, tok["eos_id"])

    def record_eval(self, ev: Evaluation) -> None:
        self.record({"step": self.progress.step, "val_loss": ev.loss, "val_bpb": self.bpb(ev.loss),
                     "val_loss_se": ev.loss_se, "val_bpb_se": self.bpb(ev.loss_se)})

    def record(self, entry: dict) -> None:
        if self.comm.rank == 0:
            storage.append_text(self.out / "metrics.jsonl", json.dumps(entry) + "\n")

    def save(self) -> Path | None:
        """Every rank's loader state, merged: resumable on any world size dividing num_splits."""
        states = self.comm.gather_lists([self.batches.state_dict()])
        if self.comm.rank != 0:
            return None
        cfg, d, p = self.cfg, self.run_data, self.progress
        loader = self.batches.merge_state_dicts(states)
        state = {
            "model": self.net.model.state_dict(),
            "optimizer": [opt.state_dict() for opt in self.net.optimizers],
            "step": p.step, "epoch": self.batches.epoch, "tokens_seen": p.tokens_seen,
            "loader": loader, "world_size": self.comm.world,
            "steps": d.steps, "model_config": asdict(self.net.model_cfg), "tokenizer": d.tok,
            "args": {**asdict(cfg), "data": str(self.root)},  # the data root the run resolved
            "table_version": d.snap.version, "table_tag": d.table_tag,
            "filter": d.split.train.lance, "git_commit": self.commit,
        }
        saved = checkpoint.save_atomic(state, self.out, p.step, keep=cfg.keep_ckpts)
        self.loader = loader
        self.record_read(loader)
        return saved

    def record_read(self, loader: dict) -> None:
        """``OUT/read.json`` (``read_record``): the documents read up to this checkpoint, as
        each epoch's stored permutation and how far each split of the current one advanced."""
        cfg, d = self.cfg, self.run_data
        if d.mixture is not None:
            found = mixture.read_epochs(loader, d.mixture, d.snap.version, cfg.seed,
                                        self.out / "permutations")
            if found is not None:
                read_record.write(self.out, table_version=d.snap.version, step=self.progress.step,
                                  epochs=found, domains=mixture.read_by_domain(loader, d.mixture))
            return
        epoch = int(loader.get("epoch", self.batches.epoch))
        # rows taken from each split: its permutation position (rows mode), or the rows the
        # packer took (packed mode, where a row's tail may wait in the buffer: read all the same)
        taken = loader.get("positions_consumed_per_split") or loader["samples_consumed_per_split"]
        epochs = []
        for e in range(epoch + 1):
            key = data.PermutationKey(d.snap.version, d.split.train.lance, cfg.seed, e,
                                      cfg.num_splits)
            stored = data.stored_rows(key, self.out / "permutations")
            if stored is None:  # an epoch read elsewhere: no exact record
                return
            epochs.append({"epoch": e, "rows": stored[0], "split_sizes": stored[1],
                           "positions": None if e < epoch else
                           [int(n) for n in taken]})
        read_record.write(self.out, table_version=d.snap.version, step=self.progress.step,
                          epochs=epochs)

