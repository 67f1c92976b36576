"""``curation_ablation``: proxy models per rule set on one pinned table version.

The plan (arms, held-out split, equal token budget) is ``corpus.ablation``; every (arm, seed) is
a normal trainer run launched like ``pretrained_model`` (torchrun through Dagster Pipes, the
same launch helper), so cancel and resume work the same way. A run that finished earlier (its
summary says it trained every step) is reused, never retrained; an interrupted one resumes
from its newest checkpoint.
"""

import json
import math
import time
from pathlib import Path

import dagster as dg
import lance
import pydantic

from lance_assets import paths, storage
from lance_assets.ablation import plan as ablation
from lance_assets.curation.rules import curation_in_force
from lance_assets.defs.common import CURATION_RULES, TOKEN_IDS, TRAINER_TAGS
from lance_assets.defs.common import TRAINING_GROUP as GROUP
from lance_assets.defs.resources import LanceStore
from lance_assets.defs.training.assets import launch
from lance_assets.defs.training.config import TrainConfig
from lance_assets.defs.training.torchrun import TorchrunPipesClient
from lance_assets.markdown import line_plot_markdown
from lance_assets.table import Table, fingerprint, snapshots
from lance_assets.train import config as train_config

ABLATION_TAG_PREFIX = "ablation-"
# `make demo` and the end_to_end job: the demo corpus holds ~250k tokens, fewer than the default
# budget asks of each arm, so the demo's comparison trains a quarter of it (and says what that
# budget can detect).
DEMO_RUN_CONFIG = {"ops": {"curation_ablation": {"config": {"token_budget": 65_536}}}}
NUM_SPLITS = 8  # the trainer's default loader splits
DEFAULT_ARMS = ("curation_rules", "no_rules")


