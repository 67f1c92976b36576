"""Corpus EDA in SQL: DuckDB scans the Lance table through Arrow (no copy into another store).

The queries are the ``.sql`` files in ``lance_assets/curation/sql/profile/`` (or any folder passed
as ``queries``): read them, change them, add one, and the next ``corpus_profile`` run shows it.
Each query runs against a view ``corpus``: the Lance table's columns plus ``kept``, true where a
row passes every curation rule in force. Rule hit counts are built from the rules themselves.
A query whose file has a ``-- requires: col1, col2`` line is skipped (and says why) until the
table has those columns, so a tagger's section appears once the tagger has run.

The rules are user text and the table config that holds them is not trusted: each rule is parsed
again (``corpus.predicate``) and only its rendered tree reaches DuckDB; a rule that does not parse
is reported, never run. Rule names are bound as query parameters. Every DuckDB connection here
runs with external access off and its configuration locked, so no query (a rule, or a ``.sql``
file from a configured folder) can read or write a file, attach a database or load an extension.
"""

from __future__ import annotations

import io
from dataclasses import dataclass, field
from pathlib import Path

import duckdb
import lance

from lance_assets.curation.predicate import Predicate
from lance_assets.curation.rules import combined_predicate, curation_in_force, rule_predicates
from lance_assets.table import Table

QUERIES_DIR = Path(__file__).parent / "sql" / "profile"


@dataclass
class QueryResult:
    name: str
    sql: str
    rows: list[dict] = field(default_factory=list)
    error: str = ""
    skipped: str = ""


@dataclass
class Profile:
    results: list[QueryResult]
    rule_hits: QueryResult
    kept_defined: bool
    histogram_png: bytes | None
    table_version: int
    rows: int


def locked_connection(tables: dict[str, object], memory_limit: str = "2GB"
                      ) -> duckdb.DuckDBPyConnection:
    """A DuckDB connection that sees ``tables`` (Lance datasets, Arrow tables) and nothing else:
    registered first, then external access (files, network, extensions) switched off and the
    configuration locked, so no later statement can switch it back on."""
    con = duckdb.connect(config={"autoload_known_extensions": False,
                                 "autoinstall_known_extensions": False})
    con.execute(f"SET memory_limit = '{memory_limit}'")  # ours, not user text
    for name, obj in tables.items():
        con.register(name, obj)
    con.execute("SET enable_external_access = false")
    con.execute("SET lock_configuration = true")
    return con


def flag_rate(table: Table, column: str) -> float:
    """Share of the rows holding the boolean ``column`` where it is true (0.0 when none hold
    it): ``is_dup`` for ``dedup_flag``, ``near_dup`` for ``near_dup``."""
    ds = table.newest()
    if column not in ds.schema.names:
        raise ValueError(f"{ds.uri} has no column {column!r}; materialize the asset that writes it")
    quoted = '"' + column.replace('"', '""') + '"'  # an identifier, never text to run
    con = locked_connection({"corpus": ds})
    return con.execute(
        f"SELECT avg({quoted}::INT) FROM corpus WHERE {quoted} IS NOT NULL").fetchone()[0] or 0.0


def _connect(ds: lance.LanceDataset, kept: Predicate | None
             ) -> tuple[duckdb.DuckDBPyConnection, bool]:
    con = locked_connection({"lance_corpus": ds})
    if kept is not None:
        try:
            con.execute(f"CREATE VIEW corpus AS SELECT *, coalesce(({kept.duckdb}), false) AS kept "
                        "FROM lance_corpus")
            con.execute("SELECT kept FROM corpus LIMIT 0")
            return con, True
        except duckdb.Error:
            pass
    # a rule that does not parse, or one DuckDB cannot evaluate: profile without `kept`
    con.execute("CREATE OR REPLACE VIEW corpus AS SELECT *, NULL::BOOLEAN AS kept FROM lance_corpus")
    return con, False


def required_columns(sql: str) -> list[str]:
    """The columns named on the query's ``-- requires:`` line (none without one)."""
    for line in sql.splitlines():
        if line.strip().lower().startswith("-- requires:"):
            return [c.strip() for c in line.split(":", 1)[1].split(",") if c.strip()]
    return []


def run_query(con: duckdb.DuckDBPyConnection, name: str, sql: str,
              columns: list[str] | None = None) -> QueryResult:
    missing = [c for c in required_columns(sql) if columns is not None and c not in columns]
    if missing:
        return QueryResult(name, sql, skipped=f"needs column(s) {missing}, which the table does "
                           "not have yet (materialize the asset that writes them)")
    try:
        table = con.sql(sql).to_arrow_table()
        return QueryResult(name, sql, table.to_pylist())
    except duckdb.Error as err:
        return QueryResult(name, sql, error=str(err).splitlines()[0])


def rule_hits_sql(predicates: dict[str, Predicate]) -> tuple[str, list]:
    """One pass over the table: per rule, the rows it removes (NULL counts as removed). The SQL
    holds only the rendered predicates; rule names are parameters."""
    parts = [f"SELECT ?::VARCHAR AS rule, count(*) FILTER (WHERE NOT coalesce(({p.duckdb}), false)) "
             "AS rows_removed, round(rows_removed / count(*), 4) AS share_removed FROM corpus"
             for p in predicates.values()]
    return "\nUNION ALL\n".join(parts), list(predicates)


def rule_hits(con: duckdb.DuckDBPyConnection, ds: lance.LanceDataset,
              rules: dict[str, str]) -> QueryResult:
    usable, problems = rule_predicates(ds, rules)
    sql, names = rule_hits_sql(usable)
    res = QueryResult("rule_hits", sql)
    if usable:
        try:
            res.rows = con.sql(sql, params=names).to_arrow_table().to_pylist()
        except duckdb.Error as err:
            res.error = str(err).splitlines()[0]
    res.rows += [{"rule": p.rule, "rows_removed": None, "share_removed": None} for p in problems]
    if problems:
        res.error = (f"{len(problems)} stored rule(s) cannot be used and were not run: "
                     + "; ".join(str(p) for p in problems))
    return res


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


def profile(table: Table, queries: str | Path | None = None) -> Profile:
    """The profile queries (``queries``: a folder of ``.sql`` files) over the newest version of
    ``table``."""
    ds = table.newest()
    rules = curation_in_force(ds).rules
    usable, problems = rule_predicates(ds, rules)
    kept = combined_predicate(usable) if usable and not problems else None
    con, kept_defined = _connect(ds, kept)
    folder = Path(queries) if queries else QUERIES_DIR
    results = [run_query(con, f.stem, f.read_text(), ds.schema.names)
               for f in sorted(folder.glob("*.sql"))]
    hits = rule_hits(con, ds, rules) if rules else \
        QueryResult("rule_hits", "", error="no rules")
    png = histogram_png(con)
    return Profile(results=results, rule_hits=hits, kept_defined=kept_defined, histogram_png=png,
                   table_version=ds.version, rows=ds.count_rows())


def null_counts(ds: lance.LanceDataset, columns: list[str]) -> dict[str, int]:
    """Rows where each of ``columns`` is null, over the whole table: rows of fragments a column
    writer has not reached yet count too. One filtered count per column (Lance reads only that
    column: about 1 GB/s of column data on one core, docs/benchmarks.md)."""
    return {c: ds.count_rows(filter=f"`{c.replace('`', '``')}` IS NULL") for c in columns}
