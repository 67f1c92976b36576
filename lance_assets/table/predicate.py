"""One parser for every predicate a person hands us: curation rules, ``--filter``, forensics
filters, ``forget``'s ``where``.

User text is data, never code. A predicate is parsed with a real SQL parser (sqlglot) into
exactly one boolean expression over the table's columns, literals, operators and a short
allow-list of scalar functions; anything else (a second statement, a subquery, a table function
such as ``read_text``, a comment, trailing text, an unknown column) is refused with a
``PredicateError`` that names the input and the fix. What runs is the parsed tree rendered back
to SQL, once for Lance (DataFusion) and once for DuckDB, with every operand that is itself an
operation parenthesised, so both engines read the same expression that was checked, whatever
their precedence tables say.

Size and nesting are bounded before any engine sees the text: Lance's planner recurses over the
expression and a deep enough one (40,000 ``OR`` terms) overflows its stack and kills the process.

It sits in the table layer, below every stage that takes user text (``curation`` re-exports
it as ``lance_assets.curation.predicate``), and depends on sqlglot only, so the trainer can
import it; ``lance_problem`` asks Lance itself whether it can filter a dataset with a checked
predicate.
"""

from __future__ import annotations

import re
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import sqlglot
from sqlglot import exp
from sqlglot.dialects.duckdb import DuckDB
from sqlglot.errors import SqlglotError
from sqlglot.tokens import TokenType

if TYPE_CHECKING:
    import lance

MAX_CHARS = 20_000
"""Longest predicate accepted (the 20 default rules together are about 1,100 characters)."""
MAX_DEPTH = 100
"""Deepest expression accepted: a chain of N ``OR``/``AND`` terms is N deep."""
MAX_NODES = 5_000
"""Most operators, columns and literals in one predicate."""

COLUMN_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
FUNCTIONS = {exp.Length: "length", exp.Lower: "lower", exp.Upper: "upper", exp.Abs: "abs",
             exp.Coalesce: "coalesce"}
"""Scalar functions both Lance (DataFusion) and DuckDB evaluate the same way."""

_BOOLEAN_OPS = (exp.And, exp.Or, exp.Not, exp.EQ, exp.NEQ, exp.GT, exp.GTE, exp.LT, exp.LTE,
                exp.Is, exp.In, exp.Between, exp.Like, exp.ILike)
_ARITHMETIC = (exp.Add, exp.Sub, exp.Mul, exp.Div, exp.Mod, exp.Neg)
_OPERATIONS = (*_BOOLEAN_OPS, *_ARITHMETIC)
_ALLOWED = (*_OPERATIONS, *FUNCTIONS, exp.Cast, exp.DataType, exp.Paren, exp.Column, exp.Identifier,
            exp.Literal,
            exp.Boolean, exp.Null)
_CONTROL_CHARS = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
_SHOWN = 120  # characters of the input quoted in an error


class PredicateError(ValueError):
    """A predicate that cannot be used; the message names the input and the fix."""

    def __init__(self, message: str, reason: str = ""):
        super().__init__(message)
        self.reason = reason or message
        """What was wrong and the fix, without the input (for messages that name it already)."""


class _ReadSQL(DuckDB):
    """DuckDB's SQL, also reading Lance's `column` quotes, so a rendered predicate parses again."""

    class Tokenizer(DuckDB.Tokenizer):
        IDENTIFIERS = ['"', "`"]


class _LanceSQL(DuckDB):
    """DuckDB's SQL with Lance's identifier quotes (in Lance "x" is a string, `x` a column)."""

    class Tokenizer(DuckDB.Tokenizer):
        IDENTIFIERS = ["`"]


@dataclass(frozen=True)
class Predicate:
    """A checked predicate: the text as given, and the parsed tree rendered for each engine."""

    source: str
    lance: str
    duckdb: str
    columns: frozenset[str]
    tree: exp.Expression = field(repr=False, compare=False, hash=False, default=None)

    def and_(self, other: Predicate) -> Predicate:
        """Both predicates must hold: the two parsed trees joined with AND, rendered again."""
        tree = exp.And(this=self._parsed(), expression=other._parsed())
        return _predicate(f"({self.source}) AND ({other.source})", tree,
                          self.columns | other.columns)

    def negated(self) -> Predicate:
        """The rows this predicate does not keep (a NULL stays NULL: kept by neither side)."""
        return _predicate(f"NOT ({self.source})", exp.Not(this=exp.Paren(this=self._parsed())),
                          self.columns)

    def __str__(self) -> str:
        return self.lance

    def _parsed(self) -> exp.Expression:
        if self.tree is not None:
            return self.tree.copy()
        return safe_predicate(self.duckdb, self.columns).tree


def _shown(text: str) -> str:
    return repr(text if len(text) <= _SHOWN else text[:_SHOWN] + "...")


def _fail(text: str, problem: str, fix: str) -> PredicateError:
    return PredicateError(f"predicate {_shown(text)}: {problem}. {fix}", f"{problem}. {fix}")


