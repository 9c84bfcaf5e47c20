"""The definition of a quantized linear, and the W8A8 emulation its fp8 kernels are held to.

    linear(x, w: QuantizedWeight, bias) = x @ w.dequantize()^T + bias      (float32, cast back)

A kernel may compute it differently (per-group partial sums, activations quantized to fp8 per
token for an fp8 tensor-core GEMM); the conformance suite states how far from this definition
each scheme may land (hal/conformance_quant.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from tessera.hal.quant.quantize import quantize_activations_fp8
from tessera.hal.quant.weight import QuantizedWeight

if TYPE_CHECKING:
    from tessera.hal.platform import RotaryStore


def quant_linear_reference(x: torch.Tensor, w: QuantizedWeight,
                           bias: torch.Tensor | None = None) -> torch.Tensor:
    out = F.linear(x.float(), w.dequantize(torch.float32).to(x.device),
                   None if bias is None else bias.float())
    return out.to(x.dtype)


def one_token_fused_reference(x: torch.Tensor, w: QuantizedWeight,
                              bias: torch.Tensor | None = None, *,
                              norm: tuple[torch.Tensor, float] | None = None,
                              residual: torch.Tensor | None = None, silu: bool = False,
                              rope: RotaryStore | None = None,
                              linear: Callable[..., torch.Tensor] | None = None
                              ) -> torch.Tensor:
    """The definition of QuantLinearKernel.one_token_fused (hal/platform.py): the reference
    ops composed, `linear` (default quant_linear_reference) the product."""
    from tessera.hal.reference import reference_op

    check_fusions(silu, residual, rope)
    h = x if norm is None else reference_op("rms_norm")(x, norm[0], norm[1])
    y = (linear or quant_linear_reference)(h, w, bias)
    if silu:
        y = reference_op("silu_and_mul")(y)
    if residual is not None:
        y = y + residual
    if rope is not None:
        y = rotate_and_store(y, rope, reference_op("rotary_embedding"),
                             reference_op("store_kv"))
    return y


def rows_fused_reference(x: torch.Tensor, w: QuantizedWeight,
                         bias: torch.Tensor | None = None, *,
                         norm: tuple[torch.Tensor, float] | None = None,
                         residual: torch.Tensor | None = None, silu: bool = False,
                         linear: Callable[..., torch.Tensor] | None = None
                         ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The definition of QuantLinearKernel.rows_fused (hal/platform.py): the reference ops
    composed, `linear` (default quant_linear_reference) the product."""
    from tessera.hal.reference import reference_op

    check_rows_fusions(norm, residual, silu)
    residual_out = None
    if norm is not None and residual is not None:
        h, residual_out = reference_op("fused_add_rms_norm")(x, residual, norm[0], norm[1])
    elif norm is not None:
        h = reference_op("rms_norm")(x, norm[0], norm[1])
    else:
        h = reference_op("silu_and_mul")(x)
    return (linear or quant_linear_reference)(h, w, bias), residual_out


def check_rows_fusions(norm: tuple[torch.Tensor, float] | None, residual: torch.Tensor | None,
                       silu: bool) -> None:
    """rows_fused's rule: one of a norm and the SiLU, a residual only with the norm."""
    if (norm is None) == (not silu) or (residual is not None and norm is None):
        raise ValueError("rows_fused takes a norm (with or without a residual) or silu, "
                         "exactly one")


def check_fusions(silu: bool, residual: torch.Tensor | None, rope: RotaryStore | None) -> None:
    """one_token_fused's rule: silu, a residual and rope exclude each other."""
    if int(silu) + int(residual is not None) + int(rope is not None) > 1:
        raise ValueError("one_token_fused takes one of silu, a residual and rope, not several")


def rotate_and_store(y: torch.Tensor, rope: RotaryStore, rotary: Callable[..., Any],
                     store_kv: Callable[..., Any]) -> torch.Tensor:
    """rope's composition after the product y [1, (Hq + 2 Hk) D]: the rotated q [1, Hq D]."""
    d, hq, hk = rope.head_dim, rope.q_heads, rope.kv_heads
    q, k, v = y.split([hq * d, hk * d, hk * d], dim=-1)
    q, k, v = q.reshape(-1, hq, d), k.reshape(-1, hk, d), v.reshape(-1, hk, d)
    q_out, k_rot = rotary(rope.positions, q, k, rope.cos_sin)
    store_kv(rope.k_cache, rope.v_cache, k_rot, v, rope.slots)
    return q_out.reshape(-1, hq * d)


def fp8_w8a8_reference(x: torch.Tensor, w: QuantizedWeight,
                       bias: torch.Tensor | None = None) -> torch.Tensor:
    """What an fp8 GEMM with dynamic per-token activation scales computes: x quantized to e4m3
    per token, products of e4m3 values accumulated in float32, then both scales applied."""
    if w.scheme != "fp8":
        raise ValueError(f"fp8_w8a8_reference takes an fp8 weight, got {w.scheme}")
    xq, sx = quantize_activations_fp8(x)
    out = (xq.float() @ w.qweight.float().t()) * sx * w.scales[:, 0].float()[None, :]
    if bias is not None:
        out = out + bias.float()
    return out.to(x.dtype)
