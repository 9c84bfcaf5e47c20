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
    offsets, total = [], 0
    for h in hosts:
        offsets.append(total)
        total += -(-h.numel() * h.element_size() // _PACK_ALIGN) * _PACK_ALIGN
    staging = torch.empty(max(total, _PACK_ALIGN), dtype=torch.uint8, pin_memory=True)
    for h, off in zip(hosts, offsets, strict=True):
        nbytes = h.numel() * h.element_size()
        if nbytes:
            staging[off:off + nbytes].view(h.dtype).copy_(h.reshape(-1))
    on_device = staging.to(device, non_blocking=True)
    return [on_device[off:off + h.numel() * h.element_size()].view(h.dtype).view(h.shape)
            for h, off in zip(hosts, offsets, strict=True)]


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
