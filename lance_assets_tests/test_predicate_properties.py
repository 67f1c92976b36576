"""Properties of the one predicate parser, on generated input.

Accepted predicates select exactly the rows a Python reference evaluation (SQL's three-valued
logic) selects, with Lance and with DuckDB alike, and parse again to themselves. Hostile
predicates (statements, table functions, subqueries, comments, unbalanced parentheses, trailing
text, non-ASCII names) are refused with a clear error, store nothing and touch no file."""

import math
import re

import lance
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lance_assets import paths
from lance_assets.curation import profile, rules
from lance_assets.curation.predicate import PredicateError, safe_predicate
from lance_assets.table import Table

ROWS = 40
SETTINGS = settings(max_examples=80, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture,
                                           HealthCheck.too_slow])
WORDS = ["a", "b", "ab", "A", "é", "a b", "", "ba%", "x_y"]


def make_rows():
    rows = []
    for i in range(ROWS):
        rows.append({
            "id": i,
            "n": None if i % 7 == 3 else (i * 5) % 23 - 11,
            "x": None if i % 5 == 1 else ((i * 3) % 17 - 8) / 2,
            "s": None if i % 6 == 2 else WORDS[i % len(WORDS)],
            "flag": None if i % 4 == 3 else bool(i % 3),
        })
    return rows


ROW_DATA = make_rows()
SCHEMA = pa.schema([("id", pa.int64()), ("n", pa.int64()), ("x", pa.float64()),
                    ("s", pa.string()), ("flag", pa.bool_())])
COLUMNS = SCHEMA.names


@pytest.fixture(scope="module")
def table(tmp_path_factory):
    root = tmp_path_factory.mktemp("predicates") / "data"
    uri = paths.table_uri(root)
    lance.write_dataset(pa.Table.from_pylist(ROW_DATA, schema=SCHEMA), uri)
    ds = lance.dataset(uri)
    con = profile.locked_connection({"t": ds})
    return root, ds, con


# --- a generator of well-formed predicates, each with its Python meaning ----------------------
# An expression is (sql, fn): fn(row) gives the value under SQL semantics (None = NULL).

def _num(v):
    return None if v is None else v


def _cmp(op, a, b):
    if a is None or b is None:
        return None
    return {"=": a == b, "<>": a != b, "<": a < b, "<=": a <= b, ">": a > b, ">=": a >= b}[op]


def _and(a, b):
    if a is False or b is False:
        return False
    return None if a is None or b is None else True


def _or(a, b):
    if a is True or b is True:
        return True
    return None if a is None or b is None else False


def _not(a):
    return None if a is None else not a


def _like(value, pattern, fold):
    if value is None:
        return None
    regex = "".join(".*" if c == "%" else "." if c == "_" else re.escape(c) for c in pattern)
    if fold:
        value, regex = value.lower(), regex.lower()
    return re.fullmatch(regex, value, re.S) is not None


def _mod(a, b):
    return None if a is None else int(math.fmod(a, b))


int_lit = st.integers(-12, 12)
half_lit = st.integers(-20, 20).map(lambda v: v / 2)


@st.composite
def int_expr(draw, depth=0):
    kind = draw(st.sampled_from(["col", "col", "lit", "add", "sub", "mul", "mod", "neg", "abs",
                                 "len", "coalesce"] if depth < 2 else ["col", "lit"]))
    if kind == "col":
        c = draw(st.sampled_from(["id", "n"]))
        return c, lambda r, c=c: r[c]
    if kind == "lit":
        v = draw(int_lit)
        return (f"({v})" if v < 0 else str(v)), lambda r, v=v: v
    if kind == "neg":
        s, f = draw(int_expr(depth + 1))
        return f"(-({s}))", lambda r: None if f(r) is None else -f(r)
    if kind == "abs":
        s, f = draw(int_expr(depth + 1))
        return f"abs({s})", lambda r: None if f(r) is None else abs(f(r))
    if kind == "len":
        return "length(s)", lambda r: None if r["s"] is None else len(r["s"])
    if kind == "coalesce":
        s, f = draw(int_expr(depth + 1))
        v = draw(int_lit)
        return f"coalesce({s}, {v})", lambda r: v if f(r) is None else f(r)
    if kind == "mod":
        s, f = draw(int_expr(depth + 1))
        d = draw(st.sampled_from([2, 3, 5, 20, -3]))
        return f"(({s}) % {d})", lambda r: _mod(f(r), d)
    (a, fa), (b, fb) = draw(int_expr(depth + 1)), draw(int_expr(depth + 1))
    op = {"add": "+", "sub": "-", "mul": "*"}[kind]
    py = {"+": lambda x, y: x + y, "-": lambda x, y: x - y, "*": lambda x, y: x * y}[op]
    return f"(({a}) {op} ({b}))", lambda r: None if fa(r) is None or fb(r) is None \
        else py(fa(r), fb(r))


