"""The loader's worker processes (``--num-workers N``): the blocks of the in-process loader, in
its order, read by N processes started the way Lance allows.

Lance is not fork-safe (a forked worker of a process that has read the table crashes), so the
workers start by ``forkserver`` (default) or ``spawn``, never by the platform's default ``fork``.
Everything a worker needs pickles: the dataset travels as its table's location and the stored
permutation as its own (``streaming_adapter``).

``StreamingDataset`` gives worker w the w-th contiguous share of the rank's splits and each worker
emits one block per owned split per cycle; torch's DataLoader hands out batches from the workers
in turn. With DataLoader batches of whole cycles, a batch from each worker put back in cycle
order is the in-process stream; ``InOrderBatches`` cuts it into the trainer's batches. So a
step's blocks do not depend on the worker count, and a checkpoint taken with one count resumes
with any other (tested through torchrun).

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
                  start_method: str = "forkserver", cycles: int = 1):
    """lancedb's ``StreamingDataLoader`` over ``dataset``: each batch ``cycles`` cycles of one
    worker (a cycle: one block of each split the worker owns), the workers taking turns; with
    no workers, ``cycles`` cycles of the rank's splits read in this process."""
    from lancedb.streaming import StreamingDataLoader

    if num_workers == 0:
        return StreamingDataLoader(dataset, batch_size=cycles * splits_per_rank)
    if splits_per_rank % num_workers:
        raise ValueError(f"--num-workers {num_workers}: the rank's {splits_per_rank} splits do not "
                         f"divide among {num_workers} workers; make --num-splits a multiple of "
                         "the world size x --num-workers")
    return StreamingDataLoader(
        dataset, batch_size=cycles * (splits_per_rank // num_workers), num_workers=num_workers,
        multiprocessing_context=start_context(start_method),
        worker_init_fn=functools.partial(worker_started, os.getpid()))


class InOrderBatches:
    """The in-process loader's blocks in its order, ``batch_size`` at a time, read a round at a
    time: one DataLoader batch of ``cycles`` cycles from each worker in turn, put back in
    cycle order (all workers' share of cycle 0, then of cycle 1, ...).

    With ``cycles`` the cycles of one optimizer step, lancedb snapshots its loader state once
    per worker and step instead of once per batch (the snapshot copies every split's pending
    tokens: most of the loader's CPU time on long documents), and a round is taken only when
    a batch needs it, so at a step boundary nothing is held here and the dataset's committed
    state is exactly what the trainer received. An epoch that starts in the middle of a step
    (the previous one ended there) reads ``first_cycles``, the rest of that step, as its first
    round, then opens the loader again for whole steps. The last batch of an epoch may be
    short, as with the plain loader."""

    def __init__(self, dataset, batch_size: int, *, splits_per_rank: int, num_workers: int = 0,
                 start_method: str = "forkserver", cycles: int = 1,
                 first_cycles: int | None = None):
        self.dataset, self.splits_per_rank = dataset, splits_per_rank
        self.num_workers, self.start_method, self.cycles = num_workers, start_method, cycles
        self.batch_size, self.turns = batch_size, max(1, num_workers)
        self.cycle = splits_per_rank // self.turns  # blocks of one worker's cycle
        self._workers: list = []
        self._held: dict | None = None
        self._n = 0
        if first_cycles and first_cycles != cycles:
            self._open(first_cycles, rounds=1)
        else:
            self._open(cycles, rounds=None)

    def _open(self, cycles: int, rounds: int | None) -> None:
        """A loader over the dataset from its committed state, for ``rounds`` rounds (None: to
        the end of the epoch)."""
        loader = worker_loader(self.dataset, self.splits_per_rank, self.num_workers,
                               self.start_method, cycles)
        before = {p.pid for p in multiprocessing.active_children()}
        with stop_signals_blocked():
            self._it = iter(loader)
        self._workers = [p for p in multiprocessing.active_children() if p.pid not in before]
        self._rounds_left = rounds

    @property
    def holding(self) -> int:
        """Blocks read and not yet handed out."""
        return self._n

    def __iter__(self) -> Iterator[dict]:
        return self

    def _round(self) -> dict:
        """One batch from each worker, in cycle order. Every worker's last batch of an epoch
        holds as many cycles as the others' (every split emits as many blocks)."""
        if self._rounds_left == 0:  # the first, shorter round is read: whole steps from here
            self.close()
            self._open(self.cycles, rounds=None)
        if self._rounds_left is not None:
            self._rounds_left -= 1
        batches = [next(self._it)]
        batches += [next(self._it) for _ in range(self.turns - 1)]
        size = len(next(iter(batches[0].values())))
        cuts = [(b, j) for j in range(0, size, self.cycle) for b in batches]
        return {k: torch.cat([b[k][j:j + self.cycle] for b, j in cuts]) for k in batches[0]}

    def __next__(self) -> dict:
        if self._n == 0:
            self._held = self._round()  # StopIteration at an epoch's end
            self._n = len(next(iter(self._held.values())))
        take = min(self.batch_size, self._n)
        out = {k: v[:take] for k, v in self._held.items()}
        self._held = {k: v[take:] for k, v in self._held.items()}
        self._n -= take
        return out

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
