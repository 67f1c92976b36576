"""Curation rules: named SQL predicates over columns, combined into the training filter.

A rule says which documents to *keep* (``word_count BETWEEN 50 AND 100000``); a document is
trained on when it passes every rule, so the training filter is the rules joined with AND. A
row where a rule's columns are NULL (a signal not computed yet) does not pass it.

A rule is user text, so it is data, never code: each is parsed by ``curation.predicate`` into one
boolean expression over the table's columns, rendered back to SQL, and that rendering is checked
with Lance, the engine the training loader filters with. A rule that does not parse, names a
column the table lacks, or that Lance cannot type is reported by name with the fix. Rules are
checked *before* they are stored: a broken rule set is refused whole and nothing is written.

The rules in force are stored in the table's config (manifest key/value metadata, versioned with
the table) by the ``curation_rules`` asset. The trainer reads them back at the version it pins
(``rules_in_force_at``), parses them again (the table config is not trusted either) and trains
on the combined filter.
"""

from __future__ import annotations

import os
import re
from dataclasses import asdict, dataclass, field

import lance
import pyarrow.compute as pc

from lance_assets.curation.predicate import Predicate, PredicateError, combine, lance_problem, safe_predicate
from lance_assets.keys import CURATION_KEY, OPT_OUT_KEY
from lance_assets.table import Table, get_json_config

