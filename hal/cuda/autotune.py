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

from collections.abc import Callable, Sequence
from typing import Any

import torch

Config = tuple[int, ...]
# Every measured key's choice, for this process (the benchmarks report them).
chosen: dict[tuple[Any, ...], Config] = {}


def measurable(x: torch.Tensor) -> bool:
    """On a GPU (the interpreter runs on CPU tensors) and not inside a graph capture."""
    return x.is_cuda and not torch.cuda.is_current_stream_capturing()


def bench_ms(run: Callable[[Config], Any], config: Config) -> float:
    """run(config)'s device time in ms (triton's do_bench: warm-up, then repeats)."""
    from triton.testing import do_bench

    return float(do_bench(lambda: run(config), warmup=2, rep=10))


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
    for cand in candidates:
        try:
            timings.append((bench_ms(run, cand), cand))
        except Exception:  # a candidate the compiler rejects (resources) is skipped  # noqa: BLE001
            continue
    cfg = min(timings, key=lambda t: t[0])[1] if timings else candidates[0]
    chosen[key] = cfg
    return cfg
