"""The trainer: runs under ``torchrun`` or alone; imports torch, lancedb and dagster_pipes only.

The face: the modules ``config`` (every setting of a run), ``checkpoint`` (what a run saved),
``shapes`` (the model presets and architectures) and ``model`` (it needs torch, so the package
does not load it), ``RunSpec`` (one training run: its settings, snapshot and folder; its
command line), and the domain and split planners and the data check (``check_run_data``) that a
launch runs before it starts.
"""

from lance_assets.train.domains import DomainError, check_domains, plan_mixture
from lance_assets.train.spec import RunSpec
from lance_assets.train.split import check_run_data, splits

__all__ = ["DomainError", "RunSpec", "check_domains", "check_run_data", "checkpoint", "config",
           "model", "plan_mixture", "shapes", "splits"]
