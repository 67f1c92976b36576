"""The training loop: steps until ``steps`` or a stop request, with progress lines, validation
passes and checkpoints once in a while, and a final checkpoint either way.

SIGINT/SIGTERM set a ``StopFlag``; every rank stops at the same step boundary (the ranks agree
through one collective per step).
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from lance_assets.launch.signals import StopRequested
from lance_assets.train import mixture
from lance_assets.train.collectives import Collectives
from lance_assets.train.evaluation import Evaluation
from lance_assets.train.run import Run
from lance_assets.train.step import lr_scale, train_step


class StopFlag(StopRequested):
    """Set by SIGINT/SIGTERM; the loop stops at the next step boundary, all ranks together."""
    def agreed(self, comm: Collectives) -> bool:
        return comm.any(self.requested)


def block_hashes(blocks: list[torch.Tensor]) -> list[str]:
    return [hashlib.blake2b(b.numpy().tobytes(), digest_size=8).hexdigest()
            for batch in blocks for b in batch.cpu()]


@dataclass
class LoopResult:
    """What the loop leaves for the summary."""

    last_eval: Evaluation  # the newest validation pass
    first_val: float  # the loss of the pass before the first step of this run
    val_step: int  # the step of the newest validation pass
    start_step: int
    start_tokens: int
    t_start: float
    data_wait: float
    step_time: float
    last_ckpt: Path | None
    interrupted: bool
    loss: float  # the last step's training loss

    @property
    def val_loss(self) -> float:
        return self.last_eval.loss


def train_loop(run: Run, step_model: torch.nn.Module, stop: StopFlag) -> LoopResult:
    """Steps until ``steps`` or a stop request, with progress lines, validation passes and
    checkpoints once in a while, and a final checkpoint either way."""
    cfg, comm, report, d, net, p = run.cfg, run.comm, run.report, run.run_data, run.net, run.progress
    tok, steps = d.tok, d.steps
    report.log(f"model {cfg.model} ({cfg.arch}): {net.model.num_params() / 1e6:.2f}M params, "
               f"vocab {net.model_cfg.vocab_size}, world {comm.world}, "
               f"{'bfloat16' if net.use_bf16 else 'float32'}, table v{d.snap.version}"
               + (f" (tag {d.table_tag})" if d.table_tag else "")
               + f", {d.blocks_per_epoch} blocks/epoch, global batch "
               f"{d.global_batch}, tokenizer {tok['name']}, {d.steps_why}")
    last_eval = run.validate()
    val_step = p.step
    if p.step == 0:
        run.record_eval(last_eval)
    if d.mixture is not None:
        report.log("mixture: " + mixture.describe(d.mixture))
    report.log(f"step {p.step}: val loss {last_eval.loss:.4f}")
    loop = LoopResult(last_eval, last_eval.loss, val_step, p.step, p.tokens_seen,
                      time.perf_counter(), 0.0, 0.0, None, False, float("nan"))
    while p.step < steps:
        if stop.agreed(comm):
            loop.interrupted = True
            break
        t0 = time.perf_counter()
        scale = lr_scale(p.step, cfg, steps)
        result = train_step(step_model, net.optimizers, run.batches, pad_id=tok["pad_id"],
                            device=run.device, grad_accum=cfg.grad_accum, lr_scale=scale,
                            comm=comm, autocast=net.autocast)
        if run.device.type == "cuda":
            torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        p.step, loop.loss = p.step + 1, result.loss
        loop.step_time, loop.data_wait = loop.step_time + dt, loop.data_wait + result.data_wait
        p.tokens_seen += result.tokens
        entry = {"step": p.step, "loss": loop.loss, "lr": cfg.lr * scale,
                 "tokens": p.tokens_seen, "tokens_per_s": result.tokens / dt,
                 "data_wait_s": result.data_wait}
        if run.peak:
            entry["mfu"] = run.mfu(result.tokens, dt)
        if d.mixture is not None:  # tokens read per domain this step, all ranks
            read = comm.sum(comm.tensor(run.batches.take_step_tokens(), dtype=torch.int64))
            entry["domain_tokens"] = dict(zip(d.mixture.names, read.tolist()))
        if cfg.log_batch_hashes:
            entry["batch_hashes"] = sorted(comm.gather_lists(block_hashes(result.blocks)))
        run.record(entry)
        # once in a while: progress, validation, checkpoint
        if p.step % cfg.log_every == 0 or p.step == steps:
            rate = (p.tokens_seen - loop.start_tokens) / (time.perf_counter() - loop.t_start)
            report.log(f"step {p.step}/{steps}: loss {loop.loss:.4f} lr {entry['lr']:.2e} "
                       f"{rate:,.0f} tok/s" + (f" mfu {entry['mfu']:.1%}" if run.peak else ""))
        if p.step % cfg.eval_every == 0 or p.step == steps:
            loop.last_eval, loop.val_step = run.validate(), p.step
            run.record_eval(loop.last_eval)
            report.log(f"step {p.step}: val loss {loop.val_loss:.4f}")
        if p.step % cfg.ckpt_every == 0 and p.step < steps:
            loop.last_ckpt = run.save() or loop.last_ckpt
    loop.last_ckpt = run.save() or loop.last_ckpt
    return loop
