"""The trainer's settings, defined once.

``TrainConfig`` is the single source, its fields declared with ``table.settings.setting`` like
every settings class of the package: ``python -m lance_assets.train``'s flags are generated from
it (``--seq-len`` for ``seq_len``, the help text and the allowed range from the field), and so is
the Dagster run config of the ``pretrained_model`` asset (``lance_assets.defs.training``), which
adds the launcher's own ``LaunchConfig``. ``check`` enforces the same ranges on both paths.
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from dataclasses import dataclass, fields
from typing import Any, Optional

from lance_assets import paths
from lance_assets.storage import Location
from lance_assets.table.settings import setting, value_problem, value_type
from lance_assets.train import reference_flags
from lance_assets.train.shapes import ARCHS, PRESETS

RUN_NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,99}$")
PLAIN_NAME = ("a plain folder name: letters, digits, '_', '.', '-', not starting with '.', no "
              "'/', at most 100 characters")
DEFAULT_STEPS = 300


class ConfigError(ValueError):
    """A setting outside its allowed range; the message names the flag and the range."""


@dataclass(frozen=True)
class TrainConfig:
    """What one training run reads, trains and writes. The defaults train the demo's `tiny`
    model in about a minute on 2 CPU cores."""

    # data
    data: Optional[str] = setting(None, "data root holding lance/corpus.lance "
                                        "(default $LANCE_ASSETS_DATA or ./data)", run_config=False)
    table: str = setting("corpus", "table name in the data root's Lance database", run_config=False)
    table_version: Optional[int] = setting(None, "table version to read (default: the one "
                                                 "--table-tag names, else the newest, resolved "
                                                 "once by rank 0 for every rank; a resume keeps "
                                                 "its own)", ge=1, run_config=False)
    table_tag: Optional[str] = setting(None, "Lance tag naming the table version to read (the "
                                             "pretrained_model asset tags one per run: "
                                             "train-<run name>); recorded with the run",
                                       run_config=False)
    filter: str = setting("NOT is_dup", "SQL predicate over the table's columns selecting the "
                          "training documents; the validation split is excluded by the trainer "
                          "itself ('': the curation rules in force at the table version the run "
                          "reads, the run config's default)",
                          run_config_default="")
    eval_filter: str = setting("", "SQL predicate selecting the evaluation documents instead of "
                               "the id % VAL_MOD split: they are never trained on (training "
                               "keeps --filter AND NOT this) and are evaluated whatever --filter "
                               "says, so runs with different filters share one held-out set "
                               "(curation_ablation sets its held-out split here)")
    domains: str = setting("", "train on a mixture: its domains as a JSON object {name: SQL "
                           "predicate} (each parsed like --filter; every training document in "
                           "exactly one), or a column whose values name them ('' : one stream)")
    weights: str = setting("", "each domain's share of the training tokens, a JSON object "
                           "{name: share} (normalised to sum 1; held over every window of "
                           "steps); with --domains")
    max_repeats: float = setting(4.0, "refuse a mixture that reads any domain more than this "
                                      "many times over the run (epochs of it)", gt=0)
    val_mod: int = setting(20, "documents with id % VAL_MOD == 0 form the frozen validation split",
                           ge=2)
    tokenizer: Optional[str] = setting(None, "expected tokenizer name; refuse to train if the "
                                             "table's input_ids were written with another")
    pack: bool = setting(True, "pack documents into full blocks in the loader (false: one "
                               "document per sequence, cut or padded)")
    seq_len: int = setting(128, "tokens per training sequence", ge=1)
    num_splits: int = setting(8, "loader splits; a resume works on any world size dividing it",
                              ge=1)
    read_batch_size: int = setting(64, "rows per Lance read in the loader", ge=1)
    io_queue_depth: int = setting(4, "Lance reads in flight in the loader", ge=1)
    transform_parallelism: Optional[int] = setting(None, "loader transform threads "
                                                         "(default: the CPU count)", ge=1)
    transform_queue_depth: Optional[int] = setting(None, "loader transform batches in flight",
                                                   ge=1)
    num_workers: int = setting(0, "loader worker processes per rank (lancedb's "
                                  "StreamingDataLoader): the same blocks in the same order as 0; "
                                  "--num-splits must be a multiple of the world size x this", ge=0)
    mp_context: str = setting("forkserver", "how the loader's worker processes start (never "
                                            "fork: Lance is not fork-safe)",
                              choices=("forkserver", "spawn"))
    # model and optimizer
    model: str = setting("tiny", "model size preset", choices=tuple(PRESETS))
    arch: str = setting("nanogpt", "nanogpt: learned positions, LayerNorm, GELU, tied head, "
                        "AdamW; modern: rotary, RMSNorm, QK-norm, ReLU^2, untied soft-capped "
                        "head, Muon for hidden matrices + AdamW", choices=ARCHS)
    batch_size: int = setting(16, "sequences per rank per micro-step", ge=1)
    grad_accum: int = setting(1, "micro-steps per optimizer step", ge=1)
    steps: Optional[int] = setting(None, f"optimizer steps (default {DEFAULT_STEPS} without "
                                         "--epochs); with --epochs too, the run stops at "
                                         "whichever ends first, and says which", ge=1)
    epochs: Optional[float] = setting(None, "passes over the training documents", gt=0)
    lr: float = setting(5e-3, "peak AdamW learning rate (tuned for tiny; ~6e-4 for small)", gt=0)
    min_lr: float = setting(3e-4, "AdamW learning rate at the end of the cosine decay", ge=0)
    matrix_lr: float = setting(0.02, "peak Muon learning rate of the hidden matrices "
                                     "(arch modern)", gt=0)
    warmup: int = setting(60, "linear warmup steps", ge=0)
    lr_total_steps: Optional[int] = setting(None, "steps of the cosine schedule (default: the "
                                                  "run's steps); set it when --steps stops a run "
                                                  "short of its schedule", ge=1)
    weight_decay: float = setting(0.1, "weight decay of the matrices", ge=0)
    dtype: str = setting("auto", "autocast dtype (auto: bfloat16 on GPUs that support it, "
                                 "else float32)", choices=("auto", "bfloat16", "float32"))
    compile: bool = setting(False, "torch.compile the model")
    seed: int = setting(1337, "seed of the initial weights and of the loader's shuffle", ge=0)
    # the once-in-a-while blocks
    eval_every: int = setting(50, "steps between validation passes", ge=1)
    eval_blocks: int = setting(32, "validation blocks per pass", ge=1)
    ckpt_every: int = setting(100, "steps between checkpoints", ge=1)
    keep_ckpts: int = setting(2, "checkpoints kept in the run folder", ge=1)
    log_every: int = setting(10, "steps between progress lines", ge=1)
    log_batch_hashes: bool = setting(False, "log the sorted hashes of every step's blocks "
                                            "(all ranks) to metrics.jsonl")
    resume: Optional[str] = setting(None, "'auto' (the newest good checkpoint in the run "
                                          "folder) or a checkpoint path")
    out: Optional[str] = setting(None, "run folder (default DATA/train/manual)", run_config=False)


@dataclass(frozen=True)
class LaunchConfig:
    """How the ``pretrained_model`` asset launches the trainer (not trainer flags)."""

    nproc_per_node: int = setting(1, "processes (GPUs) per node for torchrun", ge=1)
    nnodes: int = setting(1, "nodes, one torchrun agent each, joined by a c10d rendezvous "
                             "(launcher local: that many agents on this machine); a resume works "
                             "on any nnodes x nproc_per_node dividing num_splits", ge=1)
    launcher: str = setting("local", "local: torchrun agents as subprocesses of the run; ray: a "
                                     "Ray job with one agent per Ray node (the cluster at "
                                     "$RAY_ADDRESS, else a local Ray started for the run)",
                            choices=("local", "ray"))
    run_name: str = setting("", "folder under DATA/train for checkpoints: a plain name (letters, "
                                "digits, '_', '.', '-'); default: the Dagster run id's first "
                                "8 characters", pattern=RUN_NAME_RE, pattern_words=PLAIN_NAME)


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def check_value(cls, name: str, value: Any) -> Any:
    """``value`` if the field allows it, else ``ConfigError`` naming the flag and the range."""
    problem = value_problem(cls, name, value)
    if problem:
        raise ConfigError(f"{flag(name)} {value!r}: {problem}")
    return value


def mixture_problem(cfg) -> str | None:
    """What makes ``cfg``'s mixture settings (``domains``, ``weights``) unusable together with
    the rest, or None (``cfg``: the trainer's or the run config's settings)."""
    if bool(cfg.domains.strip()) != bool(cfg.weights.strip()):
        return "--domains and --weights go together: give both (or neither)"
    if not cfg.domains.strip():
        return None
    if not cfg.pack:
        return "--domains: a mixture is drawn in packed blocks; drop --no-pack"
    if cfg.epochs is not None:
        return "--domains: a mixture trains --steps (each domain has its own epochs); drop --epochs"
    if cfg.num_workers:
        return "--domains: a mixture is read in the training process; use --num-workers 0"
    return None


def settings_problem(cfg) -> str | None:
    """What makes ``cfg``'s settings inconsistent with one another, or None (``cfg``: the
    trainer's settings or the run config's: each rule is written here once, in flag words)."""
    if cfg.min_lr > cfg.lr:
        return f"--min-lr {cfg.min_lr}: must not exceed --lr {cfg.lr}"
    return mixture_problem(cfg)


def check(cfg: TrainConfig | LaunchConfig) -> None:
    """Every field in range, and the settings consistent with one another."""
    for f in fields(cfg):
        check_value(type(cfg), f.name, getattr(cfg, f.name))
    problem = settings_problem(cfg) if isinstance(cfg, TrainConfig) else None
    if problem:
        raise ConfigError(problem)


def world_problem(cfg, world: int, world_is: str | None = None) -> str | None:
    """What keeps ``cfg``'s loader splits (``num_splits``, ``num_workers``, ``batch_size``,
    ``grad_accum``) from dividing among ``world`` ranks and their loader workers, or ending
    every step where the loader can be checkpointed; None when nothing does. ``world_is``: how
    the caller's user sets the world (a launch's ``nnodes x nproc_per_node``)."""
    if cfg.num_splits % world:
        if world_is:
            return f"{world_is} = {world} must divide --num-splits {cfg.num_splits}"
        return f"--num-splits {cfg.num_splits} must be divisible by the world size {world}"
    splits_per_rank = cfg.num_splits // world
    if cfg.num_workers and splits_per_rank % cfg.num_workers:
        return (f"--num-splits {cfg.num_splits} must be divisible by the world size x "
                f"--num-workers ({world} x {cfg.num_workers}): each worker reads its own splits")
    if (cfg.batch_size * cfg.grad_accum) % splits_per_rank:
        return (f"--batch-size x --grad-accum ({cfg.batch_size * cfg.grad_accum}) must be a "
                f"multiple of the splits per rank ({splits_per_rank}) so every step ends on a "
                "checkpointable loader boundary")
    return None


def check_world(cfg: TrainConfig, world: int) -> None:
    """``world_problem`` as the trainer's error, for the world it was started in."""
    problem = world_problem(cfg, world)
    if problem:
        raise ConfigError(problem)


