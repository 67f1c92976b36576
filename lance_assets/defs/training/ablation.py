"""``curation_ablation``: proxy models per rule set on one pinned table version.

The comparison is the library's (``lance_assets.ablation.runner.Ablation``: the plan, every
(arm, seed) run reused when finished or yielded as a ``RunSpec``, the loss curves, the paired
verdict); this asset gives it its config and launches each run like ``pretrained_model``
(torchrun through Dagster Pipes, the same ``launch``), so cancel and resume work the same way. A
run that finished earlier (its summary says it trained every step) is reused, never retrained;
an interrupted one resumes from its newest checkpoint.
"""

import math
from contextlib import closing
from pathlib import Path

import dagster as dg
import pydantic

from lance_assets.ablation import runner
from lance_assets.ablation.plan import AblationError
from lance_assets.ablation.runner import (  # noqa: F401 (pinned_version, plan_for, unnamed: this module's API)
    NUM_SPLITS,
    pinned_version,
    plan_for,
    unnamed,
)
from lance_assets.defs.common import CURATION_RULES, TOKEN_IDS, TRAINER_TAGS
from lance_assets.defs.common import TRAINING_GROUP as GROUP
from lance_assets.defs.resources import LanceStore
from lance_assets.defs.training.assets import data_diff_metadata
from lance_assets.defs.training.launch import launch
from lance_assets.defs.training.torchrun import TorchrunPipesClient
from lance_assets.train import config as train_config

# `make demo` and the end_to_end job: the demo corpus holds ~250k tokens, fewer than the default
# budget asks of each arm, so the demo's comparison trains a quarter of it (and says what that
# budget can detect).
DEMO_RUN_CONFIG = {"ops": {"curation_ablation": {"config": {"token_budget": 65_536}}}}


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
        runs = train_config.TrainConfig(num_splits=NUM_SPLITS, batch_size=self.batch_size)
        problem = train_config.world_problem(runs, self.nproc_per_node, world_is="nproc_per_node")
        if problem:  # the trainer's rule for the runs' loader splits
            raise ValueError(f"{train_config.config_words(problem)} (every run reads "
                             f"{NUM_SPLITS} loader splits)")
        return self


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
    is real; `data_diff`: what changed in the data since the previous ablation's snapshot.
    Finished runs are reused on a rerun; an interrupted one resumes."""
    table = lance_store.table  # the ablation's one table handle
    try:
        study = runner.Ablation(table, config, log=context.log.info, warn=context.log.warning)
        hint = (f"to continue, materialize curation_ablation again with the same config "
                f"(name: {study.name}): finished runs are reused, this one resumes")
        with closing(study.runs()) as runs:
            for specs in runs:
                launch(context, pipes_subprocess_client, specs, resume_hint=hint)
    except AblationError as e:
        raise dg.Failure(str(e)) from None
    report = study.report
    metadata = ablation_metadata(report)
    metadata.update(data_diff_metadata(context, table, report.name))
    return dg.MaterializeResult(metadata=metadata)


def ablation_metadata(report: runner.AblationReport) -> dict:
    """The asset's metadata: the arms' table, the verdict and paired leads, the power, the
    pinned version and the plan, the curves, and ``arm/<name>/...`` per arm."""
    verdict, outcome, plan, detectable = (report.verdict, report.outcome, report.plan,
                                          report.detectable)
    metadata = {
        "arms": dg.MetadataValue.table(
            records=[dg.TableRecord({k: (v if not (isinstance(v, float) and math.isinf(v))
                                         else None) for k, v in r.items()}) for r in report.rows],
            schema=ARMS_SCHEMA),
        "best_arm": verdict.best or "",
        "verdict": dg.MetadataValue.text(verdict.text),
        "lead_is_real": verdict.real if verdict.real is not None else "unknown",
        "paired_leads": dg.MetadataValue.md(report.paired_markdown()),
        "smallest_detectable_lead": detectable if detectable is not None else "unknown",
        "power": dg.MetadataValue.text("\n".join(report.power_lines()) or "no paired runs"),
        "lance/snapshot_tag": report.tag,
        "lance/table_version": report.version,
        "held_out_filter": dg.MetadataValue.text(plan.held_out),
        "held_out_docs": plan.held_out_docs,
        "steps_per_run": plan.steps,
        "tokens_per_arm": plan.budget_tokens,
        "runs_trained": outcome.trained,
        "runs_reused": outcome.reused,
        "ablation_dir": dg.MetadataValue.path(str(report.base)),
        "duration_s": report.duration_s,
    }
    if outcome.stopped_early:
        metadata["stopped_early"] = dg.MetadataValue.text(outcome.stopped_early)
    curve = report.val_curves_markdown()
    if curve:
        metadata["val_curves"] = dg.MetadataValue.md(curve)
    metadata.update(report.arm_values())
    return metadata


def materialize_in_process(root: Path, config: dict, *,
                           raise_on_error: bool = True) -> dg.ExecuteInProcessResult:
    """``curation_ablation`` alone, in this process, on the data root ``root`` with the run
    config ``config`` (for tests and benchmarks; the trainer still runs under torchrun through
    Pipes, with the code location's termination timeout)."""
    return dg.materialize(
        [curation_ablation],
        resources={"lance_store": LanceStore(data_dir=str(root)),
                   "pipes_subprocess_client": TorchrunPipesClient(termination_timeout_seconds=55)},
        run_config={"ops": {"curation_ablation": {"config": config}}},
        raise_on_error=raise_on_error)


def materialize_ablation(root: Path, config: dict) -> dict:
    """``materialize_in_process``'s materialization metadata (raises if the run fails)."""
    result = materialize_in_process(root, config)
    return result.asset_materializations_for_node("curation_ablation")[0].metadata
