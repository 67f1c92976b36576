"""Threshold sweeps: what the rules in force would keep if one threshold moved, without rescoring.

For each numeric threshold of each rule (a column compared with a number: ``col <= x``,
``col < x``, ``col >= x``, ``col > x``, and both ends of ``col BETWEEN a AND b``, as terms of the
rule's top-level AND), a ``Sweep`` counts the documents (and tokens, the sum of ``n_tokens``)
the rules keep as that one threshold moves over a grid (quantiles of the column plus the value in
force) while every other rule and every other threshold stays as it is.

The thresholds come from the parsed rule (``corpus.predicate``'s sqlglot tree), never from the
text. The table is read once, at the version the rules were recorded at: the swept columns' values,
the token counts, and for each rule a boolean that Lance itself evaluates (the rule as a whole,
and the part of it that is not swept), so every rule's NULL semantics are Lance's own (a NULL does
not pass). The sweeps are then sorted arrays and ``searchsorted`` in numpy: no tagger runs again
and no count per grid point goes back to the table. A comparison is made in the column's own type
with the threshold cast to it, as Lance does (``float32`` columns compare with ``float32(0.1)``;
NaN is above every number), and the numpy masks at the thresholds in force are checked against
Lance's per rule: a rule where they differ is left out with a note rather than shown wrong.

Tables over ``max_rows`` rows (default 1,000,000) are swept on a uniform random sample of that
many rows (seeded): the counts are then the sample's and the shares estimate the table's.
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass, field

import lance
import numpy as np
import pyarrow as pa
from sqlglot import exp

from lance_assets.curation.predicate import Predicate, safe_predicate
from lance_assets.curation.rules import rule_predicates
from lance_assets.markdown import markdown_table, png_markdown

MAX_ROWS = 1_000_000
"""Rows read at most; a larger table is swept on a uniform sample of this many rows."""
POINTS = 21
"""Quantile levels of the grid (0%, 5%, ..., 100%), plus the value in force."""
SHOWN_LEVELS = (0.1, 0.25, 0.5, 0.75, 0.9)
"""Quantiles whose kept share the Markdown table shows for each threshold."""

_FLIP = {exp.GT: exp.LT, exp.GTE: exp.LTE, exp.LT: exp.GT, exp.LTE: exp.GTE}
_OPS = {exp.GT: ">", exp.GTE: ">=", exp.LT: "<", exp.LTE: "<="}


@dataclass(frozen=True)
class Threshold:
    """One numeric threshold of a rule: ``column bound value`` is the term it keeps."""

    rule: str
    column: str
    bound: str  # "<", "<=", ">", ">=": column BOUND value keeps the row
    value: int | float
    term: int  # index of its term in the rule's top-level AND

    @property
    def label(self) -> str:
        return f"{self.column} {self.bound} {_fmt(self.value)}"


@dataclass
class Sweep:
    """Documents and tokens the rules keep as one threshold moves over ``grid``."""

    rule: str
    column: str
    bound: str
    current: int | float  # the threshold in force, cast to the column's type as Lance casts it
    grid: list[int | float]
    kept_docs: list[int]
    kept_tokens: list[int] | None  # None when the table has no token counts
    rows: int  # rows read: the denominator of the shares
    total_tokens: int | None
    quantiles: dict[float, int | float] = field(default_factory=dict)  # level -> grid value

    @property
    def label(self) -> str:
        return f"{self.column} {self.bound} {_fmt(self.current)}"

    def at(self, value) -> int:
        """Index of ``value`` in the grid."""
        return self.grid.index(value)

    @property
    def kept_docs_now(self) -> int:
        return self.kept_docs[self.at(self.current)]

    @property
    def kept_tokens_now(self) -> int | None:
        return None if self.kept_tokens is None else self.kept_tokens[self.at(self.current)]


@dataclass
class SweepReport:
    version: int
    table_rows: int
    rows_read: int
    sweeps: list[Sweep]
    skipped: list[str]  # comparisons or rules not swept, and why

    @property
    def sampled(self) -> bool:
        return self.rows_read < self.table_rows


def _fmt(value) -> str:
    return str(value) if isinstance(value, (int, np.integer)) else f"{float(value):.4g}"


def _unparen(node: exp.Expression) -> exp.Expression:
    while isinstance(node, exp.Paren):
        node = node.this
    return node


def _terms(tree: exp.Expression) -> list[exp.Expression]:
    """The terms of the top-level AND, in order (parentheses around an AND are looked through)."""
    out, stack = [], [tree]
    while stack:
        node = _unparen(stack.pop())
        if isinstance(node, exp.And):
            stack += [node.expression, node.this]
        else:
            out.append(node)
    return out


def _number(node: exp.Expression) -> int | float | None:
    """The value of a numeric literal (``-x`` included), else None."""
    node = _unparen(node)
    sign = 1
    if isinstance(node, exp.Neg):
        sign, node = -1, _unparen(node.this)
    if not isinstance(node, exp.Literal) or node.is_string:
        return None
    text = node.this
    try:
        return sign * int(text)
    except ValueError:
        return sign * float(text)


def _column(node: exp.Expression) -> str | None:
    node = _unparen(node)
    return node.this.name if isinstance(node, exp.Column) else None


def _why_not(a: exp.Expression, b: exp.Expression) -> str:
    if _column(a) and _column(b):
        return "compares two columns"
    if any(isinstance(_unparen(x), exp.Literal) and _unparen(x).is_string for x in (a, b)):
        return "compares with a string"
    return "is not a column compared with a number"


def thresholds(rule: str, predicate: Predicate, schema: pa.Schema
               ) -> tuple[list[Threshold], list[str]]:
    """The numeric thresholds of ``rule`` (terms of its top-level AND, read from the parsed tree),
    and a note for each comparison that is not swept, saying why."""
    found, notes = [], []
    for i, term in enumerate(_terms(predicate.tree)):
        if isinstance(term, tuple(_OPS)):
            op, col, value = type(term), _column(term.this), _number(term.expression)
            if col is None or value is None:  # the number on the left: 0.1 >= col
                op, col, value = _FLIP[type(term)], _column(term.expression), _number(term.this)
            pairs = [(_OPS[op], value)]
            why = None if col and value is not None else _why_not(term.this, term.expression)
        elif isinstance(term, exp.Between):
            col = _column(term.this)
            pairs = [(">=", _number(term.args["low"])), ("<=", _number(term.args["high"]))]
            why = None if col and all(v is not None for _, v in pairs) else \
                _why_not(term.args["low"], term.args["high"]) if col else \
                "is not a column compared with a number"
        else:
            inner = [n for n in term.find_all(*_OPS, exp.Between)]
            if inner:
                notes.append(f"{rule}: {len(inner)} comparison(s) under OR/NOT or inside another "
                             "expression are held as they are, not swept")
            continue
        if why is None:
            kind = schema.field(col).type
            if not (pa.types.is_integer(kind) or pa.types.is_floating(kind)):
                why = f"compares column {col!r} of type {kind}, not a number"
        if why is not None:
            notes.append(f"{rule}: `{term.sql(dialect='duckdb')}` {why}; not swept")
            continue
        found += [Threshold(rule, col, bound, value, i) for bound, value in pairs]
    return found, notes


def _compare(values: np.ndarray, bound: str, value) -> np.ndarray:
    """``values bound value`` as Lance compares them: NaN above every number."""
    if bound in ("<", "<="):
        return values < value if bound == "<" else values <= value
    hit = values > value if bound == ">" else values >= value
    return hit | np.isnan(values) if values.dtype.kind == "f" else hit


def _cast(value, dtype: np.dtype) -> np.ndarray:
    """``value`` in the column's type, as Lance casts a literal (1e40 is inf in float32)."""
    with np.errstate(over="ignore"):
        return np.asarray(value).astype(dtype)


