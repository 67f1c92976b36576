"""Corpus EDA in SQL: DuckDB scans the Lance table through Arrow (no copy into another store).

The queries are the ``.sql`` files in ``lance_assets/corpus/sql/profile/`` (or any folder passed
as ``queries``): read them, change them, add one, and the next ``corpus_profile`` run shows it.
Each query runs against a view ``corpus``: the Lance table's columns plus ``kept``, true where a
row passes every curation rule in force. Rule hit counts are built from the rules themselves.
"""

from __future__ import annotations

import io
from dataclasses import dataclass, field
from pathlib import Path

import duckdb
import lance

from lance_assets import paths
from lance_assets.corpus.rules import combined_filter, curation_in_force

QUERIES_DIR = Path(__file__).parent / "sql" / "profile"


@dataclass
class QueryResult:
    name: str
    sql: str
    rows: list[dict] = field(default_factory=list)
    error: str = ""


@dataclass
class Profile:
    results: list[QueryResult]
    rule_hits: QueryResult
    kept_defined: bool
    histogram_png: bytes | None
    table_version: int
    rows: int


def _connect(ds: lance.LanceDataset, filter_sql: str) -> tuple[duckdb.DuckDBPyConnection, bool]:
    con = duckdb.connect()
    con.execute("SET memory_limit = '2GB'")
    con.register("lance_corpus", ds)
    try:
        con.execute(f"CREATE VIEW corpus AS SELECT *, coalesce(({filter_sql}), false) AS kept "
                    "FROM lance_corpus")
        con.execute("SELECT kept FROM corpus LIMIT 0")
        return con, True
    except duckdb.Error:
        # a rule DuckDB cannot evaluate (or a column not written yet): profile without `kept`
        con.execute("CREATE OR REPLACE VIEW corpus AS SELECT *, NULL::BOOLEAN AS kept FROM lance_corpus")
        return con, False


def run_query(con: duckdb.DuckDBPyConnection, name: str, sql: str) -> QueryResult:
    try:
        table = con.sql(sql).to_arrow_table()
        return QueryResult(name, sql, table.to_pylist())
    except duckdb.Error as err:
        return QueryResult(name, sql, error=str(err).splitlines()[0])


def rule_hits_sql(rules: dict[str, str]) -> str:
    """One pass over the table: per rule, the rows it removes (NULL counts as removed)."""
    parts = [f"SELECT '{name}' AS rule, count(*) FILTER (WHERE NOT coalesce(({pred}), false)) AS rows_removed, "
             f"round(rows_removed / count(*), 4) AS share_removed FROM corpus"
             for name, pred in rules.items()]
    return "\nUNION ALL\n".join(parts)


def histogram_png(con: duckdb.DuckDBPyConnection) -> bytes | None:
    """Word counts (log scale) and scores of documents kept vs. removed by curation."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    try:
        t = con.sql("SELECT word_count, score, coalesce(kept, true) AS kept FROM corpus "
                    "WHERE word_count IS NOT NULL").to_arrow_table()
    except duckdb.Error:
        return None
    if t.num_rows == 0:
        return None
    words = t.column("word_count").to_numpy(zero_copy_only=False).astype(float)
    score = t.column("score").to_numpy(zero_copy_only=False).astype(float)
    kept = t.column("kept").to_numpy(zero_copy_only=False).astype(bool)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(9, 3.2), dpi=100)
    bins = np.logspace(0, np.log10(max(words.max(), 10)) + 0.05, 40)
    words = np.maximum(words, 1)
    ax1.hist([words[kept], words[~kept]], bins=bins, stacked=True,
             label=["kept", "removed"], color=["tab:blue", "tab:red"])
    ax1.set_xscale("log")
    ax1.set_xlabel("words per document")
    ax1.set_ylabel("documents")
    ax1.legend()
    finite = ~np.isnan(score)
    if finite.any():
        sbins = np.linspace(np.nanmin(score), np.nanmax(score) + 1e-9, 26)
        ax2.hist([score[kept & finite], score[~kept & finite]], bins=sbins, stacked=True,
                 color=["tab:blue", "tab:red"])
        ax2.set_xlabel("score")
    for ax in (ax1, ax2):
        ax.grid(alpha=0.3)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return buf.getvalue()


def profile(root: str | Path, queries: str | Path | None = None) -> Profile:
    ds = lance.dataset(paths.table_uri(root))
    rules = curation_in_force(ds).rules
    con, kept_defined = _connect(ds, combined_filter(rules) if rules else "true")
    folder = Path(queries) if queries else QUERIES_DIR
    results = [run_query(con, f.stem, f.read_text()) for f in sorted(folder.glob("*.sql"))]
    hits = run_query(con, "rule_hits", rule_hits_sql(rules)) if rules else \
        QueryResult("rule_hits", "", error="no rules")
    png = histogram_png(con)
    return Profile(results=results, rule_hits=hits, kept_defined=kept_defined, histogram_png=png,
                   table_version=ds.version, rows=ds.count_rows())
