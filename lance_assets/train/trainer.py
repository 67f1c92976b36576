"""Pretrain a compact GPT on the corpus table.

    python -m lance_assets.train --data ./data --steps 300
    torchrun --standalone --nproc-per-node 2 -m lance_assets.train --data ./data --steps 300

Under Dagster Pipes (the ``pretrained_model`` asset) rank 0 streams logs and reports the final
metrics as the asset's materialization; every rank otherwise runs exactly the same code.
SIGINT/SIGTERM finish the current step, write a checkpoint and exit; ``--resume auto``
continues, on any world size that divides ``--num-splits`` (keep the global batch:
world size x --batch-size x --grad-accum).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import math
import os
import signal
import subprocess
import time
from dataclasses import asdict
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from lance_assets.train import blocks, checkpoint, data
from lance_assets.train.model import GPT, PRESETS, config_for

# Dense bf16 peak FLOP/s per device, for MFU (matched against torch.cuda.get_device_name()).
PEAK_FLOPS = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "L40S": 362e12, "L4": 121e12,
              "A10": 125e12, "RTX 4090": 165e12, "V100": 125e12, "T4": 65e12}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m lance_assets.train", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seed", type=int, default=1337)
    p.add_argument("--data", default=os.environ.get("LANCE_ASSETS_DATA", "./data"),
                   help="data root holding lance/corpus.lance (default $LANCE_ASSETS_DATA or ./data)")
    p.add_argument("--table", default="corpus")
    p.add_argument("--table-version", type=int, default=None,
                   help="table version to read (default: newest; a resume keeps its own)")
    p.add_argument("--filter", default="NOT is_dup", help="SQL predicate of training documents")
    p.add_argument("--val-mod", type=int, default=20,
                   help="documents with id %% VAL_MOD == 0 form the frozen validation split")
    p.add_argument("--model", default="tiny", choices=list(PRESETS))
    p.add_argument("--tokenizer", default=None,
                   help="expected tokenizer name; refuse to train if the table's differs")
    p.add_argument("--pack", action=argparse.BooleanOptionalAction, default=True,
                   help="pack documents into full blocks in the loader (--no-pack: one per row)")
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--batch-size", type=int, default=16, help="sequences per rank per micro-step")
    p.add_argument("--grad-accum", type=int, default=1)
    p.add_argument("--steps", type=int, default=300, help="optimizer steps")
    p.add_argument("--epochs", type=float, default=None, help="train this many epochs instead of --steps")
    p.add_argument("--lr", type=float, default=5e-3, help="peak LR (tuned for tiny; ~6e-4 for small)")
    p.add_argument("--min-lr", type=float, default=3e-4)
    p.add_argument("--warmup", type=int, default=60)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--dtype", default="auto", choices=["auto", "bfloat16", "float32"],
                   help="autocast dtype (auto: bfloat16 on GPUs that support it, else float32)")
    p.add_argument("--compile", action="store_true", help="torch.compile the model")
    p.add_argument("--num-splits", type=int, default=8,
                   help="loader splits; resume works on any world size dividing it")
    p.add_argument("--read-batch-size", type=int, default=64)
    p.add_argument("--io-queue-depth", type=int, default=4)
    p.add_argument("--transform-parallelism", type=int, default=None)
    p.add_argument("--transform-queue-depth", type=int, default=None)
    p.add_argument("--num-workers", type=int, default=0, help="StreamingDataLoader worker processes")
    p.add_argument("--blocks-mode", default="off", choices=blocks.MODES,
                   help="off: pack in the loader from the table; else read pre-packed copies "
                        "(loader A/B controls, see lance_assets.bench.build_packed_datasets)")
    p.add_argument("--blocks-path", default=None, help="folder made by build_packed_datasets")
    p.add_argument("--eval-every", type=int, default=50)
    p.add_argument("--eval-blocks", type=int, default=32)
    p.add_argument("--ckpt-every", type=int, default=100)
    p.add_argument("--keep-ckpts", type=int, default=2)
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument("--log-batch-hashes", action="store_true",
                   help="log the sorted hashes of every step's blocks (all ranks) to metrics.jsonl")
    p.add_argument("--resume", default=None, help="'auto' (newest in --out) or a checkpoint path")
    p.add_argument("--out", default=None, help="run folder (default DATA/train/manual)")
    return p.parse_args(argv)


class Reporter:
    """Rank 0's voice: Dagster Pipes when launched by the asset, stdout otherwise."""

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
    """Set by SIGINT/SIGTERM; the loop stops at the next step boundary, all ranks together."""

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


def block_hashes(blocks: torch.Tensor) -> list[str]:
    return [hashlib.blake2b(b.numpy().tobytes(), digest_size=8).hexdigest() for b in blocks.cpu()]