class AblationConfig(dg.Config):
    """Which rule sets to compare and how big the proxy models and their budget are. The
    defaults (two arms, three seeds, a `tiny` model on 262k tokens each, 512 held-out blocks)
    tell a planted fifth of junk tokens from clean text in a few minutes on 2 CPU cores; see
    docs/benchmarks.md."""

    name: str = pydantic.Field(
        "", description="the ablation's name: its runs live in DATA/ablations/<name> and its "
        "table version is tagged ablation-<name> (a rerun with the same name reuses both; a new "
        "name pins the newest version). Empty: `v<newest table version>`, so a rerun on the same "
        "data reuses every finished run and new data starts a new ablation")
    rule_sets: dict[str, dict[str, str]] = pydantic.Field(
        default_factory=dict, description="arm name -> {rule name: SQL keep-predicate}, checked "
        "like curation_rules; {} for an arm keeps every document. Empty: two arms, "
        "`curation_rules` (the rules in force) and `no_rules`")
    model: str = pydantic.Field("tiny", description="proxy model size preset")
    arch: str = pydantic.Field("nanogpt", description="proxy model architecture")
    seq_len: int = pydantic.Field(64, description="tokens per training sequence")
    batch_size: int = pydantic.Field(8, description="sequences per rank per step (a multiple "
                                     "of 8 / nproc_per_node)")
    token_budget: int = pydantic.Field(262_144, description="target tokens every arm trains on "
                                       "(rounded up to whole steps); the default is 512 steps of "
                                       "the default batch, past the early steps where a proxy "
                                       "model has learned little more than byte frequencies and "
                                       "arms differ by chance")
    seeds: list[int] = pydantic.Field([0, 1, 2], description="one run per arm and seed; seed s "
                                      "starts every arm from the same weights, and the spread "
                                      "of the per-seed differences says whether a lead is real "
                                      "(at least two; three give the t-test two degrees of "
                                      "freedom)")
    lr: float = pydantic.Field(5e-3, description="peak learning rate")
    eval_filter: str = pydantic.Field("NOT is_dup", description="neutral SQL predicate of the "
                                      "documents the held-out split is drawn from")
    eval_pct: int = pydantic.Field(10, description="per cent of those documents held out (by a "
                                   "fixed hash of the id); no arm trains on them")
    eval_blocks: int = pydantic.Field(512, description="held-out blocks per evaluation, the "
                                      "same blocks for every arm, spread over the held-out "
                                      "documents")
    evals_per_run: int = pydantic.Field(4, description="validation passes per run (the curves)")
    min_lead: float = pydantic.Field(0.0, description="the smallest lead (held-out bits/byte) "
                                     "the comparison must be able to detect: after each round of "
                                     "seeds the asset reports the smallest lead its seeds and "
                                     "budget can detect (95 % level, power 0.8) and warns, before "
                                     "the remaining seeds train, when that is larger. 0: report "
                                     "only")
    stop_when_underpowered: bool = pydantic.Field(False, description="stop after the round of "
                                                  "seeds that shows min_lead cannot be detected, "
                                                  "instead of training the remaining seeds")
    allow_repeats: bool = pydantic.Field(False, description="train an arm whose kept tokens "
                                         "are fewer than the budget on repeated data (epochs "
                                         "> 1); false: report it and skip it")
    nproc_per_node: int = pydantic.Field(1, description="torchrun processes per run")

    @pydantic.model_validator(mode="after")
    def check(self):
        try:
            if self.name:
                train_config.check_value(train_config.LaunchConfig, "run_name", self.name)
            for name in ("model", "arch", "seq_len", "batch_size", "lr", "eval_blocks"):
                train_config.check_value(train_config.TrainConfig, name, getattr(self, name))
        except train_config.ConfigError as e:
            flag, rest = str(e).split(" ", 1)
            raise ValueError(f"{'name' if flag == '--run-name' else flag[2:].replace('-', '_')} "
                             f"{rest}") from None
        if not self.seeds or len(set(self.seeds)) != len(self.seeds) or min(self.seeds) < 0:
            raise ValueError(f"seeds {self.seeds}: give one or more distinct seeds >= 0")
        if self.min_lead < 0:
            raise ValueError(f"min_lead {self.min_lead}: give a lead in bits/byte >= 0")
        if self.token_budget < 1 or self.evals_per_run < 1:
            raise ValueError("token_budget and evals_per_run must be >= 1")
        if NUM_SPLITS % self.nproc_per_node or self.batch_size % (NUM_SPLITS // self.nproc_per_node):
            raise ValueError(f"nproc_per_node {self.nproc_per_node} must divide {NUM_SPLITS} and "
                             f"batch_size {self.batch_size} be a multiple of "
                             f"{NUM_SPLITS} / nproc_per_node")
        return self


def plan_for(config: AblationConfig, ds: lance.LanceDataset,
             rule_sets: dict[str, dict[str, str]]) -> ablation.AblationPlan:
    """The ablation's plan on ``ds`` (one pinned version) under ``config``."""
    return ablation.plan_ablation(
        ds, rule_sets, token_budget=config.token_budget, seq_len=config.seq_len,
        global_batch=config.batch_size * config.nproc_per_node, num_splits=NUM_SPLITS,
        eval_filter=config.eval_filter, eval_pct=config.eval_pct,
        allow_repeats=config.allow_repeats)


def trainer_config(config: AblationConfig, plan: ablation.AblationPlan, arm: ablation.ArmPlan,
                   seed: int, run_name: str) -> TrainConfig:
    """One (arm, seed) run: the arm's rules as --filter, the held-out split as --eval-filter,
    the plan's steps, resume auto."""
    steps = plan.steps
    return TrainConfig(
        filter=arm.filter or "n_tokens > 0", eval_filter=plan.held_out, model=config.model, arch=config.arch,
        seq_len=config.seq_len, batch_size=config.batch_size, num_splits=NUM_SPLITS, steps=steps,
        lr=config.lr, min_lr=min(config.lr, 3e-4), warmup=max(1, steps // 10),
        eval_every=max(1, steps // config.evals_per_run), eval_blocks=config.eval_blocks,
        ckpt_every=max(1, steps // 4), log_every=max(1, steps // 10), seed=seed, resume="auto",
        nproc_per_node=config.nproc_per_node, run_name=run_name)


def run_settings(cfg: TrainConfig, plan: ablation.AblationPlan) -> dict:
    """What decides an arm's result besides its rules and seed (the arm folder's digest)."""
    skip = {"filter", "seed", "resume", "run_name", "launcher"}
    return {"version": plan.version, "held_out": plan.held_out,
            **{k: v for k, v in cfg.model_dump().items() if k not in skip}}


def pinned_version(table: Table, name: str) -> tuple[str, int]:
    """The ablation's tag and version: the one its tag names on a rerun, else the newest (tagged
    by ``table.snapshots.hold`` once the plan is accepted)."""
    tag = ABLATION_TAG_PREFIX + name
    version = table.snapshots.version(tag)
    return tag, table.newest().version if version is None else version


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


ARMS_SCHEMA = dg.TableSchema(columns=[
    dg.TableColumn("arm", "string", description="the rule set's name"),
    dg.TableColumn("docs_kept", "int", description="training documents its rules keep "
                                                    "(held-out split excluded)"),
    dg.TableColumn("tokens_kept", "int", description="their tokens (sum of n_tokens)"),
    dg.TableColumn("share", "float", description="share of the tokens outside the held-out split"),
    dg.TableColumn("epochs_needed", "float", description="passes over the kept documents the "
                                                         "token budget takes (> 1: repeated data)"),
    dg.TableColumn("seeds", "int", description="runs finished (one per seed)"),
    dg.TableColumn("metric", "string", description="val_bpb (bits per byte), or val_loss when "
                                                   "the table has no byte counts"),
    dg.TableColumn("val_mean", "float", description="held-out metric at the last step, mean over "
                                                    "seeds (lower is better)"),
    dg.TableColumn("val_sd", "float", description="its standard deviation over seeds "
                                                  "(unpaired: what the seeds scatter)"),
    dg.TableColumn("val_se", "float", description="one run's held-out error: the standard error "
                                                  "of its metric over held-out documents, mean "
                                                  "over seeds"),
    dg.TableColumn("best_leads_by", "float", description="the best arm's paired lead over this "
                                                         "arm: mean over seeds of this arm's "
                                                         "metric minus the best arm's"),
    dg.TableColumn("lead_se", "float", description="its standard error (per-seed differences "
                                                   "and held-out documents)"),
    dg.TableColumn("lead_ci95", "float", description="half the 95 % interval of the lead"),
    dg.TableColumn("lead_real", "bool", description="the interval excludes zero"),
    dg.TableColumn("tokens_per_s", "float", description="training throughput, mean over seeds"),
    dg.TableColumn("note", "string", description="why an arm was not trained, or trained on "
                                                 "repeated data"),
])


@dg.asset(deps=[TOKEN_IDS, CURATION_RULES], group_name=GROUP, kinds={"pytorch", "lance"},
          code_version="1", op_tags=TRAINER_TAGS)
def curation_ablation(context: dg.AssetExecutionContext, config: AblationConfig,
                      lance_store: LanceStore, pipes_subprocess_client: TorchrunPipesClient):
    """Which curation trains the better model: one small proxy model per rule set (arm) and
    seed, every arm at the same token budget on one tagged table version (`ablation-<name>`),
    all evaluated on one held-out split no arm trains on. Seeds are trained round by round; after
    each round the log says the smallest lead the whole plan can detect (and warns when it
    exceeds `min_lead`). Metadata: the arms' table (kept documents and tokens, held-out bits/byte
    mean ± sd over seeds and one run's held-out error, the best arm's paired lead over each arm
    with its 95 % interval), the paired differences seed by seed, the smallest detectable lead,
    their validation curves, `arm/<name>/val_bpb` per arm, and the best arm with whether its lead
    is real. Finished runs are reused on a rerun; an interrupted one resumes."""
    root, table = lance_store.root, lance_store.table
    start = time.perf_counter()
    name = config.name or unnamed(table)
    tag, version = pinned_version(table, name)
    ds = table.open(version)
    rule_sets = config.rule_sets or {DEFAULT_ARMS[0]: curation_in_force(ds).rules,
                                     DEFAULT_ARMS[1]: {}}
    try:
        plan = plan_for(config, ds, rule_sets)
    except ablation.AblationError as e:
        raise dg.Failure(str(e)) from None
    # no cleanup removes it now; an unnamed one is released once a newer one supersedes it
    table.snapshots.hold(tag, version, owner="curation_ablation", kind=snapshots.ABLATION,
                         named=bool(config.name))
    context.log.info(f"ablation {name}: table version {version} (tag {tag}), "
                     f"{len(plan.arms)} arms x {len(config.seeds)} seeds, {plan.steps} steps "
                     f"({plan.budget_tokens:,} tokens) per run, held out: {plan.held_out_docs:,} "
                     "documents")
    base = paths.ablation_dir(root, name)
    storage.write_atomic(base / "plan.json", json.dumps(
        {"tag": tag, **{k: v for k, v in vars(plan).items() if k != "arms"},
         "arms": [vars(a) for a in plan.arms]}, indent=2, default=str).encode())

    def train(arm: ablation.ArmPlan, seed: int, out: Path) -> None:
        hint = (f"to continue, materialize curation_ablation again with the same config "
                f"(name: {name}): finished runs are reused, this one resumes")
        invocation = launch(context, pipes_subprocess_client,
                            trainer_config(config, plan, arm, seed, out.name), root, out,
                            (tag, version), resume_hint=hint)
        invocation.get_materialize_result()  # the run's own report, summarized below

    def folder(arm: ablation.ArmPlan) -> str:
        return ablation.arm_folder(arm, run_settings(trainer_config(config, plan, arm, 0, "x"),
                                                     plan))

    try:
        with table.snapshots.using(tag):  # `forget` will not release it while arms train
            outcome = ablation.run_arms(
                plan, config.seeds, base, folder, train, log=context.log.info,
                warn=context.log.warning, wanted_lead=config.min_lead or None,
                stop_when_underpowered=config.stop_when_underpowered)
    except ablation.AblationError as e:
        raise dg.Failure(str(e)) from None
    results, verdict = outcome.results, outcome.verdict
    rows = ablation.summary_rows(results, verdict)
    estimate = outcome.power[-1] if outcome.power else None
    detectable = round(estimate.detectable, 4) if estimate and estimate.detectable else None
    storage.write_atomic(base / "results.json", json.dumps(
        {"tag": tag, "version": version, "arms": rows, "best_arm": verdict.best,
         "lead_real": verdict.real, "verdict": verdict.text,
         "paired": {arm: lead.as_dict() for arm, lead in verdict.leads.items()},
         "smallest_detectable_lead": detectable,
         "power": [e.text(verdict.metric) for e in outcome.power],
         "stopped_early": outcome.stopped_early}, indent=2).encode())
    metadata = {
        "arms": dg.MetadataValue.table(
            records=[dg.TableRecord({k: (v if not (isinstance(v, float) and math.isinf(v))
                                         else None) for k, v in r.items()}) for r in rows],
            schema=ARMS_SCHEMA),
        "best_arm": verdict.best or "",
        "verdict": dg.MetadataValue.text(verdict.text),
        "lead_is_real": verdict.real if verdict.real is not None else "unknown",
        "paired_leads": dg.MetadataValue.md(paired_markdown(verdict)),
        "smallest_detectable_lead": detectable if detectable is not None else "unknown",
        "power": dg.MetadataValue.text("\n".join(e.text(verdict.metric) for e in outcome.power)
                                       or "no paired runs"),
        "lance/snapshot_tag": tag,
        "lance/table_version": version,
        "held_out_filter": dg.MetadataValue.text(plan.held_out),
        "held_out_docs": plan.held_out_docs,
        "steps_per_run": plan.steps,
        "tokens_per_arm": plan.budget_tokens,
        "runs_trained": outcome.trained,
        "runs_reused": outcome.reused,
        "ablation_dir": dg.MetadataValue.path(str(base)),
        "duration_s": round(time.perf_counter() - start, 2),
    }
    if outcome.stopped_early:
        metadata["stopped_early"] = dg.MetadataValue.text(outcome.stopped_early)
    curves = outcome.curves
    metric = next((r.metric for r in results if r.summaries), "val_bpb")
    curve = val_curves_markdown(curves, metric)
    if curve:
        metadata["val_curves"] = dg.MetadataValue.md(curve)
    for r in results:
        mean, sd = r.mean_sd()
        metadata[f"arm/{r.name}/tokens_kept"] = r.plan.tokens
        if mean is not None:
            metadata[f"arm/{r.name}/{r.metric}"] = round(mean, 4)
        if sd is not None:
            metadata[f"arm/{r.name}/{r.metric}_sd"] = round(sd, 4)
        if r.held_out_se() is not None:
            metadata[f"arm/{r.name}/{r.metric}_se"] = round(r.held_out_se(), 5)
    return dg.MaterializeResult(metadata=metadata)
