"""The predicate parser on the cases a person meets: what the default rules and filters use is
accepted and rendered for both engines; everything else is refused with the input and the fix."""

import pytest

from lance_assets.curation import rules
from lance_assets.curation.predicate import MAX_CHARS, Predicate, PredicateError, safe_predicate

COLUMNS = ["id", "is_dup", "near_dup", "word_count", "score", "text", "n_chars"]
QUALITY_COLUMNS = sorted({c for p in rules.DEFAULT_RULES.values() for c in
                          p.replace("(", " ").split() if c.islower() and "_" in c} | {"is_dup"})


def test_every_default_rule_is_accepted_and_renders_for_both_engines():
    for name, text in rules.DEFAULT_RULES.items():
        p = safe_predicate(text, QUALITY_COLUMNS)
        assert "`" in p.lance and '"' in p.duckdb, name  # columns quoted the engine's way
        assert p.columns <= set(QUALITY_COLUMNS)


@pytest.mark.parametrize("text, lance, duckdb", [
    ("NOT is_dup", "NOT `is_dup`", 'NOT "is_dup"'),
    ("id % 20 <> 0", "(`id` % 20) <> 0", '("id" % 20) <> 0'),
    ("score IS NOT NULL", "NOT (`score` IS NULL)", 'NOT ("score" IS NULL)'),
    ("id / 2 > 1", "(CAST(`id` AS DOUBLE) / 2) > 1", '("id" / 2) > 1'),
    ("length(text) BETWEEN 1 AND 9", "LENGTH(`text`) BETWEEN 1 AND 9",
     'LENGTH("text") BETWEEN 1 AND 9'),
    ("text = 'it''s'", "`text` = 'it''s'", '"text" = \'it\'\'s\''),
    ("\"word_count\" IN (1, 2)", "`word_count` IN (1, 2)", '"word_count" IN (1, 2)'),
])
def test_rendering(text, lance, duckdb):
    p = safe_predicate(text, COLUMNS)
    assert (p.lance, p.duckdb, p.source) == (lance, duckdb, text)


def test_and_combines_trees_and_keeps_precedence():
    a = safe_predicate("is_dup OR near_dup", COLUMNS)
    b = safe_predicate("word_count > 5", COLUMNS)
    both = a.and_(b)
    assert isinstance(both, Predicate) and both.columns == {"is_dup", "near_dup", "word_count"}
    assert both.lance == "(`is_dup` OR `near_dup`) AND (`word_count` > 5)"
    assert both.duckdb == '("is_dup" OR "near_dup") AND ("word_count" > 5)'


@pytest.mark.parametrize("text, says", [
    ("", "empty"),
    ("word_count >= 50 AND", "does not parse"),
    ("1=1); DROP TABLE x; --", "';'"),
    ("word_count BETWEEN 50 AND 100000)", "stray ')'"),
    ("(word_count > 1", "without a matching ')'"),
    ("is_dup -- keep", "comment"),
    ("is_dup /* x */", "comment"),
    ("id IN (SELECT id FROM corpus)", "subqueries"),
    ("read_text('/etc/passwd') IS NULL", "function 'read_text'"),
    ("word_cont > 50", "'word_cont', which the table does not have"),
    ("corpus.id = 1", "names a table"),
    ("id = 1 pwned", "Alias"),
    ("id", None),  # a column alone is fine (Lance then checks it is boolean)
    ("5", "not a true/false condition"),
    ("id::VARCHAR = '1'", "CAST(x AS DOUBLE)"),
    ("text LIKE 'a\\%'", "backslash"),
    ("is_dup IS 5", "IS may only be followed"),
    ("id = ?", "Placeholder"),
    ("id = 1\x00", "control characters"),
    ("é = 1", "which the table does not have"),
    ("x" * (MAX_CHARS + 1), "over the limit"),
])
def test_refusals_name_the_input_and_the_fix(text, says):
    if says is None:
        safe_predicate(text, COLUMNS)
        return
    with pytest.raises(PredicateError) as err:
        safe_predicate(text, COLUMNS)
    message = str(err.value)
    assert message.startswith("predicate '") or message.startswith('predicate "')
    assert says in message, message
    assert len(message) < 600  # a huge input is quoted shortened


def test_max_chars_is_a_parameter():
    with pytest.raises(PredicateError, match="over the limit of 10"):
        safe_predicate("word_count > 100000", COLUMNS, max_chars=10)
