"""Collectives for the cpu plugin: gloo through torch.distributed.

`world_size == 1` and loopback mode never create a process group (hal/local_comm.py).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from tessera.hal.dist_comm import TorchDistCommunicator


class GlooCommunicator(TorchDistCommunicator):
    """One torch.distributed gloo group over `world_size` processes.

    all_reduce reduces in place and returns the same tensor; the other collectives return new
    tensors. Gloo has no reduce_scatter, so it is an all_reduce followed by taking this rank's
    chunk (correct, at world_size times the traffic — fine for the reference plugin).
    """

    def __init__(self, rank: int, world_size: int, init_method: str,
                 timeout_s: float = 120.0) -> None:
        self.refuse_if_initialised()
        self._init_group("gloo", rank, world_size, init_method, timeout_s)

    def all_gather(self, tensor: torch.Tensor, dim: int = 0) -> torch.Tensor:
        tensor = tensor.contiguous()
        parts = [torch.empty_like(tensor) for _ in range(self.world_size)]
        dist.all_gather(parts, tensor, group=self.group)
        return torch.cat(parts, dim=dim)

    def reduce_scatter(self, tensor: torch.Tensor, dim: int = 0) -> torch.Tensor:
        self._check_divisible(tensor, dim)
        total = tensor.clone()
        dist.all_reduce(total, group=self.group)
        return total.chunk(self.world_size, dim=dim)[self.rank].contiguous()

    def barrier(self) -> None:
        dist.barrier(group=self.group)
