"""What must hold before training reads the table: the facts the blocking checks test.

Each function returns a ``Verdict``: passed or not, a sentence a person can act on, and the
numbers behind it. The checks in ``lance_assets/defs/curation/checks.py`` only wrap these.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import lance

from lance_assets.curation.predicate import Predicate, safe_predicate
from lance_assets.curation.profile import locked_connection
from lance_assets.curation.rules import (
    RuleError,
    curation_in_force,
    rule_columns,
    rule_problems,
    validated_predicate,
)


@dataclass
class Verdict:
    passed: bool
    message: str
    numbers: dict = field(default_factory=dict)


def _filter_or_verdict(ds: lance.LanceDataset) -> tuple[Predicate | None, Verdict | None]:
    try:
        return validated_predicate(ds, curation_in_force(ds).rules), None
    except RuleError:
        return None, Verdict(False, "The curation rules cannot be used (see the `rules_valid` "
                             "check); this cannot be evaluated until they are fixed.")


def rule_columns_written(ds: lance.LanceDataset) -> Verdict:
    """Every column a rule in force reads is written on every row: a signal that is not on the
    path to training (an opt-in tagger, an embedding-based one) blocks it until its asset has
    caught up with the table, instead of leaving new rows NULL (not kept, silently)."""
    from lance_assets.table.columns import fragments_missing
    from lance_assets.table.producer import producers

    try:
        rules = curation_in_force(ds).rules
    except RuleError:
        return Verdict(False, "The curation rules cannot be used (see the `rules_valid` "
                       "check); this cannot be evaluated until they are fixed.")
    read = rule_columns(rules, frozenset(ds.schema.names))
    writer = {f.name: p.name for p in producers() for f in p.fields}
    behind: dict[str, int] = {}
    for column in sorted(read & set(writer)):
        lacking = fragments_missing(ds, [column])
        if lacking:
            behind[column] = sum(f.count_rows() for f in lacking)
    if not behind:
        return Verdict(True, f"The {len(read)} column(s) the rules read are written on every "
                       "row.", {"columns_read": sorted(read)})
    assets = sorted({writer[c] for c in behind})
    return Verdict(False, "The rules read column(s) not yet written on every row: "
                   + ", ".join(f"`{c}` ({n:,} rows in fragments without it)"
                               for c, n in behind.items())
                   + ". Materialize " + ", ".join(f"`{a}`" for a in assets)
                   + " (e.g. `dagster asset materialize -m lance_assets.definitions --select "
                   + ",".join(assets) + "`), then training runs.",
                   {"columns_behind": behind, "assets": assets})


def rules_valid(ds: lance.LanceDataset) -> Verdict:
    try:
        rules = curation_in_force(ds).rules
    except RuleError as err:
        return Verdict(False, str(err))
    problems = rule_problems(ds, rules)
    if problems:
        return Verdict(False, f"{len(problems)} of {len(rules)} curation rule(s) cannot be used:\n"
                       + "\n".join(f"- {p}" for p in problems)
                       + "\n\nFix them in the `curation_rules` config and materialize it again.",
                       {"broken_rules": [p.rule for p in problems]})
    return Verdict(True, f"all {len(rules)} rules parse and name existing columns",
                   {"rules": len(rules)})


def filter_keeps_rows(ds: lance.LanceDataset) -> Verdict:
    keep, bad = _filter_or_verdict(ds)
    if bad:
        return bad
    need = curation_in_force(ds).min_kept_rows
    kept, total = ds.count_rows(filter=keep.lance), ds.count_rows()
    numbers = {"kept_rows": kept, "total_rows": total,
               "kept_share": round(kept / total, 4) if total else 0.0, "min_kept_rows": need}
    if kept < max(need, 1):
        return Verdict(False, f"The training filter keeps {kept} of {total} rows (at least "
                       f"{max(need, 1)} needed). Loosen the rules (see the hit counts on "
                       "`curation_rules`) or ingest more data.", numbers)
    return Verdict(True, f"the training filter keeps {kept} of {total} rows", numbers)


def input_ids_present(ds: lance.LanceDataset) -> Verdict:
    if "input_ids" not in ds.schema.names:
        return Verdict(False, "The table has no `input_ids`; materialize `token_ids`.")
    keep, bad = _filter_or_verdict(ds)
    if bad:
        return bad
    untokenized = safe_predicate("input_ids IS NULL", ds.schema.names)
    missing = ds.count_rows(filter=keep.and_(untokenized).lance)
    if missing:
        return Verdict(False, f"{missing} row(s) pass the training filter but have no "
                       "`input_ids` (fragments not tokenized yet); materialize `token_ids`.",
                       {"rows_without_input_ids": missing})
    return Verdict(True, "every row that passes the filter has input_ids",
                   {"rows_without_input_ids": 0})


def n_tokens_consistent(ds: lance.LanceDataset) -> Verdict:
    if not {"input_ids", "n_tokens"} <= set(ds.schema.names):
        return Verdict(False, "The table has no `input_ids`/`n_tokens`; materialize `token_ids`.")
    con = locked_connection({"corpus": ds})
    bad, example = con.execute(
        "SELECT count(*), min(id) FROM corpus WHERE input_ids IS NOT NULL "
        "AND n_tokens IS DISTINCT FROM len(input_ids)").fetchone()
    if bad:
        return Verdict(False, f"{bad} row(s) have `n_tokens` different from the length of "
                       f"`input_ids` (first: id {example}). The token columns are corrupt: "
                       "re-tokenize into fresh columns.", {"mismatched_rows": bad})
    return Verdict(True, "n_tokens equals len(input_ids) on every tokenized row",
                   {"mismatched_rows": 0})


def duplicate_rate_in_bounds(ds: lance.LanceDataset) -> Verdict:
    cur = curation_in_force(ds)
    cols = {"is_dup", "near_dup"} & set(ds.schema.names)
    if not cols:
        return Verdict(False, "The table has neither `is_dup` nor `near_dup`; materialize "
                       "`dedup_flag` and `near_dup`.")
    flag = " OR ".join(sorted(cols))  # column names from the fixed set above, not user text
    con = locked_connection({"corpus": ds})
    rate, rows = con.execute(
        f"SELECT avg(({flag})::INT), count(*) FROM corpus WHERE ({flag}) IS NOT NULL").fetchone()
    rate = rate or 0.0
    numbers = {"duplicate_rate": round(rate, 4), "rows_flagged_or_clear": rows,
               "min_duplicate_rate": cur.min_duplicate_rate,
               "max_duplicate_rate": cur.max_duplicate_rate, "columns": sorted(cols)}
    if not cur.min_duplicate_rate <= rate <= cur.max_duplicate_rate:
        return Verdict(False, f"{rate:.2%} of rows are flagged {' or '.join(sorted(cols))}, "
                       f"outside the bounds [{cur.min_duplicate_rate:.0%}, "
                       f"{cur.max_duplicate_rate:.0%}]. Check the dedup columns, or change the "
                       "bounds in the `curation_rules` config.", numbers)
    return Verdict(True, f"duplicate rate {rate:.2%} is within bounds", numbers)


def contamination_not_kept(ds: lance.LanceDataset) -> Verdict:
    """No row the training filter keeps shares a 13-gram with a registered evaluation set, and
    none it keeps is unchecked while sets are registered."""
    from lance_assets.curation.contamination import registered_sets

    sets = registered_sets(ds)
    names = [s["name"] for s in sets]
    if not sets:
        return Verdict(True, "no evaluation sets registered", {"eval_sets": []})
    if "contaminated" not in ds.schema.names:
        return Verdict(False, "Evaluation sets are registered but the table has no "
                       "`contaminated` column; materialize `contamination`.")
    keep, bad = _filter_or_verdict(ds)
    if bad:
        return bad
    flagged = safe_predicate("contaminated IS NULL OR contaminated", ds.schema.names)
    count = ds.count_rows(filter=keep.and_(flagged).lance)
    numbers = {"eval_sets": names, "kept_rows_contaminated_or_unchecked": count}
    if count:
        return Verdict(False, f"{count} row(s) that the training filter keeps are contaminated by "
                       f"an evaluation set ({', '.join(names)}) or not checked yet. Keep the "
                       "`not_contaminated` rule (NOT contaminated) in the curation rules, or "
                       "materialize `contamination` on the new rows.", numbers)
    return Verdict(True, f"no kept row overlaps the evaluation sets ({', '.join(names) or 'none'})",
                   numbers)
