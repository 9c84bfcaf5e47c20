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
