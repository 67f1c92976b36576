"""Checks on ``pretrained_model`` that compare a run with earlier ones on this Dagster instance
(a fresh instance has none: the check passes and says so)."""

import dagster as dg

from lance_assets.defs.common import PRETRAINED_MODEL
from lance_assets.defs.conditions import CHECK_ON_ASSET_UPDATE
from lance_assets.defs.metadata import materialization_history

# Validation bits per byte may be at most this much higher (relative) than the previous run with
# the same settings: the corpus and its validation split grow between runs.
MAX_VAL_BPB_RISE = 0.03
METRIC = "val_bpb"


def compare_runs(history: list[dict], max_rise: float = MAX_VAL_BPB_RISE) -> dg.AssetCheckResult:
    """The newest run (``history[0]``) against the newest earlier run with the same
    ``train_settings_digest``: validation bits/byte may not rise by more than ``max_rise``."""
    if not history or history[0].get(METRIC) is None:
        return dg.AssetCheckResult(passed=True, severity=dg.AssetCheckSeverity.WARN,
                                   description="the run reported no validation bits/byte")
    current, *earlier = history
    same = current.get("train_settings_digest")
    previous = next((m for m in earlier if same and m.get("train_settings_digest") == same
                     and m.get(METRIC) is not None), None)
    if previous is None:
        return dg.AssetCheckResult(
            passed=True, severity=dg.AssetCheckSeverity.WARN,
            description="no earlier run with the same settings on this instance to compare with",
            metadata={"val_bpb": current[METRIC]})
    now, before = float(current[METRIC]), float(previous[METRIC])
    change = now / before - 1 if before else 0.0
    passed = change <= max_rise
    return dg.AssetCheckResult(
        passed=passed, severity=dg.AssetCheckSeverity.WARN,
        description=(f"val bits/byte {now:.4f} vs {before:.4f} for the previous run with the same "
                     f"settings ({change:+.1%}; allowed: up to +{max_rise:.0%})")
                    + ("" if passed else ": compare the runs' table versions, filters and "
                       "tokenizers (metadata) before using this model"),
        metadata={"val_bpb": now, "previous": before, "change": round(change, 4),
                  "previous_table_version": previous.get("table_version", -1),
                  "max_rise": max_rise})


@dg.asset_check(asset=PRETRAINED_MODEL, blocking=False,
                automation_condition=CHECK_ON_ASSET_UPDATE,
                description="Validation bits/byte is at most "
                            f"{MAX_VAL_BPB_RISE:.0%} above the previous run with the same "
                            "settings; warns, never blocks.")
def val_bpb_not_worse(context: dg.AssetCheckExecutionContext) -> dg.AssetCheckResult:
    return compare_runs(materialization_history(context.instance, PRETRAINED_MODEL))


CHECKS = [val_bpb_not_worse]
