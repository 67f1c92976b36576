"""Proxy-model comparisons.

For curation ablations: ``plan`` (arms, held-out split, equal tokens, run reuse, verdict),
``stats`` (paired leads, held-out error, power) and ``runner`` (the whole comparison, each run
launched by the caller). For ``mixture_search``: ``mixture`` (the swarm and its verification),
``regression`` (weights to held-out loss, the optimum) and ``remote`` (runs as Ray tasks).
``settings``: the settings of both, as run config.

The face: the modules ``runner``, ``mixture``, ``regression``, ``remote`` and ``settings``, and
the plan's types and errors.
"""

from lance_assets.ablation.plan import SAFE_NAME_RE, AblationError, AblationPlan, ArmPlan

__all__ = ["SAFE_NAME_RE", "AblationError", "AblationPlan", "ArmPlan", "mixture", "regression",
           "remote", "runner", "settings"]
