"""The cpu plugin's quantized linears: dequantize a block of output rows into float32, multiply,
repeat. The weights stay quantized in memory (the point of the scheme on a host: a 4-bit
model takes a fraction of the RAM); each step pays a dequantization pass over them.

int4 weights are kept one value per byte on this plugin (`prepare`): splitting nibbles is a
handful of PyTorch passes per call, which would cost several times the matmul; one byte per
value is still a quarter of float32.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from tessera.hal.platform import QuantLinearKernel
from tessera.hal.quant.weight import SCHEMES, QuantizedWeight, unpack_int4

# Output rows are dequantized in blocks of at most this many weights (16 MiB of float32), so
# the temporary stays in cache-sized pieces and never approaches the dense weight's size.
BLOCK_ELEMENTS = 1 << 22


def prepare(w: QuantizedWeight) -> QuantizedWeight:
    if w.scheme == "int4" and w.packing == "nibbles":
        return replace(w, qweight=unpack_int4(w.qweight).contiguous(), packing="bytes")
    return w


def fp8_to_float(q: torch.Tensor) -> torch.Tensor:
    """e4m3 -> float32, exactly, about twice as fast as PyTorch's cast on a CPU: the e4m3 bits
    s.eeee.mmm moved into a float16's s.0eeee.mmm0000000 give the same value times 2^-8
    (subnormals included; the exponent bias is 7 against 15)."""
    b = q.view(torch.uint8).to(torch.int16)
    bits = ((b & 0x80) << 8) | ((b & 0x7F) << 7)
    return bits.view(torch.float16).float().mul_(256.0)


def _dequantize_rows(w: QuantizedWeight, start: int, stop: int) -> torch.Tensor:
    rows, k, gs = stop - start, w.in_features, w.group_size
    q = w.qweight[start:stop]
    if w.scheme == "int4" and w.packing == "nibbles":
        q = unpack_int4(q)
    deq = (fp8_to_float(q) if w.scheme == "fp8" else q.float()).view(rows, k // gs, gs)
    deq.mul_(w.scales[start:stop, :, None])
    if w.offsets is not None:
        deq.add_(w.offsets[start:stop, :, None])
    return deq.view(rows, k)


def apply(x: torch.Tensor, w: QuantizedWeight, bias: torch.Tensor | None) -> torch.Tensor:
    """y = x @ dequantize(w)^T (+ bias), float32 math, in x.dtype."""
    if x.shape[-1] != w.in_features:
        raise ValueError(f"quantized linear: x has {x.shape[-1]} features, the weight "
                         f"{w.in_features}")
    x32 = x.float()
    if w.input_perm is not None:
        x32 = x32.index_select(1, w.input_perm)
    n = w.out_features
    out_t = torch.empty((n, x.shape[0]), dtype=torch.float32, device=x.device)
    step = max(1, BLOCK_ELEMENTS // max(1, w.in_features))
    for start in range(0, n, step):
        stop = min(n, start + step)
        torch.mm(_dequantize_rows(w, start, stop), x32.t(), out=out_t[start:stop])
    out = out_t.t()
    if bias is not None:
        out = out + bias.float()
    return out.to(x.dtype).contiguous()


def quant_linears() -> dict[str, QuantLinearKernel]:
    return {scheme: QuantLinearKernel(scheme, apply, prepare) for scheme in SCHEMES}
