"""One-shot all-reduce over NVLink peer memory, for the small all-reduces of tensor-parallel
decode (two per layer, a few KiB to a few MiB each).

NCCL's latency floor (15-18 us inside a CUDA graph for 1-64 tokens of hidden 4096 on two
H200s) is most of a small all-reduce's cost. torch's symmetric memory offers a one-shot
kernel instead: each rank copies its input into its own buffer of a symmetric allocation,
the ranks meet at a barrier of signal pads, and each rank reads every peer's buffer over
NVLink (plain peer loads: no multicast, which stays off) and sums. One kernel, no proxy
thread, capturable in a CUDA graph; a second barrier at its end lets the next call reuse the
buffer. `torch.ops.symm_mem.one_shot_all_reduce_copy_out` does the copy inside the kernel;
torch versions without it get a copy and `one_shot_all_reduce_out`.

Set up collectively by `NcclCommunicator.configure` (every rank of the group, at the same
point), which keeps NCCL unless every rank can use it and a probe gives NCCL's sums.
"""

from __future__ import annotations

import importlib
import logging
import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

log = logging.getLogger(__name__)

# The kernels' dtypes (AT_DISPATCH_FLOAT_AND_BFLOAT16); others go through NCCL.
ONE_SHOT_DTYPES = (torch.bfloat16, torch.float32)
_ALIGN = 16  # bytes: the buffer's offset 0 is 16-byte aligned; inputs must match it


def disable_multicast() -> None:
    """NVLink multicast (NVLS) stays off on the machines this runs on: neither NCCL nor
    symmetric memory may set it up. An operator's own setting wins."""
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")


def local_problem(dtype: torch.dtype, peers: list[int], device: torch.device) -> str | None:
    """Why this rank cannot take part (None: it can), checked without talking to peers."""
    if dtype not in ONE_SHOT_DTYPES:
        return f"{dtype} has no one-shot kernel"
    ops = getattr(torch.ops, "symm_mem", None)
    if ops is None or not hasattr(ops, "one_shot_all_reduce_out"):
        return f"torch {torch.__version__} has no symm_mem.one_shot_all_reduce_out"
    try:
        importlib.import_module("torch.distributed._symmetric_memory")
    except ImportError as exc:
        return f"no torch symmetric memory ({exc})"
    me = device.index if device.index is not None else torch.cuda.current_device()
    for peer in peers:
        if peer != me and not torch.cuda.can_device_access_peer(me, peer):
            return f"device {me} cannot access device {peer}'s memory (no P2P)"
    return None


@dataclass
class OneShotAllReduce:
    """In-place sum of a tensor of `dtype` of at most `max_numel` elements over the group."""

    buffer: torch.Tensor  # this rank's part of the symmetric allocation, [max_numel]
    group_name: str
    max_numel: int
    dtype: torch.dtype
    fused_copy: bool  # one_shot_all_reduce_copy_out exists: the copy runs in the kernel

    @classmethod
    def create(cls, group: Any, max_bytes: int, dtype: torch.dtype,
               device: torch.device) -> OneShotAllReduce:
        """Allocate and exchange the symmetric buffer: collective over `group`."""
        from torch.distributed import _symmetric_memory as symm_mem

        pg = group if group is not None else dist.group.WORLD
        if pg is None:
            raise RuntimeError("one-shot all-reduce: torch.distributed is not initialised")
        name = pg.group_name
        enable = getattr(symm_mem, "enable_symm_mem_for_group", None)
        if enable is not None:
            enable(name)  # needed by older versions; a no-op (or deprecated) in newer ones
        itemsize = torch.empty((), dtype=dtype).element_size()
        numel = max(max_bytes // itemsize // (_ALIGN // itemsize) * (_ALIGN // itemsize),
                    _ALIGN // itemsize)
        buffer = symm_mem.empty(numel, dtype=dtype, device=device)
        symm_mem.rendezvous(buffer, name)
        fused = hasattr(torch.ops.symm_mem, "one_shot_all_reduce_copy_out")
        return cls(buffer, name, numel, dtype, fused)

    def fits(self, tensor: torch.Tensor) -> bool:
        """Whether `tensor` can take the one-shot path (else NCCL): the same dtype, small
        enough, contiguous and aligned like the buffer (the kernel requires equal alignment
        of its input and the buffer)."""
        nbytes = tensor.numel() * tensor.element_size()
        return (tensor.dtype == self.dtype and 0 < tensor.numel() <= self.max_numel
                and tensor.is_contiguous() and tensor.is_cuda
                and nbytes % _ALIGN == 0
                and (tensor.storage_offset() * tensor.element_size()) % _ALIGN == 0)

    def __call__(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sum over the group, written into `tensor` (which is returned)."""
        flat = tensor.view(-1)
        view = self.buffer[: flat.numel()]
        if self.fused_copy:
            torch.ops.symm_mem.one_shot_all_reduce_copy_out(view, flat, "sum",
                                                             self.group_name, flat)
        else:
            view.copy_(flat)
            torch.ops.symm_mem.one_shot_all_reduce_out(view, "sum", self.group_name, flat)
        return tensor


def probe_matches_nccl(one_shot: OneShotAllReduce, group: Any, rank: int,
                       device: torch.device) -> bool:
    """One all-reduce of a pattern through both paths (collective): the same sums? Two
    values are summed in the same order by both; more ranks may round differently."""
    numel = min(one_shot.max_numel, 4096 * 8)
    base = (torch.arange(numel, device=device, dtype=torch.float32) % 251 - 125) / 64
    ours = (base * (rank + 1)).to(one_shot.dtype)
    theirs = ours.clone()
    one_shot(ours)
    dist.all_reduce(theirs, group=group)
    torch.cuda.synchronize(device)
    return bool(torch.allclose(ours.float(), theirs.float(), rtol=1e-2, atol=1e-2))
