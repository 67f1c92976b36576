"""Threshold sweeps count what the rules would keep as one threshold moves, from one read:

- the thresholds come from the parsed rule; rules without a numeric comparison have none, and a
  string or column-to-column comparison is skipped with a note, not a crash;
- at the value in force a sweep equals ``evaluate``'s kept rows and ``token_hits``' kept tokens
  (rows whose signals are NULL pass no rule, in both);
- at other grid points it equals Lance counting with the rule rewritten at that value, down to
  NaN, NULL and float32 thresholds;
- kept counts move the right way as a ``<=`` or ``>=`` bound moves;
- the ``curation_rules`` asset shows the plot and the table.
"""

import base64
import re

import dagster as dg
import lance
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from lance_assets import paths
from lance_assets.curation import dedup_flag, quality_signals
from lance_assets.curation import rules as rules_lib
from lance_assets.curation import sweeps as sw
from lance_assets.curation.predicate import safe_predicate
from lance_assets.ingest.raw_text import ingest
from lance_assets.table import Table
from lance_assets.table.producer import produce
from lance_assets.tokens import token_ids
from lance_assets_tests.helpers import quiet

# rule -> keep-predicate with one "{}" per threshold term, in the order the rule has them
TEMPLATES = {
    "gopher_word_count": "word_count BETWEEN {} AND {}",
    "gopher_stop_words": "stop_word_count >= {}",
    "gopher_dup_lines": "dup_line_share <= {} AND dup_line_char_share <= {}",
    "fineweb_line_punct": "terminal_punct_line_share > {}",
    "fineweb_short_lines": "{} > short_line_share",
    "gopher_top_ngrams": "(top_2gram_char_share <= {}) AND (is_dup IS NOT NULL) "
                         "AND top_3gram_char_share <= {}",
}
CURRENT = {"gopher_word_count": (50, 100000), "gopher_stop_words": (2,),
           "gopher_dup_lines": (0.3, 0.2), "fineweb_line_punct": (0.12,),
           "fineweb_short_lines": (0.67,), "gopher_top_ngrams": (0.2, 0.18)}
NOT_SWEPT = {
    "exact_dup": "NOT is_dup",
    "long_or_dup": "word_count >= 5 OR is_dup",
    "starts_late": "text >= 'A'",
    "column_vs_column": "dup_line_share <= dup_para_share",
}


def rule_text(name: str, values) -> str:
    return TEMPLATES[name].format(*(v if isinstance(v, int) else repr(float(v)) for v in values))


RULES = {**{n: rule_text(n, CURRENT[n]) for n in TEMPLATES}, **NOT_SWEPT}


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    """Quality signals and token counts on 600 rows, then rows appended without them (NULL)."""
    root = tmp_path_factory.mktemp("sweeps") / "data"
    ingest(Table.of(root), "synthetic:600", rows_per_fragment=300, log=quiet)
    produce(dedup_flag.PRODUCER, Table.of(root), log=quiet)
    produce(quality_signals.PRODUCER, Table.of(root), log=quiet)
    produce(token_ids.PRODUCER, Table.of(root), token_ids.TokenIdsSettings(tokenizer="byte"), log=quiet)
    ingest(Table.of(root), "synthetic:900", rows_per_fragment=300, log=quiet)
    return root


def dataset(root):
    return lance.dataset(paths.table_uri(root))


def lance_kept(ds, rules) -> tuple[int, int]:
    """Rows and tokens the rules keep, counted by Lance with the combined filter."""
    keep = rules_lib.validate(ds, rules)
    tokens = ds.to_table(columns=["n_tokens"], filter=keep)["n_tokens"]
    return ds.count_rows(filter=keep), pc.sum(tokens.fill_null(0)).as_py() or 0


