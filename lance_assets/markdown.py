"""Markdown for reports shown in the UI and written next to the data."""

from __future__ import annotations


def markdown_table(rows: list[dict]) -> str:
    """A Markdown table of ``rows`` (dicts with the same keys); ``_none_`` when empty."""
    if not rows:
        return "_none_"
    cols = list(rows[0])
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(str(r[c]) for c in cols) + " |" for r in rows]
    return "\n".join(lines)