def config_words(message: str) -> str:
    """A problem in flag words (``--min-lr``, ``--no-pack``) in run-config words (``min_lr``,
    ``pack: false``), for the Dagster configs that share these rules."""
    message = message.replace("--no-pack", "pack: false")
    return re.sub(r"--([a-z-]+)", lambda m: m.group(1).replace("-", "_"), message)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, not the whole usage block
        self.exit(2, f"{self.prog}: error: {message}\n")


def _argparse_type(cls, name: str, kind: type):
    def convert(text: str):
        try:
            value = kind(text)
        except ValueError:
            what = "an integer" if kind is int else "a number"
            raise argparse.ArgumentTypeError(f"{text!r} is not {what}") from None
        try:
            return check_value(cls, name, value)
        except ConfigError as e:
            raise argparse.ArgumentTypeError(f"{text!r} " + str(e).split(": ", 1)[1]) from None
    convert.__name__ = kind.__name__
    return convert


def build_parser(cls=TrainConfig, *, prog: str = "python -m lance_assets.train",
                 description: str | None = None) -> argparse.ArgumentParser:
    """One flag per field: the field's help, its default, its range checked while parsing."""
    p = _Parser(prog=prog, description=description,
                formatter_class=argparse.RawDescriptionHelpFormatter)
    for f in fields(cls):
        kind = value_type(cls, f.name)
        help = f.metadata["help"].replace("%", "%%")
        if kind is bool:
            p.add_argument(flag(f.name), action=argparse.BooleanOptionalAction, default=f.default,
                           help=help)
        elif f.metadata["choices"]:
            p.add_argument(flag(f.name), default=f.default, choices=f.metadata["choices"],
                           help=help + " (default: %(default)s)")
        elif kind is str:
            p.add_argument(flag(f.name), default=f.default, type=_argparse_type(cls, f.name, str),
                           help=help + (" (default: %(default)s)" if f.default else ""))
        else:
            p.add_argument(flag(f.name), default=f.default, type=_argparse_type(cls, f.name, kind),
                           help=help + (" (default: %(default)s)" if f.default is not None else ""))
    return p