def test_thresholds_come_from_the_parsed_rule():
    schema = pa.schema([("a", pa.float32()), ("n", pa.int64()), ("lang", pa.string()),
                        ("is_dup", pa.bool_()), ("b", pa.float64())])

    def found(text):
        got, notes = sw.thresholds("r", safe_predicate(text, schema.names), schema)
        return [(t.column, t.bound, t.value) for t in got], notes

    assert found("NOT is_dup") == ([], [])
    assert found("lang IN ('en', 'fr')") == ([], [])
    assert found("n BETWEEN 50 AND 100000")[0] == [("n", ">=", 50), ("n", "<=", 100000)]
    assert found("0.1 >= a")[0] == [("a", "<=", 0.1)]  # the number on the left
    assert found("((a < 0.3) AND (b > -2.5)) AND NOT is_dup")[0] == [("a", "<", 0.3),
                                                                    ("b", ">", -2.5)]
    assert found("lang IN ('en') AND b >= 0.65")[0] == [("b", ">=", 0.65)]
    for text, why in [("lang >= 'en'", "string"), ("a <= b", "two columns"),
                      ("n * 2 >= 100", "not a column compared with a number"),
                      ("a > 1 OR b < 2", "under OR/NOT")]:
        got, notes = found(text)
        assert got == [] and len(notes) == 1 and why in notes[0], (text, notes)


def test_sweep_at_the_rules_in_force_equals_evaluate(root):
    ds = dataset(root)
    assert ds.count_rows(filter="word_count IS NULL") > 0  # rows no tagger reached yet
    report = sw.sweeps(ds, RULES)
    ev, tokens = rules_lib.evaluate(ds, RULES), rules_lib.token_hits(ds, RULES)
    assert ev.ok and 0 < ev.kept_rows < ev.total_rows and report.rows_read == ev.total_rows
    by_rule = {}
    for s in report.sweeps:
        by_rule.setdefault(s.rule, []).append((s.column, s.bound, s.current))
        assert s.kept_docs_now == ev.kept_rows
        assert s.kept_tokens_now == tokens.kept_tokens
        assert s.current in s.grid and len(s.grid) > 1
        step = np.diff(s.kept_docs)
        assert (step >= 0).all() if s.bound in ("<", "<=") else (step <= 0).all(), s.label
        step = np.diff(s.kept_tokens)
        assert (step >= 0).all() if s.bound in ("<", "<=") else (step <= 0).all(), s.label
    assert set(by_rule) == set(TEMPLATES)  # NOT is_dup, OR, strings, two columns: none
    assert by_rule["gopher_word_count"] == [("word_count", ">=", 50),
                                            ("word_count", "<=", 100000)]
    # the threshold as Lance compares it: cast to the column's type (float32 here)
    assert by_rule["fineweb_short_lines"] == [("short_line_share", "<", float(np.float32(0.67)))]
    notes = "\n".join(report.skipped)
    assert "starts_late" in notes and "column_vs_column" in notes and "long_or_dup" in notes
    assert "exact_dup" not in notes
    nothing = sw.sweeps(ds, NOT_SWEPT)  # no numeric threshold at all: no sweep, no plot
    assert nothing.sweeps == [] and sw.markdown(nothing)["threshold_sweeps"].startswith("_no ")


