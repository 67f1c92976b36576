"""Curation rules: named SQL predicates over columns, combined into the training filter.

A rule says which documents to *keep* (``word_count BETWEEN 50 AND 100000``); a document is
trained on when it passes every rule, so the training filter is the rules joined with AND. A
row where a rule's columns are NULL (a signal not computed yet) does not pass it. Rules are
checked with Lance, the engine the training loader filters with: one that does not parse, or
names a column the table lacks, is reported by name with the fix, before training starts.

The rules in force are stored in the table's config (manifest key/value metadata, versioned with
the table) by the ``curation_rules`` asset; ``training_filter`` reads them back for training.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

import lance

from lance_assets import paths
from lance_assets.corpus.table import get_json_config, set_json_config

CURATION_KEY = "lance_assets.curation"

# name -> keep-predicate. Thresholds: Gopher (Rae et al. 2021, table A1), C4 (Raffel et al.
# 2020) and FineWeb (Penedo et al. 2024) as in datatrove's GopherQualityFilter,
# GopherRepetitionFilter, C4QualityFilter and FineWebQualityFilter.
DEFAULT_RULES: dict[str, str] = {
    "exact_dup": "NOT is_dup",
    "near_dup": "NOT near_dup",
    "gopher_word_count": "word_count BETWEEN 50 AND 100000",
    "gopher_mean_word_length": "mean_word_length BETWEEN 3 AND 10",
    "gopher_symbol_word_ratio": "symbol_word_ratio <= 0.1",
    "gopher_bullet_lines": "bullet_line_share <= 0.9",
    "gopher_ellipsis_lines": "ellipsis_line_share <= 0.3",
    "gopher_alpha_words": "alpha_word_share >= 0.8",
    "gopher_stop_words": "stop_word_count >= 2",
    "gopher_dup_lines": "dup_line_share <= 0.3 AND dup_line_char_share <= 0.2",
    "gopher_dup_paragraphs": "dup_para_share <= 0.3 AND dup_para_char_share <= 0.2",
    "gopher_top_ngrams": (
        "top_2gram_char_share <= 0.2 AND top_3gram_char_share <= 0.18 "
        "AND top_4gram_char_share <= 0.16"
    ),
    "gopher_dup_ngrams": (
        "dup_5gram_char_share <= 0.15 AND dup_6gram_char_share <= 0.14 "
        "AND dup_7gram_char_share <= 0.13 AND dup_8gram_char_share <= 0.12 "
        "AND dup_9gram_char_share <= 0.11 AND dup_10gram_char_share <= 0.1"
    ),
    "c4_lorem_ipsum": "NOT has_lorem_ipsum",
    "c4_curly_bracket": "NOT has_curly_bracket",
    "fineweb_line_punct": "terminal_punct_line_share > 0.12",
    "fineweb_short_lines": "short_line_share < 0.67",
    "fineweb_dup_line_chars": "dup_line_char_share < 0.01",
    "fineweb_newlines": "newline_word_ratio <= 0.3",
}
NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass
class Curation:
    """The rules in force and the bounds the blocking checks hold the table to."""

    rules: dict[str, str] = field(default_factory=lambda: dict(DEFAULT_RULES))
    min_duplicate_rate: float = 0.0
    max_duplicate_rate: float = 0.5
    """Bounds on the share of rows flagged `is_dup OR near_dup`."""
    min_kept_rows: int = 1
    """The training filter must keep at least this many rows."""

    def to_dict(self) -> dict:
        # rules as [name, predicate] pairs: the table config is written with sorted keys, and
        # the order a person wrote the rules in is the order they are shown and applied in
        return {**asdict(self), "rules": [[k, v] for k, v in self.rules.items()]}

    @classmethod
    def from_dict(cls, raw: dict) -> "Curation":
        rules = raw.get("rules", {})
        return cls(**{**raw, "rules": dict(rules) if isinstance(rules, dict) else
                      {k: v for k, v in rules}})


class RuleError(ValueError):
    """One or more curation rules cannot be used; the message names each and says why."""


@dataclass(frozen=True)
class RuleProblem:
    rule: str
    predicate: str
    problem: str

    def __str__(self) -> str:
        return f"rule {self.rule!r} ({self.predicate!r}): {self.problem}"


def combined_filter(rules: dict[str, str]) -> str:
    """The training filter: every rule's predicate, parenthesised, joined with AND."""
    if not rules:
        raise RuleError("no curation rules: give at least one (e.g. exact_dup: 'NOT is_dup')")
    return " AND ".join(f"({p})" for p in rules.values())


def _lance_message(err: Exception) -> str:
    """Lance's error without its prefix and source location."""
    msg = str(err).split(", /")[0]
    for prefix in ("Invalid user input: ", "Schema error: "):
        msg = msg.replace(prefix, "")
    return msg.strip()


