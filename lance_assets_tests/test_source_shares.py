"""The ``no_source_wiped_out`` check on ``curation_rules``: a planted source that one rule empties
is a warning naming the rule and the source; the share each rule removes of every source and of
every domain above the floor is in the metadata, equal to a recount of the rows."""

import json

import dagster as dg
import pyarrow as pa

from lance_assets.curation.source_shares import rule_shares
from lance_assets.definitions import defs
from lance_assets.defs.resources import LanceStore
from lance_assets.ingest.raw_text import ingest
from lance_assets.table import Table
from lance_assets.table.producer import produce
from lance_assets.tokens import token_ids
from lance_assets_tests.helpers import quiet, write_fineweb_parquet

RULES = {"long_enough": "n_chars >= 60", "no_sevens": "NOT (text LIKE '%seven%')"}


def test_a_rule_that_empties_a_source_is_a_warning_with_the_shares(tmp_path):
    root = tmp_path / "data"
    words = ["one", "two", "three", "four", "five", "six", "seven", "eight"]
    web = [f"a long page about {words[i % 8]} rivers and mountains and the sea, number {i}"
           for i in range(70)]
    urls = [f"https://www.bigdomain.com/{i}" if i < 55 else f"https://small{i}.org/" for i in range(70)]
    (tmp_path / "web").mkdir()
    (tmp_path / "forum").mkdir()
    ingest(Table.of(root), str(write_fineweb_parquet(tmp_path / "web" / "w.parquet", web,
                                                     extra={"url": pa.array(urls)})), log=quiet)
    forum = [f"short {i}" for i in range(30)]  # every forum post fails long_enough
    ingest(Table.of(root), str(write_fineweb_parquet(
        tmp_path / "forum" / "f.parquet", forum, start_id=100,
        extra={"url": pa.array([None] * 30, pa.string())})), log=quiet)
    produce(token_ids.PRODUCER, Table.of(root), token_ids.TokenIdsSettings(tokenizer="byte"),
            log=quiet)
    result = dg.materialize(
        [defs.get_assets_def("curation_rules"),
         next(c for c in defs.asset_checks if "no_source_wiped_out" in
              {k.name for k in c.check_keys})],
        resources={"lance_store": LanceStore(data_dir=str(root))},
        run_config={"ops": {"curation_rules": {"config": {
            "rules": RULES, "keep_languages": [], "drop_contaminated": False}}}})
    assert result.success  # a warning, not a failure: training is not blocked
    ev = next(e for e in result.get_asset_check_evaluations()
              if e.check_name == "no_source_wiped_out")
    assert not ev.passed and ev.severity == dg.AssetCheckSeverity.WARN
    assert "rule long_enough removes 100.0% of the documents" in ev.description
    assert "/forum/*.parquet" in ev.description and "/web/" not in ev.description
    assert "no_sevens" not in ev.description  # it removes 1/8 of the web pages
    table_md = ev.metadata["shares"].value
    assert "| domain | bigdomain.com | no_sevens | 55 | 7 | 12.7% |" in table_md
    assert "small60.org" not in table_md  # below the size floor
    # every share, recounted from the rows
    ds = Table.of(root).newest()
    rows = ds.to_table(columns=["source", "url", "n_chars", "text", "n_tokens"]).to_pylist()
    shares = rule_shares(ds, RULES)
    got = {(s.kind, s.group.rsplit("/", 2)[-2] if s.kind == "source" else s.group, s.rule):
           (s.documents, s.removed_documents, s.tokens, s.removed_tokens) for s in shares.shares}
    fails = {"long_enough": lambda r: r["n_chars"] < 60, "no_sevens": lambda r: "seven" in r["text"]}
    for (kind, group, rule), (docs, removed, tokens, removed_tokens) in got.items():
        if kind == "source":
            mine = [r for r in rows if f"/{group}/" in r["source"]]
        else:
            mine = [r for r in rows if r["url"] and group in r["url"]]
        assert docs == len(mine) and tokens == sum(r["n_tokens"] for r in mine)
        assert removed == sum(fails[rule](r) for r in mine)
        assert removed_tokens == sum(r["n_tokens"] for r in mine if fails[rule](r))
    assert {g for k, g, _ in got if k == "domain"} == {"bigdomain.com"}
    assert json.loads(json.dumps(ev.metadata["wiped_out"].value))[0]["document_share"] == 1.0