def test_other_grid_points_equal_lance_counts_of_the_rewritten_rule(root):
    ds = dataset(root)
    report = sw.sweeps(ds, RULES)
    checked = 0
    for name in ("gopher_word_count", "gopher_stop_words", "fineweb_line_punct",
                 "fineweb_short_lines", "gopher_top_ngrams"):
        sweeps = [s for s in report.sweeps if s.rule == name]
        for k, s in enumerate(sweeps):
            moving = [g for g in s.grid if g != s.current]
            for g in (moving[0], moving[len(moving) // 2], moving[-1]):
                values = list(CURRENT[name])
                values[k] = g
                rewritten = {**RULES, name: rule_text(name, values)}
                i = s.at(g)
                assert (s.kept_docs[i], s.kept_tokens[i]) == lance_kept(ds, rewritten), \
                    (s.label, g)
                checked += 1
    assert checked >= 18


def test_nulls_nans_and_float32_compare_as_lance_does(tmp_path):
    nan = float("nan")
    f32 = [0.1, None, 0.2, nan, -0.0, 0.1, 0.3, None, 1.0, 0.05, nan, 0.2]
    ints = [1, 2, None, 4, 5, 2, 3, 3, None, 7, 1, 0]
    table = pa.table({
        "id": pa.array(range(len(f32)), pa.int64()),
        "f": pa.array(f32, pa.float32()),
        "i": pa.array(ints, pa.int32()),
        "g": pa.array([x if x is None else x * 3 for x in f32], pa.float64()),
        "n_tokens": pa.array([10, 20, 30, None, 50, 60, 70, 80, 90, 100, 110, 120], pa.int64())})
    ds = lance.write_dataset(table, tmp_path / "t.lance")
    templates = {"low_f": "f <= {}", "mid_i": "i BETWEEN {} AND {}", "some_g": "g > {} OR i IS NULL",
                 "high_g": "{} <= g"}
    current = {"low_f": (0.2,), "mid_i": (1, 5), "high_g": (-1.0,)}
    rules = {"low_f": "f <= 0.2", "mid_i": "i BETWEEN 1 AND 5", "some_g": "g > 0.0 OR i IS NULL",
             "high_g": "-1.0 <= g"}
    report = sw.sweeps(ds, rules)
    assert {s.rule for s in report.sweeps} == set(current)
    for s in report.sweeps:
        k = [t for t in report.sweeps if t.rule == s.rule].index(s)
        for g in s.grid:
            values = list(current[s.rule])
            values[k] = g
            text = templates[s.rule].format(*(v if isinstance(v, int) else repr(float(v))
                                              for v in values))
            assert (s.kept_docs[s.at(g)], s.kept_tokens[s.at(g)]) == \
                lance_kept(ds, {**rules, s.rule: text}), (s.label, g)


def test_a_large_table_is_swept_on_a_sample(root):
    ds = dataset(root)
    full, sample = sw.sweeps(ds, RULES), sw.sweeps(ds, RULES, max_rows=400)
    assert not full.sampled and sample.sampled and sample.rows_read <= 400
    assert sample.table_rows == full.table_rows == ds.count_rows()
    for a, b in zip(full.sweeps, sample.sweeps):
        assert a.label == b.label and b.rows == sample.rows_read
        assert abs(a.kept_docs_now / a.rows - b.kept_docs_now / b.rows) < 0.1


def test_curation_rules_metadata_shows_the_sweeps(root):
    from lance_assets.defs.curation.assets import curation_rules
    from lance_assets.defs.resources import LanceStore

    rules = {k: RULES[k] for k in ("exact_dup", "gopher_stop_words", "fineweb_short_lines",
                                   "starts_late")}
    result = dg.materialize([curation_rules], resources={"lance_store": LanceStore(
        data_dir=str(root))}, run_config={"ops": {"curation_rules": {"config": {"rules": rules}}}})
    assert result.success
    mat = result.asset_materializations_for_node("curation_rules")[0]
    meta = {k: v.value for k, v in mat.metadata.items()}
    png = re.fullmatch(r"!\[[^\]]*\]\(data:image/png;base64,([A-Za-z0-9+/=]+)\)",
                       meta["threshold_sweeps"])
    assert png and base64.b64decode(png.group(1)).startswith(b"\x89PNG")
    table = meta["threshold_sweep_table"]
    assert "`stop_word_count >= 2`" in table and "`short_line_share < 0.67`" in table
    assert "starts_late" in table.split("Not swept:")[1]
    share = meta["kept_rows"] / meta["dagster/row_count"]
    assert f"| `stop_word_count >= 2` | {share:.3f} |" in table
