"""Blocking checks on ``curation_rules``: when one fails, ``pretrained_model`` (downstream) does
not run in that run. Each wraps a function of ``lance_assets.curation.guards`` of the same name."""

from collections.abc import Callable

import dagster as dg
import lance

from lance_assets.curation import guards
from lance_assets.defs.common import CURATION_RULES
from lance_assets.defs.conditions import CHECK_ON_ASSET_UPDATE
from lance_assets.defs.resources import LanceStore


def _result(verdict: guards.Verdict) -> dg.AssetCheckResult:
    return dg.AssetCheckResult(
        passed=verdict.passed, severity=dg.AssetCheckSeverity.ERROR,
        description=verdict.message,
        metadata={"message": dg.MetadataValue.md(verdict.message),
                  **{k: dg.MetadataValue.json(v) if isinstance(v, (list, dict)) else v
                     for k, v in verdict.numbers.items()}},
    )


def blocking_check(guard: Callable[[lance.LanceDataset], guards.Verdict],
                   description: str) -> dg.AssetChecksDefinition:
    """A blocking check on ``curation_rules`` named after ``guard``, run on the newest table."""

    @dg.asset_check(asset=CURATION_RULES, name=guard.__name__, blocking=True,
                    description=description, automation_condition=CHECK_ON_ASSET_UPDATE)
    def check(lance_store: LanceStore) -> dg.AssetCheckResult:
        return _result(guard(lance_store.table.newest()))

    return check


CHECKS = [
    blocking_check(guards.rules_valid,
                   "Every curation rule parses (Lance SQL) and names existing columns."),
    blocking_check(guards.rule_columns_written,
                   "Every column the rules read is written on every row (an opt-in signal a rule "
                   "names blocks training until its asset has run)."),
    blocking_check(guards.filter_keeps_rows,
                   "The training filter keeps more than zero (at least min_kept_rows) rows."),
    blocking_check(guards.input_ids_present,
                   "No row that passes the training filter lacks input_ids."),
    blocking_check(guards.n_tokens_consistent,
                   "n_tokens equals the length of input_ids on every tokenized row."),
    blocking_check(guards.duplicate_rate_in_bounds,
                   "The share of rows flagged is_dup OR near_dup is within the configured bounds."),
    blocking_check(guards.contamination_not_kept,
                   "No row the training filter keeps shares a word 13-gram with a registered "
                   "evaluation set (or is unchecked)."),
]
