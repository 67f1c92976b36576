"""One document at two snapshots (``python -m lance_assets explain --id N --version A --against
B``): whether it is in each version, kept or removed by each side's rules in force and by which
rule, and every signal whose value differs. Both sides are told by ``explain`` at their own
version; a side is named as for ``diff`` (a tag, a version, a training run, an ablation)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from lance_assets.forensics.diff.refs import resolve
from lance_assets.forensics.explain import Story, explain
from lance_assets.markdown import markdown_table
from lance_assets.table import Table


@dataclass
class DocumentDiff:
    id: int
    a: str  # the side, in words
    b: str
    present: tuple[bool, bool]
    kept: tuple[bool | None, bool | None]  # by the rules in force (None: none recorded)
    removed_by: tuple[list[str], list[str]]
    rules: list[dict] = field(default_factory=list)  # rule, A's verdict, B's verdict, changed
    signals: list[dict] = field(default_factory=list)  # column, A's value, B's value (differing)

    def to_dict(self) -> dict:
        return asdict(self)

    @property
    def changed(self) -> bool:
        return (self.present[0] != self.present[1] or self.kept[0] != self.kept[1]
                or any(r["changed"] for r in self.rules) or bool(self.signals))

    def headline(self) -> str:
        def state(i: int) -> str:
            if not self.present[i]:
                return "not in that version"
            if self.kept[i] is None:
                return "in it, no curation rules recorded"
            return "kept by every rule in force" if self.kept[i] else \
                "removed by " + ", ".join(self.removed_by[i])

        return (f"document {self.id}: A ({self.a}): {state(0)}; B ({self.b}): {state(1)}"
                + ("" if self.changed else "; nothing about it changed"))

    def markdown(self) -> str:
        out = [f"## Document {self.id}: {self.a} → {self.b}", "", self.headline()]
        moved = [r for r in self.rules if r["changed"]]
        if moved:
            out += ["", "### Rules whose verdict changed", "",
                    markdown_table([{k: r[k] for k in ("rule", "A", "B")} for r in moved])]
        if self.signals:
            out += ["", "### Signals that changed", "",
                    markdown_table([{"column": f"`{s['column']}`", "A": _cell(s["A"]),
                                     "B": _cell(s["B"])} for s in self.signals])]
        return "\n".join(out)


def _cell(v: Any) -> str:
    text = f"{v:.4g}" if isinstance(v, float) else json.dumps(v, default=str) \
        if isinstance(v, (list, dict)) else str(v)
    return text.replace("|", "\\|")


def _flat(story: Story) -> dict[str, Any]:
    return {col: v for cols in story.signals.values() for col, v in cols.items()}


def document_diff(table: Table, doc_id: int, a: str | int, b: str | int) -> DocumentDiff:
    """Document ``doc_id`` at sides ``a`` and ``b`` (``ExplainError`` / ``DiffError`` for a
    document id or a side that cannot be read)."""
    sa, sb = resolve(table, a), resolve(table, b)
    ea = explain(table, doc_id, ref=sa.tag or sa.version)
    eb = explain(table, doc_id, ref=sb.tag or sb.version)
    va = {r.rule: r.verdict for r in ea.rules}
    vb = {r.rule: r.verdict for r in eb.rules}
    rules = [{"rule": n, "A": va.get(n, "no such rule" if ea.present else "not in A"),
              "B": vb.get(n, "no such rule" if eb.present else "not in B"),
              "changed": va.get(n) != vb.get(n)} for n in list(va) + [n for n in vb if n not in va]]
    sig_a, sig_b = _flat(ea), _flat(eb)
    signals = [{"column": c, "A": sig_a.get(c, "(absent)"), "B": sig_b.get(c, "(absent)")}
               for c in list(sig_a) + [c for c in sig_b if c not in sig_a]
               if sig_a.get(c, "(absent)") != sig_b.get(c, "(absent)")
               ] if ea.present and eb.present else []
    return DocumentDiff(id=doc_id, a=sa.label(), b=sb.label(), present=(ea.present, eb.present),
                        kept=(ea.kept_by_rules if ea.present else False,
                              eb.kept_by_rules if eb.present else False),
                        removed_by=(ea.removed_by, eb.removed_by), rules=rules, signals=signals)
