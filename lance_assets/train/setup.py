"""A training run's parts, built once at its start and handed to the loop.

What to resume (the checkpoint ``--resume`` names), the data (one table version for every rank
and node, the training and validation split, the steps, the frozen validation blocks), the model
and its optimizers (restored on resume), and this rank's loader. Each part is a function of the
settings and the parts before it; the table is the ``Table`` the entry point resolved.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch.nn.parallel import DistributedDataParallel as DDP

from lance_assets.table import Table
from lance_assets.train import checkpoint, config, data, mixture
from lance_assets.train.collectives import Collectives
from lance_assets.train.config import TrainConfig
from lance_assets.train.model import GPT, GPTConfig, config_for
from lance_assets.train.split import RunFilter, run_filter
from lance_assets.train.step import make_optimizers


class TrainError(RuntimeError):
    """A mistake in what the trainer was asked to do: reported in one line, exit status 2."""


def resume_checkpoint(cfg: TrainConfig, out: Path,
                      log: Callable[[str], None]) -> tuple[Path | None, dict | None]:
    """The checkpoint ``--resume`` names, loaded (none without ``--resume``)."""
    try:
        return checkpoint.load_for_resume(cfg.resume, out, log=log)
    except FileNotFoundError as e:
        raise TrainError(str(e)) from None


# ---- data: one table version for every rank, the split, the epoch's block budget


def open_table(table: Table, cfg: TrainConfig, version: int | None,
               tag: str | None = None) -> data.TableSnapshot:
    try:
        return data.open_snapshot(table, version, tag)
    except Exception as e:  # a missing folder, table or version: the user's input
        raise TrainError(f"--data {table.root} --table {table.name}"
                         + (f" (version {version})" if version else "")
                         + f": cannot read the table: {str(e).splitlines()[0][:300]}"
                         + (f". The run's snapshot tag {tag!r} protects that version from "
                            "cleanup; was it released (table_maintenance release_snapshots)?"
                            if tag else "")) from None


def pinned_version(table: Table, cfg: TrainConfig, ckpt: dict | None,
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
            answer = ("ok", table.choose(cfg.table_tag).version)
        except Exception as e:  # a missing table or tag: reported on every rank alike
            answer = ("error", f"--data {table.root} --table {table.name}"
                               + (f" --table-tag {cfg.table_tag}" if cfg.table_tag else "")
                               + f": {str(e).splitlines()[0][:300]}")
    status, value = comm.gather_lists([answer])[0]
    if status == "error":
        raise TrainError(value)
    return int(value), cfg.table_tag


@dataclass
class RunData:
    """What the run reads: one table version, its training and validation split, the steps,
    and the frozen validation blocks."""

    snap: data.TableSnapshot
    table_tag: str | None
    filter: RunFilter  # --filter, or the curation rules in force at the pinned version
    split: data.Splits
    block_len: int
    blocks_per_epoch: int
    global_batch: int
    steps: int
    steps_why: str  # which of --steps and --epochs decided them
    val: data.ValBlocks
    val_tokens_per_byte: float | None
    mixture: mixture.Mixture | None = None  # --domains: blocks drawn per domain by weight
    redacted: dict | None = None  # forget redacted its snapshot since the checkpoint

    @property
    def tok(self) -> dict:
        return self.snap.tokenizer



def load_data(cfg: TrainConfig, table: Table, ckpt: dict | None, comm: Collectives) -> RunData:
    version, table_tag = pinned_version(table, cfg, ckpt, comm)
    snap = open_table(table, cfg, version, table_tag)
    tok = snap.tokenizer
    if cfg.tokenizer and cfg.tokenizer != tok["name"]:
        raise TrainError(f"--tokenizer {cfg.tokenizer}: the table's input_ids were written with "
                         f"{tok['name']!r}; re-tokenize (token_ids) or drop --tokenizer")
    chosen = run_filter(snap.table.to_lance(), cfg.filter)  # '': the rules at this version
    split = data.splits(chosen.text, cfg.val_mod, snap.table.schema.names, cfg.eval_filter)
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
    return RunData(snap, table_tag, chosen, split, block_len, blocks_per_epoch, global_batch,
                   steps, steps_why, val, val_tokens_per_byte,
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


def restore(net: Net, ckpt: dict | None, resume_path: Path | None, log: Callable[[str], None],
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
    saved_opts = ckpt["optimizer"] if isinstance(ckpt["optimizer"], list) else [ckpt["optimizer"]]
    peaks = [[g["peak_lr"] for g in opt.param_groups] for opt in net.optimizers]
    try:
        net.model.load_state_dict(ckpt["model"])
        for opt, saved, peak in zip(net.optimizers, saved_opts, peaks):
            opt.load_state_dict(saved)
            for group, lr in zip(opt.param_groups, peak):  # this run's LRs, not the saved ones
                group["peak_lr"] = lr
    except Exception as e:  # noqa: BLE001 - the file's contents, whatever they hold
        said = str(e).strip().splitlines()[0][:200] if str(e).strip() else ""
        raise TrainError(f"--resume: {resume_path}: its weights or optimizer states do not fit "
                         f"this model ({type(e).__name__}: {said}); resume another checkpoint "
                         "or start a new --out") from None
    progress = Progress(ckpt["step"], ckpt["epoch"], ckpt["tokens_seen"], ckpt["loader"])
    log(f"resumed from {resume_path} at step {progress.step} (saved at world size "
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
    if run_data.redacted and saved is not None:  # resumed on a copy forget made since
        saved = (mixture.across_redaction(saved, run_data.mixture) if run_data.mixture
                 else data.across_redaction(saved, run_data.blocks_per_epoch))
    if run_data.mixture is not None:
        return mixture.batches_for_run(cfg, run_data.snap, run_data.mixture, saved,
                                       block_len=run_data.block_len, rank=comm.rank,
                                       world_size=comm.world, permutations=out / "permutations")
    if saved is not None and "mixture" in saved:
        raise TrainError("--resume: the checkpoint trained on a mixture; resume it with its "
                         "--domains and --weights, or start a new --out")
    return data.TrainBatches(
        run_data.snap, epoch=progress.epoch, state=saved,
        batch_size=cfg.batch_size, grad_accum=cfg.grad_accum, num_workers=cfg.num_workers,
        start_method=cfg.mp_context, filter=run_data.split.train.lance,
        block_len=run_data.block_len, blocks_per_epoch=run_data.blocks_per_epoch,
        num_splits=cfg.num_splits, rank=comm.rank, world_size=comm.world, seed=cfg.seed,
        pack=cfg.pack, read_batch_size=cfg.read_batch_size, io_queue_depth=cfg.io_queue_depth,
        transform_parallelism=cfg.transform_parallelism,
        transform_queue_depth=cfg.transform_queue_depth, permutations=out / "permutations")

