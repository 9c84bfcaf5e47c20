"""Launch configurations of the quantized kernels: a few candidates, measured once per
(kernel, scheme, shape, group, batch bucket, dtype) on the device, the fastest kept.

The measurement (autotune.pick) runs the first time a shape is seen outside CUDA graph capture
(the worker's warm-up runs come before its captures, so every captured shape is measured);
during a capture, or under the Triton interpreter, the first candidate is taken as it is.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from tessera.hal.cuda.autotune import pick as _pick
from tessera.hal.cuda.quant_kernels import GEMV_COLUMN, GEMV_EXP_CVT, GEMV_X_VEC
from tessera.hal.quant.weight import QuantizedWeight

# (BLOCK_N, BLOCK_K, num_warps, variant); each thread should have several 16-byte loads in
# flight. The bf16 GEMV's best moves 8 KiB of weight per program per iteration; the wider
# tiles give fp8 / int8 / int4 as many bytes in flight (int4: 16 KiB at 8 x 4096, that is
# 64 products a thread at 8 warps). variant: flags GEMV_COLUMN | GEMV_EXP_CVT | GEMV_X_VEC
# (quant_kernels.py); the formulations are listed side by side so the device measures which
# wins, the first candidate (taken where nothing is measured) the one B12 measured.
_COL, _EXP, _XV = GEMV_COLUMN, GEMV_EXP_CVT, GEMV_X_VEC
GEMV_VARIANTS = tuple(range(8))  # every combination of the three flags
_B12_8BIT = [(2, 2048, 8), (4, 2048, 8), (4, 1024, 4), (8, 1024, 8), (1, 4096, 8)]
_WIDE_8BIT = [(2, 4096, 8), (4, 4096, 8), (8, 2048, 8)]
_GROUPED = (0, _COL, _EXP, _COL | _EXP, _EXP | _XV)  # per wide tile
GEMV_CANDIDATES: dict[str, list[tuple[int, int, int, int]]] = {
    # The H200 sweep of every candidate inside CUDA graphs (benchmarks/results/
    # quant_kernels_h200.json, 37121f2) on the 8B shape's qkv, o, gate_up and down: for fp8
    # the 4 x 1024 tile at 4 warps was the fastest on all four (2.3-3.7 TB/s), while the
    # tuner's own measurement (launch-bound at these 7-32 us) had picked slower tiles for qkv
    # and o (9.9 and 9.2 us against 9.1 and 7.3); one candidate, nothing to mis-measure.
    "fp8": [(4, 1024, 4, 0)],
    "int8": [(*c, 0) for c in _B12_8BIT] + [(*c, v) for c in _WIDE_8BIT for v in _GROUPED]
    + [(*c, _EXP | _XV) for c in _B12_8BIT[:2]],
    # int4: 8 x 4096 with exponent-bit conversion and x-wide loads won on all four (1.3-1.7
    # TB/s), then these, within 10-25%
    "int4": [(8, 4096, 8, _EXP | _XV), (4, 8192, 8, _EXP | _XV), (8, 4096, 8, 0),
             (16, 1024, 8, 0)],
}
# (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages) by batch bucket; BLOCK_K is cut to the
# group size where the group is smaller
GEMM_CANDIDATES: dict[int, list[tuple[int, int, int, int, int]]] = {
    16: [(16, 32, 128, 4, 4), (16, 64, 128, 4, 4), (16, 16, 256, 4, 4), (16, 64, 256, 4, 3)],
    32: [(32, 32, 128, 4, 4), (32, 64, 128, 4, 4), (16, 64, 128, 4, 4), (32, 64, 256, 4, 3)],
    64: [(64, 64, 128, 4, 4), (64, 128, 64, 8, 3), (32, 64, 128, 4, 4)],
    128: [(128, 128, 64, 8, 3), (64, 128, 64, 4, 4), (128, 64, 128, 8, 3)],
    256: [(128, 128, 64, 8, 3), (128, 256, 64, 8, 3), (64, 128, 64, 4, 4)],
}
# W8A8 candidates (fp8 weights, more than SKINNY_MAX_M tokens): qgemm tiles (fp8 dots need
# BLOCK_K >= 32) and SCALED_MM, cuBLASLt through torch._scaled_mm
SCALED_MM: tuple[int, ...] = (0,)
W8A8_CANDIDATES: dict[int, list[tuple[int, ...]]] = {
    64: [(64, 64, 128, 4, 4), (64, 128, 128, 8, 3), (32, 64, 128, 4, 4), SCALED_MM],
    128: [(128, 128, 128, 8, 3), (64, 128, 128, 4, 4), (128, 64, 128, 8, 3), SCALED_MM],
    256: [(128, 128, 128, 8, 3), (128, 256, 128, 8, 3), (64, 128, 128, 4, 4), SCALED_MM],
}


def tile(config: tuple[int, ...]) -> tuple[int, int, int, int, int]:
    """A qgemm tile (block_m, block_n, block_k, num_warps, num_stages) from a chosen config."""
    block_m, block_n, block_k, num_warps, num_stages = config
    return block_m, block_n, block_k, num_warps, num_stages


def batch_bucket(m: int) -> int:
    for bucket in (16, 32, 64, 128):
        if m <= bucket:
            return bucket
    return 256


def _key(kernel: str, w: QuantizedWeight, x: torch.Tensor, bucket: int) -> tuple[Any, ...]:
    return (kernel, w.scheme, w.out_features, w.in_features, w.group_size, bucket, x.dtype,
            x.device.index)


def gemv_candidates(w: QuantizedWeight) -> list[tuple[int, int, int, int]]:
    """The configs that fit the weight: a grouped weight's BLOCK_K holds whole groups."""
    return list(_gemv_candidates(w.scheme, w.num_groups == 1, w.group_size))


