"""Pretrain a compact GPT on the corpus table.

    python -m lance_assets.train --data ./data --steps 200
    torchrun --standalone --nproc-per-node 2 -m lance_assets.train --data ./data --steps 200

Under Dagster Pipes (the ``pretrained_model`` asset) rank 0 streams logs and reports the final
metrics as the asset's materialization; every rank otherwise runs exactly the same code.
SIGINT/SIGTERM finish the current step, write a checkpoint and exit; ``--resume auto`` continues.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from lance_assets.train import checkpoint, data
from lance_assets.train.model import GPT, PRESETS, config_for


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m lance_assets.train", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default=os.environ.get("LANCE_ASSETS_DATA", "./data"),
                   help="data root holding lance/corpus.lance (default $LANCE_ASSETS_DATA or ./data)")
    p.add_argument("--table", default="corpus")
    p.add_argument("--table-version", type=int, default=None,
                   help="table version to read (default: newest; a resume keeps its own)")
    p.add_argument("--filter", default="NOT is_dup", help="SQL predicate of training documents")
    p.add_argument("--val-mod", type=int, default=20,
                   help="documents with id %% VAL_MOD == 0 form the frozen validation split")
    p.add_argument("--model", default="tiny", choices=sorted(PRESETS))
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--batch-size", type=int, default=16, help="sequences per rank per micro-step")
    p.add_argument("--grad-accum", type=int, default=1)
    p.add_argument("--steps", type=int, default=200, help="optimizer steps")
    p.add_argument("--lr", type=float, default=5e-3, help="peak LR (tuned for tiny; ~6e-4 for small)")
    p.add_argument("--min-lr", type=float, default=3e-4)
    p.add_argument("--warmup", type=int, default=60)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--num-splits", type=int, default=8,
                   help="loader splits; resume works on any world size dividing it")
    p.add_argument("--read-batch-size", type=int, default=64)
    p.add_argument("--io-queue-depth", type=int, default=4)
    p.add_argument("--transform-parallelism", type=int, default=None)
    p.add_argument("--num-workers", type=int, default=0)
    p.add_argument("--eval-every", type=int, default=50)
    p.add_argument("--eval-blocks", type=int, default=32)
    p.add_argument("--ckpt-every", type=int, default=100)
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument("--resume", default=None, help="'auto' (newest in --out) or a checkpoint path")
    p.add_argument("--seed", type=int, default=1337)
    p.add_argument("--out", default=None, help="run folder (default DATA/train/manual)")
    return p.parse_args(argv)


class Reporter:
    """Rank 0's voice: stdout always, Dagster Pipes when launched by the asset."""

    def __init__(self, rank: int, stack: contextlib.ExitStack):
        self.rank = rank
        self.pipes = None
        if rank == 0 and os.environ.get("DAGSTER_PIPES_CONTEXT"):
            from dagster_pipes import open_dagster_pipes

            self.pipes = stack.enter_context(open_dagster_pipes())

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


class StopFlag:
    """Set by SIGINT/SIGTERM; the loop stops at the next step boundary (all ranks agree)."""

    def __init__(self) -> None:
        self.requested = False
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, self._handle)

    def _handle(self, signum, _frame) -> None:
        self.requested = True

    def agreed(self, distributed: bool) -> bool:
        if not distributed:
            return self.requested
        flag = torch.tensor([1.0 if self.requested else 0.0])
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item())


def lr_at(step: int, args: argparse.Namespace) -> float:
    if step < args.warmup:
        return args.lr * (step + 1) / args.warmup
    progress = (step - args.warmup) / max(1, args.steps - args.warmup)
    return args.min_lr + 0.5 * (args.lr - args.min_lr) * (1 + math.cos(math.pi * min(1.0, progress)))


@torch.no_grad()
def evaluate(model, blocks: torch.Tensor, pad_id: int, rank: int, world: int, device, batch: int):
    """Mean loss over the frozen validation blocks (each rank takes a stride, then all-reduce)."""
    model.eval()
    total = torch.zeros(2, dtype=torch.float64)
    mine = blocks[rank::world]
    for i in range(0, len(mine), batch):
        x, y = data.inputs_and_targets(mine[i : i + batch], pad_id)
        _, loss = model(x.to(device), y.to(device))
        n = (y != -1).sum().item()
        total += torch.tensor([loss.item() * n, n], dtype=torch.float64)
    if world > 1:
        dist.all_reduce(total)
    model.train()
    return (total[0] / total[1]).item() if total[1] > 0 else float("nan")


