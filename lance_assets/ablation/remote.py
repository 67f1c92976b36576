"""Proxy runs as Ray tasks (``LANCE_ASSETS_EXECUTOR=ray``): every run at once, one per GPU where
the cluster has GPUs.

Each task runs the trainer exactly as the local path does (``torchrun -m lance_assets.train``
with the spec's ``argv``: its settings, its tagged snapshot and its run folder under the
data root, which every node must reach), so a run's files are the same whichever path trained
it and a rerun finds them. A task cancelled by the driver (a cancelled Dagster run stops
waiting, ``executor.ray_map`` cancels what is left) forwards the stop to torchrun, whose ranks
write a checkpoint, as a cancel does locally.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from dataclasses import dataclass

from lance_assets.ablation.plan import AblationError
from lance_assets.launch.torchrun import SHUTDOWN_TIMEOUT_S, agent_command, agent_preexec, stop_agents
from lance_assets.progress import progress
from lance_assets.table import executor
from lance_assets.train.spec import RunSpec

TAIL = 3000  # characters of a failed run's output quoted in the error


@dataclass(frozen=True)
class Task:
    out: str  # the run folder
    command: list[str]  # torchrun -m lance_assets.train ...
    threads: int  # OMP_NUM_THREADS of its ranks


def train_task(_shared, task: Task) -> str:
    """One run in a Ray task; a cancel (KeyboardInterrupt) stops torchrun with a checkpoint."""
    env = {**os.environ, "OMP_NUM_THREADS": str(task.threads)}
    proc = subprocess.Popen(task.command, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, start_new_session=True,
                            preexec_fn=agent_preexec())
    try:
        output, _ = proc.communicate()
    except KeyboardInterrupt:
        stop_agents([proc], SHUTDOWN_TIMEOUT_S + 15, log=lambda _m: None)
        raise
    if proc.returncode:
        text = output.decode(errors="replace")[-TAIL:]
        raise RuntimeError(f"training run {task.out} exited with status {proc.returncode}:\n{text}")
    return task.out


def train_on_ray(specs: list[RunSpec], *, threads: int = 1,
                 log: Callable[[str], None] = print) -> None:
    """Every run in ``specs`` as a Ray task (``nproc_per_node`` GPUs each where the cluster has
    GPUs, else ``threads`` CPUs); returns when all finished, an ``AblationError`` naming the
    first that failed."""
    executor.ensure_ray(log)
    gpus = executor.cluster_gpus()
    per_run = specs[0].nproc_per_node if specs else 1
    tasks = [Task(s.out, agent_command(s.argv(), nproc_per_node=s.nproc_per_node), threads)
             for s in specs]
    log(f"Ray: {len(tasks)} training runs as tasks ("
        + (f"{per_run} GPU(s) each" if gpus else f"{threads} CPU(s) each") + ")")
    with progress(total=len(tasks), desc="Ray: training runs", unit="run", log=log) as bar:
        for result in executor.ray_map(train_task, None, tasks, num_gpus=per_run if gpus else 0,
                                       num_cpus=threads):
            if result.error is not None:
                raise AblationError(f"a Ray task failed: {result.error}")
            bar.update(1)
