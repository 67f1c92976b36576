"""The held-out loss: one pass over the frozen validation blocks, summed per document.

Every rank evaluates a stride of the blocks; the per-position losses are summed over ranks on
the training device, then per held-out document, the unit the standard error is taken over.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from lance_assets.train import data
from lance_assets.train.collectives import Collectives
from lance_assets.train.model import GPT


@dataclass
class Evaluation:
    """One pass over the frozen validation blocks, summed per held-out document.

    Documents are told apart by their EOS (the loader packs each document followed by one EOS),
    so ``doc_loss[d]`` and ``doc_tokens[d]`` are the summed loss (nats) and the target tokens of
    the d-th document the blocks reach, in storage order: the unit the standard error is computed
    over, since the blocks of one document are not independent samples."""

    loss: float  # nats per target token over every validation token
    loss_se: float | None  # its standard error over documents (None: fewer than two)
    doc_loss: list[float]
    doc_tokens: list[int]

    @classmethod
    def of(cls, doc_loss: torch.Tensor, doc_tokens: torch.Tensor) -> Evaluation:
        total = doc_tokens.sum().item()
        if total == 0:
            return cls(float("nan"), None, [], [])
        loss = doc_loss.sum().item() / total
        docs = len(doc_tokens)
        se = None
        if docs > 1:  # the ratio estimator's linearised variance, clusters = documents
            residual = doc_loss - loss * doc_tokens
            se = math.sqrt(docs / (docs - 1) * (residual ** 2).sum().item()) / total
        return cls(loss, se, doc_loss.tolist(), [int(n) for n in doc_tokens.tolist()])


@torch.no_grad()
def evaluate(model: GPT, val: data.ValBlocks, pad_id: int, comm: Collectives, batch_size: int,
             autocast: Callable, eos_id: int) -> Evaluation:
    """Loss over the frozen validation blocks, per held-out document: each rank a stride of the
    blocks, the per-position losses summed over ranks on the training device."""
    model.eval()
    blocks = val.blocks
    n_blocks, width = blocks.shape[0], blocks.shape[1] - 1
    # per position: [0] the loss, [1] whether it counts (not PAD); one all-reduce per pass
    sums = torch.zeros(2, n_blocks, width, dtype=torch.float64, device=comm.device)
    mine = torch.arange(comm.rank, n_blocks, comm.world)
    for i in range(0, len(mine), batch_size):
        rows = mine[i : i + batch_size]
        x, y = data.inputs_and_targets(blocks[rows], pad_id)
        x, y = x.to(comm.device), y.to(comm.device)
        with autocast():
            logits, _ = model(x)
        nll = torch.nn.functional.cross_entropy(
            logits.float().flatten(0, 1), y.flatten(), ignore_index=-1, reduction="none")
        rows = rows.to(comm.device)
        sums[0, rows] = nll.view(y.shape).double()
        sums[1, rows] = (y != -1).double()
    comm.sum(sums)
    model.train()
    doc = data.document_index(val, eos_id).reshape(-1).to(comm.device)
    docs = int(doc.max().item()) + 1 if n_blocks else 0
    doc_loss = torch.zeros(docs, dtype=torch.float64, device=comm.device)
    doc_tokens = torch.zeros(docs, dtype=torch.float64, device=comm.device)
    doc_loss.index_add_(0, doc, sums[0].reshape(-1))
    doc_tokens.index_add_(0, doc, sums[1].reshape(-1))
    keep = doc_tokens > 0  # a document cut off before its first target token
    return Evaluation.of(doc_loss[keep].cpu(), doc_tokens[keep].cpu())
