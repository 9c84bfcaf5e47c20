"""Reference dense ops in plain PyTorch (semantics: hal/ops.py).

Device-generic on purpose: other plugins borrow them as declared fallbacks. Where precision
matters (norms, rotary, gating) the math runs in float32 and the result is cast back, so the
reference is at least as accurate as any kernel it judges.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def embedding(ids: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return F.embedding(ids.long(), weight)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    x32 = x.float()
    out = x32 * torch.rsqrt(x32.pow(2).mean(dim=-1, keepdim=True) + eps)
    return (out * weight.float()).to(x.dtype)


def fused_add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                       eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    residual_out = x + residual
    return rms_norm(residual_out, weight, eps), residual_out


def rotary_embedding(positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
                     cos_sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    half = cos_sin.shape[-1] // 2
    table = cos_sin[positions.long()].float()
    cos = table[:, None, :half]  # [T, 1, D/2], broadcast over heads
    sin = table[:, None, half:]
    return _rotate(q, cos, sin), _rotate(k, cos, sin)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half].float(), x[..., half:].float()
    # rotate-half: [x1, x2] * cos + [-x2, x1] * sin, with cos/sin repeated across both halves
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(x.dtype)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    if x.dtype == torch.float32:
        return F.silu(x[..., :half]) * x[..., half:]
    return (F.silu(x[..., :half].float()) * x[..., half:].float()).to(x.dtype)


def gelu_tanh_and_mul(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    gate = F.gelu(x[..., :half].float(), approximate="tanh")
    return (gate * x[..., half:].float()).to(x.dtype)


def act_and_mul(x: torch.Tensor, activation: str) -> torch.Tensor:
    """silu_and_mul or gelu_tanh_and_mul by name (the `activation` of fused_moe)."""
    if activation == "silu":
        return silu_and_mul(x)
    if activation == "gelu_tanh":
        return gelu_tanh_and_mul(x)
    raise ValueError(f"unknown activation {activation!r}; have silu, gelu_tanh")


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
           ) -> torch.Tensor:
    return F.linear(x, weight, bias)


def silu_and_mul_linear(x: torch.Tensor, weight: torch.Tensor,
                        bias: torch.Tensor | None = None) -> torch.Tensor:
    """The fused op's definition: silu_and_mul, then linear."""
    return linear(silu_and_mul(x), weight, bias)


def store_kv(k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
             slots: torch.Tensor, *, k_scale: float = 1.0, v_scale: float = 1.0) -> None:
    index = slots.long()
    for cache, x, scale in ((k_cache, k, k_scale), (v_cache, v, v_scale)):
        values = to_cache(x, cache.dtype, scale)
        if cache.dtype == torch.float8_e4m3fn:  # index_copy_ has no fp8 kernel: copy bytes
            cache, values = cache.view(torch.uint8), values.view(torch.uint8)
        cache.index_copy_(0, index, values)


def rotary_store_kv(positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                    cos_sin: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                    slots: torch.Tensor, *, k_scale: float = 1.0, v_scale: float = 1.0
                    ) -> torch.Tensor:
    """The fused op's definition: rotary_embedding, then store_kv of the rotated k."""
    q_out, k_rot = rotary_embedding(positions, q, k, cos_sin)
    store_kv(k_cache, v_cache, k_rot, v, slots, k_scale=k_scale, v_scale=v_scale)
    return q_out


FP8_KV_MAX = 448.0  # largest finite float8_e4m3fn


def to_cache(x: torch.Tensor, dtype: torch.dtype, scale: float) -> torch.Tensor:
    """x / scale in the cache's dtype; into fp8 saturated to its finite range (a plain cast
    would turn an outlier into NaN)."""
    if dtype == torch.float8_e4m3fn:
        x32 = x.float()
        # a true division (PyTorch multiplies by the reciprocal of a scalar divisor, which
        # may round differently), as a kernel dividing by the scale does
        scaled = x32 / torch.full_like(x32, scale) if scale != 1.0 else x32
        return scaled.clamp(-FP8_KV_MAX, FP8_KV_MAX).to(dtype)
    return (x if scale == 1.0 else x.float() / scale).to(dtype)
