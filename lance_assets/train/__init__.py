"""The trainer: runs under ``torchrun`` or alone; imports torch, lancedb and dagster_pipes only.

The face: the modules ``config`` (every setting of a run), ``checkpoint`` (what a run saved),
``shapes`` (the model presets and architectures) and ``model`` (it needs torch, so the package
does not load it), and the domain and split planners that a launch checks before it starts.
"""

from lance_assets.train.domains import DomainError, check_domains, plan_mixture
from lance_assets.train.split import splits

__all__ = ["DomainError", "check_domains", "checkpoint", "config", "model", "plan_mixture",
           "shapes", "splits"]
