"""The ``curation_ablation`` runner: plan, train every (arm, seed), judge, report.

``run_ablation`` is the whole comparison on one table: it names the ablation (``unnamed``: the
data it compares on), pins and tags its table version (``pinned_version``), plans it
(``ablation.plan``), trains every arm once per seed round by round (``plan.run_arms``: runs
found finished are reused, never retrained; an interrupted one resumes from its newest
checkpoint), reads their loss curves and held-out losses, and writes ``plan.json`` and
``results.json`` next to the runs. It returns an ``AblationReport``, everything the asset shows.

Launching a run is the caller's: ``launch(run)`` gets a ``Run`` (the arm, the seed, the run
folder, the trainer's settings with the run config's names, the pinned snapshot) and returns
once the trainer has exited. The Dagster asset launches torchrun through Pipes; a test or a
benchmark may run the trainer's CLI in process. Nothing here imports Dagster.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, fields
from pathlib import Path

import lance

from lance_assets import paths, storage
from lance_assets.ablation import plan as ablation
from lance_assets.ablation.settings import NUM_SPLITS, AblationSettings
from lance_assets.curation.rules import curation_in_force
from lance_assets.markdown import line_plot_markdown
from lance_assets.progress import phase
from lance_assets.table import Table, fingerprint, snapshots
from lance_assets.table.settings import run_config_default, run_config_fields
from lance_assets.train import config as train_config

ABLATION_TAG_PREFIX = "ablation-"
DEFAULT_ARMS = ("curation_rules", "no_rules")
OWNER = "curation_ablation"  # who holds the ablation's snapshot tag
MIXTURE_SETTINGS = {"domains", "weights", "max_repeats"}


def plan_for(config: AblationSettings, ds: lance.LanceDataset,
             rule_sets: dict[str, dict[str, str]]) -> ablation.AblationPlan:
    """The ablation's plan on ``ds`` (one pinned version) under ``config``."""
    return ablation.plan_ablation(
        ds, rule_sets, token_budget=config.token_budget, seq_len=config.seq_len,
        global_batch=config.batch_size * config.nproc_per_node, num_splits=NUM_SPLITS,
        eval_filter=config.eval_filter, eval_pct=config.eval_pct,
        allow_repeats=config.allow_repeats)


RUN_CONFIG = (train_config.TrainConfig, train_config.LaunchConfig)


def run_config_defaults() -> dict:
    """The defaults of ``pretrained_model``'s run config: every trainer and launch setting
    that is not CLI-only, with its run-config default (``defs.training.config`` builds the
    Dagster config from the same fields)."""
    return {f.name: run_config_default(f) for cls in RUN_CONFIG for f in run_config_fields(cls)}


def as_run_config(values: dict) -> dict:
    """``values`` as the run config holds them: a whole number in a float setting as a float
    (the arm folder's digest tells 1 from 1.0)."""
    floats = {f.name for cls in RUN_CONFIG for f in fields(cls)
              if train_config.value_type(cls, f.name) is float}
    return {k: float(v) if k in floats and type(v) is int else v for k, v in values.items()}


