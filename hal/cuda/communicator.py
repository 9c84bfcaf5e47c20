"""NCCL collectives through torch.distributed, usable inside captured CUDA graphs.

Collectives are issued synchronously (async_op=False) on the current stream, which is what
CUDA graph capture records; NCCL >= 2.9.6 supports capture. `world_size == 1` and loopback
never reach this class (hal/local_comm.py).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from tessera.hal.dist_comm import TorchDistCommunicator


class NcclCommunicator(TorchDistCommunicator):
    """all_reduce works in place and returns its argument; the others return new tensors."""

    def __init__(self, rank: int, world_size: int, init_method: str,
                 timeout_s: float = 300.0, device_index: int | None = None) -> None:
        self.refuse_if_initialised()
        count = torch.cuda.device_count()
        if count == 0:
            raise RuntimeError("NCCL communicator: no CUDA device is visible")
        self.device = torch.device("cuda", (rank if device_index is None else device_index)
                                   % count)
        torch.cuda.set_device(self.device)
        self._init_group("nccl", rank, world_size, init_method, timeout_s, device_id=self.device)

    def all_gather(self, tensor: torch.Tensor, dim: int = 0) -> torch.Tensor:
        tensor = tensor.contiguous()
        out = torch.empty((self.world_size * tensor.shape[0], *tensor.shape[1:]),
                          dtype=tensor.dtype, device=tensor.device)
        dist.all_gather_into_tensor(out, tensor)
        if dim == 0:
            return out
        return torch.cat(out.chunk(self.world_size, dim=0), dim=dim)

    def reduce_scatter(self, tensor: torch.Tensor, dim: int = 0) -> torch.Tensor:
        self._check_divisible(tensor, dim)
        # NCCL scatters along dim 0; move `dim` there and back.
        src = tensor.movedim(dim, 0).contiguous()
        out = torch.empty((src.shape[0] // self.world_size, *src.shape[1:]), dtype=src.dtype,
                          device=src.device)
        dist.reduce_scatter_tensor(out, src)
        return out.movedim(0, dim).contiguous()

    def barrier(self) -> None:
        dist.barrier(device_ids=[self.device.index])