def all_gather_list(items: list, distributed: bool, world: int) -> list:
    if not distributed:
        return list(items)
    gathered: list = [None] * world
    dist.all_gather_object(gathered, items)
    return [x for part in gathered for x in part]


@torch.no_grad()
def evaluate(model, blocks: torch.Tensor, pad_id: int, rank: int, world: int, device, batch: int,
             autocast) -> float:
    """Mean loss (nats/token) over the frozen validation blocks: each rank a stride, all-reduced."""
    model.eval()
    total = torch.zeros(2, dtype=torch.float64)
    mine = blocks[rank::world]
    for i in range(0, len(mine), batch):
        x, y = data.inputs_and_targets(mine[i : i + batch], pad_id)
        with autocast():
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


def peak_flops(device: torch.device) -> float | None:
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((v for k, v in PEAK_FLOPS.items() if k in name), None)


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
    if args.num_splits % world:
        raise SystemExit(f"--num-splits {args.num_splits} must be divisible by world size {world}")
    splits_per_rank = args.num_splits // world
    if (args.batch_size * args.grad_accum) % splits_per_rank:
        raise SystemExit(
            f"--batch-size x --grad-accum ({args.batch_size * args.grad_accum}) must be a multiple "
            f"of the splits per rank ({splits_per_rank}) so every step ends on a checkpointable "
            "loader boundary")
    if distributed:
        dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo")
    out = Path(args.out or Path(args.data) / "train" / "manual")
    stop = StopFlag()
    with contextlib.ExitStack() as stack:
        rep = Reporter(rank, stack)
        try:
            return Trainer(args, rank, world, device, out, stop, rep).run()
        finally:
            if distributed:
                dist.destroy_process_group()