def _kept(sorted_values: np.ndarray, token_cumsum: np.ndarray | None, bound: str, grid: np.ndarray
          ) -> tuple[np.ndarray, np.ndarray | None]:
    """Rows (and their tokens) whose value passes ``bound g`` for each ``g`` of ``grid``: an
    ascending sort puts NaN last, above every number, as Lance orders it."""
    n = len(sorted_values)
    if bound in ("<", "<="):
        lo, hi = np.zeros(len(grid), np.int64), np.searchsorted(
            sorted_values, grid, side="left" if bound == "<" else "right")
    else:
        lo, hi = np.searchsorted(sorted_values, grid, side="right" if bound == ">" else "left"), \
            np.full(len(grid), n, np.int64)
    tokens = None
    if token_cumsum is not None:
        tokens = token_cumsum[hi] - token_cumsum[lo]
    return hi - lo, tokens


def _read(ds: lance.LanceDataset, columns: dict[str, str], total: int, max_rows: int, seed: int
          ) -> pa.Table:
    """The projected columns of every row, or of a seeded uniform sample of ``max_rows``."""
    if total <= max_rows:
        return ds.to_table(columns=columns)
    rows = np.unique(np.random.default_rng(seed).integers(0, total, max_rows))
    return ds.take(rows, columns=columns)


def _as_bool(column: pa.ChunkedArray) -> np.ndarray:
    return column.fill_null(False).to_numpy(zero_copy_only=False).astype(bool)