@st.composite
def float_expr(draw):
    kind = draw(st.sampled_from(["col", "div", "coalesce"]))
    if kind == "col":
        return "x", lambda r: r["x"]
    if kind == "coalesce":
        v = draw(half_lit)
        return f"coalesce(x, {v})", lambda r: v if r["x"] is None else r["x"]
    s, f = draw(int_expr(1))
    d = draw(st.sampled_from([2, 4, -8]))
    return f"(({s}) / {d})", lambda r: None if f(r) is None else f(r) / d


@st.composite
def predicate(draw, depth=0):
    leaves = ["cmp_int", "cmp_float", "between", "in", "is_null", "flag", "flag_is", "like",
              "str_eq", "lower"]
    kind = draw(st.sampled_from(leaves + (["and", "or", "not"] * 3 if depth < 3 else [])))
    op = draw(st.sampled_from(["=", "<>", "<", "<=", ">", ">="]))
    if kind == "cmp_int":
        (a, fa), (b, fb) = draw(int_expr()), draw(int_expr())
        return f"({a}) {op} ({b})", lambda r: _cmp(op, fa(r), fb(r))
    if kind == "cmp_float":
        (a, fa), v = draw(float_expr()), draw(half_lit)
        return f"({a}) {op} {v}", lambda r: _cmp(op, fa(r), v)
    if kind == "between":
        (a, fa), lo, hi = draw(int_expr()), draw(int_lit), draw(int_lit)
        neg = draw(st.booleans())
        sql = f"({a}) {'NOT ' if neg else ''}BETWEEN {lo} AND {hi}"
        inside = lambda r: _and(_cmp(">=", fa(r), lo), _cmp("<=", fa(r), hi))  # noqa: E731
        return sql, (lambda r: _not(inside(r))) if neg else inside
    if kind == "in":
        (a, fa) = draw(int_expr())
        vals = draw(st.lists(int_lit, min_size=1, max_size=4))
        neg = draw(st.booleans())
        sql = f"({a}) {'NOT ' if neg else ''}IN ({', '.join(map(str, vals))})"
        inside = lambda r: None if fa(r) is None else fa(r) in vals  # noqa: E731
        return sql, (lambda r: _not(inside(r))) if neg else inside
    if kind == "is_null":
        c = draw(st.sampled_from(COLUMNS[1:]))
        neg = draw(st.booleans())
        return f"{c} IS {'NOT ' if neg else ''}NULL", lambda r: (r[c] is None) != neg
    if kind == "flag":
        return "flag", lambda r: r["flag"]
    if kind == "flag_is":
        v, neg = draw(st.booleans()), draw(st.booleans())
        sql = f"flag IS {'NOT ' if neg else ''}{'TRUE' if v else 'FALSE'}"
        return sql, lambda r: (r["flag"] is v) != neg
    if kind == "like":
        pattern = draw(st.text(st.sampled_from("ab%_é "), max_size=4))
        fold = draw(st.booleans())
        return (f"s {'ILIKE' if fold else 'LIKE'} '{pattern}'",
                lambda r: _like(r["s"], pattern, fold))
    if kind == "str_eq":
        w = draw(st.sampled_from(WORDS))
        return f"s {op} '{w}'", lambda r: _cmp(op, r["s"], w)
    if kind == "lower":
        w = draw(st.sampled_from(WORDS))
        fn = draw(st.sampled_from(["lower", "upper"]))
        py = str.lower if fn == "lower" else str.upper
        return f"{fn}(s) = '{py(w)}'", lambda r: None if r["s"] is None else py(r["s"]) == py(w)
    if kind == "not":
        s, f = draw(predicate(depth + 1))
        return f"NOT ({s})", lambda r: _not(f(r))
    (a, fa), (b, fb) = draw(predicate(depth + 1)), draw(predicate(depth + 1))
    join = _and if kind == "and" else _or
    return f"({a}) {kind.upper()} ({b})", lambda r: join(fa(r), fb(r))


def reference(fn) -> set[int]:
    return {r["id"] for r in ROW_DATA if fn(r) is True}


@SETTINGS
@given(predicate())
def test_accepted_predicates_select_the_same_rows_in_lance_duckdb_and_python(table, pred):
    _, ds, con = table
    sql, fn = pred
    p = safe_predicate(sql, COLUMNS)
    want = reference(fn)
    got_lance = set(ds.to_table(columns=["id"], filter=p.lance).column("id").to_pylist())
    got_duck = {r[0] for r in con.execute(f"SELECT id FROM t WHERE {p.duckdb}").fetchall()}
    assert got_lance == want, (sql, p.lance)
    assert got_duck == want, (sql, p.duckdb)
    # what is validated is what runs: the rendering parses again to itself
    assert safe_predicate(p.lance, COLUMNS).lance == p.lance
    assert safe_predicate(p.duckdb, COLUMNS).duckdb == p.duckdb


@SETTINGS
@given(predicate(), predicate())
def test_and_is_the_intersection(table, a, b):
    _, ds, _ = table
    pa_, pb = safe_predicate(a[0], COLUMNS), safe_predicate(b[0], COLUMNS)
    both = set(ds.to_table(columns=["id"], filter=pa_.and_(pb).lance).column("id").to_pylist())
    assert both == reference(a[1]) & reference(b[1])