def _paren(node: exp.Expression) -> exp.Expression:
    return node if isinstance(node, (exp.Paren, exp.Column, exp.Literal, exp.Boolean, exp.Null,
                                     *FUNCTIONS)) else exp.Paren(this=node)


def _explicit(tree: exp.Expression) -> exp.Expression:
    """Parenthesise every operand that is itself an operation (``NOT (x IS NULL)``,
    ``(id % 20) = 0``), except AND inside AND and OR inside OR, which read the same either way."""
    for node in list(tree.walk()):
        if not isinstance(node, _OPERATIONS):
            continue
        for key, child in list(node.args.items()):
            if isinstance(child, _OPERATIONS) and not (
                    type(child) is type(node) and isinstance(node, (exp.And, exp.Or))):
                node.set(key, exp.Paren(this=child))
    return tree


def _for_lance(tree: exp.Expression) -> exp.Expression:
    """DataFusion divides integers as integers; DuckDB's ``/`` is always a float division."""
    for div in list(tree.find_all(exp.Div)):
        if _is_double_cast(div.this):
            continue
        div.set("this", exp.Cast(this=_paren(div.this), to=exp.DataType.build("DOUBLE")))
    return tree


def _is_double_cast(node: exp.Expression) -> bool:
    return isinstance(node, exp.Cast) and node.to.is_type(exp.DataType.Type.DOUBLE)


def _predicate(source: str, tree: exp.Expression, columns: frozenset[str]) -> Predicate:
    tree = _explicit(tree)
    lance = _for_lance(tree.copy()).sql(dialect=_LanceSQL, identify=True)
    duck = tree.sql(dialect="duckdb", identify=True)
    return Predicate(source=source, lance=lance, duckdb=duck, columns=columns, tree=tree)


def _depth_and_size(tree: exp.Expression) -> tuple[int, int]:
    """Nesting depth (parentheses not counted) and node count, without recursion."""
    deepest, nodes, stack = 0, 0, [(tree, 1)]
    while stack:
        node, depth = stack.pop()
        nodes += 1
        deepest = max(deepest, depth)
        step = 0 if isinstance(node, exp.Paren) else 1
        for child in node.iter_expressions():
            stack.append((child, depth + step))
    return deepest, nodes


def _node_problem(node: exp.Expression, columns: Collection[str]) -> str | None:
    """Why ``node`` is not allowed in a predicate, or None."""
    if isinstance(node, (exp.Select, exp.Subquery, exp.Query)) or node.find(exp.Select):
        return "subqueries are not allowed: a rule tests one row's columns"
    if isinstance(node, exp.Column):
        if node.table or node.args.get("db") or node.args.get("catalog"):
            return f"{node.sql()!r} names a table; write the column alone"
        if not isinstance(node.this, exp.Identifier):
            return f"{node.sql()!r} is not a column name"
        name = node.this.name
        if name not in columns:
            return (f"names column {name!r}, which the table does not have (columns: "
                    f"{', '.join(sorted(columns))})")
        if not COLUMN_NAME_RE.match(name):
            return f"column {name!r} cannot be used in a predicate (letters, digits, _ only)"
        return None
    if isinstance(node, exp.Func) and not isinstance(node, (*_ALLOWED, exp.Cast)):
        name = node.sql_name() if not isinstance(node, exp.Anonymous) else node.name
        return (f"function {name.lower()!r} is not allowed; allowed functions: "
                f"{', '.join(sorted(FUNCTIONS.values()))}")
    if not isinstance(node, _ALLOWED):
        return (f"{node.sql(dialect='duckdb')[:60]!r} ({type(node).__name__}) is not allowed; a "
                "predicate may use columns, literals, comparisons, AND/OR/NOT, BETWEEN, IN (...), "
                "IS [NOT] NULL, LIKE, + - * / %, CAST(x AS DOUBLE) and "
                f"{', '.join(sorted(FUNCTIONS.values()))}")
    if isinstance(node, exp.Cast) and not _is_double_cast(node):
        return "the only cast allowed is CAST(x AS DOUBLE)"
    if isinstance(node, exp.Cast) and node.args.get("safe"):
        return "TRY_CAST is not allowed; use CAST(x AS DOUBLE)"
    if isinstance(node, exp.Is) and not isinstance(node.expression, (exp.Null, exp.Boolean)):
        return "IS may only be followed by NULL, TRUE or FALSE"
    if isinstance(node, exp.In) and (node.args.get("query") or node.args.get("unnest")
                                     or node.args.get("field") or not node.expressions):
        return "IN takes a list of values: IN (1, 2, 3)"
    if isinstance(node, (exp.Like, exp.ILike)):
        pattern = node.expression
        if not (isinstance(pattern, exp.Literal) and pattern.is_string):
            return "LIKE takes a string pattern: text LIKE '%word%'"
        if "\\" in pattern.this:
            return ("a backslash in a LIKE pattern is an escape in Lance but a plain character in "
                    "DuckDB; use a pattern without backslashes")
    if isinstance(node, exp.Literal) and not node.is_string and not _is_number(node.this):
        return f"{node.this!r} is not a number"
    return None


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


