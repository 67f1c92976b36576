"""The checks that compare a result with earlier ones on the Dagster instance: a BPE that
compresses held-out text worse than the previous one, and a training run whose validation
bits/byte rose against the previous run with the same settings, warn (never block); a fresh
instance, other settings or another vocabulary size are passed with a note."""

from __future__ import annotations

import dagster as dg

from lance_assets.definitions import defs
from lance_assets.defs.resources import LanceStore
from lance_assets.defs.tokens.checks import bytes_per_token_not_worse, compare_tokenizers
from lance_assets.defs.training.checks import compare_runs, val_bpb_not_worse


def tokenizer_meta(sha: str, bpt: float, vocab: int = 8192) -> dict:
    return {"tokenizer_sha256": sha, "tokenizer_name": f"bpe:{sha}", "bytes_per_token_bpe": bpt,
            "vocab_size_requested": vocab}


def test_tokenizer_comparison_against_the_previous_bpe():
    # newest first; the same BPE materialized again is not "the previous one"
    worse = compare_tokenizers([tokenizer_meta("b", 3.5), tokenizer_meta("b", 3.5),
                                tokenizer_meta("a", 3.9)])
    assert not worse.passed and worse.severity == dg.AssetCheckSeverity.WARN
    assert "3.500 vs 3.900" in worse.description and "compresses worse" in worse.description
    assert compare_tokenizers([tokenizer_meta("b", 3.85), tokenizer_meta("a", 3.9)]).passed
    assert compare_tokenizers([tokenizer_meta("b", 4.2), tokenizer_meta("a", 3.9)]).passed
    other_vocab = compare_tokenizers([tokenizer_meta("b", 2.0, 512), tokenizer_meta("a", 3.9)])
    assert other_vocab.passed and "vocab_size" in other_vocab.description
    first = compare_tokenizers([tokenizer_meta("a", 3.9), tokenizer_meta("a", 3.9)])
    assert first.passed and "no previous tokenizer" in first.description


def run_meta(settings: str, bpb: float) -> dict:
    return {"train_settings_digest": settings, "val_bpb": bpb, "table_version": 7}


def test_run_comparison_against_the_previous_run_with_the_same_settings():
    # newest first; a run with other settings in between is skipped
    worse = compare_runs([run_meta("s", 1.10), run_meta("t", 0.50), run_meta("s", 1.00)])
    assert not worse.passed and worse.severity == dg.AssetCheckSeverity.WARN
    assert "1.1000 vs 1.0000" in worse.description
    assert compare_runs([run_meta("s", 1.02), run_meta("s", 1.00)]).passed
    alone = compare_runs([run_meta("s", 1.10), run_meta("t", 0.50)])
    assert alone.passed and "no earlier run with the same settings" in alone.description


def test_a_worse_bpe_warns_through_the_instance(tmp_path):
    """Two real `tokenizer` materializations on one instance; the second, trained on a sliver of
    the text, compresses worse and its check fails with a warning, blocking nothing."""
    store = LanceStore(data_dir=str(tmp_path / "data"), source="synthetic:400")
    assets = [defs.get_assets_def(k) for k in ("raw_text", "dedup_flag", "tokenizer")]
    with dg.instance_for_test() as instance:
        def run(tokenizer_config: dict) -> dg.AssetCheckEvaluation:
            result = dg.materialize([*assets, bytes_per_token_not_worse], instance=instance,
                                    resources={"lance_store": store},
                                    run_config={"ops": {"tokenizer": {"config": tokenizer_config}}})
            assert result.success  # a warning never fails or blocks the run
            (evaluation,) = [e for e in result.get_asset_check_evaluations()
                             if e.check_name == "bytes_per_token_not_worse"]
            return evaluation

        first = run({})
        assert first.passed and "no previous tokenizer" in first.description
        worse = run({"retrain": True, "max_train_bytes": 3000})
        assert not worse.passed and worse.severity == dg.AssetCheckSeverity.WARN
        assert worse.metadata["previous"].value > worse.metadata["bytes_per_token"].value


def test_a_worse_training_run_warns_through_the_instance():
    """Materializations of `pretrained_model` recorded on an instance (as a run reports them);
    the check reads them back from the instance."""
    key = dg.AssetKey("pretrained_model")
    with dg.instance_for_test() as instance:
        for bpb in (1.00, 1.20):
            instance.report_runless_asset_event(dg.AssetMaterialization(
                asset_key=key, metadata={"val_bpb": bpb, "train_settings_digest": "same",
                                         "table_version": 3}))
        result = val_bpb_not_worse(dg.build_asset_check_context(instance=instance))
        assert not result.passed and result.severity == dg.AssetCheckSeverity.WARN
        assert result.metadata["previous"].value == 1.00
