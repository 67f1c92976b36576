"""Progress for long work: a tqdm bar on a terminal, and log lines (the Dagster UI's log) at
every tenth of the way.

Library code takes a ``log`` callable (``print`` by default, ``context.log.info`` from an asset)
and reports progress through :func:`progress`::

    with progress(total=len(todo), desc="token_ids", unit="fragment", log=log) as bar:
        for frag in todo:
            ...
            bar.update(1, rows=frag.physical_rows)

The bar is drawn on stderr only when stderr is a terminal (``dagster asset materialize`` in a
shell); ``LANCE_ASSETS_PROGRESS=0`` turns it off, ``=1`` forces it. Log lines are written in
every case, so the web UI shows the same progress.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from tqdm.auto import tqdm


def _bar_enabled() -> bool:
    forced = os.environ.get("LANCE_ASSETS_PROGRESS", "").strip().lower()
    if forced in {"0", "false", "no", "off"}:
        return False
    if forced in {"1", "true", "yes", "on"}:
        return True
    return sys.stderr.isatty()


class Progress:
    """A counter that draws a tqdm bar and logs every tenth of ``total`` (or every 30 s)."""

    def __init__(self, total: int | None, desc: str, unit: str, log: Callable[[str], None] | None):
        self.total, self.desc, self.unit, self.log = total, desc, unit, log
        self.n = 0
        self.rows = 0
        self._start = time.perf_counter()
        self._last_log = self._start
        self._next_tenth = 1
        self._bar = tqdm(total=total, desc=desc, unit=unit, file=sys.stderr, leave=False,
                         dynamic_ncols=True) if _bar_enabled() else None

    def update(self, n: int = 1, *, rows: int = 0) -> None:
        self.n += n
        self.rows += rows
        if self._bar is not None:
            self._bar.update(n)
            if self.rows:
                self._bar.set_postfix(rows=f"{self.rows:,}", refresh=False)
        now = time.perf_counter()
        tenth_done = bool(self.total) and self.n * 10 >= self._next_tenth * self.total
        if self.log is not None and (tenth_done or now - self._last_log >= 30):
            while self.total and self.n * 10 >= self._next_tenth * self.total:
                self._next_tenth += 1
            self._last_log = now
            self.log(self.line())

    def line(self) -> str:
        elapsed = time.perf_counter() - self._start
        of = f"/{self.total:,}" if self.total is not None else ""
        pct = f" ({100 * self.n / self.total:.0f}%)" if self.total else ""
        rows = f", {self.rows:,} rows" if self.rows else ""
        return f"{self.desc}: {self.n:,}{of} {self.unit}s{pct}{rows} in {elapsed:.1f}s"

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None


@contextmanager
def progress(total: int | None, desc: str, unit: str = "item",
             log: Callable[[str], None] | None = print) -> Iterator[Progress]:
    """A :class:`Progress` that is closed (its bar removed) however the block ends."""
    bar = Progress(total, desc, unit, log)
    try:
        yield bar
    finally:
        bar.close()
