"""Curation rules on the demo's own corpus: defaults keep the prose and drop the junk; hit counts
are right; broken rules are named with the fix; the training filter comes from the rules in
force; the full-text index and the profile queries work on the same table."""

import duckdb
import lance
import pytest

from lance_assets import paths
from lance_assets.curation import guards, profile, rules
from lance_assets.forensics import text_index as fts
from lance_assets.ingest.raw_text import ingest
from lance_assets.table import Table
from lance_assets_tests.helpers import build_table, quiet

# the synthetic generator's well-formed documents all open with this title
GOOD = "text LIKE '%An introduction to the %'"


@pytest.fixture(scope="module")
def curated_root(tmp_path_factory):
    """The default synthetic corpus (the demo's), with every column curation reads."""
    return build_table(tmp_path_factory.mktemp("curated") / "data", "synthetic",
                       rows_per_fragment=1000,
                       upto=["dedup_flag", "quality_signals", "near_dup", "token_ids"])


def dataset(root):
    return lance.dataset(paths.table_uri(root))


def test_default_rules_keep_prose_and_drop_junk(curated_root):
    ds = dataset(curated_root)
    con = duckdb.connect()
    con.register("corpus", ds)
    keep = rules.validated_predicate(ds, rules.DEFAULT_RULES)
    f = keep.duckdb
    good, good_kept, bad, bad_kept = con.execute(
        f"SELECT count(*) FILTER (WHERE {GOOD}), count(*) FILTER (WHERE {GOOD} AND ({f})), "
        f"count(*) FILTER (WHERE NOT {GOOD}), count(*) FILTER (WHERE NOT {GOOD} AND ({f})) "
        "FROM corpus WHERE NOT is_dup").fetchone()
    assert bad > 300 and bad_kept == 0  # every boilerplate and word-salad document goes
    # Gopher's 50-word minimum and 5-gram repetition limit also take some short or templated
    # prose (the generator has seven sentence templates); three quarters stays.
    assert good_kept / good > 0.72
    assert ds.count_rows(filter=keep.lance) > 1000  # enough for the demo's training run
    assert ds.count_rows(filter=keep.lance) == con.execute(
        f"SELECT count(*) FROM corpus WHERE {f}").fetchone()[0]  # both renderings agree


def test_hit_counts_match_sql(curated_root):
    ds = dataset(curated_root)
    some = {k: rules.DEFAULT_RULES[k] for k in
            ("exact_dup", "gopher_word_count", "gopher_stop_words", "fineweb_line_punct")}
    ev = rules.evaluate(ds, some)
    con = duckdb.connect()
    con.register("corpus", ds)
    for h in ev.hits:
        assert h.removed == con.execute(
            f"SELECT count(*) FROM corpus WHERE NOT coalesce(({h.predicate}), false)").fetchone()[0]
        others = " AND ".join(f"({p})" for k, p in some.items() if k != h.rule)
        assert h.removed_only_by_this == con.execute(
            f"SELECT count(*) FROM corpus WHERE ({others}) AND NOT ({h.predicate})").fetchone()[0]
    assert ev.kept_rows == ds.count_rows(filter=rules.validate(ds, some)) and ev.ok


def test_broken_rules_are_named_with_the_fix(curated_root):
    ds = dataset(curated_root)
    broken = {"exact_dup": "NOT is_dup", "typo": "word_cont > 50", "unparsable": "score >= 3 AND",
              "blank": "  ", "mistyped": "id > 1.5"}
    problems = {p.rule: p.problem for p in rules.rule_problems(ds, broken)}
    assert set(problems) == {"typo", "unparsable", "blank", "mistyped"}
    assert "'word_cont', which the table does not have" in problems["typo"]
    assert "word_count" in problems["typo"]  # the columns it could have meant are listed
    assert "does not parse as SQL" in problems["unparsable"]
    assert "Lance cannot use it as a filter" in problems["mistyped"]  # parses; Lance cannot type it
    with pytest.raises(rules.RuleError, match="typo.*\n.*unparsable"):
        rules.validate(ds, broken)
    ev = rules.evaluate(ds, broken)  # the usable rules are still counted
    assert not ev.ok and ev.hits[0].removed == ds.count_rows(filter="is_dup")