# name -> keep-predicate. The project's own rule set: Gopher (Rae et al. 2021, table A1), C4
# (Raffel et al. 2020) and FineWeb (Penedo et al. 2024) thresholds over `quality_signals`, whose
# words are whitespace tokens without punctuation (docs/curation.md lists how it differs from
# FineWeb's filters and why).
LANCE_ASSETS_RULES: dict[str, str] = {
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
# FineWeb's pipeline, decision for decision (datatrove's filters as examples/fineweb.py sets
# them) over `fineweb_signals`, plus the MinHash near-duplicates FineWeb removes and exact
# copies. A family's decision is the AND of the rules named after it; the thresholds are
# datatrove's defaults, kept or dropped on the same side of each bound.
FINEWEB_RULES: dict[str, str] = {
    "exact_dup": "NOT is_dup",
    "near_dup": "NOT near_dup",
    "gopher_repetition_not_empty": "n_chars > 0",
    "gopher_repetition_dup_paragraphs": "gr_dup_para_share <= 0.3 AND gr_dup_para_char_share <= 0.2",
    "gopher_repetition_dup_lines": "gr_dup_line_share <= 0.3 AND gr_dup_line_char_share <= 0.2",
    "gopher_repetition_top_ngrams": (
        "gr_top_2gram_char_share <= 0.2 AND gr_top_3gram_char_share <= 0.18 "
        "AND gr_top_4gram_char_share <= 0.16"
    ),
    "gopher_repetition_dup_ngrams": (
        "gr_dup_5gram_char_share <= 0.15 AND gr_dup_6gram_char_share <= 0.14 "
        "AND gr_dup_7gram_char_share <= 0.13 AND gr_dup_8gram_char_share <= 0.12 "
        "AND gr_dup_9gram_char_share <= 0.11 AND gr_dup_10gram_char_share <= 0.1"
    ),
    "gopher_quality_word_count": "gq_word_count BETWEEN 50 AND 100000",
    "gopher_quality_mean_word_length": "gq_mean_word_length BETWEEN 3 AND 10",
    "gopher_quality_symbol_word_ratio": "gq_symbol_word_ratio <= 0.1",
    "gopher_quality_bullet_lines": "gq_bullet_line_share <= 0.9",
    "gopher_quality_ellipsis_lines": "gq_ellipsis_line_share <= 0.3",
    "gopher_quality_alpha_words": "gq_alpha_word_share >= 0.8",
    "gopher_quality_stop_words": "gq_stop_words >= 2",
    "c4_lorem_ipsum": "NOT c4_lorem_ipsum_line",
    "c4_curly_bracket": "NOT c4_curly_bracket_line",
    "c4_sentences": "c4_sentences >= 5",
    "fineweb_not_empty": "fw_lines > 0",
    "fineweb_line_punct": "fw_terminal_punct_line_share >= 0.12",
    "fineweb_short_lines": "fw_short_line_share <= 0.67",
    "fineweb_dup_line_chars": "fw_dup_line_char_share <= 0.01",
    "fineweb_newlines": "fw_newline_word_ratio <= 0.3",
}
# Named rule sets, each the whole `rules` map of `curation_rules` (pick one in the launchpad, or
# by name in LANCE_ASSETS_RULES). The default is the project's own: docs/curation.md says why.
RULE_SETS: dict[str, dict[str, str]] = {"lance_assets": LANCE_ASSETS_RULES,
                                        "fineweb": FINEWEB_RULES}
DEFAULT_RULE_SET = "lance_assets"
DEFAULT_RULES: dict[str, str] = RULE_SETS[DEFAULT_RULE_SET]
# The rule families of FineWeb's pipeline, by the prefix of their rules' names.
FAMILIES = ("gopher_repetition", "gopher_quality", "c4", "fineweb")


def family_rules(rules: dict[str, str], family: str) -> dict[str, str]:
    """The rules of ``rules`` that belong to ``family`` (named ``<family>_*``): the family's
    decision is their AND."""
    return {k: v for k, v in rules.items() if k.startswith(family + "_")}


NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
LANGUAGE_CODE_RE = re.compile(r"^[a-z]{2,3}(-[A-Za-z]{2,4})?$")
LANGUAGE_RULE = "main_language"
CONTAMINATION_RULE = "not_contaminated"
OPT_OUT_RULE = "opted_out"  # `NOT opted_out`, once an opt-out list is configured
DEFAULT_MAIN_LANGUAGE_MIN_SHARE = 0.1


def tagger_rules(ds: lance.LanceDataset, *, keep_languages: list[str] | tuple[str, ...] = ("auto",),
                 main_language_min_share: float = DEFAULT_MAIN_LANGUAGE_MIN_SHARE,
                 main_language_min_score: float = 0.0,
                 drop_contaminated: bool = True) -> tuple[dict[str, str], list[str]]:
    """Rules the curation taggers imply, and a note per decision:

    - ``main_language``: ``lang IN (...)``. ``keep_languages=["auto"]`` keeps the corpus's main
      languages: each language detected (``lang``, not ``und``) on at least
      ``main_language_min_share`` of the rows; explicit codes keep those; ``[]`` adds no rule.
      With ``main_language_min_score`` above 0 the rule also asks ``lang_score >= `` it
      (FineWeb keeps English at fastText's ``lang_score >= 0.65``).
    - ``not_contaminated``: ``NOT contaminated`` when ``drop_contaminated``.
    - ``opted_out``: ``NOT opted_out`` once ``opted_out`` follows an opt-out list.

    A rule is added only once its column exists (the tagger has run); the note says so."""
    from lance_assets.curation.detected_language import (
        FASTTEXT,
        LANG,
        main_languages,
        table_detector,
    )

    score = main_language_min_score
    if isinstance(score, bool) or not isinstance(score, (int, float)) or not 0.0 <= score <= 1.0:
        raise RuleError(f"main_language_min_score {score!r}: not a score between 0 and 1; give "
                        "the least `lang_score` a kept document needs (FineWeb keeps English at "
                        "0.65), or 0 for no score bound")
    rules, notes = {}, []
    names = set(ds.schema.names)
    wanted = list(keep_languages)
    if wanted:
        if LANG.name not in names:
            notes.append(f"{LANGUAGE_RULE}: no rule, `lang` is not computed yet (materialize "
                         "`detected_language`)")
        else:
            if wanted == ["auto"]:
                wanted = main_languages(ds, main_language_min_share)
                notes.append(f"{LANGUAGE_RULE}: the main languages, each on at least "
                             f"{main_language_min_share:.0%} of the rows: {wanted}")
            bad = [c for c in wanted if not isinstance(c, str) or not LANGUAGE_CODE_RE.match(c)]
            if bad:
                raise RuleError(f"keep_languages {bad}: not language codes; give ISO 639 codes as "
                                "the detector writes them in `lang` ('en', 'fr', 'ceb'), ['auto'] "
                                "for the corpus's main languages, or [] for no language rule")
            if wanted:
                rule = f"lang IN ({', '.join(repr(c) for c in sorted(wanted))})"
                if score > 0:
                    rule += f" AND lang_score >= {float(score)!r}"
                    held = table_detector(ds)
                    if held is not None and held["detector"] != FASTTEXT:
                        notes.append(f"{LANGUAGE_RULE}: `lang_score` holds {held['detector']}'s "
                                     "score, not fastText's probability: FineWeb's thresholds "
                                     "do not carry over")
                rules[LANGUAGE_RULE] = rule
            else:
                notes.append(f"{LANGUAGE_RULE}: no language holds {main_language_min_share:.0%} "
                             "of the rows; no rule")
    elif score > 0:
        notes.append(f"{LANGUAGE_RULE}: keep_languages is [], so main_language_min_score "
                     f"{score} bounds nothing")
    if drop_contaminated:
        if "contaminated" in names:
            rules[CONTAMINATION_RULE] = "NOT contaminated"
        else:
            notes.append(f"{CONTAMINATION_RULE}: no rule, `contaminated` is not computed yet "
                         "(materialize `contamination`)")
    if "opted_out" in names and (get_json_config(ds, OPT_OUT_KEY) or {}).get("lists"):
        rules[OPT_OUT_RULE] = "NOT opted_out"  # an opt-out list is configured (`opted_out`)
    return rules, notes


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
    def from_dict(cls, raw: dict) -> Curation:
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


RULES_ENV = "LANCE_ASSETS_RULES"


class RulesFileError(ValueError):
    pass


def configured_rules(path: str | os.PathLike | None = None) -> dict[str, str]:
    """The rules the definitions start from: the JSON object (name -> predicate) in the file
    ``path``, else ``$LANCE_ASSETS_RULES``, else ``DEFAULT_RULES``; a value that names a rule
    set of ``RULE_SETS`` (``fineweb``) and no file is that set. They are the default of the
    ``curation_rules`` asset's ``rules``, and the signals they read are upstream of training
    (``rule_columns``). The file is data: it is parsed as JSON, never run, and each predicate is
    checked like any rule when ``curation_rules`` puts it in force."""
    import json

    path = path or os.environ.get(RULES_ENV) or None
    if path is None:
        return dict(DEFAULT_RULES)
    if str(path) in RULE_SETS and not os.path.exists(path):
        return dict(RULE_SETS[str(path)])
    try:
        with open(path, encoding="utf-8") as f:
            rules = json.load(f)
    except (OSError, UnicodeDecodeError, ValueError) as err:
        raise RulesFileError(f"{RULES_ENV}={path}: cannot be read as JSON ({err}). Give a JSON "
                             'object of rule name -> SQL predicate, e.g. {"exact_dup": "NOT '
                             f'is_dup"}}, a rule set name ({", ".join(RULE_SETS)}), or unset it '
                             "for the default rules") from None
    bad = [] if isinstance(rules, dict) and rules else ["(not a non-empty object)"]
    bad += [repr(k) for k, v in (rules.items() if isinstance(rules, dict) else [])
            if not isinstance(k, str) or not NAME_RE.match(k) or not isinstance(v, str)]
    if bad:
        raise RulesFileError(f"{RULES_ENV}={path}: {', '.join(bad)}: each entry must be an "
                             "identifier (letters, digits, underscores) naming a SQL predicate "
                             'string, e.g. {"exact_dup": "NOT is_dup"}')
    return dict(rules)


def rule_columns(rules: dict[str, str], columns: set[str] | frozenset[str]) -> frozenset[str]:
    """The columns (of ``columns``) that ``rules`` read, each rule parsed as data; a rule that
    does not parse reads nothing here (``curation_rules`` refuses it with the reason)."""
    used: set[str] = set()
    for text in rules.values():
        try:
            used |= safe_predicate(text, columns).columns
        except PredicateError:
            continue
    return frozenset(used)


def _rule_predicate(ds: lance.LanceDataset, name, text) -> Predicate | RuleProblem:
    if not isinstance(name, str) or not NAME_RE.match(name):
        return RuleProblem(str(name), str(text), "a rule name must be an identifier (letters, "
                           "digits, underscores, starting with a letter or underscore)")
    if not isinstance(text, str) or not text.strip():
        return RuleProblem(name, str(text), "the predicate is empty")
    try:
        pred = safe_predicate(text, ds.schema.names)
    except PredicateError as err:
        return RuleProblem(name, text, err.reason)
    problem = lance_problem(ds, pred)
    return RuleProblem(name, text, problem) if problem else pred


def rule_predicates(ds: lance.LanceDataset, rules: dict[str, str]
                    ) -> tuple[dict[str, Predicate], list[RuleProblem]]:
    """Each rule parsed against ``ds``'s columns and checked by Lance: the usable ones, and a
    problem (with the fix) for each of the others."""
    if not isinstance(rules, dict) or not rules:
        return {}, [RuleProblem("(none)", "", "no rules given; training needs at least one "
                                "(e.g. exact_dup: 'NOT is_dup')")]
    usable, problems = {}, []
    for name, text in rules.items():
        got = _rule_predicate(ds, name, text)
        if isinstance(got, RuleProblem):
            problems.append(got)
        else:
            usable[name] = got
    return usable, problems


def rule_problems(ds: lance.LanceDataset, rules: dict[str, str]) -> list[RuleProblem]:
    """Every rule that does not parse as one predicate over the table's columns, or that Lance
    cannot filter with, with the fix."""
    return rule_predicates(ds, rules)[1]


def _rule_error(ds: lance.LanceDataset, problems: list[RuleProblem]) -> RuleError:
    return RuleError(
        f"{len(problems)} curation rule(s) cannot be used on {ds.uri}:\n"
        + "\n".join(f"  - {p}" for p in problems)
        + "\nFix them in the `curation_rules` asset's config (rules: {name: predicate}) and "
        "materialize it again.")


def combined_predicate(predicates: dict[str, Predicate]) -> Predicate:
    """The training filter: every rule's predicate joined with AND, in the order written."""
    if not predicates:
        raise RuleError("no curation rules: give at least one (e.g. exact_dup: 'NOT is_dup')")
    return combine(list(predicates.values()))


def validated_predicate(ds: lance.LanceDataset, rules: dict[str, str]) -> Predicate:
    """The rules' combined predicate, checked against ``ds``, or a ``RuleError`` naming every
    broken rule."""
    usable, problems = rule_predicates(ds, rules)
    if problems:
        raise _rule_error(ds, problems)
    combined = combined_predicate(usable)
    problem = lance_problem(ds, combined)
    if problem:
        raise _rule_error(ds, [RuleProblem("(all rules together)", combined.source, problem)])
    return combined


def validate(ds: lance.LanceDataset, rules: dict[str, str]) -> str:
    """The combined filter as Lance SQL, or a ``RuleError`` naming every broken rule."""
    return validated_predicate(ds, rules).lance


def stored_curation(ds: lance.LanceDataset) -> Curation | None:
    raw = get_json_config(ds, CURATION_KEY)
    if not raw:
        return None
    try:
        return Curation.from_dict(raw)
    except (TypeError, ValueError) as err:
        raise RuleError(f"the curation stored in {ds.uri} (config key {CURATION_KEY!r}) is "
                        f"malformed ({err}); materialize `curation_rules` again") from None


def curation_in_force(ds: lance.LanceDataset) -> Curation:
    """The curation stored in the table, else the defaults."""
    return stored_curation(ds) or Curation()


def store_curation(table: Table, curation: Curation) -> int:
    """Record ``curation`` in the table's config (a new table version only if it changed).
    The rules are checked first: a rule set with any broken rule raises ``RuleError`` and
    nothing is stored."""
    ds = table.newest()
    validated_predicate(ds, curation.rules)
    stored = stored_curation(ds)
    if stored is None or stored.to_dict() != curation.to_dict():
        table.set_config(CURATION_KEY, curation.to_dict())
        ds = table.newest()
    return ds.version


def rules_in_force_at(ds: lance.LanceDataset) -> Predicate:
    """The combined predicate of the rules in force at ``ds``'s version (read from its config),
    checked against its columns (``RuleError``). The validation split is not in it: the trainer
    holds it out itself."""
    return validated_predicate(ds, curation_in_force(ds).rules)


def training_predicate(table: Table) -> Predicate:
    """``rules_in_force_at`` the table's newest version."""
    return rules_in_force_at(table.newest())


def training_filter(table: Table) -> str:
    """``training_predicate`` as Lance SQL, rendered from the parsed rules (parses again with
    ``safe_predicate`` to the same predicate)."""
    return training_predicate(table).lance


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
    usable, problem_list = rule_predicates(ds, rules)
    problems = {p.rule: p for p in problem_list}
    kept = ds.count_rows(filter=combined_predicate(usable).lance) if usable else None
    hits = []
    for name, text in (rules.items() if isinstance(rules, dict) else ()):
        if name in problems:
            hits.append(RuleHits(str(name), str(text), None, None, problems[name].problem))
            continue
        others = {k: v for k, v in usable.items() if k != name}
        kept_by_others = ds.count_rows(filter=combined_predicate(others).lance) if others else total
        hits.append(RuleHits(name, text, total - ds.count_rows(filter=usable[name].lance),
                             kept_by_others - kept))
    filter_sql = combined_predicate(usable).lance if usable and not problems else ""
    return Evaluation(total_rows=total, kept_rows=None if problems else kept, filter=filter_sql,
                      hits=hits)


@dataclass
class TokenHits:
    total_tokens: int
    kept_tokens: int | None  # None when a rule is broken (as ``Evaluation.kept_rows``)
    removed: dict[str, int]  # rule -> tokens of the rows it removes (usable rules only)


def token_hits(ds: lance.LanceDataset, rules: dict[str, str],
               column: str = "n_tokens") -> TokenHits | None:
    """``evaluate`` counted in tokens (the sum of ``n_tokens``): what the rules keep and what each
    rule removes; None when the table has no token counts yet. Rows without a count add 0."""
    if column not in ds.schema.names:
        return None
    usable, problems = rule_predicates(ds, rules)

    def tokens(predicate: Predicate | None) -> int:
        batches = ds.to_batches(columns=[column],
                                filter=None if predicate is None else predicate.lance)
        return sum(int(pc.sum(b.column(0)).as_py() or 0) for b in batches)

    total = tokens(None)
    kept = tokens(combined_predicate(usable)) if usable and not problems else None
    return TokenHits(total_tokens=total, kept_tokens=kept,
                     removed={name: total - tokens(p) for name, p in usable.items()})


@dataclass
class InForce:
    """What ``put_in_force`` did: the curation recorded, the version it is recorded at, the
    rules the taggers added (and why), and the rules evaluated on the table."""

    curation: Curation
    version: int
    added: dict[str, str]
    notes: list[str]
    evaluation: Evaluation
    tokens: TokenHits | None


class RulesRefused(RuleError):
    """A rule set with broken rules: nothing was recorded; ``broken`` names the rules."""

    def __init__(self, message: str, broken: list[str]):
        super().__init__(message)
        self.broken = broken


def put_in_force(table: Table, rules: dict[str, str], *,
                 keep_languages: list[str] | tuple[str, ...] = ("auto",),
                 main_language_min_share: float = DEFAULT_MAIN_LANGUAGE_MIN_SHARE,
                 main_language_min_score: float = 0.0,
                 drop_contaminated: bool = True, min_duplicate_rate: float = 0.0,
                 max_duplicate_rate: float = 0.5, min_kept_rows: int = 1) -> InForce:
    """Record ``rules`` and the taggers' rules (the corpus's main languages, ``NOT
    contaminated``; a rule of the user's with the same name wins) as the curation in force,
    checked against the table first (``RulesRefused``: nothing recorded), then evaluate them:
    rows and tokens each rule removes."""
    added, notes = tagger_rules(table.newest(), keep_languages=keep_languages,
                                main_language_min_share=main_language_min_share,
                                main_language_min_score=main_language_min_score,
                                drop_contaminated=drop_contaminated)
    curation = Curation(rules={**dict(rules), **{k: v for k, v in added.items() if k not in rules}},
                        min_duplicate_rate=min_duplicate_rate,
                        max_duplicate_rate=max_duplicate_rate, min_kept_rows=min_kept_rows)
    try:
        version = store_curation(table, curation)
    except RuleError as err:
        broken = [p.rule for p in rule_problems(table.newest(), curation.rules)]
        raise RulesRefused(str(err), broken) from None
    ds = table.newest()
    return InForce(curation=curation, version=version, added=added, notes=notes,
                   evaluation=evaluate(ds, curation.rules), tokens=token_hits(ds, curation.rules))
