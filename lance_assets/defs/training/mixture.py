"""``mixture_search``: the domain weights that train the better model, found by a swarm of proxy
models and verified with paired seeds.

The search is the library's (``lance_assets.ablation.mixture.Search``: it yields the runs still
to train as ``RunSpec``s); this asset gives it its config and launches each run like
``curation_ablation`` (torchrun through Dagster Pipes, the same ``launch``), or, under
``LANCE_ASSETS_EXECUTOR=ray``, as Ray tasks (``via="ray_tasks"``). A run that finished earlier
is reused, an interrupted one resumes.
"""

import json
import math
from contextlib import closing

import dagster as dg

from lance_assets import storage
from lance_assets.ablation import mixture, regression
from lance_assets.ablation.plan import AblationError
from lance_assets.ablation.settings import MixtureSettings, mixture_problem
from lance_assets.defs.common import CURATION_RULES, TOKEN_IDS, TRAINER_TAGS
from lance_assets.defs.common import TRAINING_GROUP as GROUP
from lance_assets.defs.config import dagster_config
from lance_assets.defs.resources import LanceStore
from lance_assets.defs.training.launch import launch
from lance_assets.defs.training.torchrun import TorchrunPipesClient
from lance_assets.markdown import markdown_table, png_markdown
from lance_assets.table.executor import executor_name

MixtureConfig = dagster_config("MixtureConfig", MixtureSettings, module=__name__,
                               problem=mixture_problem)


SWARM_SCHEMA = dg.TableSchema(columns=[
    dg.TableColumn("proxy", "string", description="the swarm member"),
    dg.TableColumn("weights", "string", description="its share of tokens per domain"),
    dg.TableColumn("measured_bpb", "float", description="its held-out bits/byte on the target"),
    dg.TableColumn("loo_predicted_bpb", "float", description="the regression's prediction "
                                                             "for it, fitted without it"),
])


@dg.asset(deps=[TOKEN_IDS, CURATION_RULES], group_name=GROUP, kinds={"pytorch", "lance"},
          code_version="1", op_tags=TRAINER_TAGS)
def mixture_search(context: dg.AssetExecutionContext, config: MixtureConfig,
                   lance_store: LanceStore, pipes_subprocess_client: TorchrunPipesClient):
    """Which mixture of domains trains the better model: a swarm of proxy models on
    Dirichlet-sampled domain weights (RegMix), a regression of the target's held-out bits/byte
    on the weights (checked on held-out swarm members), the predicted best weights within each
    domain's tokens, then the chosen, natural and uniform mixtures with paired seeds and the
    ablation's verdict. Metadata: `weights`, `predicted_bpb`, each verified mixture's held-out
    bits/byte, `lead_over_natural`, `smallest_detectable_lead`, `lead_is_real`, the
    regression's leave-one-out error, a plot, and the run config that trains `pretrained_model`
    on the chosen weights. Finished runs are reused on a rerun; an interrupted one resumes."""
    table = lance_store.table  # the search's one table handle
    if not config.domains and config.domain_column not in table.newest().schema.names:
        message = ("no domains: give mixture_search's config `domains` ({name: SQL predicate}) "
                   f"or a `domain_column` the table has (it has no {config.domain_column!r})")
        context.log.warning(message + "; nothing searched")
        return dg.MaterializeResult(metadata={"skipped": dg.MetadataValue.text(message)})

    ray = executor_name(config.executor) == "ray"
    try:
        search = mixture.Search(table, config, log=context.log.info, warn=context.log.warning)
        hint = (f"to continue, materialize mixture_search again with the same config (name: "
                f"{search.name}): finished runs are reused, this one resumes")
        with closing(search.runs(together=ray)) as runs:
            for specs in runs:
                launch(context, pipes_subprocess_client, specs,
                       via="ray_tasks" if ray else None, resume_hint=hint)
    except AblationError as e:
        raise dg.Failure(str(e)) from None
    report = search.report
    png = report.plot()
    storage.write_atomic(report.base / "mixture_search.png", png)
    return dg.MaterializeResult(metadata=search_metadata(report, config, png))


