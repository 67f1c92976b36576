"""The run both model columns share (``embedding``, ``chunk_embeddings``): one step of a producer.

A :class:`ModelColumn` says what differs between them (the spec the column holds, the compute,
the numbers it adds); ``step()`` is the rest, the same for both. Its state, on the pinned
version: refuse to mix kinds of vectors in the column (its spec is recorded in the table's
config), resolve the backend (the column's own under ``auto``), make the compute, and, when some
fragment lacks the column, drop the saved ranges no fragment can use any more, load the model
(locally, before the first fragment, so its cost is reported apart) and record the spec.
Nothing is loaded when no fragment lacks the column. After the write, the written fragments'
saved ranges are removed and the report gets the model's numbers.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any, Optional

import lance
import pyarrow as pa

from lance_assets.embeddings import onnx_backend
from lance_assets.embeddings.ranges import RANGE_SECONDS, sweep
from lance_assets.progress import phase
from lance_assets.table.columns import ColumnWriteReport, fragments_missing
from lance_assets.table.executor import executor_name
from lance_assets.table.producer import Run, Step, setting
from lance_assets.table.settings import InputError

BACKEND_HELP = ("`auto` (the column's own backend when it holds vectors, else `torch` on a GPU, "
                "`torch-bf16` on a CPU with bfloat16 matrix units, `onnx-int8` on other CPUs), "
                "`torch`, `torch-bf16`, `onnx-fp32` or `onnx-int8`.")


class EmbeddingMismatchError(InputError):
    """The column holds vectors of another kind (model, window, backend) than asked for."""


def default_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def resolve_backend(backend: str, device: str | None, executor: str | None,
                    recorded: str | None) -> str:
    """The backend a run uses: ``recorded`` (the column's own) under ``auto``, else by where the
    model runs (under Ray: a GPU when the cluster has one)."""
    if device is None and executor_name(executor) == "ray" and backend == "auto" and not recorded:
        from lance_assets.table.executor import cluster_gpus, ensure_ray

        ensure_ray()
        device = "cuda" if cluster_gpus() else "cpu"
    return onnx_backend.resolve(backend, device or default_device(), recorded)


@dataclass(frozen=True)
class ModelSettings:
    """The settings both model columns have; each adds its window."""

    batch_size: int = setting(0, "Texts per forward pass (documents, or chunks for "
                                 "chunk_embeddings); 0 = 64 on CPU, 256 on GPU.")
    device: Optional[str] = setting(None, "`cpu`, `cuda`, `cuda:1`...; default: a GPU when "
                                          "present.")
    backend: str = setting("auto", BACKEND_HELP)
    embedder: object | None = setting(None, "A stand-in for the model (tests).", run_config=False)
    range_seconds: float = setting(RANGE_SECONDS, "Seconds of model work between two saved row "
                                   "ranges of a large fragment.", run_config=False)


@dataclass
class ModelPlan:
    """The step's state: the compute, what the column will hold, and where the model runs."""

    compute: Any
    spec: dict
    on_ray: bool
    todo: int = 0  # fragments lacking the column on the pinned version
    device: str = ""
    model_load_s: float = 0.0
    write_started: float = 0.0


@dataclass
class ModelReport(ColumnWriteReport):
    """The write's report with the model's numbers."""

    device: str = ""
    docs_per_s: float = 0.0
    model_load_s: float = 0.0
    spec: dict | None = None
    copied_from_kept: int = 0  # is_dup rows given their kept member's vectors (local executor)


class ModelColumn:
    """What differs between the model columns; the methods below it are what they share."""

    field: pa.Field
    config_key: str

    def spec(self, settings: Any, backend: str) -> Any:
        """What the column will hold (recorded in the table's config), from the settings."""
        raise NotImplementedError

    def recorded(self, ds: lance.LanceDataset) -> Any:
        """The spec the table's config records, or None."""
        raise NotImplementedError

    def mismatch(self, uri: str, current: Any, want: Any) -> EmbeddingMismatchError:
        """Why ``want`` cannot be added to a column that holds ``current``, and the fix."""
        raise NotImplementedError

    def compute(self, run: Run, want: Any) -> Any:
        """The write's compute (picklable: a Ray worker loads the model itself)."""
        raise NotImplementedError

    def describe(self, run: Run, plan: ModelPlan, rows: int) -> str:
        """The line logged before the first fragment."""
        raise NotImplementedError

    def report(self, written: ColumnWriteReport, plan: ModelPlan) -> ModelReport:
        raise NotImplementedError

    # -- shared
    def holds_data(self, ds: lance.LanceDataset) -> bool:
        return self.field.name in ds.schema.names and len(
            fragments_missing(ds, [self.field.name])) < len(ds.get_fragments())

    def plan(self, run: Run, before: Any) -> ModelPlan:
        """The step's state, on the pinned version (see the module docstring)."""
        table, ds, log, settings = run.table, run.pinned, run.log, run.settings
        current = self.recorded(ds)
        holds = current is not None and self.holds_data(ds)
        backend = resolve_backend(settings.backend, settings.device, run.executor,
                                  current.backend if holds else None)
        want = self.spec(settings, backend)
        if holds and current != want:
            raise self.mismatch(table.uri, current, want)
        name = self.field.name
        todo = fragments_missing(ds, [name]) if name in ds.schema.names else ds.get_fragments()
        on_ray = run.where == "ray"
        plan = ModelPlan(self.compute(run, want), want.to_dict(), on_ray, len(todo))
        if not todo:  # nothing to embed: do not pay for loading the model
            return plan
        sweep(table, name, plan.spec)  # ranges no fragment can use any more
        if on_ray:
            plan.device = "ray"  # each task picks its own (cuda when it was given a GPU)
        else:
            t0 = time.perf_counter()
            with phase(f"{name}: loading the model", log, announce=False):
                plan.device = getattr(plan.compute.model(), "device", "")
            plan.model_load_s = time.perf_counter() - t0
        if current != want:
            table.set_config(self.config_key, plan.spec)
        log(self.describe(run, plan, sum(f.count_rows() for f in todo)))
        plan.write_started = time.perf_counter()
        return plan

    def after(self, run: Run, plan: ModelPlan, written: ColumnWriteReport) -> ModelReport:
        """After the write: the written fragments' saved ranges removed; the report."""
        wall_s = time.perf_counter() - plan.write_started
        if plan.todo:
            sweep(run.table, self.field.name, plan.spec)
        out = self.report(written, plan)
        # local: the model's own time; Ray: rows per second of the whole fan-out
        busy = plan.compute.encode_s if not plan.on_ray else wall_s
        out.docs_per_s = written.rows_written / busy if busy else 0.0
        return out

    def base_report(self, written: ColumnWriteReport, plan: ModelPlan) -> dict:
        """The fields every model report has, for ``report``."""
        return {**asdict(written), "device": plan.device, "model_load_s": plan.model_load_s,
                "spec": plan.spec, "copied_from_kept": plan.compute.copied}

    def step(self) -> Step:
        return Step(fields=[self.field], state=self.plan,
                    compute=lambda settings, plan: plan.compute, after=self.after, gpu=True)

