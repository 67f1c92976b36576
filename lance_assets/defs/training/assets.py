"""``pretrained_model`` (torchrun through Dagster Pipes) and ``samples`` (text from its checkpoint)."""


import dataclasses
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Optional

import dagster as dg

from lance_assets import paths, storage
from lance_assets.defs.common import CURATION_RULES, TOKEN_IDS, TRAINER_TAGS
from lance_assets.defs.common import TRAINING_GROUP as GROUP
from lance_assets.defs.conditions import ON_NEW_DATA, training_condition
from lance_assets.defs.metadata import data_version
from lance_assets.defs.resources import LanceStore
from lance_assets.defs.training.config import TrainConfig
from lance_assets.defs.training.launch import launch
from lance_assets.defs.training.torchrun import TorchrunPipesClient
from lance_assets.keys import DEFAULT_PROMPTS
from lance_assets.markdown import line_plot_markdown, markdown_table
from lance_assets.progress import phase
from lance_assets.table import Table, maintenance, snapshots
from lance_assets.table.fingerprint import digest
from lance_assets.train import checkpoint
from lance_assets.train.config import config_words, world_problem
from lance_assets.train.spec import RunSpec


def resumes(cfg: TrainConfig, out: Path) -> bool:
    """Whether the trainer will continue from a checkpoint (``resume: auto`` with one in
    ``out``, or a named checkpoint)."""
    if not cfg.resume:
        return False
    return cfg.resume != "auto" or bool(checkpoint.list_checkpoints(out))


def check_run_data(spec: RunSpec, table: Table, version: int | str) -> None:
    """What the trainer would refuse about the data it is asked to read, checked at the
    ``version`` it will read (a number, or the tag of a redacted copy) before the run holds a
    snapshot or starts a process, by the trainer's own check (``train.split.check_run_data``:
    the filter, or the curation rules in force at that version, and the mixture): a
    ``dg.Failure`` naming the setting (a domain with its rows and tokens) and the fix."""
    from lance_assets.curation.predicate import PredicateError
    from lance_assets.curation.rules import RuleError
    from lance_assets.train.config import DEFAULT_STEPS, ConfigError
    from lance_assets.train.split import check_run_data as trainer_check

    cfg = spec.trainer_config()
    try:
        trainer_check(cfg, table.open(version), steps=cfg.steps or DEFAULT_STEPS,
                      global_batch=cfg.batch_size * cfg.grad_accum * spec.nnodes
                      * spec.nproc_per_node)
    except (ConfigError, PredicateError, RuleError) as e:
        raise dg.Failure(f"{config_words(str(e))} (nothing was tagged or launched)") from None


def training_snapshot(cfg: TrainConfig, table: Table, out: Path,
                      check: Callable[[int | str], None] | None = None) -> tuple[str, int]:
    """The table version this run reads, resolved once here and tagged `train-<run name>` so
    that no cleanup removes it while the run, its resumes, `samples` or the forensics need it:
    on a resume, the version the run's tag names; otherwise the newest (the tag moves there).
    The tag's record says who holds it: a run without `run_name` is unnamed, and
    `table_maintenance` releases it once newer unnamed runs of this asset push it out of the
    retention (`keep_unnamed_runs`); a named run keeps it until released."""
    tag = maintenance.snapshot_tag(out.name)
    chosen = table.choose(tag if resumes(cfg, out) else None, or_newest=True)
    if check is not None:  # refused before the tag is held
        check(chosen.ref)  # a redacted copy's version is a branch's: opened through its tag
    return tag, table.snapshots.hold(tag, chosen.version, owner="pretrained_model",
                                     kind=snapshots.RUN, named=bool(cfg.run_name),
                                     branch=chosen.branch)


def check_world(cfg: TrainConfig) -> None:
    """The trainer's rule (``train.config.world_problem``) for the launch's world, checked
    before a run holds its snapshot or starts an agent."""
    problem = world_problem(cfg, cfg.nnodes * cfg.nproc_per_node,
                            world_is="nnodes x nproc_per_node")
    if problem and problem.startswith("nnodes"):
        raise dg.Failure(f"{config_words(problem)}: change nnodes, nproc_per_node or num_splits")
    if problem:
        raise dg.Failure(config_words(problem))


def loss_curve_markdown(metrics_path: Path) -> Optional[str]:
    """The train/val loss series as an inline PNG (Markdown) for the asset's page."""
    if not metrics_path.is_file():
        return None
    rows = [json.loads(line) for line in metrics_path.read_text().splitlines() if line.strip()]
    train = [(r["step"], r["loss"]) for r in rows if "loss" in r]
    val = [(r["step"], r["val_loss"]) for r in rows if "val_loss" in r]
    series = [(train, {"label": "train", "linewidth": 1})] if train else []
    series += [(val, {"fmt": "o-", "label": "val"})] if val else []
    return line_plot_markdown(series, "loss curve", "step", "loss (nats/token)")


