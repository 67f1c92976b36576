"""Checks on the tokens assets that compare a result with the previous one on this Dagster
instance (a fresh instance has none: the check passes and says so)."""

import dagster as dg

from lance_assets.defs.common import TOKENIZER
from lance_assets.defs.conditions import CHECK_ON_ASSET_UPDATE
from lance_assets.defs.metadata import materialization_history

# A new BPE may compress the held-out text at most this much worse (relative) than the one
# before it: the held-out sample grows with the corpus, so small moves are noise, not a
# regression.
MAX_BYTES_PER_TOKEN_DROP = 0.03
METRIC = "bytes_per_token_bpe"


def compare_tokenizers(history: list[dict], max_drop: float = MAX_BYTES_PER_TOKEN_DROP
                       ) -> dg.AssetCheckResult:
    """The newest tokenizer (``history[0]``) against the newest earlier one that is a different
    BPE: held-out bytes/token may not fall by more than ``max_drop``."""
    if not history or history[0].get(METRIC) is None:
        return dg.AssetCheckResult(passed=True, severity=dg.AssetCheckSeverity.WARN,
                                   description="tokenizer reported no held-out bytes/token yet")
    current, *earlier = history
    previous = next((m for m in earlier if m.get("tokenizer_sha256") != current.get("tokenizer_sha256")
                     and m.get(METRIC) is not None), None)
    if previous is None:
        return dg.AssetCheckResult(
            passed=True, severity=dg.AssetCheckSeverity.WARN,
            description="no previous tokenizer on this instance to compare with",
            metadata={"bytes_per_token": current[METRIC]})
    if previous.get("vocab_size_requested") != current.get("vocab_size_requested"):
        return dg.AssetCheckResult(
            passed=True, severity=dg.AssetCheckSeverity.WARN,
            description=f"not compared: the previous tokenizer asked for vocab_size "
                        f"{previous.get('vocab_size_requested')}, this one "
                        f"{current.get('vocab_size_requested')}",
            metadata={"bytes_per_token": current[METRIC], "previous": previous[METRIC]})
    now, before = float(current[METRIC]), float(previous[METRIC])
    change = now / before - 1 if before else 0.0
    passed = change >= -max_drop
    return dg.AssetCheckResult(
        passed=passed, severity=dg.AssetCheckSeverity.WARN,
        description=(f"held-out bytes/token {now:.3f} vs {before:.3f} for the previous BPE "
                     f"({change:+.1%}; allowed: down to -{max_drop:.0%})")
                    + ("" if passed else ": the new BPE compresses worse; check its training "
                       "sample (filter, max_train_bytes) before re-tokenizing with it"),
        metadata={"bytes_per_token": now, "previous": before, "change": round(change, 4),
                  "previous_tokenizer": previous.get("tokenizer_name", ""),
                  "max_drop": max_drop})


@dg.asset_check(asset=TOKENIZER, blocking=False, automation_condition=CHECK_ON_ASSET_UPDATE,
                description="Held-out bytes/token of the newest BPE is at most "
                            f"{MAX_BYTES_PER_TOKEN_DROP:.0%} below the previous BPE's (same "
                            "vocab_size requested); warns, never blocks.")
def bytes_per_token_not_worse(context: dg.AssetCheckExecutionContext) -> dg.AssetCheckResult:
    return compare_tokenizers(materialization_history(context.instance, TOKENIZER))


CHECKS = [bytes_per_token_not_worse]
