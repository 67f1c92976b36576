"""Run a command as a child process and measure it: wall seconds, CPU seconds (user + system,
the child and everything it waited for) and peak RSS, from ``os.wait4``'s own accounting."""

from __future__ import annotations

import os
import subprocess
import time
from dataclasses import asdict, dataclass


@dataclass
class Measured:
    name: str
    wall_s: float
    cpu_s: float
    peak_rss_mb: float
    returncode: int

    def to_dict(self) -> dict:
        return {k: round(v, 3) if isinstance(v, float) else v for k, v in asdict(self).items()}


def run_measured(name: str, cmd: list[str], env: dict | None = None, cwd: str | None = None,
                 log_path: str | None = None) -> Measured:
    """``cmd`` to completion; its output goes to ``log_path`` (appended) or is dropped. Peak RSS
    is the largest of the child's own and its descendants' (``ru_maxrss`` of a waited process
    covers the biggest process in its tree that it waited for)."""
    out = open(log_path, "ab") if log_path else subprocess.DEVNULL
    try:
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=out, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)
    finally:
        if log_path:
            out.close()
    return Measured(name, wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024,
                    proc.returncode)
