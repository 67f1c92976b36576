"""Progress for long work: a tqdm bar on a terminal, and log lines (the Dagster UI's log) that
say what is done, how fast and how long is left, at least every ``LOG_EVERY_S`` seconds.

Library code takes a ``log`` callable (``print`` by default, ``context.log.info`` from an asset)
and reports progress through :func:`progress`::

    with progress(total=len(todo), desc="token_ids", unit="fragment", log=log,
                  rows_total=rows) as bar:
        for frag in todo:
            for batch in ...:
                bar.update(0, rows=batch.num_rows)  # rows within the fragment
            bar.update(1)

A line reads ``token_ids: 3/8 fragments (38%), 1,200/3,200 rows, 410.2 rows/s, ~5 s left,
2.9 s``. Work with no count (a scan, k-means, an index build) is a :func:`phase`. A line is
logged every tenth of ``total``, on an update ``LOG_EVERY_S`` after the last line, and by a
heartbeat thread whenever the innermost block has been quiet that long: a slow fragment or an
uncounted phase is never silent. ``note(text)`` says which part of the work runs; code with no
handle on the bar calls :func:`advance`, which counts rows on this thread's innermost block.

The bar is drawn on stderr only when stderr is a terminal; ``LANCE_ASSETS_PROGRESS=0`` turns it
off, ``=1`` forces it. Log lines are written in every case.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from tqdm.auto import tqdm

# A block logs a line at least this often while it runs (tests lower it). Under the 30 s a run's
# log may stay quiet (scripts/log_gaps.py), with room for a busy machine.
LOG_EVERY_S = 20.0

Log = Callable[[str], None]

_clock = time.perf_counter
_lock = threading.Lock()
_last_line: dict = {}  # log callable -> when a progress line last went through it
_open: dict = {}  # log callable -> its open blocks, in the order they opened
_local = threading.local()  # .stack: this thread's open blocks, innermost last


def _bar_enabled() -> bool:
    forced = os.environ.get("LANCE_ASSETS_PROGRESS", "").strip().lower()
    if forced in {"0", "false", "no", "off"}:
        return False
    if forced in {"1", "true", "yes", "on"}:
        return True
    return sys.stderr.isatty()


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:,.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:,.1f} min"
    return f"{seconds / 3600:,.1f} h"


class Progress:
    """A counter that draws a tqdm bar and logs lines (see the module docstring)."""

    def __init__(self, total: int | None, desc: str, unit: str, log: Log | None,
                 rows_total: int | None = None):
        self.total, self.desc, self.unit, self.log = total, desc, unit, log
        self.rows_total = rows_total
        self.n = 0
        self.rows = 0
        self.status = ""
        self._start = _clock()
        self._last_log = self._start
        self._next_tenth = 1
        self._state = threading.Lock()
        self._stop = threading.Event()
        self._bar = tqdm(total=total, desc=desc, unit=unit, file=sys.stderr, leave=False,
                         dynamic_ncols=True) if _bar_enabled() else None
        self._heartbeat: threading.Thread | None = None
        if log is not None:
            with _lock:
                _open.setdefault(_key(log), []).append(self)
        if log is not None and LOG_EVERY_S > 0:
            self._heartbeat = threading.Thread(target=self._beat, name=f"progress: {desc}",
                                               daemon=True)
            self._heartbeat.start()

    @property
    def elapsed(self) -> float:
        return _clock() - self._start

    def update(self, n: int = 1, *, rows: int = 0) -> None:
        """``n`` more units done (0: only rows within the current one), ``rows`` more rows."""
        with self._state:
            self.n += n
            self.rows += rows
            if self._bar is not None:
                if n:
                    self._bar.update(n)
                if self.rows:
                    self._bar.set_postfix(rows=f"{self.rows:,}", refresh=not n)
            now = _clock()
            tenth_done = bool(self.total) and n > 0 and \
                self.n * 10 >= self._next_tenth * self.total
            due = tenth_done or now - self._last_log >= LOG_EVERY_S
            while self.total and self.n * 10 >= self._next_tenth * self.total:
                self._next_tenth += 1
        if due:
            self._emit()

    def note(self, status: str) -> None:
        """Name the part of the work now running (shown in the next line; "" clears it)."""
        with self._state:
            self.status = status

    def line(self) -> str:
        elapsed = self.elapsed
        parts = []
        if self.total is not None or self.n:
            of = f"/{self.total:,}" if self.total is not None else ""
            pct = f" ({100 * self.n / self.total:.0f}%)" if self.total else ""
            parts.append(f"{self.n:,}{of} {self.unit}s{pct}")
        if self.unit != "row" and (self.rows or self.rows_total):
            of = f"/{self.rows_total:,}" if self.rows_total is not None else ""
            parts.append(f"{self.rows:,}{of} rows")
        # rate and time left in rows when rows are counted, else in the unit
        by_rows = self.unit != "row" and (self.rows or self.rows_total)
        done, todo, label = (self.rows, self.rows_total, "rows") if by_rows else \
            (self.n, self.total, f"{self.unit}s")
        if done and elapsed > 0:
            rate = done / elapsed
            parts.append(f"{rate:,.1f} {label}/s")
            if todo is not None:
                parts.append(f"~{_duration(max(0, todo - done) / rate)} left")
        if not parts:
            parts.append("still running")
        if self.status:
            parts.append(self.status)
        return f"{self.desc}: {', '.join(parts)}, {elapsed:.1f} s"

    def _emit(self) -> None:
        if self.log is None:
            return
        text = self.line()
        now = _clock()
        with self._state:
            self._last_log = now
        with _lock:
            _last_line[_key(self.log)] = now
        self.log(text)

    def _beat(self) -> None:
        key = _key(self.log)
        while True:
            with self._state:
                last = self._last_log
            with _lock:
                last = max(last, _last_line.get(key, last))
                innermost = (_open.get(key) or [None])[-1] is self
            if not innermost:  # the block nested in this one beats for both
                if self._stop.wait(LOG_EVERY_S):
                    return
                continue
            wait = last + LOG_EVERY_S - _clock()
            if wait > 0:
                if self._stop.wait(min(wait, LOG_EVERY_S)):
                    return
                continue
            if self._stop.is_set():
                return
            try:
                self._emit()
            except Exception:  # noqa: BLE001 - a log that fails must not end the work
                with self._state:
                    self._last_log = _clock()

    def close(self) -> None:
        self._stop.set()
        if self.log is not None:
            with _lock:
                blocks = _open.get(_key(self.log), [])
                if self in blocks:
                    blocks.remove(self)
                if not blocks:
                    _open.pop(_key(self.log), None)
                    _last_line.pop(_key(self.log), None)
        if self._heartbeat is not None and self._heartbeat is not threading.current_thread():
            self._heartbeat.join(timeout=5)
        self._heartbeat = None
        if self._bar is not None:
            self._bar.close()
            self._bar = None


def _key(log: Log) -> object:
    try:
        hash(log)
        return log
    except TypeError:
        return id(log)


def _stack() -> list[Progress]:
    stack = getattr(_local, "stack", None)
    if stack is None:
        stack = _local.stack = []
    return stack


@contextmanager
def progress(total: int | None, desc: str, unit: str = "item", log: Log | None = print,
             rows_total: int | None = None) -> Iterator[Progress]:
    """A :class:`Progress` whose heartbeat stops and whose bar is removed however the block
    ends. ``rows_total``: rows to do, when the unit is not rows (rate and time left in rows)."""
    bar = Progress(total, desc, unit, log, rows_total)
    stack = _stack()
    stack.append(bar)
    try:
        yield bar
    finally:
        stack.remove(bar)
        bar.close()


@contextmanager
def phase(desc: str, log: Log | None = print, *, announce: bool = True) -> Iterator[Progress]:
    """Work with no count of its own (a scan, k-means, building an index): a line when it
    starts, ``still running`` lines while it runs, and one with its duration when it ends.
    ``announce=False``: only the ``still running`` lines (work that is usually short)."""
    if log is not None and announce:
        log(f"{desc}...")
    with progress(None, desc, "step", log) as bar:
        yield bar
    if log is not None and announce:
        log(f"{desc}: done in {bar.elapsed:.1f} s")


def advance(rows: int) -> None:
    """Count ``rows`` more rows on this thread's innermost open block (none open: nothing)."""
    stack = _stack()
    if stack:
        bar = stack[-1]
        if bar.unit == "row":
            bar.update(rows)
        else:
            bar.update(0, rows=rows)