@functools.lru_cache(maxsize=64)
def _gemv_candidates(scheme: str, per_row: bool, group_size: int
                     ) -> tuple[tuple[int, int, int, int], ...]:
    # Cached: every one-token quantized linear asks, its choice already kept or not.
    return tuple(c for c in GEMV_CANDIDATES[scheme] if per_row or c[1] % group_size == 0) or \
        ((4, max(group_size, 256), 8, 0),)


def gemv_config(w: QuantizedWeight, x: torch.Tensor, bias: torch.Tensor | None
                ) -> tuple[int, int, int, int]:
    from tessera.hal.cuda.quant_linear import qgemv

    candidates = gemv_candidates(w)
    cfg = _pick(_key("gemv", w, x, 1), candidates, x, lambda c: qgemv(x, w, bias, *c))
    return cfg  # type: ignore[return-value]


def gemm_config(w: QuantizedWeight, x: torch.Tensor, bias: torch.Tensor | None
                ) -> tuple[int, int, int, int, int]:
    from tessera.hal.cuda.quant_linear import qgemm

    bucket = batch_bucket(x.shape[0])
    candidates = GEMM_CANDIDATES[bucket]
    if x.dtype == torch.float32:  # fp32 tiles are twice the registers and shared memory
        candidates = [(min(bm, 32), min(bn, 32), min(bk, 64), nw, min(ns, 2))
                      for bm, bn, bk, nw, ns in candidates[:1]]
    cfg = _pick(_key("gemm", w, x, bucket), candidates, x, lambda c: qgemm(x, w, bias, *tile(c)))
    return cfg  # type: ignore[return-value]


def w8a8_config(w: QuantizedWeight, x: torch.Tensor, bias: torch.Tensor | None
                ) -> tuple[int, ...]:
    """A qgemm tile for the fp8 dot, or SCALED_MM (where torch._scaled_mm can take the
    shapes and measures faster; a device or torch without it fails its measurement and is
    skipped)."""
    from tessera.hal.cuda.quant_linear import fp8_scaled_mm, qgemm, scaled_mm_fits

    bucket = max(64, batch_bucket(x.shape[0]))
    candidates = [c for c in W8A8_CANDIDATES[bucket]
                  if c != SCALED_MM or scaled_mm_fits(x, w)]
    if x.dtype == torch.float32:  # the interpreter: small tiles
        candidates = [(32, 32, 32, 4, 1)]

    def run(c: tuple[int, ...]) -> torch.Tensor:
        if c == SCALED_MM:
            return fp8_scaled_mm(x, w, bias)
        return qgemm(x, w, bias, *tile(c), w8a8=True)
    return _pick(_key("w8a8", w, x, bucket), candidates, x, run)