MAX_CURVE_ROWS = 500  # rows of the loss-curve table; every evaluation is kept
LOSS_CURVE_SCHEMA = dg.TableSchema(columns=[
    dg.TableColumn("step", "int", description="optimizer step"),
    dg.TableColumn("train_loss", "float", description="training loss (nats/token) logged at this "
                                                       "step; empty where only an evaluation ran"),
    dg.TableColumn("val_loss", "float", description="validation loss (nats/token) on the frozen "
                                                     "validation split; empty between evaluations"),
])


def loss_curve_records(metrics_path: Path) -> list[dict]:
    """(step, train loss, val loss) rows from metrics.jsonl, one per logged step (a resumed run's
    repeated steps once), thinned to MAX_CURVE_ROWS train points plus every evaluation."""
    if not metrics_path.is_file():
        return []
    by_step: dict[int, dict] = {}
    for line in metrics_path.read_text().splitlines():
        if not line.strip():
            continue
        r = json.loads(line)
        point = by_step.setdefault(int(r["step"]), {"step": int(r["step"]), "train_loss": None,
                                                    "val_loss": None})
        if "loss" in r:
            point["train_loss"] = float(r["loss"])
        if "val_loss" in r:
            point["val_loss"] = float(r["val_loss"])
    steps = sorted(by_step)
    if not steps:
        return []
    stride = -(-len(steps) // MAX_CURVE_ROWS)  # ceil
    keep = set(steps[::stride]) | {steps[-1]}
    return [by_step[s] for s in steps if s in keep or by_step[s]["val_loss"] is not None]


def loss_curve_table(records: list[dict]) -> dg.TableMetadataValue:
    return dg.MetadataValue.table(records=[dg.TableRecord(r) for r in records],
                                  schema=LOSS_CURVE_SCHEMA)


def data_diff_metadata(context: dg.AssetExecutionContext, table: Table, current: str) -> dict:
    """``data_diff``: what changed in the data between the asset's previous materialization on
    this instance (its run folder, else its tag, else its version) and ``current`` (this run or
    ablation): a short Markdown table, a chart of the documents each rule moved, and the
    headline numbers (plotted across materializations). Never fails the run: a previous
    snapshot that is gone is said so."""
    from lance_assets.forensics.diff import DiffError, against_previous

    what = context.asset_key.to_user_string()
    event = context.instance.get_latest_materialization_event(context.asset_key)
    before = event.asset_materialization if event is not None else None
    meta = {k: v.value for k, v in (before.metadata if before else {}).items()}
    if not meta:
        return {"data_diff": dg.MetadataValue.md(
            f"No earlier materialization of `{what}` on this instance: nothing to compare with.")}
    folder = meta.get("run_dir") or meta.get("ablation_dir")
    refs = [Path(folder).name if folder else None, meta.get("lance/snapshot_tag"),
            meta.get("lance/table_version")]
    try:
        with phase(f"{what}: the data diff against the previous run", context.log.info,
                   announce=False):
            change = against_previous(table, refs, current, log=context.log.info)
    except DiffError as err:
        return {"data_diff": dg.MetadataValue.md(f"Cannot compare with the previous "
                                                 f"materialization: {err}")}
    except Exception as err:  # noqa: BLE001 - a report, never the reason a finished run fails
        context.log.warning(f"the data diff against the previous run failed: {err!r}")
        return {"data_diff": dg.MetadataValue.md(f"The data diff failed: {err!r}")}
    out = {
        "data_diff": dg.MetadataValue.md(f"What changed in the data since the previous "
                                         f"materialization:\n\n{change.markdown(short=True)}"),
        "data_diff/against": change.a["name"],
        "data_diff/documents_added": change.documents["added"],
        "data_diff/documents_removed": change.documents["removed"],
        "data_diff/training_docs_net": change.training["net_docs"],
        "data_diff/training_tokens_net": change.training["net_tokens"],
        "data_diff/rules_changed": sum(r.status != "same" for r in change.rules),
    }
    chart = change.chart()
    if chart:
        out["data_diff_chart"] = dg.MetadataValue.md(chart)
    return out


@dg.asset(deps=[TOKEN_IDS, CURATION_RULES], group_name=GROUP,
          kinds={"pytorch", "lance"}, code_version="3", automation_condition=training_condition(),
          op_tags=TRAINER_TAGS)
def pretrained_model(context: dg.AssetExecutionContext, config: TrainConfig,
                     lance_store: LanceStore, pipes_subprocess_client: TorchrunPipesClient):
    """A compact GPT trained by `torchrun -m lance_assets.train`, launched through Dagster Pipes.
    The loader packs and shuffles `input_ids` straight from the Lance table (filter: the
    `curation_rules` in force, a frozen validation split); rank 0 reports losses and tokens/s.
    Every rank and node reads one table version, resolved here and tagged `train-<run name>`
    (no cleanup removes it; resume, `samples` and `forensics` read it too). Metadata: the loss
    curve, the settings, and `data_diff`: what changed in the data since the previous run
    (documents added and removed, what each rule moved, flags flipped, with a chart)."""
    root, table = lance_store.root, lance_store.table  # the run's one table handle
    out = paths.run_dir(root, config.run_name or context.run.run_id[:8])
    start = time.perf_counter()
    check_world(config)
    spec = RunSpec.of(table, out, config.model_dump())
    tag, version = training_snapshot(config, table, out,
                                     check=lambda v: check_run_data(spec, table, v))
    context.log.info(f"training on table version {version}, tagged {tag} (release it with "
                     f"table_maintenance's release_snapshots once the run is no longer needed)")
    spec = dataclasses.replace(spec, tag=tag, version=version)
    with table.snapshots.using(tag):  # `forget` will not release it while it trains
        (metadata,) = launch(context, pipes_subprocess_client, spec)
    summary = json.loads((out / "summary.json").read_text())
    storage.write_atomic(paths.latest_checkpoint_pointer(root), summary["checkpoint"].encode())
    metadata["duration_s"] = round(time.perf_counter() - start, 2)
    metadata["run_dir"] = dg.MetadataValue.path(str(out))
    metadata["lance/snapshot_tag"] = tag
    metadata["lance/table_version"] = summary["table_version"]
    curve = loss_curve_markdown(out / "metrics.jsonl")
    if curve:
        metadata["loss_curve"] = dg.MetadataValue.md(curve)
    records = loss_curve_records(out / "metrics.jsonl")
    if records:
        metadata["loss_curve_table"] = loss_curve_table(records)
    metadata.update(data_diff_metadata(context, table, out.name))
    metadata["train_settings"] = dg.MetadataValue.json(spec.comparable())
    metadata["train_settings_digest"] = spec.digest()
    # its output is the checkpoint, trained on one table version
    version = data_version(context, summary["table_version"], digest(summary["checkpoint"]))
    return dg.MaterializeResult(metadata=metadata, data_version=version)


class SamplesConfig(dg.Config):
    prompts: list[str] = list(DEFAULT_PROMPTS)
    max_new_tokens: int = 200
    temperature: float = 0.8
    top_k: int = 40
    seed: int = 0


@dg.asset(deps=[pretrained_model], group_name=GROUP, kinds={"pytorch"}, code_version="1",
          automation_condition=ON_NEW_DATA)
def samples(context: dg.AssetExecutionContext, config: SamplesConfig, lance_store: LanceStore):
    """Text generated from the newest `pretrained_model` checkpoint (also:
    `python -m lance_assets.sample`). Written to DATA/samples/samples.json."""
    # the phase starts before the import: loading torch takes seconds on a busy machine
    with phase(f"samples: generating {len(config.prompts)} samples", context.log.info,
               announce=False):
        from lance_assets.sample import generate_samples, latest_checkpoint

        ckpt = latest_checkpoint(lance_store.root)
        start = time.perf_counter()
        result = generate_samples(ckpt, config.prompts, max_new_tokens=config.max_new_tokens,
                                  temperature=config.temperature, top_k=config.top_k,
                                  seed=config.seed)
    duration = time.perf_counter() - start
    storage.write_atomic(paths.samples_dir(lance_store.root) / "samples.json", json.dumps(
        {"checkpoint": str(ckpt), "samples": result}, indent=2).encode())
    n_tokens = sum(len(s["token_ids"]) for s in result)
    # The text stays in the file: a sample can reproduce a training document, and `forget`
    # rewrites files under the data root but cannot erase the instance's records.
    md = markdown_table([{"prompt": " ".join(s["prompt"].split()).replace("|", "/") or "(unconditional)",
                          "tokens": len(s["token_ids"])} for s in result])
    return dg.MaterializeResult(metadata={
        "dagster/row_count": len(result),
        "checkpoint": dg.MetadataValue.path(str(ckpt)),
        "samples": dg.MetadataValue.md(md),
        "samples_path": dg.MetadataValue.path(
            str(paths.samples_dir(lance_store.root) / "samples.json")),
        "settings": dg.MetadataValue.md(markdown_table([{
            "temperature": config.temperature, "top_k": config.top_k,
            "max_new_tokens": config.max_new_tokens, "seed": config.seed}])),
        "duration_s": round(duration, 3),
        "tokens_per_s": round(n_tokens / duration, 1) if duration else 0.0,
    })
