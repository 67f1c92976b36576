"""Pipes clients for torchrun: agents on this machine, or one agent per node of a Ray cluster.

Cancelling the Dagster run stops every agent on every node and leaves a resumable checkpoint:
each agent gets SIGINT, forwards it to its workers, and they finish their step and write the
final checkpoint before exiting; whatever is still running after the client's
``termination_timeout_seconds`` (longer than torchrun's own shutdown timeout) is killed.
"""

from __future__ import annotations

import os
import secrets
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

import dagster as dg

from lance_assets.launch.torchrun import agent_preexec, free_port, stop_agents, terminate_tree

Context = dg.OpExecutionContext | dg.AssetExecutionContext


@contextmanager
def local_ray_cluster(num_cpus: int | None = None,
                      timeout_s: float = 120) -> Iterator[tuple[str, dict[str, str]]]:
    """A one-node Ray cluster for the duration of the block; yields its job-submission address
    and the HTTP headers that authenticate to it.

    ``ray start --head --block`` on free ports and in a temp dir of its own rather than
    ``ray.init()``: two local clusters (two runs, or another asset's Ray) would otherwise
    collide on Ray's fixed default ports (the dashboard agent's 52365 above all, which leaves
    the job API without an agent), and ``ray.init()`` elsewhere on this machine would join
    this cluster through /tmp/ray. Token authentication with a token of its own (its ports
    listen on the node's address). Stopped as a process tree: nothing outlives the block.
    """
    from ray.job_submission import JobSubmissionClient

    temp_dir = tempfile.mkdtemp(prefix="ray-", dir="/tmp")  # short: Ray's socket paths
    dashboard_port = free_port()
    cmd = [sys.executable, "-m", "ray.scripts.scripts", "start", "--head", "--block",
           "--disable-usage-stats", "--include-dashboard=true", f"--temp-dir={temp_dir}",
           f"--port={free_port()}", f"--dashboard-port={dashboard_port}",
           f"--dashboard-agent-listen-port={free_port()}",
           f"--ray-client-server-port={free_port()}"]
    if num_cpus is not None:
        cmd.append(f"--num-cpus={num_cpus}")
    token = secrets.token_hex(32)
    headers = {"authorization": f"Bearer {token}"}
    log_path = Path(temp_dir) / "ray_start.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, start_new_session=True, stdout=log, stderr=subprocess.STDOUT,
                                env={**os.environ, "RAY_AUTH_MODE": "token",
                                     "RAY_AUTH_TOKEN": token})
    address = f"http://127.0.0.1:{dashboard_port}"
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            if proc.poll() is not None:
                raise RuntimeError("a local Ray did not start: "
                                   + log_path.read_text(errors="replace")[-2000:])
            try:
                JobSubmissionClient(address, headers=headers)
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(1)
        yield address, headers
    finally:
        terminate_tree(proc, 30)
        shutil.rmtree(temp_dir, ignore_errors=True)


@contextmanager
def ray_job_address(local_num_cpus: int | None = None,
                    ) -> Iterator[tuple[str | None, dict[str, str] | None]]:
    """The cluster's job-submission address and headers: ``RAY_ADDRESS`` when set (the
    dashboard, e.g. ``http://head:8265``; yields None and lets Ray read it and its own token
    settings), else a local Ray for the block."""
    if os.environ.get("RAY_ADDRESS"):
        yield None, None
        return
    with local_ray_cluster(local_num_cpus) as (address, headers):
        yield address, headers


def _run_ray_job(context: Context, extras: dict | None, address: str | None,
                 headers: dict[str, str] | None, submit_job_params: dict,
                 stop_timeout_s: float) -> dg.PipesClientCompletedInvocation:
    """dagster-ray's ``PipesRayJobClient`` (context in the job's environment, messages read
    from the job's logs), through its public ``run`` only:

    - a cluster just started takes a moment before its job agent accepts a job: a submission
      refused with "No available agent" (no job exists yet) is tried again for up to 60 s;
    - on cancel the client stops the job and returns at once: here the run waits until the job
      has really stopped (found by the submission id given to it), since the agents need that
      time to write their checkpoint, and a local Ray must not be shut down under them."""
    from dagster_ray import PipesRayJobClient
    from ray.job_submission import JobStatus

    client = PipesRayJobClient(address=address, headers=headers, poll_interval=0.5)
    deadline = time.monotonic() + 60
    while True:
        submission_id = f"lance-assets-{secrets.token_hex(8)}"
        try:
            return client.run(context=context, extras=extras,
                              submit_job_params={**submit_job_params,
                                                 "submission_id": submission_id})
        except RuntimeError as e:
            if "No available agent" not in str(e) or time.monotonic() > deadline:
                raise
            time.sleep(1)
        except dg.DagsterExecutionInterruptedError:
            stop_by = time.monotonic() + stop_timeout_s + 10
            while time.monotonic() < stop_by:
                if client.client.get_job_status(submission_id) in (
                        JobStatus.STOPPED, JobStatus.FAILED, JobStatus.SUCCEEDED):
                    break
                time.sleep(0.5)
            else:
                context.log.warning(f"Ray job {submission_id} still not stopped after "
                                    f"{stop_timeout_s:.0f}s")
            raise