_BOOLEAN_ROOTS = (*_BOOLEAN_OPS, exp.Boolean, exp.Column, exp.Coalesce)


def safe_predicate(text: str, columns: Collection[str], *, max_chars: int = MAX_CHARS) -> Predicate:
    """``text`` as one boolean expression over ``columns``, or a ``PredicateError``."""
    if not isinstance(text, str):
        raise PredicateError(f"predicate {text!r}: not a string. Write the predicate as SQL text, "
                             "e.g. 'NOT is_dup'")
    fix = "Write one boolean expression over the table's columns, e.g. 'word_count >= 50'"
    if not text.strip():
        raise _fail(text, "it is empty", fix)
    if len(text) > max_chars:
        raise _fail(text, f"it is {len(text):,} characters long, over the limit of {max_chars:,}",
                    "Shorten it (a long IN (...) list or many OR terms belong in a column)")
    if _CONTROL_CHARS.search(text):
        raise _fail(text, "it contains control characters", "Remove them")
    columns = frozenset(columns)
    try:
        tokens = _ReadSQL().tokenize(text)
    except SqlglotError as err:
        raise _fail(text, f"it is not valid SQL ({str(err).splitlines()[0]})", fix) from None
    for tok in tokens:
        if tok.comments:
            raise _fail(text, "it contains a comment (-- or /* */)", "Remove the comment")
        if tok.token_type == TokenType.SEMICOLON:
            raise _fail(text, "it contains ';': a predicate is one expression, not statements",
                        fix)
    depth = 0
    for tok in tokens:
        depth += {TokenType.L_PAREN: 1, TokenType.R_PAREN: -1}.get(tok.token_type, 0)
        if depth < 0:
            raise _fail(text, "it has a ')' without a matching '(' (the text after the complete "
                        "expression would be ignored or mean something else)",
                        "Remove the stray ')' or add the missing '('")
        if depth > MAX_DEPTH:
            raise _fail(text, f"parentheses nest deeper than {MAX_DEPTH}", "Simplify it")
    if depth:
        raise _fail(text, "it has a '(' without a matching ')'", "Close every parenthesis")
    try:
        statements = sqlglot.parse(text, read=_ReadSQL)
    except RecursionError:
        raise _fail(text, f"it nests deeper than {MAX_DEPTH}", "Simplify it") from None
    except SqlglotError as err:
        detail = str(err).splitlines()[0]
        raise _fail(text, f"it does not parse as SQL ({detail})", fix) from None
    if len(statements) != 1 or statements[0] is None:
        raise _fail(text, "it is not exactly one expression", fix)
    tree = statements[0]
    deepest, nodes = _depth_and_size(tree)
    if deepest > MAX_DEPTH or nodes > MAX_NODES:
        raise _fail(text, f"it is {deepest} operations deep with {nodes:,} terms (limits: "
                    f"{MAX_DEPTH} deep, {MAX_NODES:,} terms)",
                    "Simplify it: use IN (...) instead of a chain of OR terms")
    for node in tree.walk():
        problem = _node_problem(node, columns)
        if problem:
            raise _fail(text, problem, "Use one of the table's columns, or materialize the asset "
                        "that writes it" if "names column" in problem else fix)
    root = tree.unnest() if isinstance(tree, exp.Paren) else tree
    if not isinstance(root, _BOOLEAN_ROOTS):
        raise _fail(text, "it is not a true/false condition", fix)
    used = frozenset(c.this.name for c in tree.find_all(exp.Column))
    return _predicate(text, tree, used)


def combine(predicates: Collection[Predicate]) -> Predicate:
    """Every predicate must hold (AND), in the order given."""
    items = list(predicates)
    if not items:
        raise PredicateError("no predicates to combine: give at least one, e.g. 'NOT is_dup'")
    out = items[0]
    for p in items[1:]:
        out = out.and_(p)
    return out


def _lance_message(err: Exception) -> str:
    """Lance's error without its prefix and source location."""
    msg = str(err).split(", /")[0]
    for prefix in ("Invalid user input: ", "Schema error: "):
        msg = msg.replace(prefix, "")
    return msg.strip()


def lance_problem(ds: lance.LanceDataset, pred: Predicate) -> str | None:
    """Why Lance cannot filter ``ds`` with ``pred`` (types, functions), or None. Planning
    parses, binds and types the rendered predicate; nothing is scanned."""
    try:
        ds.scanner(columns=["id"], filter=pred.lance).explain_plan()
    except Exception as err:  # Lance raises OSError/ValueError with a parser message
        return f"Lance cannot use it as a filter: {_lance_message(err)}"
    return None
