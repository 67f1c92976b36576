"""``launch``: the one way the training assets run a ``RunSpec``.

``via`` says how: ``torchrun`` (agents on this machine through Dagster Pipes), ``ray_job`` (a
Ray job with one agent per node, through Pipes) or ``ray_tasks`` (every spec at once, one Ray
task each: ``ablation.remote``). By default each spec goes the way its ``launcher`` setting
says (local: torchrun, ray: a Ray job). Every path runs the trainer on ``spec.argv()``.
"""

import os
from collections.abc import Sequence

import dagster as dg

from lance_assets import storage
from lance_assets.defs.training.torchrun import TorchrunPipesClient
from lance_assets.launch.torchrun import (
    local_agent_commands,
    local_agent_gpus,
    local_agent_threads,
)
from lance_assets.progress import phase
from lance_assets.train import checkpoint
from lance_assets.train.spec import RunSpec

VIA = ("torchrun", "ray_job", "ray_tasks")


def local_agent_envs(spec: RunSpec) -> list[dict[str, str]]:
    """Each local agent's GPUs (none on a machine without CUDA)."""
    if spec.nnodes == 1:
        return [{}]
    import torch

    try:
        gpus = local_agent_gpus(spec.nnodes, spec.nproc_per_node, torch.cuda.device_count())
    except ValueError as e:
        raise dg.Failure(str(e)) from None
    threads = local_agent_threads(spec.nnodes, spec.nproc_per_node, os.cpu_count())
    return [{**env, **threads} for env in gpus]


def launch(context: dg.AssetExecutionContext, client: TorchrunPipesClient,
           specs: RunSpec | Sequence[RunSpec], *, via: str | None = None,
           resume_hint: str | None = None) -> list[dict]:
    """Run ``specs`` (one after another; all at once with ``ray_tasks``) and return what rank 0
    of each reported through Pipes (nothing for Ray tasks, whose runs are read from their
    folders). On cancel, say how to go on (``resume_hint``, default: for
    ``pretrained_model``)."""
    specs = [specs] if isinstance(specs, RunSpec) else list(specs)
    if via not in (None, *VIA):
        raise ValueError(f"via {via!r}: choose one of {', '.join(VIA)}")
    if via == "ray_tasks":
        from lance_assets.ablation import remote

        remote.train_on_ray(specs, log=context.log.info)
        return [{} for _ in specs]
    return [_run(context, client, spec, via or ("ray_job" if spec.launcher == "ray"
                                                else "torchrun"), resume_hint)
            for spec in specs]


def _run(context: dg.AssetExecutionContext, client: TorchrunPipesClient, spec: RunSpec, via: str,
         resume_hint: str | None) -> dict:
    """The trainer on ``spec.nnodes`` nodes by torchrun agents here or a Ray job, every rank
    reading the spec's snapshot."""
    out = storage.location(spec.out)
    args = spec.argv()
    rdzv_id = f"{out.name}-{context.run.run_id[:8]}"
    extras = {"resume_hint": resume_hint or "to continue, materialize pretrained_model again "
                                            f"with resume: auto and run_name: {out.name}"}
    # a line at least every progress.LOG_EVERY_S while torchrun starts (imports, the loader)
    # and runs, besides the trainer's own lines
    running = phase(f"{context.asset_key.to_user_string()}: training run {out.name}",
                    context.log.info, announce=False)
    try:
        if via == "ray_job":
            with running:
                invocation = client.run_on_ray(context=context, argv=args,
                                               nnodes=spec.nnodes,
                                               nproc_per_node=spec.nproc_per_node,
                                               rdzv_id=rdzv_id, extras=extras)
        else:
            commands = local_agent_commands(args, nnodes=spec.nnodes,
                                            nproc_per_node=spec.nproc_per_node, rdzv_id=rdzv_id)
            envs = local_agent_envs(spec)
            for cmd, env in zip(commands, envs):
                context.log.info("launching: " + " ".join(f"{k}={v}" for k, v in env.items())
                                 + (" " if env else "") + " ".join(cmd))
            with running:
                invocation = client.run_agents(context=context, commands=commands,
                                               extras=extras, agent_envs=envs)
    except dg.DagsterExecutionInterruptedError:
        saved = checkpoint.list_checkpoints(out) if out.is_dir() else []
        context.log.warning("training cancelled; " + (
            f"newest checkpoint {saved[-1].name} in {out}; {extras['resume_hint']}" if saved
            else f"no checkpoint was written to {out}; materialize "
                 f"{context.asset_key.to_user_string()} again to start over"))
        raise
    return dict(invocation.get_materialize_result().metadata or {})
