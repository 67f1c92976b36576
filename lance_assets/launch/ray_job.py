"""Entrypoint of a Ray job that runs one torchrun agent per Ray node.

    python -m lance_assets.launch.ray_job --nnodes 2 --nproc-per-node 1 --rdzv-id RUN \
        -- --data /shared/data --out /shared/data/train/RUN --steps 300

A placement group spreads ``nnodes`` bundles over the cluster's nodes (``SPREAD``: on a cluster
with fewer nodes they share one, so a one-node local Ray still runs the same code). One actor
per bundle starts a torchrun agent on its node; the first actor's node hosts the c10d
rendezvous on a port free there. The agents inherit the job's environment (Dagster Pipes' when
launched by ``pretrained_model``), and their output is the actors' output, which Ray forwards
to this driver and so to the job's logs, where the Pipes reader finds rank 0's messages.

SIGTERM or SIGINT (``ray job stop``, a cancelled Dagster run) asks every agent to stop: each
forwards SIGINT to its workers, which finish their step and write the final checkpoint.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys

import ray
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from lance_assets.launch.signals import StopRequested
from lance_assets.launch.torchrun import SHUTDOWN_TIMEOUT_S, agent_command, agent_preexec, free_port


@ray.remote(max_concurrency=2)  # `interrupt` runs while `run` waits for the agent
class Agent:
    """One torchrun agent on the node this actor was placed on."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen | None = None
        self.stopped = False

    def address(self) -> tuple[str, int]:
        """This node's IP and a port free on it (for the rendezvous, if this node hosts it)."""
        ip = ray.util.get_node_ip_address()
        return ip, free_port(ip)

    def run(self, argv: list[str], nnodes: int, nproc_per_node: int, endpoint: str,
            rdzv_id: str, is_host: bool) -> int:
        ip = ray.util.get_node_ip_address()
        cmd = agent_command(argv, nproc_per_node=nproc_per_node, nnodes=nnodes,
                            rdzv_endpoint=endpoint, rdzv_id=rdzv_id, local_addr=ip,
                            is_host=is_host)
        if self.stopped:
            return 130
        # preexec_fn runs two plain syscalls in the child: safe even in this threaded actor
        self.proc = subprocess.Popen(cmd, start_new_session=True,
                                     preexec_fn=agent_preexec())  # noqa: PLW1509
        return self.proc.wait()

    def interrupt(self) -> None:
        self.stopped = True
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGINT)


def parse_args(argv: list[str] | None = None) -> tuple[argparse.Namespace, list[str]]:
    p = argparse.ArgumentParser(prog="python -m lance_assets.launch.ray_job",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--nnodes", type=int, required=True, help="torchrun agents (Ray nodes)")
    p.add_argument("--nproc-per-node", type=int, default=1, help="trainer processes per agent")
    p.add_argument("--rdzv-id", required=True, help="the rendezvous id: unique per run")
    p.add_argument("--gpus-per-proc", type=float, default=None,
                   help="GPUs each trainer process reserves (default: 1 on a cluster with GPUs, "
                        "else 0; Ray hides the GPUs an actor did not reserve)")
    argv = sys.argv[1:] if argv is None else argv
    split = argv.index("--") if "--" in argv else len(argv)
    ns = p.parse_args(argv[:split])
    if ns.nnodes < 1 or ns.nproc_per_node < 1:
        p.error("--nnodes and --nproc-per-node must be >= 1")
    return ns, argv[split + 1:]


def main(argv: list[str] | None = None) -> int:
    ns, trainer_argv = parse_args(argv)
    ray.init()  # inside a Ray job: the job's cluster
    stop = StopRequested()  # after ray.init, which installs a SIGTERM handler that exits at once
    gpus = ns.gpus_per_proc
    if gpus is None:
        gpus = 1 if ray.cluster_resources().get("GPU") else 0
    bundle = {"CPU": 1, **({"GPU": gpus * ns.nproc_per_node} if gpus else {})}
    pg = placement_group([bundle] * ns.nnodes, strategy="SPREAD")
    ray.get(pg.ready())
    try:
        agents = [Agent.options(num_cpus=1, num_gpus=bundle.get("GPU", 0),
                                scheduling_strategy=PlacementGroupSchedulingStrategy(
                                    pg, placement_group_bundle_index=i)).remote()
                  for i in range(ns.nnodes)]
        host, port = ray.get(agents[0].address.remote())
        print(f"rendezvous {host}:{port}, {ns.nnodes} nodes x {ns.nproc_per_node} processes",
              flush=True)
        runs = [a.run.remote(trainer_argv, ns.nnodes, ns.nproc_per_node, f"{host}:{port}",
                             ns.rdzv_id, i == 0) for i, a in enumerate(agents)]
        pending = list(runs)
        while pending and not stop.requested:
            _, pending = ray.wait(pending, num_returns=len(pending), timeout=0.5)
        if stop.requested:
            print("stop requested: every agent checkpoints and exits", flush=True)
            ray.get([a.interrupt.remote() for a in agents])
            ray.wait(runs, num_returns=len(runs), timeout=SHUTDOWN_TIMEOUT_S + 15)
            return 130
        codes = ray.get(runs)
        return max(codes, key=abs)
    finally:
        remove_placement_group(pg)


if __name__ == "__main__":
    sys.exit(main())
