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

from lance_assets.ablation import runner
from lance_assets.ablation.plan import AblationError
from lance_assets.ablation.runner import (  # noqa: F401 (pinned_version, plan_for, unnamed: this module's API)
    pinned_version,
    plan_for,
    unnamed,
)
from lance_assets.ablation.settings import AblationSettings, ablation_problem
from lance_assets.defs.common import CURATION_RULES, TOKEN_IDS, TRAINER_TAGS
from lance_assets.defs.common import TRAINING_GROUP as GROUP
from lance_assets.defs.config import dagster_config
from lance_assets.defs.resources import LanceStore
from lance_assets.defs.training.assets import data_diff_metadata
from lance_assets.defs.training.launch import launch
from lance_assets.defs.training.torchrun import TorchrunPipesClient

# `make demo` and the end_to_end job: the demo corpus holds ~250k tokens, fewer than the default
# budget asks of each arm, so the demo's comparison trains a quarter of it (and says what that
# budget can detect).
DEMO_RUN_CONFIG = {"ops": {"curation_ablation": {"config": {"token_budget": 65_536}}}}


AblationConfig = dagster_config("AblationConfig", AblationSettings, module=__name__,
                                problem=ablation_problem)


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
