"""The longest silence of every stage (Dagster step) of a run, from its log; fails when one is
longer than ``--max-gap`` seconds (default 30).

Reads either what ``dagster asset materialize`` / ``make demo`` printed (a file, or ``-`` for
stdin), or a run's event log in the Dagster instance at ``DAGSTER_HOME`` (``--run-id``, or
``--run-id last`` for the newest run)::

    make demo 2>&1 | tee demo.log; python scripts/log_gaps.py demo.log
    DAGSTER_HOME=.dagster_home python scripts/log_gaps.py --run-id last

A gap is the time between two consecutive log lines of one step, from its first line to its
last (lines without a step, the run's own events, are not a stage's). Printed lines have whole
seconds, so a gap read from them is exact to about a second; the event log is exact.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

MAX_GAP_S = 30.0

# "2026-12-04 10:13:13 +0000 - dagster - INFO - <job> - <run id> - [pid - ]<step> - <message>"
LINE = re.compile(r"^(?P<ts>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d [+-]\d{4}) - (?P<logger>\S+) - "
                  r"(?P<level>[A-Z]+) - (?P<rest>.*)$")
RUN_ID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
STEP_KEY = re.compile(r"^[A-Za-z_][\w.\[\]-]*$")
EVENT = re.compile(r"^[A-Z][A-Z_]+$")  # STEP_START, ENGINE_EVENT: the run's own, not a step


@dataclass
class Line:
    step: str
    at: float  # seconds since the epoch
    text: str


@dataclass
class StepGaps:
    step: str
    lines: int
    first: float
    last: float
    gap_s: float  # the longest time between two consecutive lines
    after: str  # the line that began it

    @property
    def duration_s(self) -> float:
        return self.last - self.first


def parse_console(lines: Iterable[str]) -> list[Line]:
    """The step lines of printed Dagster logs; other lines (prints, tracebacks) are skipped."""
    out = []
    for raw in lines:
        m = LINE.match(raw.rstrip("\n"))
        if m is None:
            continue
        parts = m["rest"].split(" - ")
        at = next((i for i, p in enumerate(parts) if RUN_ID.match(p)), None)
        if at is None:
            continue
        rest = parts[at + 1:]
        if rest and rest[0].isdigit():  # the pid of an event
            rest = rest[1:]
        if len(rest) < 2 or EVENT.match(rest[0]) or not STEP_KEY.match(rest[0]):
            continue  # a run-level event
        when = datetime.strptime(m["ts"], "%Y-%m-%d %H:%M:%S %z").timestamp()
        out.append(Line(rest[0], when, " - ".join(rest[1:])))
    return out


def read_event_log(run_id: str) -> list[Line]:
    """The step lines of one run (``last``: the newest) of the instance at ``DAGSTER_HOME``."""
    from dagster import DagsterInstance

    instance = DagsterInstance.get()
    if run_id == "last":
        runs = instance.get_runs(limit=1)
        if not runs:
            raise SystemExit("no run in the instance at DAGSTER_HOME")
        run_id = runs[0].run_id
    out = []
    for entry in instance.all_logs(run_id):
        kind = entry.dagster_event.event_type_value if entry.dagster_event else ""
        # *_PLANNED events name their step but are written when the run starts
        if entry.step_key and not kind.endswith("_PLANNED"):
            text = kind or entry.message
            out.append(Line(entry.step_key, entry.timestamp, text or ""))
    return out


def gaps(lines: list[Line]) -> list[StepGaps]:
    """Per step, in the order steps started: its longest silence."""
    by_step: dict[str, list[Line]] = {}
    for line in sorted(lines, key=lambda x: x.at):
        by_step.setdefault(line.step, []).append(line)
    out = []
    for step, its in by_step.items():
        gap, after = 0.0, ""
        for a, b in zip(its, its[1:]):
            if b.at - a.at > gap:
                gap, after = b.at - a.at, a.text
        out.append(StepGaps(step, len(its), its[0].at, its[-1].at, gap, after))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("log", nargs="?", help="printed Dagster log (a file, or - for stdin)")
    parser.add_argument("--run-id", help="read this run's event log from DAGSTER_HOME "
                                         "instead ('last': the newest run)")
    parser.add_argument("--max-gap", type=float, default=MAX_GAP_S,
                        help=f"fail when a step is silent longer than this (s; {MAX_GAP_S:g})")
    args = parser.parse_args(argv)
    if (args.log is None) == (args.run_id is None):
        parser.error("give a log file (or -) or --run-id, one of them")
    if args.run_id:
        lines = read_event_log(args.run_id)
    elif args.log == "-":
        lines = parse_console(sys.stdin)
    else:
        with open(args.log, encoding="utf-8", errors="replace") as f:
            lines = parse_console(f)
    steps = gaps(lines)
    if not steps:
        print("no step lines found: is it a Dagster run's log?", file=sys.stderr)
        return 2
    width = max(len(s.step) for s in steps)
    print(f"{'step':<{width}}  {'lines':>5}  {'took':>7}  {'longest gap':>11}  after the line")
    for s in steps:
        flag = " !" if s.gap_s > args.max_gap else ""
        print(f"{s.step:<{width}}  {s.lines:>5}  {s.duration_s:>6.0f}s  {s.gap_s:>10.0f}s{flag}"
              f"  {s.after[:90]}")
    over = [s for s in steps if s.gap_s > args.max_gap]
    if over:
        print(f"{len(over)} step(s) silent for more than {args.max_gap:g} s: "
              + ", ".join(f"{s.step} ({s.gap_s:.0f} s)" for s in over))
        return 1
    print(f"no step silent for more than {args.max_gap:g} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