def trainer_settings(config: AblationSettings, plan: ablation.AblationPlan,
                     arm: ablation.ArmPlan, seed: int, run_name: str) -> dict:
    """One (arm, seed) run's settings, every one of the run config (names and defaults of
    ``pretrained_model``'s): the arm's rules as --filter, the held-out split as --eval-filter,
    the plan's steps, resume auto."""
    steps = plan.steps
    return as_run_config({**run_config_defaults(), **dict(
        filter=arm.filter or "n_tokens > 0", eval_filter=plan.held_out, model=config.model,
        arch=config.arch, seq_len=config.seq_len, batch_size=config.batch_size,
        num_splits=NUM_SPLITS, steps=steps, lr=config.lr, min_lr=min(config.lr, 3e-4),
        warmup=max(1, steps // 10), eval_every=max(1, steps // config.evals_per_run),
        eval_blocks=config.eval_blocks, ckpt_every=max(1, steps // 4),
        log_every=max(1, steps // 10), seed=seed, resume="auto",
        nproc_per_node=config.nproc_per_node, run_name=run_name)})


def run_settings(settings: dict, plan: ablation.AblationPlan) -> dict:
    """What decides an arm's result besides its rules and seed (the arm folder's digest), from
    a run's ``trainer_settings``."""
    skip = {"filter", "seed", "resume", "run_name", "launcher"}
    if not settings.get("domains"):  # one stream: the mixture settings decide nothing
        skip |= MIXTURE_SETTINGS
    return {"version": plan.version, "held_out": plan.held_out,
            **{k: v for k, v in settings.items() if k not in skip}}


def pinned_version(table: Table, name: str) -> tuple[str, int]:
    """The ablation's tag and version: the one its tag names on a rerun, else the newest (tagged
    by ``table.snapshots.hold`` once the plan is accepted)."""
    tag = ABLATION_TAG_PREFIX + name
    return tag, table.choose(tag, or_newest=True).version


def unnamed(table: Table) -> str:
    """The name of an ablation without one: the data it compares on (``fingerprint.data_version``),
    so maintenance commits (compaction, an index refresh) do not start a new comparison, and an
    ingest, a delete or a new column does."""
    return f"data-{fingerprint.data_version(table.newest())}"


def val_curves_markdown(curves: dict[str, dict[int, list[tuple[int, float]]]],
                        metric: str) -> str | None:
    """Held-out curves per arm (one colour per arm, one line per seed) as an inline PNG."""
    series = [(points, {"fmt": "o-", "color": f"C{i}", "alpha": 0.8, "linewidth": 1,
                        "label": arm if j == 0 else None})
              for i, (arm, seeds) in enumerate(curves.items())
              for j, points in enumerate(seeds.values()) if points]
    if not series:
        return None
    return line_plot_markdown(series, "val curves", "step", f"held-out {metric}")


def paired_markdown(verdict: ablation.Verdict) -> str:
    """The best arm's paired lead over each other arm, seed by seed."""
    if not verdict.leads:
        return "No paired comparison: fewer than two arms trained on a common seed."
    lines = [f"Lead of **{verdict.best}** ({verdict.metric}, lower is better): per seed, the "
             "other arm's metric minus the best arm's.", "",
             "| vs arm | per-seed differences | lead | se (seeds) | se (held-out) | se | "
             "95 % interval | real |", "|---|---|---:|---:|---:|---:|---:|---|"]

    def f(x):
        return f"{x:.4f}" if x is not None else "—"

    for arm, lead in verdict.leads.items():
        diffs = ", ".join(f"{s}: {d:+.4f}" for s, d in zip(lead.seeds, lead.diffs))
        ci = lead.half_width
        interval = f"{lead.lead - ci:+.4f} … {lead.lead + ci:+.4f}" if ci is not None else "—"
        real = {True: "yes", False: "no", None: "one seed: no verdict"}[lead.real]
        lines.append(f"| {arm} | {diffs} | {lead.lead:+.4f} | {f(lead.seed_se)} | "
                     f"{f(lead.held_out_se)} | {f(lead.se)} | {interval} | {real} |")
    return "\n".join(lines)


@dataclass(frozen=True)
class Run:
    """One (arm, seed) run for ``launch``: train ``settings`` into ``out`` on ``snapshot``."""

    ablation: str  # the ablation's name (how to rerun it)
    arm: ablation.ArmPlan
    seed: int
    out: Path  # the run folder (its name is the run name)
    settings: dict  # trainer_settings: the run config's names, every setting
    snapshot: tuple[str, int]  # (tag, version) every rank reads


@dataclass
class AblationReport:
    """What ``run_ablation`` planned, trained, reused and concluded."""

    name: str
    tag: str
    version: int
    plan: ablation.AblationPlan
    base: Path  # DATA/ablations/<name>
    outcome: ablation.Outcome
    verdict: ablation.Verdict
    rows: list[dict]  # ablation.summary_rows: one per arm
    duration_s: float

    @property
    def detectable(self) -> float | None:
        """The smallest lead the whole plan can detect, after the last round of seeds."""
        estimate = self.outcome.power[-1] if self.outcome.power else None
        return round(estimate.detectable, 4) if estimate and estimate.detectable else None

    def power_lines(self) -> list[str]:
        return [e.text(self.verdict.metric) for e in self.outcome.power]

    def paired_markdown(self) -> str:
        return paired_markdown(self.verdict)

    def val_curves_markdown(self) -> str | None:
        metric = next((r.metric for r in self.outcome.results if r.summaries), "val_bpb")
        return val_curves_markdown(self.outcome.curves, metric)

    def arm_values(self) -> dict[str, int | float]:
        """``arm/<name>/tokens_kept`` and the held-out metric's mean, sd and error per arm."""
        out: dict[str, int | float] = {}
        for r in self.outcome.results:
            mean, sd = r.mean_sd()
            out[f"arm/{r.name}/tokens_kept"] = r.plan.tokens
            if mean is not None:
                out[f"arm/{r.name}/{r.metric}"] = round(mean, 4)
            if sd is not None:
                out[f"arm/{r.name}/{r.metric}_sd"] = round(sd, 4)
            if r.held_out_se() is not None:
                out[f"arm/{r.name}/{r.metric}_se"] = round(r.held_out_se(), 5)
        return out

    def results_json(self) -> dict:
        """``results.json``: the arms, the verdict, the paired leads and the power."""
        v = self.verdict
        return {"tag": self.tag, "version": self.version, "arms": self.rows, "best_arm": v.best,
                "lead_real": v.real, "verdict": v.text,
                "paired": {arm: lead.as_dict() for arm, lead in v.leads.items()},
                "smallest_detectable_lead": self.detectable, "power": self.power_lines(),
                "stopped_early": self.outcome.stopped_early}


def run_ablation(table: Table, config: AblationSettings,
                 launch: Callable[[Run], object], *, log: Callable[[str], None] = print,
                 warn: Callable[[str], None] | None = None) -> AblationReport:
    """The ablation ``config`` describes on ``table``, every
    run not found finished handed to ``launch``. An ``ablation.AblationError`` for a plan that
    cannot run (a broken rule set: refused before anything is tagged or trained) or a run that
    stopped short of its steps."""
    start = time.perf_counter()
    name = config.name or unnamed(table)
    tag, version = pinned_version(table, name)
    branch = table.snapshots.branch_of(tag, version)  # a copy forget redacted: read by its tag
    ds = table.open(tag if branch else version)
    rule_sets = config.rule_sets or {DEFAULT_ARMS[0]: curation_in_force(ds).rules,
                                     DEFAULT_ARMS[1]: {}}
    with phase(f"ablation {name}: planning the arms (documents and tokens each rule set keeps)",
               log, announce=False):
        plan = plan_for(config, ds, rule_sets)
    ablation.check_trainable(plan)  # before the tag, plan.json or any run
    # no cleanup removes it now; an unnamed one is released once a newer one supersedes it
    table.snapshots.hold(tag, version, owner=OWNER, kind=snapshots.ABLATION,
                         named=bool(config.name), branch=branch)
    log(f"ablation {name}: table version {version} (tag {tag}), {len(plan.arms)} arms x "
        f"{len(config.seeds)} seeds, {plan.steps} steps ({plan.budget_tokens:,} tokens) per "
        f"run, held out: {plan.held_out_docs:,} documents")
    base = paths.ablation_dir(table.root, name)
    storage.write_atomic(base / "plan.json", json.dumps(
        {"tag": tag, **{k: v for k, v in vars(plan).items() if k != "arms"},
         "arms": [vars(a) for a in plan.arms]}, indent=2, default=str).encode())

    def train(arm: ablation.ArmPlan, seed: int, out: Path) -> None:
        launch(Run(name, arm, seed, out, trainer_settings(config, plan, arm, seed, out.name),
                   (tag, version)))  # the run's own report is summarized from its files

    def folder(arm: ablation.ArmPlan) -> str:
        return ablation.arm_folder(arm, run_settings(
            trainer_settings(config, plan, arm, 0, "x"), plan))

    with table.snapshots.using(tag):  # `forget` will not release it while arms train
        outcome = ablation.run_arms(
            plan, config.seeds, base, folder, train, log=log, warn=warn,
            wanted_lead=config.min_lead or None,
            stop_when_underpowered=config.stop_when_underpowered)
    verdict = outcome.verdict
    report = AblationReport(name, tag, version, plan, base, outcome, verdict,
                            ablation.summary_rows(outcome.results, verdict), 0.0)
    storage.write_atomic(base / "results.json",
                         json.dumps(report.results_json(), indent=2).encode())
    report.duration_s = round(time.perf_counter() - start, 2)
    return report

