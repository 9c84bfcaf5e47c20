"""Collectives for the cpu plugin: gloo through torch.distributed.

`world_size == 1` and loopback mode never create a process group (hal/local_comm.py).
"""

from __future__ import annotations

from datetime import timedelta

import torch
import torch.distributed as dist

from tessera.hal.platform import Communicator


class GlooCommunicator(Communicator):
    """One torch.distributed gloo group over `world_size` processes.

    all_reduce reduces in place and returns the same tensor; the other collectives return new
    tensors. Gloo has no reduce_scatter, so it is an all_reduce followed by taking this rank's
    chunk (correct, at world_size times the traffic — fine for the reference plugin).
    """

    def __init__(self, rank: int, world_size: int, init_method: str,
                 timeout_s: float = 120.0) -> None:
        if dist.is_initialized():
            raise RuntimeError("torch.distributed is already initialised in this process; "
                               "destroy the previous communicator first")
        dist.init_process_group("gloo", init_method=init_method, rank=rank,
                                world_size=world_size, timeout=timedelta(seconds=timeout_s))
        self.rank = rank
        self.world_size = world_size

    def all_reduce(self, tensor: torch.Tensor) -> torch.Tensor:
        dist.all_reduce(tensor)
        return tensor

    def all_gather(self, tensor: torch.Tensor, dim: int = 0) -> torch.Tensor:
        tensor = tensor.contiguous()
        parts = [torch.empty_like(tensor) for _ in range(self.world_size)]
        dist.all_gather(parts, tensor)
        return torch.cat(parts, dim=dim)

    def reduce_scatter(self, tensor: torch.Tensor, dim: int = 0) -> torch.Tensor:
        if tensor.shape[dim] % self.world_size:
            raise ValueError(f"reduce_scatter: size {tensor.shape[dim]} along dim {dim} is not "
                             f"divisible by world_size {self.world_size}")
        total = tensor.clone()
        dist.all_reduce(total)
        return total.chunk(self.world_size, dim=dim)[self.rank].contiguous()

    def send(self, tensor: torch.Tensor, dst: int) -> None:
        dist.send(tensor.contiguous(), dst)

    def recv(self, tensor: torch.Tensor, src: int) -> torch.Tensor:
        dist.recv(tensor, src)
        return tensor

    def barrier(self) -> None:
        dist.barrier()

    def destroy(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()
