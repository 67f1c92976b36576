"""One arm of the loader A/B: its blocks, and `tiny` trained on them through the trainer's own
step function (``lance_assets.train.step.train_step``), so every arm runs the same training
code and only the source of the blocks differs.

    python -m benchmarks.train_arm ARM DATA_DIR PACKED_DIR STEPS BATCH SEQ_LEN

``ARM`` is ``off`` (the trainer's loader: packed on the fly from the corpus table) or one of the
pre-packed copies in ``benchmarks.blocks.MODES``. Prints one JSON line: tokens/s and the share
of step time spent waiting for blocks.
"""

from __future__ import annotations

import itertools
import json
import sys
import time
from collections.abc import Iterator

import torch

from benchmarks.blocks import iter_blocks
from benchmarks.build_packed_datasets import train_filter
from lance_assets.table import Table
from lance_assets.train import data
from lance_assets.train.config import TrainConfig
from lance_assets.train.model import GPT, config_for
from lance_assets.train.step import lr_scale, make_optimizers, train_step

SEED = 1337


def corpus_snapshot(data_dir: str) -> data.TableSnapshot:
    """The corpus table under ``data_dir``, newest version, as the trainer opens it."""
    table = Table.of(data_dir)
    return data.open_snapshot(table)


def arm_batches(arm: str, data_dir: str, packed: str, batch: int, seq_len: int,
                snap: data.TableSnapshot | None = None) -> Iterator[torch.Tensor]:
    """Endless (batch, seq_len + 1) blocks from ``arm``, epoch after epoch."""
    if arm == "off":
        snap = snap or corpus_snapshot(data_dir)
        f = train_filter(snap)
        n = data.count_blocks(snap, f, seq_len + 1, 8)
        return data.TrainBatches(snap, epoch=0, state=None, batch_size=batch, filter=f,
                                 block_len=seq_len + 1, blocks_per_epoch=n, num_splits=8, rank=0,
                                 world_size=1, seed=SEED)
    return itertools.chain.from_iterable(
        iter_blocks(arm, packed, batch=batch, seed=SEED, epoch=e) for e in itertools.count())


def train_arm(arm: str, data_dir: str, packed: str, steps: int, batch: int, seq_len: int) -> dict:
    snap = corpus_snapshot(data_dir)
    cfg = TrainConfig(seq_len=seq_len, batch_size=batch, steps=steps)
    torch.manual_seed(cfg.seed)
    model = GPT(config_for(cfg.model, snap.tokenizer["vocab_size"], seq_len, cfg.arch))
    optimizers = make_optimizers(model, cfg, torch.device("cpu"))
    batches = arm_batches(arm, data_dir, packed, batch, seq_len, snap)
    wait, tokens = 0.0, 0
    start = time.perf_counter()
    for step in range(steps):
        result = train_step(model, optimizers, batches, pad_id=snap.tokenizer["pad_id"],
                            device=torch.device("cpu"), lr_scale=lr_scale(step, cfg, steps))
        wait, tokens = wait + result.data_wait, tokens + result.tokens
    elapsed = time.perf_counter() - start
    return {"tokens_per_s": tokens / elapsed, "data_wait_share": wait / elapsed}


if __name__ == "__main__":
    arm, data_dir, packed, steps, batch, seq_len = sys.argv[1:7]
    print(json.dumps(train_arm(arm, data_dir, packed, int(steps), int(batch), int(seq_len))))
