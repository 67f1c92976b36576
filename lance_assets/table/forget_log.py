"""``forget.log.jsonl``: one line per finished ``forget`` (ids' count and range, the predicate's
digest, what it redacted and released, the versions its cleanup removed; never text), and the
questions readers ask of it: which forget removed a version."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from lance_assets import storage

LOG_NAME = "forget.log.jsonl"


def entries(table: Any, newest_first: bool = True) -> Iterator[dict]:
    """The log's entries (``table``: a ``Table``); unreadable lines are skipped."""
    log = storage.location(table.root) / LOG_NAME
    try:
        lines = log.read_text().splitlines() if log.is_file() else []
    except OSError:
        lines = []
    for line in reversed(lines) if newest_first else lines:
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if isinstance(entry, dict):
            yield entry


def removed_by_forget(table: Any, version: int | None) -> str | None:
    """``forget``'s own cleanup, when its log lists ``version`` among the versions it removed."""
    for entry in entries(table) if version is not None else ():
        spans = entry.get("removed_versions") or []
        if any(isinstance(s, list) and len(s) == 2 and s[0] <= version <= s[1] for s in spans):
            return (f"`forget` removed version {version} at {entry.get('at', '?')} (its cleanup "
                    "removes every version no tag names, so that none keeps a forgotten "
                    "document)")
    return None