# --- hostile input ----------------------------------------------------------------------------

STATEMENTS = ["DROP TABLE corpus", "COPY (SELECT 1) TO '{target}'", "ATTACH '{target}' AS x",
              "SELECT * FROM read_text('/etc/passwd')", "INSTALL httpfs", "PRAGMA version",
              "SET enable_external_access = true", "CREATE TABLE x AS SELECT 1"]
TABLE_FUNCTIONS = ["read_text('/etc/passwd')", "read_csv('{target}')", "glob('/etc/*')",
                   "read_parquet('/etc/passwd')", "sniff_csv('/etc/passwd')"]


@st.composite
def well_formed(draw):
    return draw(predicate(2))[0]


@st.composite
def hostile(draw):
    good = draw(well_formed())
    kind = draw(st.sampled_from(["statement", "table_function", "subquery", "comment",
                                 "unbalanced", "trailing", "unknown_column", "cast"]))
    stmt = draw(st.sampled_from(STATEMENTS))
    fn = draw(st.sampled_from(TABLE_FUNCTIONS))
    if kind == "statement":
        return draw(st.sampled_from([f"{good}; {stmt}", f"{good}); {stmt}; --",
                                     f"{stmt}; {good}", f"({good}); {stmt}"]))
    if kind == "table_function":
        return draw(st.sampled_from([f"{good} AND {fn} IS NULL",
                                     f"id IN (SELECT * FROM {fn})",
                                     f"EXISTS (SELECT 1 FROM {fn})",
                                     f"length(({fn})) > 0"]))
    if kind == "subquery":
        return draw(st.sampled_from([f"{good} AND id IN (SELECT id FROM corpus)",
                                     f"(SELECT count(*) FROM corpus) > 0 OR {good}",
                                     f"{good} UNION SELECT 1"]))
    if kind == "comment":
        text = draw(st.text(max_size=10).filter(lambda t: "\n" not in t and "*/" not in t))
        return draw(st.sampled_from([f"{good} -- {text}", f"{good} /* {text} */",
                                     f"/*{text}*/ {good}"]))
    if kind == "unbalanced":
        i = draw(st.integers(0, len(good)))
        return good[:i] + draw(st.sampled_from(["(", ")", "))", "(("])) + good[i:]
    if kind == "trailing":
        tail = draw(st.sampled_from(["x", "AND", "OR", ")", "1", "id", "' --", "b", "LIMIT 1",
                                     "FROM corpus", "AS pwned"]))
        return f"{good} {tail}"
    if kind == "cast":
        return f"{good} AND CAST(id AS VARCHAR) = '1'"
    name = draw(st.text(st.characters(min_codepoint=0xA1, max_codepoint=0x2FFF),
                        min_size=1, max_size=6))
    return f'{good} AND "{name}" = 1'


@SETTINGS
@given(hostile())
def test_hostile_predicates_are_refused_store_nothing_and_touch_no_file(table, tmp_path, text):
    root, ds, con = table
    target = tmp_path / "owned.csv"
    text = text.replace("{target}", str(target))
    try:
        p = safe_predicate(text, COLUMNS)
    except PredicateError as err:
        message = str(err)
        assert message.startswith("predicate ") and ". " in message  # names input and fix
    else:
        # only a '(' or ')' that landed inside a string literal can make it through
        assert "'" in text, text
        set(ds.to_table(columns=["id"], filter=p.lance).column("id").to_pylist())
        return
    version = lance.dataset(ds.uri).version
    with pytest.raises(rules.RuleError):
        rules.store_curation(Table.of(root), rules.Curation(rules={"hostile": text}))
    assert lance.dataset(ds.uri).version == version
    assert rules.stored_curation(lance.dataset(ds.uri)) is None
    hits = profile.rule_hits(con, ds, {"hostile": text})  # the profile's path: reported, not run
    assert hits.rows == [{"rule": "hostile", "rows_removed": None, "share_removed": None}]
    assert not target.exists()


@settings(max_examples=100, deadline=None)
@given(st.text(max_size=60))
def test_any_text_is_refused_cleanly_or_is_a_usable_predicate(text):
    """Arbitrary (non-ASCII, control, quote) characters: a PredicateError or a predicate; never
    another exception."""
    try:
        p = safe_predicate(text, COLUMNS)
    except PredicateError:
        return
    assert safe_predicate(p.lance, COLUMNS).lance == p.lance


def test_non_ascii_literals_match_in_both_engines(table):
    _, ds, con = table
    p = safe_predicate("s = 'é' OR upper(s) = 'É'", COLUMNS)
    want = {r["id"] for r in ROW_DATA if r["s"] == "é"}
    assert set(ds.to_table(columns=["id"], filter=p.lance).column("id").to_pylist()) == want
    assert {r[0] for r in con.execute(f"SELECT id FROM t WHERE {p.duckdb}").fetchall()} == want
