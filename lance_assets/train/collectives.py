"""Every collective the trainer runs, in one place, on the training device.

NCCL has no CPU tensors: a collective handed a CPU tensor on a GPU run fails on the first step.
So the process group is mixed (``cpu:gloo,cuda:nccl``: objects and CPU tensors over gloo, GPU
tensors over NCCL) and every tensor goes through ``Collectives``, which refuses one that is not
on the training device. Under ``torchrun`` the collectives run even at world size 1, so one GPU
exercises the same path as eight; run alone (``python -m lance_assets.train``) they are no-ops.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist


def launched_by_torchrun() -> bool:
    """torchrun (or any launcher that sets the standard rendezvous variables)."""
    return "WORLD_SIZE" in os.environ and "MASTER_ADDR" in os.environ


def backend_for(device: torch.device) -> str:
    """Gloo for CPU tensors and objects, NCCL for GPU tensors (gloo where torch lacks NCCL)."""
    gpu = "nccl" if dist.is_nccl_available() else "gloo"
    return f"cpu:gloo,cuda:{gpu}"


class Collectives:
    """All-reduce and object gathers across ranks; ``world == 1`` without a process group."""

    def __init__(self, device: torch.device, rank: int = 0, world: int = 1,
                 group_open: bool = False):
        self.device, self.rank, self.world, self.group_open = device, rank, world, group_open

    @classmethod
    def start(cls, device: torch.device) -> Collectives:
        """The process group under torchrun (any world size), none when run alone."""
        if not launched_by_torchrun():
            return cls(device)
        kwargs = {"device_id": device} if device.type == "cuda" else {}
        dist.init_process_group(backend=backend_for(device), **kwargs)
        return cls(device, dist.get_rank(), dist.get_world_size(), group_open=True)

    def close(self) -> None:
        if self.group_open:
            dist.destroy_process_group()
            self.group_open = False

    def tensor(self, values, dtype=torch.float64) -> torch.Tensor:
        """A tensor on the training device, ready for a collective."""
        return torch.tensor(values, dtype=dtype, device=self.device)

    def _on_device(self, t: torch.Tensor) -> torch.Tensor:
        if t.device != self.device:
            raise RuntimeError(f"collective on a {t.device} tensor; the training device is "
                               f"{self.device} (NCCL cannot reduce CPU tensors)")
        return t

    def sum(self, t: torch.Tensor) -> torch.Tensor:
        """In-place sum over ranks."""
        if self.group_open:
            dist.all_reduce(self._on_device(t), op=dist.ReduceOp.SUM)
        return t

    def max(self, t: torch.Tensor) -> torch.Tensor:
        """In-place maximum over ranks."""
        if self.group_open:
            dist.all_reduce(self._on_device(t), op=dist.ReduceOp.MAX)
        return t

    def any(self, flag: bool) -> bool:
        """True on every rank if it is true on any rank."""
        return bool(self.max(self.tensor([1.0 if flag else 0.0])).item())

    def gather_lists(self, items: list) -> list:
        """Every rank's ``items``, concatenated in rank order."""
        if not self.group_open:
            return list(items)
        gathered: list = [None] * self.world
        dist.all_gather_object(gathered, items)
        return [x for part in gathered for x in part]