class Trainer:
    def __init__(self, args, rank, world, device, out: Path, stop: StopFlag, rep: Reporter):
        self.args, self.rank, self.world, self.device = args, rank, world, device
        self.distributed = world > 1
        self.out, self.stop, self.rep = out, stop, rep
        torch.manual_seed(args.seed)
        resume_path = checkpoint.resolve_resume(args.resume, out)
        ckpt = checkpoint.load(resume_path) if resume_path else None
        version = ckpt["table_version"] if ckpt else args.table_version
        self.snap = data.open_snapshot(str(Path(args.data) / "lance"), args.table, version)
        self.tok = self.snap.tokenizer
        if args.tokenizer and args.tokenizer != self.tok["name"]:
            raise SystemExit(f"--tokenizer {args.tokenizer}: the table's input_ids were written with "
                             f"{self.tok['name']!r}; re-tokenize (token_ids) or drop --tokenizer")
        self.block_len = args.seq_len + 1
        self.tfilter = data.train_filter(args.filter, args.val_mod)
        vfilter = data.val_filter(args.filter, args.val_mod)
        if args.blocks_mode != "off":
            manifest = blocks.read_manifest(args.blocks_path or "")
            if manifest["block_len"] != self.block_len:
                raise SystemExit(f"{args.blocks_path} holds blocks of {manifest['block_len']} "
                                 f"tokens; --seq-len must be {manifest['block_len'] - 1}")
            self.blocks_per_epoch = manifest["n_blocks"]
        elif args.pack:
            self.blocks_per_epoch = data.count_blocks(self.snap, self.tfilter, self.block_len,
                                                      args.num_splits)
        else:
            self.blocks_per_epoch = data.count_rows(self.snap, self.tfilter, args.num_splits)
        self.global_batch = args.batch_size * args.grad_accum * world
        if args.epochs is not None:
            args.steps = max(1, math.ceil(args.epochs * self.blocks_per_epoch / self.global_batch))
        self.val = data.val_blocks(self.snap, filter=vfilter, block_len=self.block_len,
                                   max_blocks=args.eval_blocks)
        self.val_tokens_per_byte = data.tokens_per_byte(self.snap, vfilter)

        if args.dtype == "auto":
            use_bf16 = device.type == "cuda" and torch.cuda.is_bf16_supported()
        else:
            use_bf16 = args.dtype == "bfloat16"
        self.dtype = "bfloat16" if use_bf16 else "float32"
        self.autocast = lambda: torch.autocast(device.type, dtype=torch.bfloat16, enabled=use_bf16)

        self.cfg = config_for(args.model, self.tok["vocab_size"], args.seq_len)
        self.model = GPT(self.cfg).to(device)
        params = list(self.model.named_parameters())
        self.opt = torch.optim.AdamW(
            [{"params": [p for _, p in params if p.dim() >= 2], "weight_decay": args.weight_decay},
             {"params": [p for _, p in params if p.dim() < 2], "weight_decay": 0.0}],
            lr=args.lr, betas=(0.9, 0.95), fused=device.type == "cuda")
        self.step, self.epoch, self.tokens_seen, loader_state = 0, 0, 0, None
        if ckpt:
            self.model.load_state_dict(ckpt["model"])
            self.opt.load_state_dict(ckpt["optimizer"])
            self.step, self.epoch = ckpt["step"], ckpt["epoch"]
            self.tokens_seen, loader_state = ckpt["tokens_seen"], ckpt["loader"]
            rep.log(f"resumed from {resume_path} at step {self.step} (saved at world size "
                    f"{ckpt['world_size']}, now {world})")
        model = torch.compile(self.model) if args.compile else self.model
        self.ddp = DDP(model, device_ids=[device.index] if device.type == "cuda" else None) \
            if self.distributed else model
        self.dataset, self.batches = self._loader(self.epoch, loader_state)
        self.metrics_path = out / "metrics.jsonl"
        out.mkdir(parents=True, exist_ok=True)
        self.peak = peak_flops(device)

    def _loader(self, epoch: int, state: dict | None):
        a = self.args
        if a.blocks_mode != "off":
            return None, blocks.iter_blocks(a.blocks_mode, a.blocks_path, batch=a.batch_size,
                                            rank=self.rank, world=self.world, seed=a.seed,
                                            epoch=epoch)
        ds = data.train_dataset(
            self.snap, filter=self.tfilter, block_len=self.block_len,
            blocks_per_epoch=self.blocks_per_epoch, num_splits=a.num_splits, rank=self.rank,
            world_size=self.world, seed=a.seed, epoch=epoch, pack=a.pack,
            read_batch_size=a.read_batch_size, io_queue_depth=a.io_queue_depth,
            transform_parallelism=a.transform_parallelism,
            transform_queue_depth=a.transform_queue_depth)
        if state is not None:
            ds.load_state_dict(state)
        return ds, iter(data.train_loader(ds, a.batch_size, a.num_workers))

    def _next_blocks(self) -> torch.Tensor:
        try:
            item = next(self.batches)
        except StopIteration:
            self.epoch += 1
            self.dataset, self.batches = self._loader(self.epoch, None)
            item = next(self.batches)
        return item if isinstance(item, torch.Tensor) else item["input_ids"]

    def _record(self, entry: dict) -> None:
        if self.rank == 0:
            with open(self.metrics_path, "a") as fh:
                fh.write(json.dumps(entry) + "\n")

    def _evaluate(self) -> float:
        return evaluate(self.model, self.val, self.tok["pad_id"], self.rank, self.world, self.device,
                        self.args.batch_size, self.autocast)

    def _bpb(self, loss: float) -> float | None:
        return loss * self.val_tokens_per_byte / math.log(2) if self.val_tokens_per_byte else None

    def save(self) -> Path | None:
        """Every rank's loader state, merged: resumable on any world size dividing num_splits."""
        states = all_gather_list([self.dataset.state_dict()] if self.dataset else [],
                                 self.distributed, self.world)
        if self.rank != 0:
            return None
        state = {
            "model": self.model.state_dict(), "optimizer": self.opt.state_dict(),
            "step": self.step, "epoch": self.epoch, "tokens_seen": self.tokens_seen,
            "loader": type(self.dataset).merge_state_dicts(states) if states else None,
            "world_size": self.world, "blocks_mode": self.args.blocks_mode,
            "model_config": asdict(self.cfg), "args": vars(self.args), "tokenizer": self.tok,
            "table_version": self.snap.version, "filter": self.tfilter, "git_commit": git_commit(),
        }
        return checkpoint.save_atomic(state, self.out, self.step, keep=self.args.keep_ckpts)

    def train_step(self) -> tuple[float, int, float, list[str]]:
        """One optimizer step; returns (loss, tokens, seconds waiting for data, block hashes)."""
        a = self.args
        lr = lr_at(self.step, a)
        for group in self.opt.param_groups:
            group["lr"] = lr
        loss_sum, tokens, wait, hashes = 0.0, 0, 0.0, []
        for micro in range(a.grad_accum):
            t0 = time.perf_counter()
            blocks = self._next_blocks()
            wait += time.perf_counter() - t0
            if a.log_batch_hashes:
                hashes += block_hashes(blocks)
            x, y = data.inputs_and_targets(blocks, self.tok["pad_id"])
            x, y = x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)
            last = micro == a.grad_accum - 1
            with contextlib.nullcontext() if last or not self.distributed else self.ddp.no_sync():
                with self.autocast():
                    _, loss = self.ddp(x, y)
                (loss / a.grad_accum).backward()
            loss_sum += loss.item() / a.grad_accum
            tokens += int((y != -1).sum().item())
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        if self.distributed:  # the global mean loss and token count, as the step saw them
            t = torch.tensor([loss_sum, float(tokens)], dtype=torch.float64)
            dist.all_reduce(t)
            loss_sum, tokens = t[0].item() / self.world, int(t[1].item())
        return loss_sum, tokens, wait, all_gather_list(hashes, self.distributed, self.world)

    def run(self) -> int:
        a, rep = self.args, self.rep
        rep.log(f"model {a.model}: {self.model.num_params() / 1e6:.2f}M params, vocab "
                f"{self.cfg.vocab_size}, world {self.world}, {self.dtype}, table v{self.snap.version}, "
                f"{self.blocks_per_epoch} blocks/epoch, global batch {self.global_batch}, "
                f"tokenizer {self.tok['name']}")
        val_loss = self._evaluate()
        first_val = val_loss
        if self.step == 0:
            self._record({"step": 0, "val_loss": val_loss, "val_bpb": self._bpb(val_loss)})
        rep.log(f"step {self.step}: val loss {val_loss:.4f}")
        start_step, start_tokens = self.step, self.tokens_seen
        t_start = time.perf_counter()
        data_wait = step_time = 0.0
        last_ckpt, interrupted, loss = None, False, float("nan")
        while self.step < a.steps:
            if self.stop.agreed(self.distributed):
                interrupted = True
                break
            t0 = time.perf_counter()
            loss, tokens, wait, hashes = self.train_step()
            if self.device.type == "cuda":
                torch.cuda.synchronize()
            dt = time.perf_counter() - t0
            step_time += dt
            data_wait += wait
            self.step += 1
            self.tokens_seen += tokens
            entry = {"step": self.step, "loss": loss, "lr": lr_at(self.step - 1, a),
                     "tokens": self.tokens_seen, "tokens_per_s": tokens / dt, "data_wait_s": wait}
            if self.peak:
                entry["mfu"] = self.model.flops_per_token() * tokens / dt / (self.peak * self.world)
            if a.log_batch_hashes:
                entry["batch_hashes"] = sorted(hashes)
            self._record(entry)
            if self.step % a.log_every == 0 or self.step == a.steps:
                rate = (self.tokens_seen - start_tokens) / (time.perf_counter() - t_start)
                rep.log(f"step {self.step}/{a.steps}: loss {loss:.4f} lr {entry['lr']:.2e} "
                        f"{rate:,.0f} tok/s" + (f" mfu {entry['mfu']:.1%}" if self.peak else ""))
            if self.step % a.eval_every == 0 or self.step == a.steps:
                val_loss = self._evaluate()
                self._record({"step": self.step, "val_loss": val_loss, "val_bpb": self._bpb(val_loss)})
                rep.log(f"step {self.step}: val loss {val_loss:.4f}")
            if self.step % a.ckpt_every == 0 and self.step < a.steps:
                last_ckpt = self.save() or last_ckpt
        last_ckpt = self.save() or last_ckpt
        elapsed = time.perf_counter() - t_start
        rate = (self.tokens_seen - start_tokens) / max(elapsed, 1e-9)
        if interrupted:
            rep.log(f"interrupted at step {self.step}; checkpoint {last_ckpt}; "
                    "continue with --resume auto")
        summary = {
            "checkpoint": str(last_ckpt), "step": self.step, "steps_requested": a.steps,
            "interrupted": interrupted, "model": a.model,
            "params_m": round(self.model.num_params() / 1e6, 3), "world_size": self.world,
            "global_batch": self.global_batch, "dtype": self.dtype,
            "table_version": self.snap.version, "filter": self.tfilter,
            "tokenizer": self.tok["name"], "tokenizer_sha256": self.tok["sha256"],
            "tokens_seen": self.tokens_seen, "tokens_per_s": round(rate, 1),
            "train_seconds": round(elapsed, 2),
            "data_wait_share": round(data_wait / step_time, 4) if step_time else None,
            "first_val_loss": round(first_val, 4), "val_loss": round(val_loss, 4),
            "val_bpb": round(self._bpb(val_loss), 4) if self._bpb(val_loss) else None,
            "train_loss": round(loss, 4) if self.step > start_step else None,
            "blocks_per_epoch": self.blocks_per_epoch, "git_commit": git_commit(),
        }
        if self.peak and step_time:
            summary["mfu"] = round(self.model.flops_per_token() * (self.tokens_seen - start_tokens)
                                   / step_time / (self.peak * self.world), 4)
        if self.rank == 0:
            (self.out / "summary.json").write_text(json.dumps(summary, indent=2))
        self.rep.materialize(summary)
        rep.log(f"done: step {self.step}, val loss {first_val:.4f} -> {val_loss:.4f}, {rate:,.0f} tok/s")
        return 0
