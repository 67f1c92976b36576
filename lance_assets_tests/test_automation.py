"""Declarative automation, evaluated tick by tick with Dagster's own tester
(``dg.evaluate_automation_conditions``) over an instance that holds real materializations of a
small table:

- a fresh instance requests nothing;
- after ``raw_text`` ingests new rows, every column asset, index, report, the curation rules and
  the checks on them are requested in that one tick; training, samples and forensics are not;
- once that run is done, the next tick requests nothing (no cascade of no-op runs);
- an ingest that finds nothing new (same data version) requests nothing;
- with ``LANCE_ASSETS_AUTO_TRAIN=1`` training, its check and what follows it join.
"""

from __future__ import annotations

import dagster as dg
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lance_assets.definitions import defs
from lance_assets.defs import conditions
from lance_assets.defs.resources import LanceStore
from lance_assets.ingest.synthetic import SyntheticSpec, generate

COLUMN_CHAIN = {"dedup_flag", "tokenizer", "token_ids", "quality_signals", "fineweb_signals", "near_dup",
                "text_index", "curation_rules", "corpus_profile", "embeddings", "vector_index",
                "detected_language", "personal_data", "paragraph_dups", "contamination",
                "quality_score", "chunk_embeddings", "chunk_index", "semantic_dup", "opted_out"}
CHAIN_CHECKS = {"rules_valid", "filter_keeps_rows", "input_ids_present", "n_tokens_consistent",
                "duplicate_rate_in_bounds", "contamination_not_kept", "bytes_per_token_not_worse",
                "columns_written", "rule_columns_written", "no_source_wiped_out"}
TRAINING = {"pretrained_model", "samples", "forensics", "val_bpb_not_worse", "training_data_summary"}
INGEST_CONFIG = {"ops": {"raw_text": {"config": {"rows_per_fragment": 40}}}}
CHAIN_CONFIG = {"ops": {"embeddings": {"config": {"max_tokens": 16}}}}


def landing_file(folder, name: str, rows: int, seed: int):
    folder.mkdir(parents=True, exist_ok=True)
    texts = generate(SyntheticSpec(rows=rows, seed=seed, dup_fraction=0.1)).column("text")
    pq.write_table(pa.table({"text": texts}), folder / name)


def requested(result) -> set[str]:
    """Names of the assets and checks a tick requested."""
    return {r.key.name if isinstance(r.key, dg.AssetCheckKey) else r.key.to_user_string()
            for r in result.results if r.true_subset.size}


def auto_train_definitions(monkeypatch) -> dg.Definitions:
    """The code location as it loads with LANCE_ASSETS_AUTO_TRAIN=1."""
    monkeypatch.setenv(conditions.AUTO_TRAIN_ENV, "1")
    condition = conditions.training_condition()
    assert condition is not None
    assets = [a.map_asset_specs(lambda spec: spec.replace_attributes(automation_condition=condition))
              if a.key == dg.AssetKey("pretrained_model") else a for a in defs.assets]
    return dg.Definitions(assets=assets, asset_checks=defs.asset_checks, resources=defs.resources)


class Ticks:
    """One automation sensor: evaluates ``definitions`` on every ``tick``, keeping its cursor."""

    def __init__(self, definitions: dg.Definitions, instance: dg.DagsterInstance):
        self.definitions, self.instance, self.cursor = definitions, instance, None

    def tick(self) -> set[str]:
        result = dg.evaluate_automation_conditions(defs=self.definitions, instance=self.instance,
                                                   cursor=self.cursor)
        self.cursor = result.cursor
        return requested(result)


