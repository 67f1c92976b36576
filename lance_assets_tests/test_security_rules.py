"""Issue 12 as a hostile user tried it: curation rules and filters that read or write files,
filters that silently mean something else, and a predicate big enough to crash the process.
Each test is the attack; each would have succeeded before rules were parsed."""

import shutil
import subprocess
import sys
import textwrap

import duckdb
import lance
import pytest

from lance_assets import paths
from lance_assets.curation import dedup_flag, near_dup, profile, quality_signals, rules
from lance_assets.curation.predicate import PredicateError, safe_predicate
from lance_assets.ingest.raw_text import ingest
from lance_assets.table import Table
from lance_assets.table.producer import produce
from lance_assets_tests.helpers import quiet

PASSWD_RULE = ("true), false)) AS rows_removed, 0 AS share_removed FROM corpus UNION ALL SELECT "
               "content AS rule, 0, 0 FROM read_text('/etc/passwd') UNION ALL SELECT 'y' AS rule, "
               "count(*) FILTER (WHERE NOT coalesce((true")


def copy_to_rule(target) -> str:
    return (f"true), false)) AS rows_removed, 0 AS share_removed FROM corpus; COPY (SELECT 'owned') "
            f"TO '{target}'; SELECT 'y' AS rule, count(*) FILTER (WHERE NOT coalesce((true")


STRAY_PAREN_RULES = {**rules.DEFAULT_RULES,
                     "gopher_word_count": "word_count BETWEEN 50 AND 100000)"}


@pytest.fixture(scope="module")
def signals_root(tmp_path_factory):
    """A small corpus with every column the default rules read (shared: copy before writing)."""
    root = tmp_path_factory.mktemp("security") / "data"
    ingest(Table.of(root), "synthetic:300", rows_per_fragment=150, log=quiet)
    produce(dedup_flag.PRODUCER, Table.of(root), log=quiet)
    produce(quality_signals.PRODUCER, Table.of(root), log=quiet)
    produce(near_dup.PRODUCER, Table.of(root), log=quiet)
    return root


@pytest.fixture
def root(signals_root, tmp_path):
    out = tmp_path / "data"
    shutil.copytree(signals_root, out)
    return out


def dataset(root):
    return lance.dataset(paths.table_uri(root))


def assert_refused_and_nothing_stored(root, bad_rules, rule_name):
    before = dataset(root)
    with pytest.raises(rules.RuleError, match=f"rule '{rule_name}'"):
        rules.store_curation(Table.of(root), rules.Curation(rules=bad_rules))
    after = dataset(root)
    assert after.version == before.version
    assert rules.stored_curation(after) == rules.stored_curation(before)


def test_passwd_rule_is_refused_and_nothing_is_stored(root):
    with pytest.raises(PredicateError, match="without a matching"):
        safe_predicate(PASSWD_RULE, dataset(root).schema.names)
    assert_refused_and_nothing_stored(root, {**rules.DEFAULT_RULES, "x": PASSWD_RULE}, "x")
    assert "x" in {p.rule for p in rules.rule_problems(dataset(root), {"x": PASSWD_RULE})}


def test_profile_shows_no_file_even_with_a_hostile_rule_in_the_table_config(root, tmp_path):
    """The second defence: the rule is written straight into the manifest config, as if storing
    had been bypassed. The profile parses rules again, binds names, and DuckDB cannot read or
    write files."""
    target = tmp_path / "owned.csv"
    hostile = {**rules.DEFAULT_RULES, "x": PASSWD_RULE, "y": copy_to_rule(target),
               "z'); SELECT 1; --": "NOT is_dup"}
    Table.of(root).set_config(rules.CURATION_KEY, rules.Curation(rules=hostile).to_dict())
    prof = profile.profile(Table.of(root))
    shown = repr(prof)
    assert "root:" not in shown and "/bin/" not in shown  # no line of /etc/passwd
    assert not target.exists()
    assert not prof.kept_defined  # the rules in force cannot be used, so `kept` is not claimed
    hit_rules = {r["rule"] for r in prof.rule_hits.rows}
    assert {"x", "y", "z'); SELECT 1; --"} <= hit_rules  # reported by name, never run
    assert all(r["rows_removed"] is None for r in prof.rule_hits.rows if r["rule"] in "xy")


def test_rule_names_are_data(root):
    """A rule name that closes the string literal is shown as itself, not run."""
    name = "q' AS rule, 1, 1 FROM corpus UNION ALL SELECT content, 0, 0 FROM read_text('/etc/passwd') --"
    ds = dataset(root)
    con = profile.locked_connection({"lance_corpus": ds})
    con.execute("CREATE VIEW corpus AS SELECT * FROM lance_corpus")
    hits = profile.rule_hits(con, ds, {name: "NOT is_dup"})  # refused by name: not run
    assert [r["rule"] for r in hits.rows] == [name] and hits.rows[0]["rows_removed"] is None
    # and were one to reach the query, it is a bound parameter, never part of the SQL
    sql, params = profile.rule_hits_sql({name: safe_predicate("NOT is_dup", ds.schema.names)})
    assert "passwd" not in sql and params == [name]
    rows = con.sql(sql, params=params).fetchall()
    assert rows == [(name, ds.count_rows(filter="is_dup"), pytest.approx(rows[0][2]))]


