"""torchrun command lines and process-tree shutdown, shared by every launcher.

One node: ``torchrun --standalone``. Several: one agent per node, all joining a c10d rendezvous
hosted by the agent whose address is the ``--rdzv-endpoint`` (on one machine the first agent to
bind the port hosts it; the others connect to it). ``--local-addr`` makes every agent publish an
address the other nodes can reach, rather than a host name they may not resolve.
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Callable

import psutil

SHUTDOWN_TIMEOUT_S = 30
"""torchrun's own ``--shutdown-timeout``: how long its workers get to write the final
checkpoint after it forwards SIGINT/SIGTERM, before it kills them."""


PR_SET_PDEATHSIG = 1  # <sys/prctl.h>


def agent_preexec() -> Callable[[], None]:
    """What an agent runs before exec. A blocked signal stays blocked across exec (Ray's workers
    block SIGINT): unblock it, or neither torchrun nor the trainer ever sees a stop. Then ask
    for SIGINT when the thread that started the agent dies (Linux): the agent runs in a session
    of its own, so when its launcher is killed (SIGKILL of the Dagster step, Ray killing a
    job's actors) it would go on training unwatched, next to the rerun; SIGINT makes it write a
    checkpoint and stop, like a cancel. ``prctl`` is looked up here,
    before the fork: between fork and exec only plain system calls belong (no dlopen)."""
    prctl = ctypes.CDLL(None, use_errno=True).prctl if sys.platform.startswith("linux") else None

    def prepare() -> None:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})
        if prctl is not None:
            prctl(PR_SET_PDEATHSIG, signal.SIGINT)

    return prepare


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` now (the rendezvous binds it a moment later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def agent_command(argv: list[str], *, nproc_per_node: int, nnodes: int = 1,
                  rdzv_endpoint: str | None = None, rdzv_id: str | None = None,
                  local_addr: str | None = None, is_host: bool | None = None,
                  python: str = sys.executable) -> list[str]:
    """One torchrun agent running ``-m lance_assets.train *argv``.

    ``nnodes == 1``: a standalone rendezvous on a free local port. Otherwise every agent gets the
    same ``rdzv_endpoint`` (host:port) and ``rdzv_id`` and waits there until all ``nnodes`` joined.
    ``is_host``: whether this agent serves the rendezvous store. Left unset, torchrun guesses by
    comparing the endpoint with the machine's host name, which misses an IP that is not the
    host name's (each agent then waits for a server nobody starts); launchers that know which
    agent owns the endpoint say so.
    """
    cmd = [python, "-m", "torch.distributed.run", f"--nproc-per-node={nproc_per_node}",
           f"--shutdown-timeout={SHUTDOWN_TIMEOUT_S}"]
    if nnodes == 1:
        cmd.append("--standalone")
    else:
        if not rdzv_endpoint or not rdzv_id:
            raise ValueError("nnodes > 1 needs a rendezvous endpoint (host:port) and id")
        cmd += [f"--nnodes={nnodes}", "--rdzv-backend=c10d", f"--rdzv-endpoint={rdzv_endpoint}",
                f"--rdzv-id={rdzv_id}"]
        if local_addr:
            cmd.append(f"--local-addr={local_addr}")
        if is_host is not None:
            cmd.append(f"--rdzv-conf=is_host={str(is_host).lower()}")
    return cmd + ["-m", "lance_assets.train", *argv]


def local_agent_commands(argv: list[str], *, nnodes: int, nproc_per_node: int,
                         rdzv_id: str) -> list[list[str]]:
    """``nnodes`` agents on this machine sharing one rendezvous: multi-node on one box."""
    if nnodes == 1:
        return [agent_command(argv, nproc_per_node=nproc_per_node)]
    endpoint = f"127.0.0.1:{free_port()}"
    return [agent_command(argv, nproc_per_node=nproc_per_node, nnodes=nnodes,
                          rdzv_endpoint=endpoint, rdzv_id=rdzv_id, local_addr="127.0.0.1",
                          is_host=i == 0)
            for i in range(nnodes)]


def local_agent_gpus(nnodes: int, nproc_per_node: int, gpu_count: int) -> list[dict[str, str]]:
    """Each local agent's environment: its own slice of this machine's GPUs.

    Every agent numbers its ranks' devices from LOCAL_RANK 0, so without a slice each would put
    its ranks on the same GPUs and NCCL refuses a second rank on one device. No GPUs: nothing
    to split (CPU training)."""
    if gpu_count == 0 or nnodes == 1:
        return [{} for _ in range(nnodes)]
    if gpu_count < nnodes * nproc_per_node:
        raise ValueError(
            f"nnodes {nnodes} x nproc_per_node {nproc_per_node} on this machine needs "
            f"{nnodes * nproc_per_node} GPUs, it has {gpu_count}: lower nnodes or nproc_per_node, "
            "or use launcher ray on a cluster")
    return [{"CUDA_VISIBLE_DEVICES": ",".join(
                str(g) for g in range(i * nproc_per_node, (i + 1) * nproc_per_node))}
            for i in range(nnodes)]


def local_agent_threads(nnodes: int, nproc_per_node: int, cpu_count: int | None,
                        environ: dict | None = None) -> dict[str, str]:
    """``OMP_NUM_THREADS`` for agents that share this machine: its cores split over every rank.

    torchrun sets 1 thread per worker only when one agent runs several workers; with several
    one-worker agents on one machine each rank would take every core, and the ranks would fight
    over them. A value the user set is kept."""
    environ = os.environ if environ is None else environ
    if nnodes == 1 or "OMP_NUM_THREADS" in environ:
        return {}
    return {"OMP_NUM_THREADS": str(max(1, (cpu_count or 1) // (nnodes * nproc_per_node)))}


def _tree(pid: int) -> list[psutil.Process]:
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def stop_agents(procs: list[subprocess.Popen], timeout_s: float,
                log: Callable[[str], None] = print) -> None:
    """SIGINT to every agent (torchrun forwards it: each worker finishes its step and writes
    the final checkpoint), wait up to ``timeout_s`` for every process under them, then SIGKILL
    what is left.

    torchrun starts each worker in a session of its own, so signalling the agent's process
    group does not reach the workers directly; the tree is collected before the signal, while
    the workers are still the agent's children.
    """
    tree = [p for proc in procs for p in _tree(proc.pid)]
    for proc in procs:
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGINT)
            except ProcessLookupError:
                pass
    _, alive = psutil.wait_procs(tree, timeout=timeout_s)
    if alive:
        log(f"still running after {timeout_s:.0f}s, killing: {sorted(p.pid for p in alive)}")
        _kill(alive)
    for proc in procs:
        proc.wait()


def terminate_tree(proc: subprocess.Popen, timeout_s: float) -> None:
    """SIGTERM to ``proc`` and every process under it (collected first, while they are still
    its descendants), then SIGKILL what is left after ``timeout_s``: a service's whole tree."""
    tree = _tree(proc.pid)
    for p in tree:
        try:
            p.terminate()
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(tree, timeout=timeout_s)
    _kill(alive)
    proc.wait()


def _kill(procs: list[psutil.Process]) -> None:
    """SIGKILL every process still alive in ``procs`` and reap them."""
    for p in procs:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(procs, timeout=10)
