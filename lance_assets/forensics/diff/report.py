"""What a data diff holds, and how it reads: Markdown for a person (all of it, or the short form
shown on a training run's page with a chart of the documents each rule moved), JSON for code.

Documents are named by count and id only, never by text: a diff may be kept in a run's metadata
after some of its documents were forgotten.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from lance_assets.markdown import bar_chart_markdown, markdown_table

EXAMPLES = 5  # example ids per changed column
SHORT_ROWS = 8  # rows of each table in the short form


@dataclass
class RuleChange:
    """One rule of either side: how it changed, and the documents (present in both versions)
    whose verdict under it moved. A side without the rule keeps every document."""

    rule: str
    status: str  # same | added | removed | changed
    predicate_a: str | None
    predicate_b: str | None
    out_docs: int = 0  # kept at A, dropped at B
    out_tokens: int = 0  # their tokens at A
    in_docs: int = 0  # dropped at A, kept at B
    in_tokens: int = 0  # their tokens at B
    problem: str = ""  # a side where the rule cannot be evaluated (it then keeps everything)


@dataclass
class GroupChange:
    """A source or a domain: documents (and tokens) added, removed, moved into and out of the
    training set, and the net change of what the rules keep."""

    group: str
    added_docs: int = 0
    added_tokens: int = 0
    removed_docs: int = 0
    removed_tokens: int = 0
    in_docs: int = 0
    in_tokens: int = 0
    out_docs: int = 0
    out_tokens: int = 0
    kept_docs_net: int = 0
    kept_tokens_net: int = 0


@dataclass
class ColumnChange:
    """A flag or signal column present in both versions, over the documents in both."""

    column: str
    type: str
    changed: int = 0  # a value that became another value
    to_true: int | None = None  # booleans: false -> true (of ``changed``)
    to_false: int | None = None
    filled: int = 0  # null -> a value (written since)
    cleared: int = 0  # a value -> null
    examples: list[int] = field(default_factory=list)  # smallest ids among those rows


@dataclass
class DataDiff:
    a: dict
    b: dict
    documents: dict
    training: dict
    rules: list[RuleChange]
    sources: list[GroupChange]
    domains: list[GroupChange]
    columns: list[ColumnChange]
    columns_only_a: list[str]
    columns_only_b: list[str]
    columns_not_compared: list[str]
    tokenizer: dict
    read: dict | None
    cost: dict
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)

    # -- in words
    def headline(self) -> str:
        d, t = self.documents, self.training
        return (f"{_side(self.a)} → {_side(self.b)}: {d['added']:,} documents added, "
                f"{d['removed']:,} removed, {d['in_both']:,} in both; training set "
                f"{t['net_docs']:+,} documents ({t['net_tokens']:+,} tokens)")

    def _lines(self) -> list[str]:
        d, t = self.documents, self.training
        out = [f"**A**: {_side(self.a)} ({self.a['rules_from']})",
               f"**B**: {_side(self.b)} ({self.b['rules_from']})", "",
               f"**Documents**: {d['a']:,} → {d['b']:,}: {d['added']:,} added "
               f"({_runs(d['added_ids'])}), {d['removed']:,} removed (deleted or forgotten; "
               f"{_runs(d['removed_ids'])}), {d['in_both']:,} in both"
               + (f"; and {d['forgotten']:,} removed (forgotten: forget redacted them from A's "
                  f"snapshot; {_runs(d['forgotten_ids'])})" if d.get("forgotten") else "") + ".",
               f"**Training set** (each side's rules): {t['out_docs']:,} documents "
               f"({t['out_tokens']:,} tokens) moved out and {t['in_docs']:,} "
               f"({t['in_tokens']:,} tokens) moved in; {t['added_kept_docs']:,} added documents "
               f"kept ({t['added_kept_tokens']:,} tokens), {t['removed_kept_docs']:,} removed "
               f"ones had been kept ({t['removed_kept_tokens']:,} tokens): net "
               f"{t['net_docs']:+,} documents, {t['net_tokens']:+,} tokens."]
        out.append(f"**Tokenizer**: {_tokenizer(self.tokenizer)}.")
        if self.read is not None:
            r = self.read
            out.append(f"**Documents read**: A read {r['a']:,}, B read {r['b']:,}; {r['both']:,} "
                       f"read by both ({r['only_a']:,} only by A, {r['only_b']:,} only by B).")
        return out

    def rule_rows(self, short: bool = False) -> list[dict]:
        rules = [r for r in self.rules if not short or r.status != "same" or r.out_docs
                 or r.in_docs]
        rows = [{"rule": r.rule, "change": r.status + (f" ({r.problem})" if r.problem else ""),
                 "kept → dropped": f"{r.out_docs:,} ({r.out_tokens:,} tokens)",
                 "dropped → kept": f"{r.in_docs:,} ({r.in_tokens:,} tokens)"}
                for r in rules]
        if not short:
            for row, r in zip(rows, rules):
                row["keep when (A)"] = _code(r.predicate_a)
                row["keep when (B)"] = _code(r.predicate_b)
        return rows[:SHORT_ROWS] if short else rows

    def markdown(self, short: bool = False) -> str:
        """The whole diff, or (``short``) what a run's page shows: the headline numbers, the
        rules that changed or moved documents, the sources and columns that changed most."""
        out = self._lines()
        out += ["", "### Rules" + (" that changed or moved documents" if short else ""), "",
                markdown_table(self.rule_rows(short))]
        for title, groups in (("Sources", self.sources), ("Domains", self.domains)):
            if groups or (title == "Sources" and not short):
                ranked = sorted(groups, key=lambda g: -abs(g.kept_docs_net) - g.added_docs
                                - g.removed_docs) if short else groups
                out += ["", f"### {title}", "", markdown_table([_group_row(g) for g in (
                    ranked[:SHORT_ROWS] if short else ranked)])]
        changed = [c for c in self.columns if c.changed or c.filled or c.cleared]
        if short:
            changed = sorted(changed, key=lambda c: -(c.changed + c.filled + c.cleared))
        out += ["", "### Flags and signals (documents in both versions)", "",
                markdown_table([_column_row(c) for c in (changed[:SHORT_ROWS] if short
                                                           else changed)])]
        unchanged = len(self.columns) - len(changed)
        extra = [f"{unchanged} compared column(s) unchanged"]
        if self.columns_only_a:
            extra.append("only in A: " + ", ".join(f"`{c}`" for c in self.columns_only_a))
        if self.columns_only_b:
            extra.append("only in B: " + ", ".join(f"`{c}`" for c in self.columns_only_b))
        if self.columns_not_compared and not short:
            extra.append("not compared by value (lists, vectors, bytes): "
                         + ", ".join(f"`{c}`" for c in self.columns_not_compared))
        out += ["", "; ".join(extra) + "."]
        c = self.cost
        out += ["", f"Read by {c['mode']} ({c['why']}): A {_cost(c['a'])}; B {_cost(c['b'])}; "
                    f"{c['seconds']:.2f} s."]
        if self.notes:
            out += ["", "Notes: " + "; ".join(self.notes)]
        return "\n".join(out)

    def chart(self) -> str | None:
        """A bar chart of the documents each rule moved (None when no rule moved any)."""
        moved = [r for r in self.rules if r.out_docs or r.in_docs]
        if not moved:
            return None
        return bar_chart_markdown([r.rule for r in moved],
                                  [("kept → dropped", [r.out_docs for r in moved]),
                                   ("dropped → kept", [r.in_docs for r in moved])],
                                  "documents moved per rule", "documents")


def _side(s: dict) -> str:
    tag = f", tag `{s['tag']}`" if s.get("tag") else ""
    what = "" if s["kind"] in ("version", "tag") else f"{s['kind']} `{s['name']}` "
    return f"{what}version {s['version']}{tag}"


def _code(text: str | None) -> str:
    return "" if text is None else "`" + text.replace("|", "\\|") + "`"


def _tokenizer(t: dict) -> str:
    def name(x):
        return "none recorded" if not x else f"`{x.get('name')}` (sha256 {str(x.get('sha256'))[:12]}…)"

    if t["same"] is None:
        return "none recorded at either side (no `token_ids` yet)"
    if t["same"]:
        return f"same, {name(t['a'])}"
    return f"**changed**: A {name(t['a'])}, B {name(t['b'])}"


def _runs(runs: list[list[int]], shown: int = 6) -> str:
    if not runs:
        return "none"
    parts = [str(a) if a == b else f"{a}–{b}" for a, b in runs[:shown]]
    return "ids " + ", ".join(parts) + (f", … ({len(runs) - shown} more runs)"
                                        if len(runs) > shown else "")


def _group_row(g: GroupChange) -> dict:
    return {"": f"`{g.group}`", "added": f"{g.added_docs:,} ({g.added_tokens:,} tokens)",
            "removed": f"{g.removed_docs:,} ({g.removed_tokens:,})",
            "moved in": f"{g.in_docs:,} ({g.in_tokens:,})",
            "moved out": f"{g.out_docs:,} ({g.out_tokens:,})",
            "training set, net": f"{g.kept_docs_net:+,} ({g.kept_tokens_net:+,} tokens)"}


def _column_row(c: ColumnChange) -> dict:
    return {"column": f"`{c.column}`", "changed": f"{c.changed:,}",
            "false → true": "" if c.to_true is None else f"{c.to_true:,}",
            "true → false": "" if c.to_false is None else f"{c.to_false:,}",
            "filled": f"{c.filled:,}", "cleared": f"{c.cleared:,}",
            "example ids": ", ".join(map(str, c.examples))}


def _cost(c: dict) -> str:
    return (f"{c['rows_read']:,} of {c['rows_total']:,} rows in {c['fragments_read']} of "
            f"{c['fragments_total']} fragments, {c['bytes_read'] / 1e6:,.2f} MB")
