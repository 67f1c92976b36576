"""The curation assets and their blocking checks, through Dagster: metadata a person reads in the
UI, and a broken rule that stops training before it starts."""

import dagster as dg
import lance
import pytest

from lance_assets import paths
from lance_assets.curation import rules
from lance_assets.definitions import defs
from lance_assets.defs.curation.checks import CHECKS
from lance_assets.defs.resources import LanceStore
from lance_assets.defs.training.torchrun import TorchrunPipesClient
from lance_assets.table import Table

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


def test_no_asset_metadata_quotes_a_document(curated, store):
    """The instance keeps every materialization's metadata, and `forget` cannot erase it: no
    entry holds eight words in a row of any document."""
    from lance_assets.table.forget import quotes, shingles

    ds = lance.dataset(store.table_uri)
    fingerprints = shingles(ds.to_table(columns=["text"]).column("text").to_pylist())
    events = curated.get_asset_materialization_events()
    assert {e.asset_key.path[-1] for e in events} >= set(CORPUS)
    for event in events:
        for name, entry in event.materialization.metadata.items():
            assert not quotes(str(entry.value), fingerprints), (event.asset_key, name)


def test_curation_assets_report_what_a_person_needs(curated, store):
    ds = lance.dataset(store.table_uri)
    signals, near = meta(curated, "quality_signals"), meta(curated, "near_dup")
    index = meta(curated, "text_index")
    assert signals["rows_written"] == 800 and "word_count" in signals["signals"]
    assert "word_count" in signals["dagster/column_lineage"].deps_by_column
    assert near["rows_written"] == 800 and 0 < near["near_dup_rate"] < 0.2
    assert near["settings"]["bands"] == 14 and near["settings"]["rows_per_band"] == 8
    assert index["action"] == "created" and index["indexed_rows"] == 800
    # the best matches by id and score, never a document's text (forget cannot erase metadata)
    best = ds.to_table(full_text_query="telescope", columns=["id", "text"], limit=5)
    assert best.num_rows and all(f"| {i} |" in index["example_results"]
                                 for i in best.column("id").to_pylist())
    assert not any(t[:40] in index["example_results"] for t in best.column("text").to_pylist())

    cur = meta(curated, "curation_rules")
    assert cur["broken_rules"] == [] and 0 < cur["kept_rows"] < 800
    assert "gopher_word_count" in cur["rules"] and "removed only by this rule" in cur["rules"]
    assert cur["hit_counts"]["exact_dup"] == ds.count_rows(filter="is_dup")
    # the same counts as plain numbers (one key per rule) for Dagster's plots, and in tokens
    for rule, removed in cur["hit_counts"].items():
        assert cur[f"removed_rows/{rule}"] == removed
        # every row has tokens: a rule removes tokens exactly when it removes rows
        assert (cur[f"removed_tokens/{rule}"] > 0) == (removed > 0), rule
        assert cur[f"removed_tokens/{rule}"] <= cur["total_tokens"] - cur["kept_tokens"], rule
    # recounted from the rows themselves: the exact copies' tokens (NULL counts as removed)
    flags = ds.to_table(columns=["is_dup", "n_tokens"])
    dup = flags.column("is_dup").to_pylist()
    assert cur["removed_tokens/exact_dup"] == sum(
        n for d, n in zip(dup, flags.column("n_tokens").to_pylist()) if d is not False) > 0
    assert 0 < cur["kept_tokens"] < cur["total_tokens"]
    assert rules.stored_curation(ds).rules == rules.DEFAULT_RULES

    prof = meta(curated, "corpus_profile")
    assert prof["failed_queries"] == []
    for section in ("02_score_buckets", "03_length_percentiles", "04_duplicates", "06_language",
                    "07_tokens_per_document", "rule_hits"):
        assert prof[section].startswith("|"), section  # a Markdown table
    assert prof["histogram"].startswith("![") and "image/png;base64," in prof["histogram"]

    evaluations = checks(curated)
    assert evaluations.pop("files_ingested").passed  # raw_text's own, evaluated with it
    assert set(evaluations) == {c.check_key.name for c in CHECKS}
    assert all(e.passed and e.blocking for e in evaluations.values())


def failure_description(result, key):
    data = result.failure_data_for_node(key)
    assert data is not None, key
    return data.user_failure_data.description if data.user_failure_data else data.error.message


def test_broken_rule_is_refused_before_it_is_stored_and_training_never_starts(curated, store):
    version = lance.dataset(store.table_uri).version
    broken = {**rules.DEFAULT_RULES, "min_words": "word_cont >= 50"}
    result = dg.materialize(
        [*assets("curation_rules", "pretrained_model"), *CHECKS],
        resources={"lance_store": store, "pipes_subprocess_client": TorchrunPipesClient()},
        run_config={"ops": {"curation_rules": {"config": {"rules": broken}}}},
        raise_on_error=False,
    )
    assert not result.success
    message = failure_description(result, "curation_rules")
    assert "rule 'min_words'" in message
    assert "'word_cont', which the table does not have" in message
    assert "Fix them in the `curation_rules`" in message
    assert not result.asset_materializations_for_node("pretrained_model")
    started = {e.step_key for e in result.all_events if e.event_type_value == "STEP_START"}
    assert "pretrained_model" not in started
    # nothing stored: the table did not change and the rules in force are still the defaults
    ds = lance.dataset(store.table_uri)
    assert ds.version == version and rules.stored_curation(ds).rules == rules.DEFAULT_RULES
    assert rules.training_filter(Table.of(paths.data_dir(store.data_dir))) == rules.validate(
        ds, rules.DEFAULT_RULES)

    fixed = dg.materialize([*assets("curation_rules"), *CHECKS], resources={"lance_store": store})
    assert fixed.success and all(e.passed for e in checks(fixed).values())


PASSWD_RULE = ("true), false)) AS rows_removed, 0 AS share_removed FROM corpus UNION ALL SELECT "
               "content AS rule, 0, 0 FROM read_text('/etc/passwd') UNION ALL SELECT 'y' AS rule, "
               "count(*) FILTER (WHERE NOT coalesce((true")


def test_hostile_rule_never_shows_a_file_in_the_ui(curated, store):
    """The attack of issue 12: a rule that closes the hit-count query and reads /etc/passwd.
    Refused by curation_rules; and written straight into the table config, corpus_profile runs
    without it and shows no file contents."""
    version = lance.dataset(store.table_uri).version
    refused = dg.materialize(
        [*assets("curation_rules"), *CHECKS], resources={"lance_store": store},
        run_config={"ops": {"curation_rules": {"config": {"rules": {"x": PASSWD_RULE}}}}},
        raise_on_error=False)
    assert not refused.success and "rule 'x'" in failure_description(refused, "curation_rules")
    assert lance.dataset(store.table_uri).version == version

    hostile = rules.Curation(rules={**rules.DEFAULT_RULES, "x": PASSWD_RULE})
    store.table.set_config(rules.CURATION_KEY, hostile.to_dict())
    try:
        prof = dg.materialize(assets("corpus_profile"), resources={"lance_store": store})
        assert prof.success
        shown = repr(meta(prof, "corpus_profile"))
        assert "root:" not in shown and "/bin/" not in shown  # no line of /etc/passwd
        assert "rule_hits" in meta(prof, "corpus_profile")["failed_queries"]
    finally:
        restored = dg.materialize(assets("curation_rules"), resources={"lance_store": store})
        assert restored.success
