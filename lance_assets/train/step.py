"""One optimizer step: the learning-rate schedule, the optimizers, and ``train_step``.

``train_step`` takes any iterator of token blocks (the trainer's loader or a benchmark's), so
the benchmarks time exactly the step the trainer runs.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
from torch.nn.parallel import DistributedDataParallel as DDP

from lance_assets.train import data
from lance_assets.train.collectives import Collectives
from lance_assets.train.config import TrainConfig
from lance_assets.train.model import GPT


def lr_scale(step: int, cfg: TrainConfig, steps: int) -> float:
    """Linear warmup to 1, then cosine decay to min_lr / lr over --lr-total-steps (default: the
    run's steps): the multiplier of every peak LR."""
    if step < cfg.warmup:
        return (step + 1) / cfg.warmup
    floor = cfg.min_lr / cfg.lr
    steps = cfg.lr_total_steps or steps
    progress = min(1.0, (step - cfg.warmup) / max(1, steps - cfg.warmup))
    return floor + 0.5 * (1 - floor) * (1 + math.cos(math.pi * progress))


def make_optimizers(model: GPT, cfg: TrainConfig, device: torch.device) -> list[torch.optim.Optimizer]:
    """nanogpt: AdamW on everything (decay on matrices only). modern: Muon on the blocks' hidden
    matrices, AdamW on the embedding, the head and any vector. Every group records its
    ``peak_lr``; the schedule scales it."""
    fused = device.type in ("cuda", "cpu")  # one kernel per step instead of a loop over tensors
    named = list(model.named_parameters())
    if cfg.arch == "modern":
        hidden = [p for n, p in named if n.startswith("blocks.") and p.dim() == 2]
        rest = [p for n, p in named if not (n.startswith("blocks.") and p.dim() == 2)]
        muon = torch.optim.Muon(hidden, lr=cfg.matrix_lr, weight_decay=cfg.weight_decay)
        adamw = torch.optim.AdamW(rest, lr=cfg.lr, betas=(0.9, 0.95), weight_decay=0.0,
                                  fused=fused)
        optimizers = [muon, adamw]
    else:
        optimizers = [torch.optim.AdamW(
            [{"params": [p for _, p in named if p.dim() >= 2], "weight_decay": cfg.weight_decay},
             {"params": [p for _, p in named if p.dim() < 2], "weight_decay": 0.0}],
            lr=cfg.lr, betas=(0.9, 0.95), fused=fused)]
    for opt in optimizers:
        for group in opt.param_groups:
            group["peak_lr"] = group["lr"]
    return optimizers


@dataclass
class StepResult:
    loss: float  # mean over micro-steps and ranks
    tokens: int  # target tokens over all ranks
    data_wait: float  # seconds this rank waited for blocks
    blocks: list[torch.Tensor]  # this rank's blocks, as the loader gave them


def train_step(model: torch.nn.Module, optimizers: list[torch.optim.Optimizer],
               batches: Iterator[torch.Tensor], *, pad_id: int, device: torch.device,
               grad_accum: int = 1, lr_scale: float = 1.0, comm: Collectives | None = None,
               autocast: Callable = contextlib.nullcontext) -> StepResult:
    """One optimizer step over ``grad_accum`` batches from ``batches`` (any iterator of
    (batch, seq_len + 1) token tensors: the trainer's loader, or a benchmark's)."""
    comm = comm or Collectives(device)
    for opt in optimizers:
        for group in opt.param_groups:
            group["lr"] = group["peak_lr"] * lr_scale
    loss_sum = torch.zeros((), device=device)
    tokens = torch.zeros((), dtype=torch.long, device=device)
    wait, seen = 0.0, []
    for micro in range(grad_accum):
        t0 = time.perf_counter()
        blocks = next(batches)
        wait += time.perf_counter() - t0
        seen.append(blocks)
        x, y = data.inputs_and_targets(blocks, pad_id)
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        sync = micro == grad_accum - 1 or not isinstance(model, DDP)
        with contextlib.nullcontext() if sync else model.no_sync():
            with autocast():
                _, loss = model(x, y)
            (loss / grad_accum).backward()
        loss_sum += loss.detach().float() / grad_accum
        tokens += (y != -1).sum()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    for opt in optimizers:
        opt.step()
    for opt in optimizers:
        opt.zero_grad(set_to_none=True)
    totals = comm.sum(torch.stack([loss_sum.double(), tokens.double()]))
    return StepResult(totals[0].item() / comm.world, int(totals[1].item()), wait, seen)

