"""Markdown for reports shown in the UI and written next to the data, and the metadata values a
producer's summary may hold besides plain numbers and strings (shown as Markdown, JSON or a
path by the Dagster layer)."""

from __future__ import annotations

import base64
import io
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Markdown:
    text: str


@dataclass(frozen=True)
class Json:
    value: Any


@dataclass(frozen=True)
class FilePath:
    path: str


def markdown_table(rows: list[dict]) -> str:
    """A Markdown table of ``rows`` (dicts with the same keys); ``_none_`` when empty."""
    if not rows:
        return "_none_"
    cols = list(rows[0])
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(str(r[c]) for c in cols) + " |" for r in rows]
    return "\n".join(lines)


def png_markdown(png: bytes, alt: str) -> str:
    """``png`` inline in Markdown (the UI renders it; no file to serve)."""
    return f"![{alt}](data:image/png;base64,{base64.b64encode(png).decode()})"


def line_plot_markdown(series: list[tuple[list[tuple[int, float]], dict]], alt: str,
                       xlabel: str, ylabel: str) -> str:
    """Lines of (x, y) points, each with its matplotlib keyword arguments, as an inline PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.2), dpi=100)
    for points, style in series:
        fmt = style.pop("fmt", "-")
        ax.plot(*zip(*points), fmt, **style)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.legend()
    ax.grid(alpha=0.3)
    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return png_markdown(buf.getvalue(), alt)


def bar_chart_markdown(labels: list[str], series: list[tuple[str, list[float]]], alt: str,
                       xlabel: str) -> str:
    """Horizontal bars, one group per label and one bar per series, as an inline PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    height = 0.8 / max(1, len(series))
    fig, ax = plt.subplots(figsize=(6, 0.6 + 0.35 * len(labels) * max(1, len(series))), dpi=100)
    for i, (name, values) in enumerate(series):
        ax.barh([y + i * height for y in range(len(labels))], values, height=height, label=name)
    ax.set_yticks([y + height * (len(series) - 1) / 2 for y in range(len(labels))], labels)
    ax.invert_yaxis()
    ax.set_xlabel(xlabel)
    ax.legend()
    ax.grid(alpha=0.3, axis="x")
    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return png_markdown(buf.getvalue(), alt)
