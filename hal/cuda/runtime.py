"""The cuda plugin's events, asynchronous copies through pinned host memory, and NVTX ranges.

A copy from pageable host memory makes the host wait for the whole stream; from pinned memory
it is queued behind the work already there, so the worker can queue step n+1 while step n
runs and read step n's tokens once its event has completed.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from tessera.hal.platform import Event


class CudaEvent(Event):
    """`Event` on the current CUDA stream (hal/platform.py)."""

    def __init__(self) -> None:
        self._event = torch.cuda.Event()

    def record(self) -> None:
        self._event.record()

    def query(self) -> bool:
        return bool(self._event.query())

    def synchronize(self) -> None:
        self._event.synchronize()


def pinned_empty(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    return torch.empty(shape, dtype=dtype, pin_memory=True)


def host_to_device(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    if device.type != "cuda":
        return host.to(device)
    return host.pin_memory().to(device, non_blocking=True)


_PACK_ALIGN = 16  # bytes: every tensor of a packed copy starts 16-byte aligned


def host_to_device_many(hosts: list[torch.Tensor],
                        device: torch.device) -> list[torch.Tensor]:
    """The tensors packed into one pinned host buffer (torch's caching host allocator keeps
    it until its copy has run), sent in one copy, returned as views of the device buffer:
    one pinning and one copy a step instead of one per input."""
    if device.type != "cuda" or len(hosts) < 2:
        return [host_to_device(h, device) for h in hosts]
    offsets, total = pack_offsets(hosts)
    staging = torch.empty(max(total, _PACK_ALIGN), dtype=torch.uint8, pin_memory=True)
    pack(hosts, offsets, staging)
    return packed_views(staging.to(device, non_blocking=True), hosts, offsets)


def pack_offsets(hosts: list[torch.Tensor]) -> tuple[list[int], int]:
    """Each tensor's byte offset in the packed buffer (16-byte aligned) and its size."""
    offsets, total = [], 0
    for h in hosts:
        offsets.append(total)
        total += -(-h.numel() * h.element_size() // _PACK_ALIGN) * _PACK_ALIGN
    return offsets, total


def pack(hosts: list[torch.Tensor], offsets: list[int], staging: torch.Tensor) -> None:
    """The host tensors' bytes into the uint8 staging buffer at their offsets: numpy slice
    assignments where numpy holds the dtype (a few microseconds each, against four torch
    calls a tensor), torch's copy for the rest (bfloat16)."""
    raw = staging.numpy()
    for h, off in zip(hosts, offsets, strict=True):
        nbytes = h.numel() * h.element_size()
        if not nbytes:
            continue
        if h.dtype == torch.bfloat16:
            staging[off:off + nbytes].view(h.dtype).copy_(h.reshape(-1))
        else:
            raw[off:off + nbytes] = h.contiguous().numpy().reshape(-1).view("u1")


def packed_views(on_device: torch.Tensor, hosts: list[torch.Tensor],
                 offsets: list[int]) -> list[torch.Tensor]:
    """The packed buffer's tensors, views of it with the hosts' dtypes and shapes (one dtype
    view of the whole buffer per dtype, then a slice each)."""
    by_dtype: dict[torch.dtype, torch.Tensor] = {}
    out = []
    for h, off in zip(hosts, offsets, strict=True):
        base = by_dtype.get(h.dtype)
        if base is None:
            base = by_dtype[h.dtype] = on_device.view(h.dtype)
        start = off // h.element_size()
        view = base[start:start + h.numel()]
        out.append(view if h.dim() == 1 else view.view(h.shape))
    return out


def device_to_host(tensor: torch.Tensor) -> torch.Tensor:
    if not tensor.is_cuda:
        return tensor
    host = pinned_empty(tuple(tensor.shape), tensor.dtype)
    host.copy_(tensor, non_blocking=True)
    return host


@contextlib.contextmanager
def nvtx_range(name: str) -> Iterator[None]:
    torch.cuda.nvtx.range_push(name)
    try:
        yield
    finally:
        torch.cuda.nvtx.range_pop()
