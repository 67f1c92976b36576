"""The settings of a curation ablation and of a mixture search, defined once.

Each is a frozen dataclass of ``setting(default, help, ...)`` fields (``table.settings``), the
proxy models' ranges the trainer's own. The library reads them (``runner.run_ablation``,
``mixture.run_search``); the Dagster layer makes the run config of ``curation_ablation`` and
``mixture_search`` from them, with ``ablation_problem`` and ``mixture_problem`` checking the
rules across settings before a run starts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from lance_assets.table.executor import executor_name
from lance_assets.table.settings import setting
from lance_assets.train import config as train_config
from lance_assets.train.shapes import ARCHS, PRESETS

NUM_SPLITS = 8  # the trainer's default loader splits
SEEDS = (0, 1, 2)


def _seeds() -> list[int]:
    return list(SEEDS)


@dataclass(frozen=True)
class AblationSettings:
    """Which rule sets to compare and how big the proxy models and their budget are. The
    defaults (two arms, three seeds, a `tiny` model on 262k tokens each, 512 held-out blocks)
    tell a planted fifth of junk tokens from clean text in a few minutes on 2 CPU cores; see
    docs/benchmarks.md."""

    name: str = setting(
        "", "the ablation's name: its runs live in DATA/ablations/<name> and its table version "
        "is tagged ablation-<name> (a rerun with the same name reuses both; a new name pins the "
        "newest version). Empty: `v<newest table version>`, so a rerun on the same data reuses "
        "every finished run and new data starts a new ablation",
        pattern=train_config.RUN_NAME_RE, pattern_words=train_config.PLAIN_NAME)
    rule_sets: dict[str, dict[str, str]] = setting(
        default_factory=dict, help="arm name -> {rule name: SQL keep-predicate}, checked like "
        "curation_rules; {} for an arm keeps every document. Empty: two arms, `curation_rules` "
        "(the rules in force) and `no_rules`")
    model: str = setting("tiny", "proxy model size preset", choices=tuple(PRESETS))
    arch: str = setting("nanogpt", "proxy model architecture", choices=ARCHS)
    seq_len: int = setting(64, "tokens per training sequence", ge=1)
    batch_size: int = setting(8, "sequences per rank per step (a multiple of 8 / "
                                 "nproc_per_node)", ge=1)
    token_budget: int = setting(262_144, "target tokens every arm trains on (rounded up to "
                                "whole steps); the default is 512 steps of the default batch, "
                                "past the early steps where a proxy model has learned little "
                                "more than byte frequencies and arms differ by chance")
    # the run config's default a value, not a factory: the launchpad shows it
    seeds: list[int] = setting(default_factory=_seeds, run_config_default=list(SEEDS),
                               help="one run per arm and seed; seed s "
                               "starts every arm from the same weights, and the spread of the "
                               "per-seed differences says whether a lead is real (at least two; "
                               "three give the t-test two degrees of freedom)")
    lr: float = setting(5e-3, "peak learning rate", gt=0)
    eval_filter: str = setting("NOT is_dup", "neutral SQL predicate of the documents the "
                               "held-out split is drawn from")
    eval_pct: int = setting(10, "per cent of those documents held out (by a fixed hash of the "
                            "id); no arm trains on them")
    eval_blocks: int = setting(512, "held-out blocks per evaluation, the same blocks for every "
                               "arm, spread over the held-out documents", ge=1)
    evals_per_run: int = setting(4, "validation passes per run (the curves)")
    min_lead: float = setting(0.0, "the smallest lead (held-out bits/byte) the comparison must "
                              "be able to detect: after each round of seeds the asset reports "
                              "the smallest lead its seeds and budget can detect (95 % level, "
                              "power 0.8) and warns, before the remaining seeds train, when "
                              "that is larger. 0: report only")
    stop_when_underpowered: bool = setting(False, "stop after the round of seeds that shows "
                                           "min_lead cannot be detected, instead of training "
                                           "the remaining seeds")
    allow_repeats: bool = setting(False, "train an arm whose kept tokens are fewer than the "
                                  "budget on repeated data (epochs > 1); false: report it and "
                                  "skip it")
    nproc_per_node: int = setting(1, "torchrun processes per run")


@dataclass(frozen=True)
class MixtureSettings:
    """The domains to mix, the target, and the size of the swarm and of each run. The defaults
    (5 proxies per domain, then 3 mixtures x 3 seeds, a `tiny` model on 131k tokens per run,
    512 steps of 8 x 32) finish within 20 minutes on 2 CPU cores for three domains; see
    docs/benchmarks.md."""

    name: str = setting(
        "", "the search's name: its runs live in DATA/ablations/mixture-<name> and its table "
        "version is tagged ablation-mixture-<name> (a rerun with the same name reuses both). "
        "Empty: named after the data it searches on",
        pattern=train_config.RUN_NAME_RE, pattern_words=train_config.PLAIN_NAME)
    domains: dict[str, str] = setting(
        default_factory=dict, help="domain name -> SQL predicate over the table's columns "
        "(parsed like a curation rule); every document of the mixture must be in exactly one. "
        "Empty: one domain per value of domain_column")
    domain_column: str = setting(
        "domain", "with no domains: the column whose values name the domains (without it, and "
        "without domains, the asset does nothing and says how to configure it)")
    filter: str = setting(
        "", "SQL predicate choosing the documents the mixture is made of; empty: the curation "
        "rules in force (what pretrained_model trains on)")
    target: str = setting(
        "", "SQL predicate choosing the documents the mixture should be good at: their "
        "held-out split (eval_pct by a fixed hash of the id, never trained on) is the "
        "yardstick. Empty: every document of the mixture")
    proxies: int = setting(5, "proxy models per domain in the swarm (one seed each, "
                              "Dirichlet-sampled weights)")
    token_budget: int = setting(131_072, "tokens every run (proxy or verified mixture) trains "
                                "on, rounded up to whole steps")
    seeds: list[int] = setting(default_factory=_seeds, run_config_default=list(SEEDS),
                               help="seeds of the verification: the "
                               "chosen, natural and uniform mixtures train once per seed, seed s "
                               "from the same weights (the swarm trains with the first)")
    max_repeats: float = setting(4.0, "no run reads a domain more than this many times: it caps "
                                 "each domain's weight")
    model: str = setting("tiny", "proxy model size preset", choices=tuple(PRESETS))
    arch: str = setting("nanogpt", "proxy model architecture", choices=ARCHS)
    seq_len: int = setting(32, "tokens per training sequence (32: twice the steps of 64 for the "
                               "same tokens, which a proxy on real text needs to get past its "
                               "noisy first hundreds of steps)", ge=1)
    batch_size: int = setting(8, "sequences per rank per step (a multiple of 8 / "
                                 "nproc_per_node)", ge=1)
    lr: float = setting(2e-3, "peak learning rate (curation_ablation's 5e-3 makes proxies on "
                              "real text scatter between seeds several times more)", gt=0)
    eval_pct: int = setting(10, "per cent of the target's documents held out")
    eval_blocks: int = setting(512, "held-out blocks per evaluation, the same for every run",
                               ge=1)
    evals_per_run: int = setting(1, "validation passes per run besides the first (the verdict "
                                    "reads the last)")
    nproc_per_node: int = setting(1, "torchrun processes per run (GPUs per Ray task under the "
                                     "ray executor)")
    executor: Optional[str] = setting(
        None, "local (one run after another, through Dagster Pipes) or ray (the swarm, then the "
        "verification, as Ray tasks at once); default LANCE_ASSETS_EXECUTOR, else local")


def _seeds_problem(seeds: list[int]) -> str | None:
    if not seeds or len(set(seeds)) != len(seeds) or min(seeds) < 0:
        return f"seeds {seeds}: give one or more distinct seeds >= 0"
    return None


def _runs_problem(settings: AblationSettings | MixtureSettings) -> str | None:
    """What keeps the proxy runs of ``settings`` from training: their budget, and the loader
    splits among ``nproc_per_node`` ranks (the trainer's rule)."""
    if settings.token_budget < 1 or settings.evals_per_run < 1:
        return "token_budget and evals_per_run must be >= 1"
    runs = train_config.TrainConfig(num_splits=NUM_SPLITS, batch_size=settings.batch_size)
    problem = train_config.world_problem(runs, settings.nproc_per_node,
                                         world_is="nproc_per_node")
    if problem:
        return (f"{train_config.config_words(problem)} (every run reads {NUM_SPLITS} loader "
                "splits)")
    return None


def ablation_problem(settings: AblationSettings) -> str | None:
    """What makes ``settings`` unusable together (each setting in its range aside), or None."""
    if problem := _seeds_problem(settings.seeds):
        return problem
    if settings.min_lead < 0:
        return f"min_lead {settings.min_lead}: give a lead in bits/byte >= 0"
    return _runs_problem(settings)


def mixture_problem(settings: MixtureSettings) -> str | None:
    """What makes ``settings`` unusable together (each setting in its range aside), or None;
    an executor that is neither local nor ray is refused with ``executor_name``'s error."""
    if problem := _seeds_problem(settings.seeds) or _runs_problem(settings):
        return problem
    if settings.proxies < 1:
        return f"proxies {settings.proxies}: give at least 1 per domain"
    if len(settings.seeds) < 2:
        return f"seeds {settings.seeds}: the verification needs at least two"
    if not settings.max_repeats > 0:
        return f"max_repeats {settings.max_repeats}: give a number of passes > 0"
    executor_name(settings.executor)
    return None
