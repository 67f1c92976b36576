"""The ``curation_ablation`` runner: plan, train every (arm, seed), judge, report.

``Ablation`` is the whole comparison on one table: it names the ablation (``unnamed``: the
data it compares on), pins and tags its table version (``pinned_version``), plans it
(``ablation.plan``), yields every (arm, seed) run still to train as a ``RunSpec``, round by
round of seeds (``plan.run_arms``: runs found finished are reused, never retrained; an
interrupted one resumes from its newest checkpoint), reads their loss curves and held-out
losses, and writes ``plan.json`` and ``results.json`` next to the runs. Once its runs are
exhausted, ``report`` is an ``AblationReport``, everything the asset shows.

Launching a run is the caller's: it launches each spec it is given (the Dagster asset through
torchrun and Pipes; a test or a benchmark may run the trainer's CLI in process on
``spec.argv()``) before it asks for the next. Nothing here imports Dagster.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import lance

from lance_assets import paths, storage
from lance_assets.ablation import plan as ablation
from lance_assets.ablation.settings import NUM_SPLITS, AblationSettings
from lance_assets.curation.rules import curation_in_force
from lance_assets.markdown import line_plot_markdown
from lance_assets.progress import phase
from lance_assets.storage import Location
from lance_assets.table import Table, fingerprint, snapshots
from lance_assets.train.spec import RunSpec

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


def run_spec(table: Table, config: AblationSettings, plan: ablation.AblationPlan,
             arm: ablation.ArmPlan, seed: int, out: Location, snapshot: tuple[str, int] | None,
             **settings) -> RunSpec:
    """One (arm, seed) run (every other setting at ``pretrained_model``'s defaults): the arm's
    rules as --filter, the held-out split as --eval-filter, the plan's steps, resume auto;
    ``settings`` on top (a mixture's domains and weights)."""
    steps = plan.steps
    return RunSpec.of(table, out, {**dict(
        filter=arm.filter or "n_tokens > 0", eval_filter=plan.held_out, model=config.model,
        arch=config.arch, seq_len=config.seq_len, batch_size=config.batch_size,
        num_splits=NUM_SPLITS, steps=steps, lr=config.lr, min_lr=min(config.lr, 3e-4),
        warmup=max(1, steps // 10), eval_every=max(1, steps // config.evals_per_run),
        eval_blocks=config.eval_blocks, ckpt_every=max(1, steps // 4),
        log_every=max(1, steps // 10), seed=seed, resume="auto",
        nproc_per_node=config.nproc_per_node, run_name=out.name), **settings}, snapshot)


def result_key(spec: RunSpec, plan, add: dict | None = None) -> str:
    """The digest of what decides a run's result besides its rules and seed, on ``plan``'s
    version and held-out split (``add``: what else does, such as an arm's training filter):
    the run folders' names, so a changed run trains anew and an unchanged one is found again."""
    skip = {"filter", "seed"}
    if not spec.settings.get("domains"):  # one stream: the mixture settings decide nothing
        skip |= MIXTURE_SETTINGS
    return spec.digest(skip, {"version": plan.version, "held_out": plan.held_out,
                              **(add or {})})


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


@dataclass
class AblationReport:
    """What an ``Ablation`` planned, trained, reused and concluded."""

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


class Ablation:
    """The ablation ``config`` describes on ``table``: named, planned and its version tagged
    when made (an ``ablation.AblationError`` for a plan that cannot run: a broken rule set is
    refused before anything is tagged or trained). ``runs`` yields the runs still to train;
    ``report`` is set once they are exhausted."""

    def __init__(self, table: Table, config: AblationSettings, *,
                 log: Callable[[str], None] = print, warn: Callable[[str], None] | None = None):
        self.start = time.perf_counter()
        self.table, self.config, self.log, self.warn = table, config, log, warn
        self.name = name = config.name or unnamed(table)
        self.tag, self.version = tag, version = pinned_version(table, name)
        branch = table.snapshots.branch_of(tag, version)  # a copy forget redacted: by its tag
        ds = table.open(tag if branch else version)
        rule_sets = config.rule_sets or {DEFAULT_ARMS[0]: curation_in_force(ds).rules,
                                         DEFAULT_ARMS[1]: {}}
        with phase(f"ablation {name}: planning the arms (documents and tokens each rule set "
                   "keeps)", log, announce=False):
            self.plan = plan = plan_for(config, ds, rule_sets)
        ablation.check_trainable(plan)  # before the tag, plan.json or any run
        # no cleanup removes it now; an unnamed one is released once a newer one supersedes it
        table.snapshots.hold(tag, version, owner=OWNER, kind=snapshots.ABLATION,
                             named=bool(config.name), branch=branch)
        log(f"ablation {name}: table version {version} (tag {tag}), {len(plan.arms)} arms x "
            f"{len(config.seeds)} seeds, {plan.steps} steps ({plan.budget_tokens:,} tokens) per "
            f"run, held out: {plan.held_out_docs:,} documents")
        self.base = paths.ablation_dir(table.root, name)
        storage.write_atomic(self.base / "plan.json", json.dumps(
            {"tag": tag, **{k: v for k, v in vars(plan).items() if k != "arms"},
             "arms": [vars(a) for a in plan.arms]}, indent=2, default=str).encode())
        self.report: AblationReport | None = None

    def spec(self, arm: ablation.ArmPlan, seed: int, out: Path) -> RunSpec:
        """The (arm, seed) run in ``out`` on the ablation's snapshot."""
        return run_spec(self.table, self.config, self.plan, arm, seed, out,
                        (self.tag, self.version))

    def folder(self, arm: ablation.ArmPlan) -> str:
        return ablation.arm_folder(arm, result_key(self.spec(arm, 0, Path("x")), self.plan,
                                                   {"train": arm.train_filter}))

    def runs(self) -> Iterator[list[RunSpec]]:
        """The runs still to train, one at a time: launch each before asking for the next
        (its own report is summarized from its files). Then ``report``."""
        config, plan = self.config, self.plan
        with self.table.snapshots.using(self.tag):  # `forget` will not release it meanwhile
            arms = ablation.run_arms(
                plan, config.seeds, self.base, self.folder, log=self.log, warn=self.warn,
                wanted_lead=config.min_lead or None,
                stop_when_underpowered=config.stop_when_underpowered)
            outcome = yield from specs_of(arms, lambda arm, seed, out: [self.spec(arm, seed, out)])
        verdict = outcome.verdict
        report = AblationReport(self.name, self.tag, self.version, plan, self.base, outcome,
                                verdict, ablation.summary_rows(outcome.results, verdict), 0.0)
        storage.write_atomic(self.base / "results.json",
                             json.dumps(report.results_json(), indent=2).encode())
        report.duration_s = round(time.perf_counter() - self.start, 2)
        self.report = report


def specs_of(runs, make: Callable[[ablation.ArmPlan, int, Path], list[RunSpec]]):
    """``plan.run_arms``'s (arm, seed, run folder) to train, each as ``make``'s specs;
    returns its ``Outcome``."""
    while True:
        try:
            arm, seed, out = next(runs)
        except StopIteration as done:
            return done.value
        yield make(arm, seed, out)
