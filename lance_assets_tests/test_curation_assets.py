"""The curation assets and their blocking checks, through Dagster: metadata a person reads in the
UI, and a broken rule that stops training before it starts."""

import dagster as dg
import lance
import pytest

from lance_assets import paths
from lance_assets.corpus import rules
from lance_assets.definitions import defs
from lance_assets.defs.curation.checks import CHECKS
from lance_assets.defs.resources import LanceStore
from lance_assets.defs.training.assets import TrainConfig, trainer_command
from lance_assets.defs.training.torchrun import TorchrunPipesClient

CORPUS = ("raw_text", "dedup_flag", "token_ids", "quality_signals", "near_dup", "text_index")


def assets(*keys):
    return [defs.get_assets_def(k) for k in keys]


def meta(result, key):
    mats = result.asset_materializations_for_node(key)
    assert len(mats) == 1, key
    return {k: v.value for k, v in mats[0].metadata.items()}


def checks(result):
    return {e.check_name: e for e in result.get_asset_check_evaluations()}


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    root = tmp_path_factory.mktemp("curation_assets") / "data"
    return LanceStore(data_dir=str(root), source="synthetic:800")


@pytest.fixture(scope="module")
def curated(store):
    """The corpus columns, then the rules, their checks and the profile, in one Dagster run."""
    result = dg.materialize(
        [*assets(*CORPUS, "curation_rules", "corpus_profile"), *CHECKS],
        resources={"lance_store": store},
        run_config={"ops": {"raw_text": {"config": {"rows_per_fragment": 300}},
                            "token_ids": {"config": {"tokenizer": "byte"}}}},
    )
    assert result.success
    return result


def test_curation_assets_report_what_a_person_needs(curated, store):
    ds = lance.dataset(store.table_uri)
    signals, near, index = meta(curated, "quality_signals"), meta(curated, "near_dup"), meta(curated, "text_index")
    assert signals["rows_written"] == 800 and "word_count" in signals["signals"]
    assert "word_count" in signals["dagster/column_lineage"].deps_by_column
    assert near["rows_written"] == 800 and 0 < near["near_dup_rate"] < 0.2
    assert near["settings"]["bands"] == 14 and near["settings"]["rows_per_band"] == 8
    assert index["action"] == "created" and index["indexed_rows"] == 800
    assert "telescope" in index["example_results"].lower()

    cur = meta(curated, "curation_rules")
    assert cur["broken_rules"] == [] and 0 < cur["kept_rows"] < 800
    assert "gopher_word_count" in cur["rules"] and "removed only by this rule" in cur["rules"]
    assert cur["hit_counts"]["exact_dup"] == ds.count_rows(filter="is_dup")
    assert rules.stored_curation(ds).rules == rules.DEFAULT_RULES

    prof = meta(curated, "corpus_profile")
    assert prof["failed_queries"] == []
    for section in ("02_score_buckets", "03_length_percentiles", "04_duplicates", "06_language",
                    "07_tokens_per_document", "rule_hits"):
        assert prof[section].startswith("|"), section  # a Markdown table
    assert prof["histogram"].startswith("![") and "image/png;base64," in prof["histogram"]

    evaluations = checks(curated)
    assert set(evaluations) == {c.check_key.name for c in CHECKS}
    assert all(e.passed and e.blocking for e in evaluations.values())


def test_broken_rule_fails_the_blocking_check_and_training_never_starts(curated, store):
    broken = {**rules.DEFAULT_RULES, "min_words": "word_cont >= 50"}
    result = dg.materialize(
        [*assets("curation_rules", "pretrained_model"), *CHECKS],
        resources={"lance_store": store, "pipes_subprocess_client": TorchrunPipesClient()},
        run_config={"ops": {"curation_rules": {"config": {"rules": broken}}}},
        raise_on_error=False,
    )
    assert not result.success
    evaluations = checks(result)
    failed = evaluations["rules_valid"]
    assert not failed.passed and failed.blocking
    assert "rule 'min_words'" in failed.description
    assert "'word_cont', which the table does not have" in failed.description
    assert "Fix them in the `curation_rules` config" in failed.description
    assert meta(result, "curation_rules")["broken_rules"] == ["min_words"]
    assert not result.asset_materializations_for_node("pretrained_model")
    started = {e.step_key for e in result.all_events if e.event_type_value == "STEP_START"}
    assert "pretrained_model" not in started
    # outside this run too: the default filter is resolved from the stored (broken) rules
    with pytest.raises(rules.RuleError, match="min_words"):
        trainer_command(TrainConfig(), paths.data_dir(store.data_dir), store.root / "train" / "x")

    fixed = dg.materialize([*assets("curation_rules"), *CHECKS], resources={"lance_store": store})
    assert fixed.success and all(e.passed for e in checks(fixed).values())