def sweeps(ds: lance.LanceDataset, rules: dict[str, str], *, points: int = POINTS,
           max_rows: int = MAX_ROWS, token_column: str = "n_tokens", seed: int = 0
           ) -> SweepReport:
    """A ``Sweep`` for every numeric threshold of the usable ``rules`` on ``ds`` (open it at the
    version the rules were recorded at), from one read of the columns they need. Broken rules
    are noted, not swept, and still not counted as passing."""
    usable, problems = rule_predicates(ds, rules)
    skipped = [f"{p.rule}: {p.problem}; not swept" for p in problems]
    names, schema = list(usable), ds.schema
    found: dict[str, list[Threshold]] = {}
    for name in names:
        found[name], notes = thresholds(name, usable[name], schema)
        skipped += notes
    swept_columns = sorted({t.column for ts in found.values() for t in ts})
    table_rows = ds.count_rows()
    if not swept_columns:  # nothing to sweep: no need to read the table
        return SweepReport(version=ds.version, table_rows=table_rows, rows_read=table_rows,
                           sweeps=[], skipped=skipped)
    projection = {f"rule_{i}": usable[n].lance for i, n in enumerate(names)}
    for i, name in enumerate(names):
        held = [t for j, t in enumerate(_terms(usable[name].tree))
                if j not in {x.term for x in found[name]}]
        if found[name] and held:  # the terms not swept, as Lance evaluates them
            fixed = exp.and_(*(t.copy() for t in held))
            projection[f"held_{i}"] = safe_predicate(fixed.sql(dialect="duckdb", identify=True),
                                                     schema.names).lance
    projection.update({f"value_{c}": f"`{c}`" for c in swept_columns})
    has_tokens = token_column in schema.names
    if has_tokens:
        projection["tokens"] = f"`{token_column}`"
    data = _read(ds, projection, table_rows, max_rows, seed)
    rows = data.num_rows

    tokens = data["tokens"].fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64) \
        if has_tokens else None
    passes = {n: _as_bool(data[f"rule_{i}"]) for i, n in enumerate(names)}
    values = {c: data[f"value_{c}"] for c in swept_columns}

    def term_mask(t: Threshold) -> np.ndarray:
        col = values[t.column]
        arr = col.to_numpy(zero_copy_only=False) if col.null_count == 0 else \
            col.fill_null(0).to_numpy(zero_copy_only=False)
        hit = _compare(arr, t.bound, _cast(t.value, arr.dtype))
        return hit & ~_as_bool(col.is_null()) if col.null_count else hit

    out = []
    failing = np.zeros(rows, np.int32)  # rules each row fails
    for n in names:
        failing += ~passes[n]
    for i, name in enumerate(names):
        if not found[name]:
            continue
        held = _as_bool(data[f"held_{i}"]) if f"held_{i}" in data.column_names else \
            np.ones(rows, bool)
        masks = [term_mask(t) for t in found[name]]
        if not np.array_equal(np.logical_and.reduce([held, *masks]), passes[name]):
            skipped.append(f"{name}: its thresholds compare differently here than in Lance "
                           "(an unusual column type?); not swept")
            continue
        others = (failing - ~passes[name]) == 0  # every other rule keeps the row
        for k, t in enumerate(found[name]):
            keep = others & held
            for j, m in enumerate(masks):
                if j != k:
                    keep &= m
            out.append(_sweep(t, values[t.column], keep, tokens, rows, points))
    return SweepReport(version=ds.version, table_rows=table_rows, rows_read=rows, sweeps=out,
                       skipped=skipped)


def _sweep(t: Threshold, column: pa.ChunkedArray, keep: np.ndarray, tokens: np.ndarray | None,
           rows: int, points: int) -> Sweep:
    valid = ~_as_bool(column.is_null())
    arr = column.fill_null(0).to_numpy(zero_copy_only=False)
    dtype = arr.dtype
    current = _cast(t.value, dtype)
    numbers = arr[valid & ~np.isnan(arr)] if dtype.kind == "f" else arr[valid]
    levels = np.linspace(0.0, 1.0, max(points, 2))
    at_levels = np.quantile(numbers, levels, method="inverted_cdf").astype(dtype) \
        if len(numbers) else np.array([], dtype)
    grid = np.unique(np.concatenate([at_levels, [current]]).astype(dtype))
    chosen = keep & valid
    order = np.argsort(arr[chosen], kind="stable")
    sorted_values = arr[chosen][order]
    cumsum = None
    if tokens is not None:
        cumsum = np.concatenate([[0], np.cumsum(tokens[chosen][order])])
    docs, toks = _kept(sorted_values, cumsum, t.bound, grid)
    py = int if dtype.kind in "iu" else float
    shown = {float(lv): py(v) for lv, v in zip(levels, at_levels)
             if any(math.isclose(lv, s) for s in SHOWN_LEVELS)}
    return Sweep(rule=t.rule, column=t.column, bound=t.bound, current=py(current),
                 grid=[py(g) for g in grid], kept_docs=[int(d) for d in docs],
                 kept_tokens=None if toks is None else [int(x) for x in toks], rows=rows,
                 total_tokens=None if tokens is None else int(tokens.sum()), quantiles=shown)


