"""The predicate parser, as curation uses it: rules, sweeps, guards and profiles import it from
here. The parser itself (user text checked into one expression over known columns, rendered for
Lance and DuckDB) lives in the table layer, ``lance_assets.table.predicate``, so that every stage
that takes user text, the table's own ``forget`` included, imports it downward."""

from lance_assets.table.predicate import (
    COLUMN_NAME_RE,
    FUNCTIONS,
    MAX_CHARS,
    MAX_DEPTH,
    MAX_NODES,
    Predicate,
    PredicateError,
    combine,
    lance_problem,
    safe_predicate,
)

__all__ = ["COLUMN_NAME_RE", "FUNCTIONS", "MAX_CHARS", "MAX_DEPTH", "MAX_NODES", "Predicate",
           "PredicateError", "combine", "lance_problem", "safe_predicate"]
