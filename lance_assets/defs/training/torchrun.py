"""A Pipes client for torchrun that stops every rank when the Dagster run is cancelled.

torchrun starts each worker in a session of its own, so signalling torchrun's process group
does not reach them directly. On cancel we send SIGINT to torchrun (which forwards it to the
workers: each finishes its step and writes a checkpoint), wait longer than torchrun's own
``--shutdown-timeout``, then SIGKILL whatever is left of torchrun and every process under it.
"""

import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Mapping, Optional, Sequence, Union

import dagster as dg
from dagster._core.errors import DagsterExecutionInterruptedError

TORCHRUN_SHUTDOWN_TIMEOUT_S = 30


def descendants(pid: int) -> set[int]:
    """Every live process below ``pid`` (Linux /proc; empty elsewhere)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.exists() and stat.read_text().rsplit(")", 1)[1].split()[0] == "Z")


def stop_process_tree(proc: subprocess.Popen, timeout_s: float, log=print) -> None:
    """SIGINT to the launcher's group, wait up to ``timeout_s``, then SIGKILL the whole tree."""
    tree = descendants(proc.pid)
    try:
        os.killpg(proc.pid, signal.SIGINT)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and (proc.poll() is None or any(map(_alive, tree))):
        tree |= descendants(proc.pid) if proc.poll() is None else set()
        time.sleep(0.2)
    left = [p for p in tree | {proc.pid} if _alive(p)]
    if left:
        log(f"still running after {timeout_s:.0f}s, killing: {sorted(left)}")
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    proc.wait()


class TorchrunPipesClient(dg.PipesSubprocessClient):
    """``PipesSubprocessClient`` whose subprocess tree is stopped as a whole on cancel."""

    def run(  # type: ignore[override]
        self,
        *,
        context: Union[dg.OpExecutionContext, dg.AssetExecutionContext],
        extras: Optional[dict] = None,
        command: Union[str, Sequence[str]],
        env: Optional[Mapping[str, str]] = None,
        cwd: Optional[str] = None,
    ) -> dg.PipesClientCompletedInvocation:
        with dg.open_pipes_session(context=context, context_injector=self.context_injector,
                                   message_reader=self.message_reader, extras=extras) as session:
            proc = subprocess.Popen(
                command, cwd=cwd or self.cwd, start_new_session=True,
                env={**os.environ, **self.env, **(env or {}), **session.get_bootstrap_env_vars()},
            )
            try:
                if proc.wait() != 0:
                    raise dg.DagsterPipesExecutionError(
                        f"trainer exited with code {proc.returncode}; see the run's logs")
            except DagsterExecutionInterruptedError:
                context.log.info("run cancelled: asking every rank to checkpoint and stop")
                stop_process_tree(proc, self.termination_timeout_seconds, log=context.log.warning)
                raise
            finally:
                if proc.poll() is None:  # any other failure: leave nothing running
                    stop_process_tree(proc, self.termination_timeout_seconds, log=context.log.warning)
        return dg.PipesClientCompletedInvocation(session)