def plot_png(report: SweepReport) -> bytes | None:
    """Kept share (documents, tokens) against each threshold, one small panel per threshold, the
    value in force marked; None when nothing was swept."""
    if not report.sweeps:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    n = len(report.sweeps)
    cols = min(4, n)
    nrows = math.ceil(n / cols)
    # dpi 60, no tight_layout, few ticks: the default rules make ~26 panels, and drawing their
    # text is most of the cost on a small CPU
    fig, axes = plt.subplots(nrows, cols, figsize=(3 * cols, 2.1 * nrows + 0.5), dpi=60,
                             squeeze=False, sharey=True)
    for ax in axes.flat[n:]:
        ax.axis("off")
    for ax, s in zip(axes.flat, report.sweeps):
        steps = "steps-post" if s.bound in ("<", "<=") else "steps-pre"
        ax.plot(s.grid, [d / max(s.rows, 1) for d in s.kept_docs], "-", label="documents",
                lw=1.2, drawstyle=steps)
        if s.kept_tokens is not None and s.total_tokens:
            ax.plot(s.grid, [x / s.total_tokens for x in s.kept_tokens], "--", label="tokens",
                    lw=1.2, drawstyle=steps)
        data = [g for g in s.grid if g != s.current] or s.grid  # the column's quantiles
        low, high = min(data), max(data)
        if low <= s.current <= high or low == high:
            ax.axvline(s.current, color="k", ls=":", lw=1)
            off = ""
        else:  # e.g. word_count <= 100000 on a corpus of short documents
            ax.set_xlim(low, high)
            off = " (off the plot)"
        ax.set_title(f"{s.rule}\n{s.label}{off}", fontsize=8)
        ax.set_ylim(0, 1.02)
        ax.xaxis.set_major_locator(MaxNLocator(4))
        ax.tick_params(labelsize=7)
    axes.flat[0].legend(fontsize=7, loc="lower left")
    fig.suptitle("share kept as one threshold moves, the others as in force; dotted: the value "
                 "in force" + (f"; a sample of {report.rows_read:,} rows" if report.sampled
                               else ""), fontsize=9)
    fig.subplots_adjust(left=0.05, right=0.98, top=1 - 0.75 / (2.1 * nrows + 0.5),
                        bottom=0.25 / (2.1 * nrows + 0.5), hspace=0.75, wspace=0.15)
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return buf.getvalue()


def table_rows(report: SweepReport) -> list[dict]:
    """Per threshold: the kept share (documents) in force and with the threshold at a few
    quantiles of its column."""
    out = []
    for s in report.sweeps:
        share = max(s.rows, 1)
        row = {"rule": s.rule, "threshold": f"`{s.label}`",
               "kept now": f"{s.kept_docs_now / share:.3f}",
               "tokens now": "" if s.kept_tokens is None or not s.total_tokens else
               f"{s.kept_tokens_now / s.total_tokens:.3f}"}
        for level in SHOWN_LEVELS:
            value = s.quantiles.get(level)
            row[f"at q{round(level * 100)}"] = "" if value is None else \
                f"{_fmt(value)} → {s.kept_docs[s.at(value)] / share:.3f}"
        out.append(row)
    return out


def markdown(report: SweepReport) -> dict[str, str]:
    """Markdown for the ``curation_rules`` metadata: the plot and the table of kept shares."""
    png = plot_png(report)
    sample = (f"\n\n_A uniform sample of {report.rows_read:,} of {report.table_rows:,} rows._"
              if report.sampled else "")
    notes = "".join(f"\n- {note}" for note in report.skipped)
    return {
        "threshold_sweeps": png_markdown(png, "kept share as each threshold moves") if png
        else "_no numeric thresholds in the rules in force_",
        "threshold_sweep_table": markdown_table(table_rows(report)) + sample
        + (f"\n\nNot swept:{notes}" if notes else ""),
    }


__all__ = ["MAX_ROWS", "POINTS", "Sweep", "SweepReport", "Threshold",
           "markdown", "plot_png", "sweeps", "table_rows", "thresholds"]