class TorchrunPipesClient(dg.PipesSubprocessClient):
    """Runs torchrun agents through Dagster Pipes and stops all of them as a whole on cancel.

    ``run``/``run_agents``: agents as subprocesses of this machine (Pipes over a temp file, as
    ``PipesSubprocessClient``). ``run_on_ray``: a Ray job with one agent per node (Pipes over the
    job's logs). ``local_ray_num_cpus``: the CPUs of the local Ray started for a run when
    ``RAY_ADDRESS`` is not set (default: all); Ray is only ever started by ``run_on_ray``.
    """

    def __init__(self, *args, local_ray_num_cpus: int | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.local_ray_num_cpus = local_ray_num_cpus

    def run(  # type: ignore[override]
        self,
        *,
        context: Context,
        extras: dict | None = None,
        command: str | Sequence[str],
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
    ) -> dg.PipesClientCompletedInvocation:
        return self.run_agents(context=context, commands=[command], extras=extras, env=env,
                               cwd=cwd)

    def run_agents(self, *, context: Context, commands: Sequence[str | Sequence[str]],
                   extras: dict | None = None, env: Mapping[str, str] | None = None,
                   cwd: str | None = None, agent_envs: Sequence[Mapping[str, str]] | None = None,
                   ) -> dg.PipesClientCompletedInvocation:
        """Every command (one torchrun agent each) at once, each in a session of its own;
        ``agent_envs``: one environment overlay per command (e.g. its GPUs)."""
        with dg.open_pipes_session(context=context, context_injector=self.context_injector,
                                   message_reader=self.message_reader, extras=extras) as session:
            full_env = {**os.environ, **self.env, **(env or {}), **session.get_bootstrap_env_vars()}
            procs: list[subprocess.Popen] = []
            try:
                for command, overlay in zip(commands, agent_envs or [{}] * len(commands)):
                    procs.append(subprocess.Popen(command, cwd=cwd or self.cwd,
                                                  start_new_session=True,
                                                  preexec_fn=agent_preexec(),  # noqa: PLW1509
                                                  env={**full_env, **overlay}))
                codes = [proc.wait() for proc in procs]
                if any(codes):
                    raise dg.Failure(
                        f"trainer exited with codes {codes}; see the run's logs")
            except dg.DagsterExecutionInterruptedError:
                context.log.info("run cancelled: asking every rank to checkpoint and stop")
                stop_agents(procs, self.termination_timeout_seconds, log=context.log.warning)
                raise
            finally:
                if any(proc.poll() is None for proc in procs):  # any failure: nothing left running
                    stop_agents(procs, self.termination_timeout_seconds, log=context.log.warning)
        return dg.PipesClientCompletedInvocation(session)

    def run_on_ray(self, *, context: Context, argv: Sequence[str], nnodes: int,
                   nproc_per_node: int, rdzv_id: str,
                   extras: dict | None = None) -> dg.PipesClientCompletedInvocation:
        """A Ray job (``python -m lance_assets.launch.ray_job``) placing one agent per node."""
        local = not os.environ.get("RAY_ADDRESS")
        entrypoint = [sys.executable if local else "python", "-m", "lance_assets.launch.ray_job",
                      f"--nnodes={nnodes}", f"--nproc-per-node={nproc_per_node}",
                      f"--rdzv-id={rdzv_id}", "--",
                      *argv]
        stop_s = self.termination_timeout_seconds
        env_vars = {
            **self.env,
            "PYTHONUNBUFFERED": "1",
            "RAY_DISABLE_WORKER_LOG_PREFIX": "1",  # rank 0's Pipes lines reach the job log as is
            "RAY_DEDUP_LOGS": "0",  # and are never folded into "repeated N times"
            "RAY_JOB_STOP_SIGNAL": "SIGTERM",
            "RAY_JOB_STOP_WAIT_TIME_S": str(int(stop_s)),  # time for the final checkpoint
        }
        if local and os.environ.get("PYTHONPATH"):
            env_vars["PYTHONPATH"] = os.environ["PYTHONPATH"]
        context.log.info("launching on Ray: " + shlex.join(entrypoint))
        with ray_job_address(self.local_ray_num_cpus) as (address, headers):
            return _run_ray_job(context, extras, address, headers, {
                "entrypoint": shlex.join(entrypoint), "runtime_env": {"env_vars": env_vars},
                "entrypoint_num_cpus": 0}, stop_s)
