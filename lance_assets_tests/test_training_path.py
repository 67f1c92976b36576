"""Training waits only for what its rules read: the signals the configured rules name are
upstream of `pretrained_model`, the others (the embeddings, `semantic_dup`, `quality_score`)
are not, and a rule set at run time that names one of them is held by a blocking check until
its column is written on every row."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import dagster as dg
import lance
import pytest

from lance_assets import paths
from lance_assets.curation import guards, paragraph_dups, rules
from lance_assets.ingest.raw_text import ingest
from lance_assets.table import Table
from lance_assets.table.producer import produce
from lance_assets_tests.helpers import quiet

EMBEDDING_WORK = {"embeddings", "chunk_embeddings", "quality_score", "semantic_dup"}
RULE_SIGNALS = {"dedup_flag", "quality_signals", "near_dup", "detected_language",
                "contamination", "opted_out", "token_ids", "curation_rules"}

UPSTREAM = """
import json, dagster as dg
from lance_assets.definitions import defs
g = defs.resolve_asset_graph()
print(json.dumps({t: sorted(k.to_user_string() for k in
                  dg.AssetSelection.from_string("*" + t).resolve(g))
                  for t in ("pretrained_model", "curation_ablation")}))
"""


def upstream(env: dict | None = None) -> dict[str, set[str]]:
    out = subprocess.run([sys.executable, "-c", UPSTREAM], capture_output=True, text=True,
                         env={**os.environ, **(env or {})}, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return {k: set(v) for k, v in json.loads(out.stdout.strip().splitlines()[-1]).items()}


def test_default_rules_put_no_embedding_model_on_the_path_to_training():
    from lance_assets.definitions import defs

    graph = defs.resolve_asset_graph()
    for target in ("pretrained_model", "curation_ablation"):
        path = {k.to_user_string() for k in
                dg.AssetSelection.from_string(f"*{target}").resolve(graph)}
        assert not path & EMBEDDING_WORK, (target, path & EMBEDDING_WORK)
        assert RULE_SIGNALS <= path, (target, RULE_SIGNALS - path)
    # automation still brings every signal, the ones off the path included
    for name in EMBEDDING_WORK | {"paragraph_dups"}:
        node = graph.get(dg.AssetKey(name))
        assert node.automation_condition is not None, name
    checks = {key.name for key in graph.asset_check_keys
              if key.asset_key == dg.AssetKey("curation_rules")}
    assert "rule_columns_written" in checks


def test_a_rules_file_that_names_a_signal_puts_its_model_on_the_path(tmp_path):
    path = tmp_path / "rules.json"
    path.write_text(json.dumps({**rules.DEFAULT_RULES, "semantic": "NOT semantic_dup",
                                "scored": "quality_score >= 2.5"}))
    got = upstream({rules.RULES_ENV: str(path)})
    for target in ("pretrained_model", "curation_ablation"):
        assert EMBEDDING_WORK <= got[target], (target, EMBEDDING_WORK - got[target])


@pytest.mark.parametrize("content,problem", [
    ("{not json", "cannot be read as JSON"),
    ("[]", "not a non-empty object"),
    ('{"bad name": "NOT is_dup"}', "'bad name'"),
    ('{"r": 3}', "'r'"),
])
def test_a_broken_rules_file_is_named_with_the_fix(tmp_path, content, problem):
    path = tmp_path / "rules.json"
    path.write_text(content)
    with pytest.raises(rules.RulesFileError, match=problem) as err:
        rules.configured_rules(path)
    assert rules.RULES_ENV in str(err.value) and "exact_dup" in str(err.value)


def test_rule_columns_are_parsed_never_pasted():
    cols = frozenset({"is_dup", "quality_score", "word_count"})
    assert rules.rule_columns({"a": "NOT is_dup", "b": "quality_score > 1 AND word_count < 9"},
                              cols) == cols
    # a broken or hostile rule reads nothing here (curation_rules refuses it with the reason)
    assert rules.rule_columns({"x": "1; DROP TABLE corpus", "y": "is_dup OR"}, cols) == set()


def test_a_rule_on_a_signal_not_written_everywhere_blocks_training_until_it_is(tmp_path):
    root = tmp_path / "data"
    ingest(Table.of(root), "synthetic:300", rows_per_fragment=100, log=quiet)
    produce(paragraph_dups.PRODUCER, Table.of(root), log=quiet)
    ingest(Table.of(root), "synthetic:150", rows_per_fragment=100, log=quiet)  # new rows, not tagged yet
    rules.put_in_force(Table.of(root), {"few_repeats": "dup_paragraph_frac < 0.5"}, keep_languages=[],
                       drop_contaminated=False)
    verdict = guards.rule_columns_written(lance.dataset(paths.table_uri(root)))
    assert not verdict.passed
    assert "`dup_paragraph_frac` (150 rows" in verdict.message
    assert "--select paragraph_dups" in verdict.message
    assert verdict.numbers["assets"] == ["paragraph_dups"]
    produce(paragraph_dups.PRODUCER, Table.of(root), log=quiet)  # the asset catches up
    verdict = guards.rule_columns_written(lance.dataset(paths.table_uri(root)))
    assert verdict.passed, verdict.message
    assert "dup_paragraph_frac" in verdict.numbers["columns_read"]