def test_copy_to_rule_writes_no_file(root, tmp_path):
    target = tmp_path / "owned.csv"
    assert_refused_and_nothing_stored(root, {"y": copy_to_rule(target)}, "y")
    assert not target.exists()


def test_duckdb_connections_cannot_touch_files(root, tmp_path):
    con = profile.locked_connection({"lance_corpus": dataset(root)})
    assert con.execute("SELECT count(*) FROM lance_corpus").fetchone()[0] == 300
    target = tmp_path / "owned.csv"
    for sql in ("SELECT * FROM read_text('/etc/passwd')", f"COPY (SELECT 1) TO '{target}'",
                "SET enable_external_access = true", f"ATTACH '{tmp_path / 'x.db'}'",
                "INSTALL httpfs"):
        with pytest.raises(duckdb.Error):
            con.execute(sql)
    assert not target.exists() and not (tmp_path / "x.db").exists()


def test_filter_with_a_trailing_statement_is_refused(root):
    """Lance alone stops at the first complete expression: this kept every row."""
    assert dataset(root).count_rows(filter="1=1); DROP TABLE x; --") == 300  # why it matters
    with pytest.raises(PredicateError, match=r"';'|\)"):
        safe_predicate("1=1); DROP TABLE x; --", dataset(root).schema.names)
    assert_refused_and_nothing_stored(root, {"all": "1=1); DROP TABLE x; --"}, "all")


def test_default_rules_with_one_stray_paren_are_refused(root):
    """Lance read the stray ')' as the end of the filter, dropping every later rule."""
    flt = " AND ".join(f"({p})" if k != "gopher_word_count" else p
                       for k, p in STRAY_PAREN_RULES.items())
    ds = dataset(root)
    good = rules.validate(ds, rules.DEFAULT_RULES)
    assert ds.count_rows(filter=flt) > ds.count_rows(filter=good)  # silently looser
    assert_refused_and_nothing_stored(root, STRAY_PAREN_RULES, "gopher_word_count")
    problem = {p.rule: p.problem for p in rules.rule_problems(ds, STRAY_PAREN_RULES)}
    assert list(problem) == ["gopher_word_count"] and "stray ')'" in problem["gopher_word_count"]


def test_training_filter_has_no_pasted_user_text(root):
    rules.store_curation(Table.of(root), rules.Curation(rules={"a": "NOT is_dup", "b": "word_count >= 50"}))
    flt = rules.training_filter(Table.of(root))
    assert flt == "(NOT `is_dup`) AND (`word_count` >= 50)"
    assert "%" not in flt  # the validation split is the trainer's, not pasted in here
    assert rules.training_predicate(Table.of(root)).columns == {"is_dup", "word_count"}


RUN_PREDICATE = textwrap.dedent("""
    import sys, lance
    from lance_assets.curation import rules
    from lance_assets.curation.predicate import PredicateError, safe_predicate
    ds = lance.dataset(sys.argv[1])
    text = sys.argv[2] if len(sys.argv) > 2 else sys.stdin.read()
    try:
        safe_predicate(text, ds.schema.names)
    except PredicateError as err:
        problems = rules.rule_problems(ds, {"huge": text})
        assert problems and problems[0].rule == "huge"
        print("refused:", str(err)[:200])
        sys.exit(3)
    ds.count_rows(filter=text)
    print("accepted")
""")


@pytest.mark.parametrize("kind", ["40000_or", "deep_or_under_size_limit", "deep_parens", "deep_not"])
def test_huge_predicates_are_refused_without_crashing(signals_root, kind):
    """40,000 OR terms (549 KB) killed the process with SIGSEGV inside Lance's planner."""
    text = {
        "40000_or": " OR ".join(f"id = {i}" for i in range(40_000)),
        "deep_or_under_size_limit": " OR ".join(f"id={i}" for i in range(1_500)),
        "deep_parens": "(" * 50_000 + "id = 1" + ")" * 50_000,
        "deep_not": "NOT " * 50_000 + "is_dup",
    }[kind]
    if kind == "40000_or":
        assert len(text) > 500_000
    proc = subprocess.run([sys.executable, "-c", RUN_PREDICATE, paths.table_uri(signals_root)],
                          input=text, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 3, (proc.returncode, proc.stderr[-2000:])  # not -11 (SIGSEGV)
    assert proc.stdout.startswith("refused: predicate '") and "Traceback" not in proc.stderr
