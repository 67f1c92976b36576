"""What the code location gives every asset: the resources (``lance_store`` from the
environment, the torchrun Pipes client) and the run executor."""

import dagster as dg

from lance_assets.defs.common import RUN_EXECUTOR
from lance_assets.defs.resources import lance_store_from_env
from lance_assets.defs.training.torchrun import TorchrunPipesClient


@dg.definitions
def location() -> dg.Definitions:
    return dg.Definitions(
        executor=RUN_EXECUTOR,
        resources={
            "lance_store": lance_store_from_env(),
            # Longer than torchrun's own shutdown, so a cancelled run's ranks can flush a
            # checkpoint, and short enough that every rank is gone within a minute.
            "pipes_subprocess_client": TorchrunPipesClient(termination_timeout_seconds=55),
        },
    )
