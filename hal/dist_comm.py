"""The torch.distributed collectives the gloo (cpu/) and NCCL (cuda/) communicators share.

A subclass checks `refuse_if_initialised()` first, does its backend's setup, calls
`_init_group(...)`, and implements all_gather, reduce_scatter (after `_check_divisible`) and
barrier its own way.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from tessera.codes import MULTI_DEVICE_TIMEOUT, coded
from tessera.hal.platform import Communicator


class TorchDistCommunicator(Communicator):
    """One torch.distributed process group; all_reduce works in place and returns its argument."""

    @staticmethod
    def refuse_if_initialised() -> None:
        if dist.is_initialized():
            raise RuntimeError("torch.distributed is already initialised in this process; "
                               "destroy the previous communicator first")

    def _init_group(self, backend: str, rank: int, world_size: int, init_method: str,
                    timeout_s: float, **kwargs: Any) -> None:
        try:
            dist.init_process_group(backend, init_method=init_method, rank=rank,
                                    world_size=world_size, timeout=timedelta(seconds=timeout_s),
                                    **kwargs)
        except Exception as exc:
            raise RuntimeError(
                f"rank {rank} of {world_size} could not join the {backend} group at "
                f"{init_method} within {timeout_s:g} s: {type(exc).__name__}: {exc}"
                + coded(MULTI_DEVICE_TIMEOUT)) from exc
        self.rank = rank
        self.world_size = world_size

    def _check_divisible(self, tensor: torch.Tensor, dim: int) -> None:
        if tensor.shape[dim] % self.world_size:
            raise ValueError(f"reduce_scatter: size {tensor.shape[dim]} along dim {dim} is not "
                             f"divisible by world_size {self.world_size}")

    def all_reduce(self, tensor: torch.Tensor) -> torch.Tensor:
        dist.all_reduce(tensor)
        return tensor

    def send(self, tensor: torch.Tensor, dst: int) -> None:
        dist.send(tensor.contiguous(), dst)

    def recv(self, tensor: torch.Tensor, src: int) -> torch.Tensor:
        dist.recv(tensor, src)
        return tensor

    def destroy(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()