def test_training_filter_follows_the_stored_rules(curated_root, tmp_path):
    import shutil

    from lance_assets.curation.predicate import safe_predicate
    from lance_assets.table import Table

    root = tmp_path / "data"
    shutil.copytree(curated_root, root)
    assert rules.training_filter(Table.of(root)) == rules.validate(dataset(root), rules.DEFAULT_RULES)
    v = rules.store_curation(Table.of(root), rules.Curation(rules={"exact_dup": "NOT is_dup"}))
    assert rules.store_curation(Table.of(root), rules.Curation(rules={"exact_dup": "NOT is_dup"})) == v
    assert rules.training_filter(Table.of(root)) == "NOT `is_dup`"
    rules.store_curation(Table.of(root), rules.Curation(rules={"z": "NOT is_dup", "a": "n_chars > 0"}))
    flt = rules.training_filter(Table.of(root))
    assert flt == "(NOT `is_dup`) AND (`n_chars` > 0)"  # the order written
    assert safe_predicate(flt, dataset(root).schema.names).lance == flt  # the trainer re-parses it
    with pytest.raises(rules.RuleError, match="'short'"):  # refused before it is stored
        rules.store_curation(Table.of(root), rules.Curation(rules={"short": "n_chars <<< 3"}))
    assert rules.training_filter(Table.of(root)) == flt
    # a broken rule that reached the table config some other way is caught when read back
    Table.of(root).set_config(rules.CURATION_KEY,
                              rules.Curation(rules={"short": "n_chars <<< 3"}).to_dict())
    with pytest.raises(rules.RuleError, match="'short'"):
        rules.training_filter(Table.of(root))
    assert not guards.rules_valid(dataset(root)).passed


def test_guards_pass_on_a_curated_table(curated_root):
    ds = dataset(curated_root)
    for guard in (guards.rules_valid, guards.filter_keeps_rows, guards.input_ids_present,
                  guards.n_tokens_consistent, guards.duplicate_rate_in_bounds):
        verdict = guard(ds)
        assert verdict.passed, (guard.__name__, verdict.message)


def test_profile_queries_run_on_the_lance_table(curated_root):
    prof = profile.profile(Table.of(curated_root))
    by_name = {r.name: r for r in prof.results}
    assert not [r.name for r in prof.results if r.error] and prof.kept_defined
    overview = by_name["01_overview"].rows[0]
    assert overview["rows"] == 2000 and 0 < overview["kept_rows"] < 2000
    assert sum(r["rows"] for r in by_name["02_score_buckets"].rows) == 2000
    assert {r["rule"] for r in prof.rule_hits.rows} == set(rules.DEFAULT_RULES)
    assert prof.histogram_png.startswith(b"\x89PNG")


def test_text_index_is_kept_current(tmp_path):
    root = tmp_path / "data"
    ingest(Table.of(root), "synthetic:300", rows_per_fragment=100, log=quiet)
    assert fts.text_index(Table.of(root)).action == "created"
    assert fts.text_index(Table.of(root)).nothing_to_do
    ingest(Table.of(root), "synthetic:200", rows_per_fragment=100, log=quiet)  # a second source unit
    report = fts.text_index(Table.of(root))
    assert report.action == "updated" and report.indexed_rows == 500 and report.unindexed_rows == 0
    hits = fts.search(Table.of(root), "telescope", limit=5, filter="id >= 300")
    assert hits.num_rows == 5 and all(r >= 300 for r in hits.column("id").to_pylist())
    assert all("telescope" in t.lower() for t in hits.column("text").to_pylist())
