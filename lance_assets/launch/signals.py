"""A flag set by SIGINT or SIGTERM: long-running loops (the trainer's steps, the Ray job's wait
for its agents) check it at a safe point instead of dying inside a step or a checkpoint."""

from __future__ import annotations

import signal


class StopRequested:
    """Installs SIGINT/SIGTERM handlers (replacing any installed before) that set ``requested``."""

    def __init__(self) -> None:
        self.requested = False
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, self._handle)

    def _handle(self, signum, _frame) -> None:
        self.requested = True
