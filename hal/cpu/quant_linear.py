"""The cpu plugin's quantized linears: dequantize a block of output rows into float32, multiply,
repeat. The weights stay quantized in memory (the point of the scheme on a host: a 4-bit
model takes a fraction of the RAM); each step pays a dequantization pass over them.

int4 weights are kept one value per byte on this plugin (`prepare`): splitting nibbles is a
handful of PyTorch passes per call, which would cost several times the matmul; one byte per
value is still a quarter of float32.
"""

from __future__ import annotations

import threading
from dataclasses import replace
from functools import partial

import torch

from tessera.hal.platform import QuantLinearKernel
from tessera.hal.quant.reference import one_token_fused_reference
from tessera.hal.quant.weight import SCHEMES, QuantizedWeight, unpack_int4

# Output rows are dequantized in blocks of up to this many weights (16 MiB of float32) into one
# reused scratch buffer, then multiplied in one matmul per block: every projection of a small
# model (the default one's largest is 3072 x 576) is one block, so a call runs three parallel
# regions (copy_, mul_, mm) whatever its rows. Each region costs its thread team a wake-up and
# a barrier; with two intra-op threads on a loaded machine that was about 0.6 ms per matmul,
# which blocks of 128k weights (7 for the 576 x 1536 down projection) paid seven times:
# 5-7 ms of CPU a call at 2-64 rows against 0.7-0.8 ms at 2-32 rows in one block (the matmul
# itself is 0.1-0.35 ms of it). One thread measured the same in both (0.8 ms at 32 rows). A
# model whose projections exceed a block still never allocates its dense weight.
BLOCK_ELEMENTS = 1 << 22
# Inputs of 2 to this many rows multiply x @ block^T, which MKL runs several times faster
# than block @ x^T with 2-8 columns (0.13-0.19 against 0.24 ms for the whole down projection
# with two threads; 0.02 against 0.66 ms for a block of 85 of its rows); from 16 rows on
# block @ x^T is the faster one (0.24-0.33 against 0.62-0.74 ms at 16-32 rows).
ROWS_FIRST_MAX = 8
_scratch = threading.local()


def _buffer(numel: int) -> torch.Tensor:
    buf = getattr(_scratch, "buf", None)
    if buf is None or buf.numel() < numel:
        # a normal tensor, usable in and out of inference mode (an inference tensor is not)
        with torch.inference_mode(False):
            buf = _scratch.buf = torch.empty(numel, dtype=torch.float32)
    return buf[:numel]


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


def _values(w: QuantizedWeight, start: int, stop: int) -> torch.Tensor:
    """The integer (or e4m3) values of rows [start, stop), in a form copy_ reads."""
    q = w.qweight[start:stop]
    if w.scheme == "fp8":
        return fp8_to_float(q)
    if w.scheme == "int4" and w.packing == "nibbles":
        return unpack_int4(q)
    return q


def apply(x: torch.Tensor, w: QuantizedWeight, bias: torch.Tensor | None) -> torch.Tensor:
    """y = x @ dequantize(w)^T (+ bias), float32 math, in x.dtype.

    Per block of rows: the values times their group scales, then one matmul. The int4
    offsets are added once for the whole layer through the per-group sums of x
    (sum_k x_k (s q_k + b) = sum_k x_k s q_k + b sum_k x_k), and a scale shared by a whole row
    multiplies the output row instead of every weight."""
    if x.shape[-1] != w.in_features:
        raise ValueError(f"quantized linear: x has {x.shape[-1]} features, the weight "
                         f"{w.in_features}")
    x32 = x.float()
    if w.input_perm is not None:
        x32 = x32.index_select(1, w.input_perm)
    n, k, gs = w.out_features, w.in_features, w.group_size
    groups = k // gs
    m = x32.shape[0]
    rows_first = 1 < m <= ROWS_FIRST_MAX
    # rows_first: out [m, n]; else out_t [n, m], transposed at the end.
    out = torch.empty((m, n) if rows_first else (n, m), dtype=torch.float32, device=x.device)
    step = max(1, BLOCK_ELEMENTS // max(1, k))
    scratch = _buffer(min(n, step) * k)
    for start in range(0, n, step):
        stop = min(n, start + step)
        deq = scratch[:(stop - start) * k].view(stop - start, groups, gs)
        deq.copy_(_values(w, start, stop).view(stop - start, groups, gs))
        if groups > 1:
            deq.mul_(w.scales[start:stop, :, None])
        block = deq.view(stop - start, k)
        if rows_first:
            out[:, start:stop] = torch.mm(x32, block.t())
        else:
            torch.mm(block, x32.t(), out=out[start:stop])
    if rows_first:
        if groups == 1:
            out.mul_(w.scales.view(1, n))
        if w.offsets is not None:
            out.addmm_(x32.view(-1, groups, gs).sum(dim=2), w.offsets.t())
    else:
        if groups == 1:
            out.mul_(w.scales)
        if w.offsets is not None:
            out.addmm_(w.offsets, x32.view(-1, groups, gs).sum(dim=2).t())
        out = out.t()
    if bias is not None:
        out = out + bias.float()
    return out.to(x.dtype).contiguous()


def quant_linears() -> dict[str, QuantLinearKernel]:
    # one_token_fused as its definition, the composition, over this plugin's product; `fuses`
    # stays False (a composition saves no launch): the model keeps its plain path here
    return {scheme: QuantLinearKernel(scheme, apply, prepare,
                                      one_token_fused=partial(one_token_fused_reference,
                                                              linear=apply))
            for scheme in SCHEMES}
