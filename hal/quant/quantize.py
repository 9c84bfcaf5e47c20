"""Float -> runtime scheme quantizers (`--quantization` at load, dummy weights, tests) and the
per-token fp8 activation quantization of W8A8.

    fp8   one scale per output row: amax(|w[n]|) / 448, round to nearest e4m3
    int8  symmetric per group: amax / 127, round to nearest, clamp to [-127, 127]
    int4  asymmetric per group (min/max, the AWQ/GPTQ convention): s = (max - min) / 15, an
          integer zero point z = round(-min / s), q = clamp(round(w / s) + z, 0, 15);
          stored as W = s * q + (-s * z), exact in float32
"""

from __future__ import annotations

import torch

from tessera.hal.quant.weight import (
    FP8_DTYPE,
    FP8_MAX,
    QuantizationError,
    QuantizedWeight,
    check_scheme,
    pack_int4,
)

DEFAULT_GROUP_SIZE = 128  # int8 / int4 at load: AWQ's and GPTQ's usual group
_TINY = 1e-12  # an all-zero row or group gets this scale instead of dividing by zero


def _groups(w: torch.Tensor, group_size: int) -> torch.Tensor:
    n, k = w.shape
    if k % group_size:
        raise QuantizationError(f"group size {group_size} does not divide the {k} input "
                                f"features")
    return w.float().reshape(n, k // group_size, group_size)


def group_size_for(in_features: int, wanted: int = DEFAULT_GROUP_SIZE) -> int:
    """The largest of wanted, 64, 32 that divides in_features (else one group per row)."""
    for gs in (wanted, 64, 32):
        if gs <= in_features and in_features % gs == 0:
            return gs
    return in_features


def quantize_fp8(w: torch.Tensor) -> QuantizedWeight:
    w32 = w.float()
    scales = (w32.abs().amax(dim=1, keepdim=True) / FP8_MAX).clamp_min(_TINY)
    q = (w32 / scales).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    return QuantizedWeight("fp8", q, scales, None, w.shape[1], w.shape[1])


def quantize_int8(w: torch.Tensor, group_size: int = DEFAULT_GROUP_SIZE) -> QuantizedWeight:
    g = _groups(w, group_size)
    scales = (g.abs().amax(dim=2) / 127.0).clamp_min(_TINY)
    q = torch.round(g / scales[..., None]).clamp(-127, 127).to(torch.int8)
    return QuantizedWeight("int8", q.reshape(w.shape), scales, None, group_size, w.shape[1])


def quantize_int4(w: torch.Tensor, group_size: int = DEFAULT_GROUP_SIZE) -> QuantizedWeight:
    g = _groups(w, group_size)
    lo = g.amin(dim=2).clamp(max=0.0)  # the range always holds 0, so zero stays exact
    hi = g.amax(dim=2).clamp(min=0.0)
    scales = ((hi - lo) / 15.0).clamp_min(_TINY)
    zeros = torch.round(-lo / scales).clamp(0, 15)
    q = (torch.round(g / scales[..., None]) + zeros[..., None]).clamp(0, 15).to(torch.uint8)
    return QuantizedWeight("int4", pack_int4(q.reshape(w.shape)), scales, -scales * zeros,
                           group_size, w.shape[1])


def quantize(w: torch.Tensor, scheme: str, group_size: int | None = None) -> QuantizedWeight:
    """A dense weight [out, in] in `scheme` (group size: DEFAULT_GROUP_SIZE or the largest
    that divides the input)."""
    check_scheme(scheme)
    if w.dim() != 2:
        raise QuantizationError(f"only 2-D weights are quantized, got shape {tuple(w.shape)}")
    if scheme == "fp8":
        return quantize_fp8(w)
    gs = group_size or group_size_for(w.shape[1])
    return quantize_int8(w, gs) if scheme == "int8" else quantize_int4(w, gs)


def quantize_activations_fp8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Dynamic per-token scales: (x_q e4m3 [T, K], scale float32 [T, 1]), x ~ x_q * scale."""
    x32 = x.float()
    amax = x32.abs().amax(dim=-1, keepdim=True)
    # a true division (PyTorch multiplies by the reciprocal of a scalar divisor), as kernels
    # computing the same scale do
    scale = (amax / torch.full_like(amax, FP8_MAX)).clamp_min(_TINY)
    return (x32 / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE), scale
