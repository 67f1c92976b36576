"""Pretrain a compact GPT on the corpus table.

    python -m lance_assets.train --data ./data --steps 300
    torchrun --standalone --nproc-per-node 2 -m lance_assets.train --data ./data --steps 300

Under Dagster Pipes (the ``pretrained_model`` asset) rank 0 streams logs and reports the final
metrics as the asset's materialization; every rank otherwise runs exactly the same code.
SIGINT/SIGTERM finish the current step, write a checkpoint and exit; ``--resume auto``
continues, on any world size that divides ``--num-splits`` (keep the global batch:
world size x --batch-size x --grad-accum).

Read top to bottom: helpers, the step, evaluation, then ``train`` (setup) and ``_train``, a
short sequence of named steps, each defined below it in order: the checkpoint to resume, the
data, the model and optimizers (restored on resume), the loader, the once-in-a-while blocks
(validate, record, checkpoint), the loop, the summary; then ``main``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch.nn.parallel import DistributedDataParallel as DDP

from lance_assets import paths, storage
from lance_assets.curation.predicate import PredicateError
from lance_assets.launch.signals import StopRequested
from lance_assets.table import Table
from lance_assets.train import checkpoint, config, data, mixture, read_record
from lance_assets.train.collectives import Collectives, launched_by_torchrun
from lance_assets.train.config import ConfigError, TrainConfig, data_root, parse_args
from lance_assets.train.model import GPT, GPTConfig, config_for

# Dense bf16 peak FLOP/s per device, for MFU (matched against torch.cuda.get_device_name()).
PEAK_FLOPS = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "L40S": 362e12, "L4": 121e12,
              "A10": 125e12, "RTX 4090": 165e12, "V100": 125e12, "T4": 65e12}


class TrainError(RuntimeError):
    """A mistake in what the trainer was asked to do: reported in one line, exit status 2."""


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


class StopFlag(StopRequested):
    """Set by SIGINT/SIGTERM; the loop stops at the next step boundary, all ranks together."""
    def agreed(self, comm: Collectives) -> bool:
        return comm.any(self.requested)


def lr_scale(step: int, cfg: TrainConfig, steps: int) -> float:
    """Linear warmup to 1, then cosine decay to min_lr / lr over --lr-total-steps (default: the
    run's steps): the multiplier of every peak LR."""
    if step < cfg.warmup:
        return (step + 1) / cfg.warmup
    floor = cfg.min_lr / cfg.lr
    steps = cfg.lr_total_steps or steps
    progress = min(1.0, (step - cfg.warmup) / max(1, steps - cfg.warmup))
    return floor + 0.5 * (1 - floor) * (1 + math.cos(math.pi * progress))


def block_hashes(blocks: list[torch.Tensor]) -> list[str]:
    return [hashlib.blake2b(b.numpy().tobytes(), digest_size=8).hexdigest()
            for batch in blocks for b in batch.cpu()]


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


def corpus_table(root: Path, cfg: TrainConfig) -> Table:
    """The table ``--table`` under the data root ``root``."""
    return Table.of(storage.uri_of(root), name=cfg.table)


def open_table(root: Path, cfg: TrainConfig, version: int | None,
               tag: str | None = None) -> data.TableSnapshot:
    try:
        return data.open_snapshot(corpus_table(root, cfg), cfg.table, version)
    except Exception as e:  # a missing folder, table or version: the user's input
        raise TrainError(f"--data {root} --table {cfg.table}"
                         + (f" (version {version})" if version else "")
                         + f": cannot read the table: {str(e).splitlines()[0][:300]}"
                         + (f". The run's snapshot tag {tag!r} protects that version from "
                            "cleanup; was it released (table_maintenance release_snapshots)?"
                            if tag else "")) from None


def pinned_version(root: Path, cfg: TrainConfig, ckpt: dict | None,
                   comm: Collectives) -> tuple[int, str | None]:
    """(table version, snapshot tag) this run reads, the same on every rank and node: the
    checkpoint's on resume, else ``--table-version``, else the version ``--table-tag`` names,
    else the newest. Rank 0 resolves it and the others take its answer, so a commit landing
    while the ranks start cannot split them over two versions."""
    if ckpt:
        return int(ckpt["table_version"]), ckpt.get("table_tag")
    if cfg.table_version is not None:
        return cfg.table_version, cfg.table_tag
    answer: tuple = ()
    if comm.rank == 0:
        try:
            answer = ("ok", corpus_table(root, cfg).choose(cfg.table_tag).version)
        except Exception as e:  # a missing table or tag: reported on every rank alike
            answer = ("error", f"--data {root} --table {cfg.table}"
                               + (f" --table-tag {cfg.table_tag}" if cfg.table_tag else "")
                               + f": {str(e).splitlines()[0][:300]}")
    status, value = comm.gather_lists([answer])[0]
    if status == "error":
        raise TrainError(value)
    return int(value), cfg.table_tag


def train(cfg: TrainConfig) -> dict:
    """One training run; returns the summary (also written to OUT/summary.json)."""
    # ---- setup: device, world, process group
    world = int(os.environ.get("WORLD_SIZE", 1)) if launched_by_torchrun() else 1
    config.check_world(cfg, world)
    if torch.cuda.is_available():
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    root = data_root(cfg)
    out = storage.location(cfg.out) if cfg.out else paths.run_dir(root, "manual")
    stop = StopFlag()
    comm = Collectives.start(device)
    with contextlib.ExitStack() as stack:
        stack.callback(comm.close)
        report = Reporter(comm.rank, stack)
        return _train(cfg, comm, device, root, out, stop, report)


def _train(cfg: TrainConfig, comm: Collectives, device: torch.device, root: Path, out: Path,
           stop: StopFlag, report: Reporter) -> dict:
    """The run, step by step: what to resume, the data, the model and its optimizers (restored
    on resume), the loader, the loop, the summary."""
    resume_path, ckpt = resume_checkpoint(cfg, out, report)
    run_data = load_data(cfg, root, ckpt, comm)
    net = build_model(cfg, device, run_data.tok["vocab_size"])
    progress = restore(net, ckpt, resume_path, report, comm.world)
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


# ---- setup: the checkpoint to resume


def resume_checkpoint(cfg: TrainConfig, out: Path, report: Reporter) -> tuple[Path | None, dict | None]:
    """The checkpoint ``--resume`` names, loaded (none without ``--resume``)."""
    try:
        return checkpoint.load_for_resume(cfg.resume, out, log=report.log)
    except FileNotFoundError as e:
        raise TrainError(str(e)) from None


# ---- data: one table version for every rank, the split, the epoch's block budget


@dataclass
class RunData:
    """What the run reads: one table version, its training and validation split, the steps,
    and the frozen validation blocks."""

    snap: data.TableSnapshot
    table_tag: str | None
    split: data.Splits
    block_len: int
    blocks_per_epoch: int
    global_batch: int
    steps: int
    steps_why: str  # which of --steps and --epochs decided them
    val: data.ValBlocks
    val_tokens_per_byte: float | None
    mixture: mixture.Mixture | None = None  # --domains: blocks drawn per domain by weight

    @property
    def tok(self) -> dict:
        return self.snap.tokenizer


def load_data(cfg: TrainConfig, root: Path, ckpt: dict | None, comm: Collectives) -> RunData:
    version, table_tag = pinned_version(root, cfg, ckpt, comm)
    snap = open_table(root, cfg, version, table_tag)
    tok = snap.tokenizer
    if cfg.tokenizer and cfg.tokenizer != tok["name"]:
        raise TrainError(f"--tokenizer {cfg.tokenizer}: the table's input_ids were written with "
                         f"{tok['name']!r}; re-tokenize (token_ids) or drop --tokenizer")
    split = data.splits(cfg.filter, cfg.val_mod, snap.table.schema.names, cfg.eval_filter)
    block_len = cfg.seq_len + 1
    try:
        if cfg.pack:
            blocks_per_epoch = data.count_blocks(snap, split.train.lance, block_len, cfg.num_splits)
        else:
            blocks_per_epoch = data.count_rows(snap, split.train.lance, cfg.num_splits)
    except data.TooLittleData as e:
        raise TrainError(str(e)) from None
    global_batch = cfg.batch_size * cfg.grad_accum * comm.world
    steps, steps_why = config.planned_steps(cfg, blocks_per_epoch, global_batch)
    val = data.val_blocks(snap, filter=split.val.lance, block_len=block_len,
                          max_blocks=cfg.eval_blocks)
    val_tokens_per_byte = data.tokens_per_byte(snap, split.val.lance)
    return RunData(snap, table_tag, split, block_len, blocks_per_epoch, global_batch, steps,
                   steps_why, val, val_tokens_per_byte,
                   mixture.for_run(cfg, snap, split.train, block_len, steps, global_batch))


# ---- model and optimizer


@dataclass
class Net:
    """The model, its optimizers and its autocast."""

    model: GPT
    model_cfg: GPTConfig
    optimizers: list[torch.optim.Optimizer]
    use_bf16: bool
    autocast: Callable


def build_model(cfg: TrainConfig, device: torch.device, vocab_size: int) -> Net:
    torch.manual_seed(cfg.seed)
    if cfg.dtype == "auto":
        use_bf16 = device.type == "cuda" and torch.cuda.is_bf16_supported()
    else:
        use_bf16 = cfg.dtype == "bfloat16"
    autocast = lambda: torch.autocast(device.type, dtype=torch.bfloat16, enabled=use_bf16)  # noqa: E731
    model_cfg = config_for(cfg.model, vocab_size, cfg.seq_len, cfg.arch)
    model = GPT(model_cfg).to(device)
    optimizers = make_optimizers(model, cfg, device)
    return Net(model, model_cfg, optimizers, use_bf16, autocast)


@dataclass
class Progress:
    """Where the run stands: from the checkpoint on resume, advanced by every step."""

    step: int = 0
    epoch: int = 0
    tokens_seen: int = 0
    loader_state: dict | None = None


def restore(net: Net, ckpt: dict | None, resume_path: Path | None, report: Reporter,
            world: int) -> Progress:
    """The checkpoint's weights, optimizer states (with this run's peak LRs) and progress; a
    fresh start without one."""
    if not ckpt:
        return Progress()
    saved_cfg = {"arch": "nanogpt", **ckpt["model_config"]}  # older checkpoints: no arch
    if saved_cfg != asdict(net.model_cfg):
        raise TrainError(f"--resume: {resume_path} holds a {saved_cfg} model; this run asks "
                         f"for {asdict(net.model_cfg)} (keep --model, --arch and --seq-len, or "
                         "start a new --out)")
    net.model.load_state_dict(ckpt["model"])
    saved_opts = ckpt["optimizer"] if isinstance(ckpt["optimizer"], list) else [ckpt["optimizer"]]
    peaks = [[g["peak_lr"] for g in opt.param_groups] for opt in net.optimizers]
    for opt, saved, peak in zip(net.optimizers, saved_opts, peaks):
        opt.load_state_dict(saved)
        for group, lr in zip(opt.param_groups, peak):  # this run's LRs, not the saved ones
            group["peak_lr"] = lr
    progress = Progress(ckpt["step"], ckpt["epoch"], ckpt["tokens_seen"], ckpt["loader"])
    report.log(f"resumed from {resume_path} at step {progress.step} (saved at world size "
               f"{ckpt['world_size']}, now {world})")
    return progress


def distribute(model: GPT, cfg: TrainConfig, comm: Collectives,
               device: torch.device) -> torch.nn.Module:
    """The module the steps call: compiled when asked, wrapped in DDP when a process group is
    open."""
    step_model = torch.compile(model) if cfg.compile else model
    if comm.group_open:
        step_model = DDP(step_model, device_ids=[device.index] if device.type == "cuda" else None)
    return step_model


def train_batches(cfg: TrainConfig, run_data: RunData, progress: Progress,
                  comm: Collectives, out: Path) -> data.TrainBatches | mixture.MixtureBatches:
    """This rank's training blocks, from where the checkpoint's loader stood. Each epoch's
    shuffle permutation is built once, by rank 0, under ``OUT/permutations`` and read from
    there by every rank (and by a resume on any world size); a mixture draws them from one
    stream per domain (``train.mixture``)."""
    saved = progress.loader_state
    if run_data.mixture is not None:
        return mixture.batches_for_run(cfg, run_data.snap, run_data.mixture, saved,
                                       block_len=run_data.block_len, rank=comm.rank,
                                       world_size=comm.world, permutations=out / "permutations")
    if saved is not None and "mixture" in saved:
        raise TrainError("--resume: the checkpoint trained on a mixture; resume it with its "
                         "--domains and --weights, or start a new --out")
    return data.TrainBatches(
        run_data.snap, epoch=progress.epoch, state=progress.loader_state,
        batch_size=cfg.batch_size, grad_accum=cfg.grad_accum, num_workers=cfg.num_workers,
        start_method=cfg.mp_context, filter=run_data.split.train.lance,
        block_len=run_data.block_len, blocks_per_epoch=run_data.blocks_per_epoch,
        num_splits=cfg.num_splits, rank=comm.rank, world_size=comm.world, seed=cfg.seed,
        pack=cfg.pack, read_batch_size=cfg.read_batch_size, io_queue_depth=cfg.io_queue_depth,
        transform_parallelism=cfg.transform_parallelism,
        transform_queue_depth=cfg.transform_queue_depth, permutations=out / "permutations")


# ---- the once-in-a-while blocks: validate, record, checkpoint


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


# ---- the loop


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


# ---- summary


def finish(run: Run, loop: LoopResult) -> dict:
    """The run's summary: written with the held-out losses per document (rank 0), reported as
    the Pipes materialization, returned."""
    cfg, d, p, report = run.cfg, run.run_data, run.progress, run.report
    elapsed = time.perf_counter() - loop.t_start
    rate = (p.tokens_seen - loop.start_tokens) / max(elapsed, 1e-9)
    if loop.interrupted:
        report.log(f"interrupted at step {p.step}; checkpoint {loop.last_ckpt}; "
                   f"{report.resume_hint}")
    summary = summarize(run, loop, elapsed, rate)
    last_eval = loop.last_eval
    if run.comm.rank == 0:  # the held-out losses per document first: a summary names a finished run
        storage.write_atomic(run.out / paths.HELD_OUT_FILE, json.dumps({
            "step": loop.val_step, "tokens_per_byte": d.val_tokens_per_byte,
            "doc_loss": [round(v, 6) for v in last_eval.doc_loss],
            "doc_tokens": last_eval.doc_tokens}).encode())
        storage.write_atomic(run.out / "summary.json", json.dumps(summary, indent=2).encode())
    report.materialize(mixture.flat(summary))
    if loop.val_step > loop.start_step:
        val_text = f"val loss {loop.first_val:.4f} -> {loop.val_loss:.4f}"
    else:
        val_text = (f"no evaluation ran after step {loop.start_step} (eval_every "
                    f"{cfg.eval_every}); val loss at step {loop.start_step}: {loop.first_val:.4f}")
    report.log(f"done: step {p.step}, {val_text}, {rate:,.0f} tok/s")
    return summary


def summarize(run: Run, loop: LoopResult, elapsed: float, rate: float) -> dict:
    """``summary.json``: what was trained on what, how fast, and the held-out loss."""
    cfg, d, p, net, bpb = run.cfg, run.run_data, run.progress, run.net, run.bpb
    last_eval = loop.last_eval
    final_bpb = bpb(loop.val_loss)
    run_mfu = run.mfu(p.tokens_seen - loop.start_tokens, loop.step_time)
    summary = {
        "checkpoint": str(loop.last_ckpt), "step": p.step, "steps_requested": d.steps,
        "interrupted": loop.interrupted, "model": cfg.model, "arch": cfg.arch,
        "params_m": round(net.model.num_params() / 1e6, 3), "world_size": run.comm.world,
        "global_batch": d.global_batch, "dtype": "bfloat16" if net.use_bf16 else "float32",
        "table_version": d.snap.version, "table_tag": d.table_tag or "",
        "filter": d.split.train.lance, "eval_filter": d.split.val.lance,
        "tokenizer": d.tok["name"], "tokenizer_sha256": d.tok["sha256"],
        "tokens_seen": p.tokens_seen, "tokens_per_s": round(rate, 1),
        "train_seconds": round(elapsed, 2),
        "data_wait_share": round(loop.data_wait / loop.step_time, 4) if loop.step_time else None,
        "first_val_loss": round(loop.first_val, 4), "val_loss": round(loop.val_loss, 4),
        "val_loss_step": loop.val_step,
        "val_bpb": round(final_bpb, 4) if final_bpb else None,
        "val_loss_se": round(last_eval.loss_se, 5) if last_eval.loss_se is not None else None,
        "val_bpb_se": round(bpb(last_eval.loss_se), 5) if bpb(last_eval.loss_se) is not None
        else None,
        "eval_blocks": len(d.val), "eval_docs": len(last_eval.doc_tokens),
        "eval_tokens": sum(last_eval.doc_tokens),
        "train_loss": round(loop.loss, 4) if p.step > loop.start_step else None,
        "blocks_per_epoch": d.blocks_per_epoch, "git_commit": run.commit,
    }
    if run_mfu is not None:
        summary["mfu"] = round(run_mfu, 4)
    if d.mixture is not None and run.loader is not None:
        summary["domains"] = mixture.read_by_domain(run.loader, d.mixture)
    return summary


USER_ERRORS = (TrainError, ConfigError, PredicateError, checkpoint.CheckpointError)


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
