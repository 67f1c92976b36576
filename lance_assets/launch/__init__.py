"""Launching ``torchrun -m lance_assets.train`` on one or several nodes, without Dagster.

``torchrun`` builds the agent command lines (single node, or one c10d rendezvous shared by
``nnodes`` agents) and stops process trees; ``ray_job`` is the entrypoint of a Ray job that
starts one agent per Ray node. The asset ``pretrained_model`` drives both through Pipes.

The face: the module ``torchrun``, and ``StopRequested`` (a stop the trainer obeys).
"""

from lance_assets.launch.signals import StopRequested

__all__ = ["StopRequested", "torchrun"]