def test_new_rows_bring_every_column_and_nothing_else_does(tmp_path, monkeypatch):
    landing = tmp_path / "landing"
    landing_file(landing, "a.parquet", rows=80, seed=1)
    store = LanceStore(data_dir=str(tmp_path / "data"), source=str(landing))
    resources = {"lance_store": store}
    raw_text = defs.get_assets_def("raw_text")

    def ingest() -> None:
        assert dg.materialize([raw_text], instance=instance, resources=resources,
                              run_config=INGEST_CONFIG).success

    with dg.instance_for_test() as instance:
        default, auto = Ticks(defs, instance), Ticks(auto_train_definitions(monkeypatch), instance)
        assert default.tick() == set() and auto.tick() == set()  # a fresh instance starts nothing

        ingest()  # 80 new rows
        chain = default.tick()
        assert chain == COLUMN_CHAIN | CHAIN_CHECKS, chain
        assert auto.tick() == COLUMN_CHAIN | CHAIN_CHECKS | TRAINING

        # the automation sensor's run: everything it requested, in one run
        checks = [c for c in defs.asset_checks
                  if {k.name for k in c.check_keys} <= CHAIN_CHECKS]
        assert dg.materialize([*(defs.get_assets_def(k) for k in COLUMN_CHAIN), *checks],
                              instance=instance, resources=resources, run_config=CHAIN_CONFIG).success
        assert default.tick() == set()  # up to date: no second round of no-op runs
        auto.tick()  # (training, requested on the tick before, would be running by now)

        ingest()  # nothing new: same data version
        assert default.tick() == set() and auto.tick() == set()

        landing_file(landing, "b.parquet", rows=30, seed=2)
        ingest()  # 30 new rows
        assert default.tick() == COLUMN_CHAIN | CHAIN_CHECKS
        assert auto.tick() == COLUMN_CHAIN | CHAIN_CHECKS | TRAINING


def test_auto_train_refuses_a_value_that_is_not_yes_or_no(monkeypatch):
    monkeypatch.setenv(conditions.AUTO_TRAIN_ENV, "sometimes")
    with pytest.raises(ValueError, match="LANCE_ASSETS_AUTO_TRAIN='sometimes' is not a yes/no"):
        conditions.training_condition()
    monkeypatch.setenv(conditions.AUTO_TRAIN_ENV, "0")
    assert conditions.training_condition() is None


def test_a_failed_blocking_check_upstream_holds_back_what_follows_it(tmp_path):
    """After the chain ran, rows arrive behind Dagster's back (a library ingest; pending for
    `dedup_flag`'s next run) and a value `dedup_flag` wrote on its pinned version is lost (its
    write marker nulled, as a compaction by another tool can leave it), so `dedup_flag`'s
    blocking `columns_written` check fails. A new `quality_signals` then changes
    a data version upstream of `curation_rules`, but `curation_rules` is not requested while
    `dedup_flag`'s check stands failed and `dedup_flag` itself is not being rerun."""
    from lance_assets.ingest.raw_text import ingest as library_ingest

    landing = tmp_path / "landing"
    landing_file(landing, "a.parquet", rows=80, seed=1)
    store = LanceStore(data_dir=str(tmp_path / "data"), source=str(landing))
    resources = {"lance_store": store}
    with dg.instance_for_test() as instance:
        ticks = Ticks(defs, instance)
        assert dg.materialize([defs.get_assets_def("raw_text")], instance=instance,
                              resources=resources, run_config=INGEST_CONFIG).success
        checks = [c for c in defs.asset_checks if {k.name for k in c.check_keys} <= CHAIN_CHECKS]
        assert dg.materialize([*(defs.get_assets_def(k) for k in COLUMN_CHAIN), *checks],
                              instance=instance, resources=resources, run_config=CHAIN_CONFIG).success
        assert ticks.tick() == set()

        landing_file(landing, "b.parquet", rows=30, seed=2)
        library_ingest(store.table, str(landing), rows_per_fragment=40, log=lambda _: None)
        store.table.commit("lose a value", lambda ds: ds.update({"_written_is_dup": "NULL"},
                                                                 where="id = 3"))
        dedup_check = [c for c in checks if dg.AssetCheckKey(dg.AssetKey("dedup_flag"),
                                                             "columns_written") in c.check_keys]
        result = dg.materialize([defs.get_assets_def("dedup_flag"), *dedup_check],
                                instance=instance, resources=resources, raise_on_error=False,
                                selection=dg.AssetSelection.checks_for_assets(
                                    dg.AssetKey("dedup_flag")))
        (evaluation,) = result.get_asset_check_evaluations()
        assert not evaluation.passed
        assert dg.materialize([defs.get_assets_def("quality_signals")], instance=instance,
                              resources=resources).success  # writes the new rows' signals
        requested_now = ticks.tick()
        assert "curation_rules" not in requested_now and "corpus_profile" not in requested_now