def git_commit() -> str | None:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                              cwd=Path(__file__).parent, timeout=5).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    rank = int(os.environ.get("RANK", 0))
    world = int(os.environ.get("WORLD_SIZE", 1))
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    distributed = world > 1
    if torch.cuda.is_available():
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    if distributed:
        dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo")
    if args.num_splits % world:
        raise SystemExit(f"--num-splits {args.num_splits} must be divisible by world size {world}")
    splits_per_rank = args.num_splits // world
    if (args.batch_size * args.grad_accum) % splits_per_rank:
        raise SystemExit(
            f"--batch-size x --grad-accum ({args.batch_size * args.grad_accum}) must be a multiple "
            f"of the splits per rank ({splits_per_rank}) so every step ends on a checkpointable "
            "loader boundary")
    out = Path(args.out or Path(args.data) / "train" / "manual")
    stop = StopFlag()
    with contextlib.ExitStack() as stack:
        rep = Reporter(rank, stack)
        try:
            return _train(args, rank, world, distributed, device, out, stop, rep)
        finally:
            if distributed:
                dist.destroy_process_group()


def _train(args, rank, world, distributed, device, out: Path, stop: StopFlag, rep: Reporter) -> int:
    torch.manual_seed(args.seed)
    resume_path = checkpoint.resolve_resume(args.resume, out)
    ckpt = checkpoint.load(resume_path) if resume_path else None
    version = ckpt["table_version"] if ckpt else args.table_version
    snap = data.open_snapshot(str(Path(args.data) / "lance"), args.table, version)
    tok = snap.tokenizer
    block_len = args.seq_len + 1
    tfilter = data.train_filter(args.filter, args.val_mod)
    vfilter = data.val_filter(args.filter, args.val_mod)
    blocks_per_epoch = data.count_blocks(snap, tfilter, block_len, args.num_splits)
    val = data.val_blocks(snap, filter=vfilter, block_len=block_len, max_blocks=args.eval_blocks)

    cfg = config_for(args.model, tok["vocab_size"], args.seq_len)
    model = GPT(cfg).to(device)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95))
    step, epoch, tokens_seen, loader_state = 0, 0, 0, None
    if ckpt:
        model.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["optimizer"])
        step, epoch, tokens_seen = ckpt["step"], ckpt["epoch"], ckpt["tokens_seen"]
        loader_state = ckpt["loader"]
        rep.log(f"resumed from {resume_path} at step {step}")
    ddp = DDP(model) if distributed else model

    def make_loader(epoch: int, state: dict | None):
        ds = data.train_dataset(
            snap, filter=tfilter, block_len=block_len, blocks_per_epoch=blocks_per_epoch,
            num_splits=args.num_splits, rank=rank, world_size=world, seed=args.seed, epoch=epoch,
            read_batch_size=args.read_batch_size, io_queue_depth=args.io_queue_depth,
            transform_parallelism=args.transform_parallelism)
        if state is not None:
            ds.load_state_dict(state)
        return ds, iter(data.train_loader(ds, args.batch_size, args.num_workers))

    dataset, batches = make_loader(epoch, loader_state)
    rep.log(f"model {args.model}: {model.num_params() / 1e6:.2f}M params, vocab {cfg.vocab_size}, "
            f"world {world}, table v{snap.version}, {blocks_per_epoch} blocks/epoch, "
            f"tokenizer {tok['name']}")
    metrics_path = out / "metrics.jsonl"
    out.mkdir(parents=True, exist_ok=True)

    def record(entry: dict) -> None:
        if rank == 0:
            with open(metrics_path, "a") as fh:
                fh.write(json.dumps(entry) + "\n")

    def save() -> Path | None:
        # Every rank's loader state, merged: resumable on any world size dividing num_splits.
        states = [None] * world
        if distributed:
            dist.all_gather_object(states, dataset.state_dict())
        else:
            states = [dataset.state_dict()]
        if rank != 0:
            return None
        merged = type(dataset).merge_state_dicts(states)
        state = {"model": model.state_dict(), "optimizer": opt.state_dict(), "step": step,
                 "epoch": epoch, "tokens_seen": tokens_seen, "loader": merged,
                 "model_config": asdict(cfg), "args": vars(args), "tokenizer": tok,
                 "table_version": snap.version, "filter": tfilter, "git_commit": git_commit()}
        return checkpoint.save_atomic(state, out, step)

    val_loss = evaluate(model, val, tok["pad_id"], rank, world, device, args.batch_size)
    first_val = val_loss
    record({"step": step, "val_loss": val_loss})
    rep.log(f"step {step}: val loss {val_loss:.4f}")
    losses: list[tuple[int, float]] = []
    t_start = time.perf_counter()
    tokens_at_start = tokens_seen
    last_ckpt = None
    interrupted = False
    while step < args.steps:
        if stop.agreed(distributed):
            interrupted = True
            break
        lr = lr_at(step, args)
        for group in opt.param_groups:
            group["lr"] = lr
        loss_sum = 0.0
        for micro in range(args.grad_accum):
            try:
                batch = next(batches)
            except StopIteration:
                epoch += 1
                dataset, batches = make_loader(epoch, None)
                batch = next(batches)
            x, y = data.inputs_and_targets(batch["input_ids"], tok["pad_id"])
            x, y = x.to(device), y.to(device)
            sync = micro == args.grad_accum - 1 or not distributed
            with contextlib.nullcontext() if sync else ddp.no_sync():
                _, loss = ddp(x, y)
                (loss / args.grad_accum).backward()
            loss_sum += loss.item() / args.grad_accum
            tokens_seen += int((y != -1).sum().item()) * world
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        step += 1
        losses.append((step, loss_sum))
        elapsed = time.perf_counter() - t_start
        tok_s = (tokens_seen - tokens_at_start) / max(elapsed, 1e-9)
        record({"step": step, "loss": loss_sum, "lr": lr, "tokens": tokens_seen, "tokens_per_s": tok_s})
        if step % args.log_every == 0 or step == args.steps:
            rep.log(f"step {step}/{args.steps}: loss {loss_sum:.4f} lr {lr:.2e} {tok_s:,.0f} tok/s")
        if step % args.eval_every == 0 or step == args.steps:
            val_loss = evaluate(model, val, tok["pad_id"], rank, world, device, args.batch_size)
            record({"step": step, "val_loss": val_loss})
            rep.log(f"step {step}: val loss {val_loss:.4f}")
        if step % args.ckpt_every == 0 and step < args.steps:
            last_ckpt = save() or last_ckpt
    last_ckpt = save() or last_ckpt
    elapsed = time.perf_counter() - t_start
    tok_s = (tokens_seen - tokens_at_start) / max(elapsed, 1e-9)
    if interrupted:
        rep.log(f"interrupted at step {step}; checkpoint {last_ckpt}; continue with --resume auto")
    summary = {
        "checkpoint": str(last_ckpt), "step": step, "steps_requested": args.steps,
        "interrupted": interrupted, "model": args.model, "params_m": round(model.num_params() / 1e6, 3),
        "world_size": world, "table_version": snap.version, "filter": tfilter,
        "tokenizer": tok["name"], "tokenizer_sha256": tok["sha256"], "tokens_seen": tokens_seen,
        "tokens_per_s": round(tok_s, 1), "train_seconds": round(elapsed, 2),
        "first_val_loss": round(first_val, 4), "val_loss": round(val_loss, 4),
        "train_loss": round(losses[-1][1], 4) if losses else None,
        "blocks_per_epoch": blocks_per_epoch, "git_commit": git_commit(),
    }
    if rank == 0:
        (out / "summary.json").write_text(json.dumps(summary, indent=2))
    rep.materialize(summary)
    rep.log(f"done: step {step}, val loss {first_val:.4f} -> {val_loss:.4f}, {tok_s:,.0f} tok/s")
    return 0
