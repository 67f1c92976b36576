"""Run one ingest in this process and freeze it (SIGSTOP) just before its N-th commit.

    python -m lance_assets_tests.stall_driver ROOT SOURCE N [--no-lock]

The freeze lands inside the commit call, after the ingest checked its lock (or lease): the
moment a garbage-collection pause or a frozen VM would hit. ``--no-lock`` runs the ingest with
no lock at all, to show that exactly-once rests on the commit alone. Prints the ingest's report
as JSON when it finishes. Nothing here is imported by the package.
"""

from __future__ import annotations

import functools
import json
import os
import signal
import sys
from contextlib import contextmanager
from pathlib import Path

import lance

from lance_assets.table import Table


@contextmanager
def no_lock(root, log=print):
    """An ingest lock that locks nothing."""
    from lance_assets.ingest.raw_text import HeldLock

    yield HeldLock(0.0, lambda: None)


def freeze_before_commit(n: int) -> None:
    commits = {"n": 0}
    real = lance.LanceDataset.commit

    @functools.wraps(real)
    def commit(*args, **kwargs):
        operation = args[1] if len(args) > 1 else kwargs.get("operation")
        if isinstance(operation, (lance.LanceOperation.Merge, lance.LanceOperation.Append)):
            commits["n"] += 1
            if commits["n"] == n:
                os.kill(os.getpid(), signal.SIGSTOP)  # resumes here on SIGCONT
        return real(*args, **kwargs)

    lance.LanceDataset.commit = staticmethod(commit)


def is_stopped(pid: int) -> bool:
    """True while ``pid`` is stopped by a signal (state T in /proc)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat[stat.rindex(")") + 2] == "T"


def start_frozen(root: str, source: str, n: int, *args: str, timeout_s: float = 300):
    """The driver as a subprocess, returned once it has frozen before its ``n``-th commit."""
    import subprocess
    import time

    repo = Path(__file__).resolve().parents[1]
    proc = subprocess.Popen([sys.executable, "-m", "lance_assets_tests.stall_driver", root,
                             source, str(n), *args], cwd=repo, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "LANCE_LOG": "error"})
    deadline = time.monotonic() + timeout_s
    while not is_stopped(proc.pid):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            out, err = proc.communicate()
            raise AssertionError(f"the ingest never reached commit {n}: {err[-2000:]}")
        time.sleep(0.05)
    return proc


def table_rows(root) -> list[tuple]:
    """(id, source, source_part, text) of every row, by id."""
    from lance_assets import paths

    t = lance.dataset(paths.table_uri(root)).to_table(columns=["id", "source", "source_part",
                                                                "text"])
    return sorted(zip(*(t.column(c).to_pylist() for c in t.column_names)))


if __name__ == "__main__":
    root, source, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    import lance_assets.ingest.raw_text as ingest_module

    if "--no-lock" in sys.argv[4:]:
        ingest_module.ingest_lock = no_lock
    freeze_before_commit(n)
    report = ingest_module.ingest(Table.of(root), source, rows_per_commit=1000, rows_per_fragment=512,
                                  log=lambda msg: print(msg, file=sys.stderr, flush=True))
    print(json.dumps({"rows_added": report.rows_added, "replans": report.replans}))
