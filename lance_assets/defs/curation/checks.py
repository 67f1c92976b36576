"""Blocking checks on ``curation_rules``: when one fails, ``pretrained_model`` (downstream) does
not run in that run. Each wraps a function of ``lance_assets.corpus.guards``."""

import dagster as dg
import lance

from lance_assets.corpus import guards
from lance_assets.defs.curation.assets import curation_rules
from lance_assets.defs.resources import LanceStore


def _result(verdict: guards.Verdict) -> dg.AssetCheckResult:
    return dg.AssetCheckResult(
        passed=verdict.passed, severity=dg.AssetCheckSeverity.ERROR,
        description=verdict.message,
        metadata={"message": dg.MetadataValue.md(verdict.message),
                  **{k: dg.MetadataValue.json(v) if isinstance(v, (list, dict)) else v
                     for k, v in verdict.numbers.items()}},
    )


def _ds(lance_store: LanceStore) -> lance.LanceDataset:
    return lance.dataset(lance_store.table_uri)


@dg.asset_check(asset=curation_rules, blocking=True,
                description="Every curation rule parses (Lance SQL) and names existing columns.")
def rules_valid(lance_store: LanceStore) -> dg.AssetCheckResult:
    return _result(guards.rules_valid(_ds(lance_store)))


@dg.asset_check(asset=curation_rules, blocking=True,
                description="The training filter keeps more than zero (at least min_kept_rows) rows.")
def filter_keeps_rows(lance_store: LanceStore) -> dg.AssetCheckResult:
    return _result(guards.filter_keeps_rows(_ds(lance_store)))


@dg.asset_check(asset=curation_rules, blocking=True,
                description="No row that passes the training filter lacks input_ids.")
def input_ids_present(lance_store: LanceStore) -> dg.AssetCheckResult:
    return _result(guards.input_ids_present(_ds(lance_store)))


@dg.asset_check(asset=curation_rules, blocking=True,
                description="n_tokens equals the length of input_ids on every tokenized row.")
def n_tokens_consistent(lance_store: LanceStore) -> dg.AssetCheckResult:
    return _result(guards.n_tokens_consistent(_ds(lance_store)))


@dg.asset_check(asset=curation_rules, blocking=True,
                description="The share of rows flagged is_dup OR near_dup is within the configured bounds.")
def duplicate_rate_in_bounds(lance_store: LanceStore) -> dg.AssetCheckResult:
    return _result(guards.duplicate_rate_in_bounds(_ds(lance_store)))


CHECKS = [rules_valid, filter_keeps_rows, input_ids_present, n_tokens_consistent,
          duplicate_rate_in_bounds]