def parse_args(argv: list[str] | None = None, description: str | None = None) -> TrainConfig:
    """The command line as a ``TrainConfig`` (argparse exits 2 with one line on a bad flag)."""
    parser = build_parser(description=description)
    refused = reference_flags.refusal(sys.argv[1:] if argv is None else argv)
    if refused:
        parser.error(refused)
    ns = parser.parse_args(argv)
    cfg = TrainConfig(**vars(ns))
    try:
        check(cfg)
    except ConfigError as e:
        build_parser().error(str(e))
    return cfg


def planned_steps(cfg: TrainConfig, blocks_per_epoch: int, global_batch: int) -> tuple[int, str]:
    """The optimizer steps the run trains and why: ``--steps``, ``--epochs``, or both (the one
    that ends first wins, as in the reference recipe)."""
    if cfg.epochs is None:
        steps = cfg.steps or DEFAULT_STEPS
        return steps, f"--steps {steps}"
    epoch_steps = max(1, math.ceil(cfg.epochs * blocks_per_epoch / global_batch))
    if cfg.steps is None:
        return epoch_steps, f"--epochs {cfg.epochs:g}: {epoch_steps} steps"
    if cfg.steps <= epoch_steps:
        return cfg.steps, (f"--steps {cfg.steps} ends before --epochs {cfg.epochs:g} "
                           f"({epoch_steps} steps): {cfg.steps} steps")
    return epoch_steps, (f"--epochs {cfg.epochs:g} ({epoch_steps} steps) ends before --steps "
                         f"{cfg.steps}: {epoch_steps} steps")


def data_root(cfg: TrainConfig) -> Location:
    """The data root: ``--data``, else ``$LANCE_ASSETS_DATA``, else ``./data``
    (``paths.data_dir``)."""
    return paths.data_dir(cfg.data or None)


def to_flags(values: dict) -> list[str]:
    """Trainer flags for ``values`` (field name -> value); None means the trainer's default."""
    out: list[str] = []
    for name, value in values.items():
        if value is None:
            continue
        if value_type(TrainConfig, name) is bool:
            out.append(flag(name) if value else "--no-" + flag(name)[2:])
        else:
            out += [flag(name), str(value)]
    return out

