"""Where the column assets compute: the ``executor`` run-config field and the Ray resource.

The resource is ``dagster-ray``'s ``LocalRay`` with ``connect`` off: nothing starts with the
run, so a run with ``executor: local`` (the default) never pays for Ray. An asset run with
``executor: ray`` connects it on first use: ``RAY_ADDRESS`` when set (``ray.init`` reads it),
else a local Ray for the run, shut down with the run. Workers get this package from the job's
runtime environment (``py_modules``), never secrets.

The resource is bound to the column assets themselves, so ``dg.materialize`` callers that
pass only ``lance_store`` keep working; a Definitions-level key of the same name would conflict.
"""

from __future__ import annotations

import os
import warnings
from enum import Enum
from typing import Optional

import dagster as dg
from dagster_ray import Lifecycle, LocalRay, RayResource

from lance_assets.defs.config import RunConfig
from lance_assets.table.executor import EXECUTOR_ENV, executor_name, runtime_env

RAY_RESOURCE_KEY = "ray_cluster"

# `resource_defs=` on `@dg.asset` is marked beta; it is how the column assets carry the
# Ray resource without every caller of `dg.materialize` having to pass it. Say so once, here,
# instead of on every load of the code location.
warnings.filterwarnings("ignore", message=r"Parameter `resource_defs` of function `asset`",
                        category=dg.BetaWarning)


class Executor(Enum):
    local = "local"
    ray = "ray"


class ExecutorConfig(RunConfig):
    executor: Optional[Executor] = None
    """`local` (this run's process) or `ray` (one Ray task per fragment; `RAY_ADDRESS` when set,
    else a local Ray); default: `LANCE_ASSETS_EXECUTOR`, else `local`."""


def ray_cluster_resource() -> LocalRay:
    """A Ray resource that connects only when an asset asks for it (see ``column_executor``)."""
    options: dict = {"runtime_env": runtime_env()}
    if not os.environ.get("RAY_ADDRESS"):
        options["include_dashboard"] = False  # a run's own local Ray: start fast
    # cleanup "never": nothing to delete (LocalRay), and a connected Ray is shut down at the
    # end of the step whatever the policy
    return LocalRay(lifecycle=Lifecycle(connect=False, cleanup="never"),
                    ray_init_options=options)


RAY_RESOURCE_DEFS = {RAY_RESOURCE_KEY: ray_cluster_resource()}


def column_executor(context: dg.AssetExecutionContext, config: ExecutorConfig,
                    ray_cluster: RayResource) -> str:
    """The executor for this run (``local`` or ``ray``), with Ray connected when it is ``ray``."""
    name = executor_name(config.executor.value if config.executor else None)
    if name == "ray":
        import ray

        if not ray.is_initialized():
            ray_cluster.connect(context)
        context.log.info(f"executor: ray ({ray.cluster_resources().get('CPU', 0):.0f} CPUs, "
                         f"{ray.cluster_resources().get('GPU', 0):.0f} GPUs)")
    else:
        context.log.info(f"executor: local ({EXECUTOR_ENV}={os.environ.get(EXECUTOR_ENV, '')!r})")
    return name
