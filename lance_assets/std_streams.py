"""The standard streams of the command lines: a standard output or error closed early (``|
head``, ``>&-``) costs only what would have been printed, never the work or its exit status."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable


def closed(stream) -> None:
    """Point ``stream``'s descriptor at /dev/null: later writes, and the flush at exit, go
    nowhere instead of raising again (Python's documented idiom for SIGPIPE)."""
    if stream is None:
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, stream.fileno())
    except (OSError, ValueError):
        pass
    finally:
        os.close(devnull)


def hold_std_fds() -> None:
    """Open /dev/null on a standard descriptor the shell closed (``>&-``): otherwise the first
    file this process opens (a table's data file) would take its number."""
    for fd in (1, 2):
        try:
            os.fstat(fd)
        except OSError:
            devnull = os.open(os.devnull, os.O_WRONLY)
            if devnull != fd:
                os.dup2(devnull, fd)
                os.close(devnull)


def run_main(main: Callable[[], int], broken: int = 1) -> None:
    """Run a command line's ``main`` and exit with its status; a write to a closed pipe that
    ``main`` did not handle stops it with ``broken``, without a traceback."""
    hold_std_fds()
    try:
        status = main()
    except BrokenPipeError:
        closed(sys.stdout)
        closed(sys.stderr)
        status = broken
    sys.exit(status)