def rule_problems(ds: lance.LanceDataset, rules: dict[str, str]) -> list[RuleProblem]:
    """Every rule that Lance cannot parse or that names a missing column, with the fix."""
    problems = []
    columns = set(ds.schema.names)
    if not rules:
        return [RuleProblem("(none)", "", "no rules given; training needs at least one")]
    for name, predicate in rules.items():
        if not NAME_RE.match(name):
            problems.append(RuleProblem(name, predicate, "a rule name must be an identifier "
                                        "(letters, digits, underscores)"))
            continue
        if not isinstance(predicate, str) or not predicate.strip():
            problems.append(RuleProblem(name, str(predicate), "the predicate is empty"))
            continue
        try:  # planning parses, binds columns and types the predicate; nothing is scanned
            ds.scanner(columns=["id"], filter=predicate).explain_plan()
        except Exception as err:  # Lance raises OSError/ValueError with a parser message
            msg = _lance_message(err)
            missing = re.search(r"No field named ([\w\"]+)", msg)
            if missing:
                col = missing.group(1).strip('"')
                problems.append(RuleProblem(name, predicate, (
                    f"names column {col!r}, which the table does not have. Materialize the asset "
                    f"that writes it, or fix the rule. Columns: {', '.join(sorted(columns))}")))
            else:
                problems.append(RuleProblem(name, predicate, f"Lance cannot use it as a filter: "
                                            f"{msg}"))
    return problems


def validate(ds: lance.LanceDataset, rules: dict[str, str]) -> str:
    """The combined filter, or a ``RuleError`` naming every broken rule."""
    problems = rule_problems(ds, rules)
    if problems:
        raise RuleError(
            f"{len(problems)} curation rule(s) cannot be used on {ds.uri}:\n"
            + "\n".join(f"  - {p}" for p in problems)
            + "\nFix them in the `curation_rules` asset's config (rules: {name: predicate}) and "
            "materialize it again."
        )
    return combined_filter(rules)


def stored_curation(ds: lance.LanceDataset) -> Curation | None:
    raw = get_json_config(ds, CURATION_KEY)
    return Curation.from_dict(raw) if raw else None


def curation_in_force(ds: lance.LanceDataset) -> Curation:
    """The curation stored in the table, else the defaults."""
    return stored_curation(ds) or Curation()


def store_curation(root: str | Path, curation: Curation) -> int:
    """Record ``curation`` in the table's config (a new table version only if it changed)."""
    ds = lance.dataset(paths.table_uri(root))
    stored = stored_curation(ds)
    if stored is None or stored.to_dict() != curation.to_dict():
        set_json_config(ds, CURATION_KEY, curation.to_dict())
        ds = lance.dataset(paths.table_uri(root))
    return ds.version


def training_filter(root: str | Path) -> str:
    """The combined filter of the rules in force, validated against the table (``RuleError``)."""
    ds = lance.dataset(paths.table_uri(root))
    return validate(ds, curation_in_force(ds).rules)


@dataclass
class RuleHits:
    rule: str
    predicate: str
    removed: int | None  # rows that do not pass the rule (NULL counts as not passing)
    removed_only_by_this: int | None  # rows every other rule keeps
    problem: str = ""


@dataclass
class Evaluation:
    total_rows: int
    kept_rows: int | None
    filter: str
    hits: list[RuleHits]

    @property
    def ok(self) -> bool:
        return all(not h.problem for h in self.hits)

    @property
    def kept_share(self) -> float:
        return (self.kept_rows or 0) / self.total_rows if self.total_rows else 0.0

    def rows(self) -> list[dict]:
        return [{"rule": h.rule, "keep when": "`" + h.predicate.replace("|", "\\|") + "`",
                 "rows removed": "error" if h.problem else h.removed,
                 "removed only by this rule": "" if h.problem else h.removed_only_by_this,
                 "problem": h.problem} for h in self.hits]


def evaluate(ds: lance.LanceDataset, rules: dict[str, str]) -> Evaluation:
    """Hit counts per rule with Lance's own filter (what training applies); broken rules are
    reported, not raised, so the other rules are still counted."""
    total = ds.count_rows()
    problems = {p.rule: p for p in rule_problems(ds, rules)}
    usable = {k: v for k, v in rules.items() if k not in problems}
    kept = ds.count_rows(filter=combined_filter(usable)) if usable else None
    hits = []
    for name, predicate in rules.items():
        if name in problems:
            hits.append(RuleHits(name, predicate, None, None, problems[name].problem))
            continue
        others = {k: v for k, v in usable.items() if k != name}
        kept_by_others = ds.count_rows(filter=combined_filter(others)) if others else total
        hits.append(RuleHits(name, predicate, total - ds.count_rows(filter=predicate),
                             kept_by_others - kept))
    filter_sql = combined_filter(rules) if rules else ""
    return Evaluation(total_rows=total, kept_rows=None if problems else kept, filter=filter_sql,
                      hits=hits)