def _r(x: float | None, digits: int = 4):
    return round(x, digits) if x is not None and math.isfinite(x) else "unknown"


def search_metadata(report: mixture.SearchReport, config: MixtureConfig, png: bytes) -> dict:
    """The asset's metadata: the chosen weights and their verdict, the regression's fit, the
    swarm, the plot and the run config for ``pretrained_model``."""
    names = report.plan.names
    natural, uniform = report.leads.get("natural"), report.leads.get("uniform")
    metadata = {
        "weights": dg.MetadataValue.json(dict(zip(names, report.chosen.tolist()))),
        "predicted_bpb": _r(report.predicted),
        "lead_over_natural": _r(natural.lead if natural else None),
        "lead_over_natural_ci95": _r(natural.half_width if natural else None),
        "lead_over_uniform": _r(uniform.lead if uniform else None),
        "smallest_detectable_lead": _r(report.detectable),
        "lead_is_real": report.lead_is_real if report.lead_is_real is not None else "unknown",
        "verdict": dg.MetadataValue.text(natural.text("val_bpb") if natural else
                                         "no paired runs of the chosen and natural mixtures"),
        "regression": dg.MetadataValue.text(regression.MODEL),
        "regression_loo_rmse": _r(report.fit.loo_rmse),
        "regression_loo_r2": _r(report.fit.loo_r2, 3),
        "plot": dg.MetadataValue.md(png_markdown(png, "predicted vs measured; weights")),
        "mixtures": dg.MetadataValue.md(markdown_table([
            {"mixture": arm, **{n: f"{w:.3f}" for n, w in zip(names, weights)},
             "held-out bits/byte": (f"{report.arm_bpb()[arm][0]:.4f}"
                                    if report.arm_bpb().get(arm, (None,))[0] is not None
                                    else "not trained")}
            for arm, weights in report.arms.items()])),
        "swarm": dg.MetadataValue.table(records=[dg.TableRecord({
            "proxy": m.name, "weights": json.dumps(dict(zip(names, m.weights.round(4).tolist()))),
            "measured_bpb": round(m.measured, 4), "loo_predicted_bpb": round(m.predicted, 4)})
            for m in report.members], schema=SWARM_SCHEMA),
        "pretrained_model_config": dg.MetadataValue.json(
            report.pretrained_model_config()),
        "domains": dg.MetadataValue.json({d.name: {"predicate": d.predicate, "tokens": d.tokens,
                                                   "natural": round(d.natural, 4),
                                                   "max_weight": round(d.cap, 4)}
                                          for d in report.plan.domains}),
        "lance/snapshot_tag": report.tag,
        "lance/table_version": report.version,
        "held_out_filter": dg.MetadataValue.text(report.plan.held_out),
        "held_out_docs": report.plan.held_out_docs,
        "steps_per_run": report.plan.steps,
        "tokens_per_run": report.plan.budget_tokens,
        "runs_trained": report.trained,
        "runs_reused": report.reused,
        "search_dir": dg.MetadataValue.path(str(report.base)),
        "duration_s": report.duration_s,
    }
    for arm, (mean, sd) in report.arm_bpb().items():
        if mean is not None:
            metadata[f"arm/{arm}/val_bpb"] = round(mean, 4)
        if sd is not None:
            metadata[f"arm/{arm}/val_bpb_sd"] = round(sd, 4)
    return metadata


def materialize_in_process(root, config: dict, *,
                           raise_on_error: bool = True) -> dg.ExecuteInProcessResult:
    """``mixture_search`` alone, in this process, on the data root ``root`` (tests, benchmarks;
    each run still goes through torchrun and Pipes)."""
    return dg.materialize(
        [mixture_search],
        resources={"lance_store": LanceStore(data_dir=str(root)),
                   "pipes_subprocess_client": TorchrunPipesClient(termination_timeout_seconds=55)},
        run_config={"ops": {"mixture_search": {"config": config}}},
        raise_on_error=raise_on_error)
