"""The loader's worker processes (``--num-workers N``): the blocks of the in-process loader, in
its order, read by N processes started the way Lance allows.

Lance is not fork-safe (a forked worker of a process that has read the table crashes), so the
workers start by ``forkserver`` (default) or ``spawn``, never by the platform's default ``fork``.
Everything a worker needs pickles: the dataset travels as its table's location and the stored
permutation as its own (``streaming_adapter``).

``StreamingDataset`` gives worker w the w-th contiguous share of the rank's splits and each worker
emits one block per owned split per cycle; torch's DataLoader hands out batches from the workers
in turn. With DataLoader batches of exactly one cycle of a worker (its splits), the batches in
order are the in-process stream, cycle after cycle; ``InOrderBatches`` cuts that stream into the
trainer's batches again. So a step's blocks do not depend on the worker count, and a checkpoint
taken with one count resumes with any other (tested through torchrun).

Workers never act on SIGINT or SIGTERM: Ctrl-C and torchrun signal the rank's whole process
group, and the rank stops its workers itself once it finished its step and wrote its checkpoint.
The workers (and the forkserver) are started with both signals blocked, a mask they inherit from
their first instruction. A worker whose rank was killed exits at once: it watches the rank's
process itself, since a forkserver's worker is the server's child, and the server lives as long
as any of its children does (torch's own watchdog only sees the parent).
"""

from __future__ import annotations

import contextlib
import functools
import multiprocessing
import os
import select
import signal
import threading
import time
from collections.abc import Iterator

import torch

START_METHODS = ("forkserver", "spawn")
"""Start methods Lance supports in a process that reads it (``fork`` is not one of them)."""

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def worker_started(rank_pid: int, _worker_id: int) -> None:
    """A worker's ``worker_init_fn``: the rank, not its workers, answers SIGINT and SIGTERM (for
    a forkserver that another part of the process started without the mask), and the worker
    exits as soon as the rank's process is gone."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    threading.Thread(target=_exit_with, args=(rank_pid,), name="rank-watch", daemon=True).start()


def _exit_with(pid: int) -> None:
    """End this process as soon as process ``pid`` has exited."""
    try:
        fd = os.pidfd_open(pid)  # readable when the process exits
        select.select([fd], [], [])
    except ProcessLookupError:
        pass
    except OSError:  # no pidfd here: look once a second
        while True:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            time.sleep(1.0)
    os.kill(os.getpid(), signal.SIGKILL)  # nothing of this worker's is worth finishing


@contextlib.contextmanager
def stop_signals_blocked():
    """SIGINT and SIGTERM blocked in this thread while processes start: they inherit the mask.
    The process still gets them (another of its threads takes a signal this one blocks)."""
    old = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def start_context(method: str):
    """The multiprocessing context for the workers; a forkserver imports torch once for all of
    them (not Lance: forking after Lance is imported is what Lance warns about)."""
    if method not in START_METHODS:
        raise ValueError(f"--mp-context {method!r}: choose one of {', '.join(START_METHODS)} "
                         "(Lance is not fork-safe)")
    ctx = multiprocessing.get_context(method)
    if method == "forkserver":
        ctx.set_forkserver_preload(["torch"])
    return ctx


def worker_loader(dataset, splits_per_rank: int, num_workers: int,
                  start_method: str = "forkserver"):
    """lancedb's ``StreamingDataLoader`` over ``dataset`` with ``num_workers`` processes, each
    batch one cycle of one worker (its share of the rank's splits), in the workers' turn."""
    from lancedb.streaming import StreamingDataLoader

    if splits_per_rank % num_workers:
        raise ValueError(f"--num-workers {num_workers}: the rank's {splits_per_rank} splits do not "
                         f"divide among {num_workers} workers; make --num-splits a multiple of "
                         "the world size x --num-workers")
    return StreamingDataLoader(
        dataset, batch_size=splits_per_rank // num_workers, num_workers=num_workers,
        multiprocessing_context=start_context(start_method),
        worker_init_fn=functools.partial(worker_started, os.getpid()))


class InOrderBatches:
    """The in-process loader's batches of ``batch_size`` blocks, cut from the workers' cycles.

    Cycles are taken from the DataLoader only when a batch needs them, so at a step boundary
    (a multiple of the rank's splits) nothing is held here and the dataset's committed state is
    exactly what the trainer received. The last batch of an epoch may be short, as without
    workers."""

    def __init__(self, dataset, batch_size: int, *, splits_per_rank: int, num_workers: int,
                 start_method: str = "forkserver"):
        self.batch_size = batch_size
        loader = worker_loader(dataset, splits_per_rank, num_workers, start_method)
        before = {p.pid for p in multiprocessing.active_children()}
        with stop_signals_blocked():
            self._it = iter(loader)
        self._workers = [p for p in multiprocessing.active_children() if p.pid not in before]
        self._held: list[dict] = []
        self._n = 0

    @property
    def holding(self) -> int:
        """Blocks taken from the workers and not yet handed out."""
        return self._n

    def __iter__(self) -> Iterator[dict]:
        return self

    def __next__(self) -> dict:
        while self._n < self.batch_size:
            try:
                cycle = next(self._it)
            except StopIteration:
                if not self._n:
                    raise
                break
            self._held.append(cycle)
            self._n += len(next(iter(cycle.values())))
        joined = {k: torch.cat([c[k] for c in self._held]) for k in self._held[0]}
        take = min(self.batch_size, self._n)
        rest = {k: v[take:] for k, v in joined.items()}
        self._n -= take
        self._held = [rest] if self._n else []
        return {k: v[:take] for k, v in joined.items()}

    def close(self) -> None:
        """Stop the workers now: lancedb's iterator, once collected, asks them to finish and
        joins them; one still there is killed (they ignore SIGTERM, which the interpreter's
        exit would send them, and would keep it waiting)."""
        self._it = iter(())
        for process in self._workers:
            process.join(timeout=5)
            if process.is_alive():
                process.kill()
                process.join(timeout=5)
