"""Measure-once launch configurations: among a kernel's candidate configs, the fastest on this
device for a key (kernel, shape, batch bucket, dtype, device), measured the first time the key
is seen outside CUDA graph capture and kept for the process.

The worker's warm-up runs come before its captures, so every captured shape is measured before
it is captured; during a capture (no host synchronization allowed) or under the Triton
interpreter (nothing to measure) the first candidate is taken as it is, and not kept, so a
later run outside a capture still measures. Used by quant_tune (the quantized linears) and
moe_tune (the fused MoE's grouped GEMMs).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import torch

Config = tuple[int, ...]
# Every measured key's choice, for this process (the benchmarks report them).
chosen: dict[tuple[Any, ...], Config] = {}


@functools.lru_cache(maxsize=16)
def capability(device: torch.device) -> tuple[int, int]:
    """The device's compute capability, asked of the driver once per device."""
    return tuple(torch.cuda.get_device_capability(device))  # type: ignore[return-value]


@functools.lru_cache(maxsize=16)
def sm_count(device_index: int) -> int:
    """The device's multiprocessors, asked of the driver once per device."""
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def measurable(x: torch.Tensor) -> bool:
    """On a GPU (the interpreter runs on CPU tensors) and not inside a graph capture."""
    return x.is_cuda and not torch.cuda.is_current_stream_capturing()


# The measurement: each repeat holds the device in a spin (torch.cuda._sleep) while the host
# queues the L2 flush and the call, so the events around the call time the device alone. With
# triton's do_bench the host's launch work (tens of microseconds for a quantized linear's
# Python path) showed through for kernels of 7-40 us: the H200's quant sweep at 195304e found
# the tuner's pick 10-25% slower than the fastest candidate on several shapes.
REPEATS = 15
SPIN_CYCLES = 200_000  # about 0.1 ms at the H200's clock: more than a call's host work
FLUSH_BYTES = 128 << 20  # more than the L2 of any current GPU (H200: 50 MiB)
# the L2 flush buffer while a pick measures its candidates (dropped after: not held for the
# life of the process)
_flush: dict[torch.device, torch.Tensor] = {}


def bench_ms(run: Callable[[Config], Any], config: Config) -> float:
    """run(config)'s device time in ms: the median of REPEATS calls, each from a cold L2
    and with its launch hidden behind a device-side spin."""
    run(config)  # compile and warm
    dev = torch.device("cuda", torch.cuda.current_device())
    flush = _flush.get(dev)
    if flush is None:
        flush = _flush[dev] = torch.empty(FLUSH_BYTES // 4, dtype=torch.int32, device=dev)
    pairs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
             for _ in range(REPEATS)]
    for start, end in pairs:
        torch.cuda._sleep(SPIN_CYCLES)
        flush.zero_()
        start.record()
        run(config)
        end.record()
    torch.cuda.synchronize()
    times = sorted(start.elapsed_time(end) for start, end in pairs)
    return float(times[len(times) // 2])


def pick(key: tuple[Any, ...], candidates: Sequence[Config], x: torch.Tensor,
         run: Callable[[Config], Any]) -> Config:
    """The config kept for key, else the fastest candidate, measured now where that is
    possible (see the module's docstring), else candidates[0]."""
    cfg = chosen.get(key)
    if cfg is not None:
        return cfg
    if not measurable(x) or len(candidates) == 1:
        return candidates[0]
    timings = []
    try:
        for cand in candidates:
            try:
                timings.append((bench_ms(run, cand), cand))
            except Exception:  # a candidate the compiler rejects (resources) is skipped  # noqa: BLE001
                continue
    finally:
        _flush.clear()
    cfg = min(timings, key=lambda t: t[0])[1] if timings else candidates[0]
    chosen[key] = cfg
    return cfg
