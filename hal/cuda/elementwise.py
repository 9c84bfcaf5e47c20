"""Small memory-bound ops as Triton kernels: rotary embedding, SiLU/GELU-and-mul, KV store,
and rotary fused with the KV store (one launch instead of two, k never written back).

Each reads its inputs once and writes its outputs once, math in fp32. Inputs may be strided
views (q/k/v slices of a fused QKV projection) as long as the innermost dimension is
contiguous.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tessera.hal.cuda import pdl
from tessera.hal.cuda.pdl import enter as pdl_enter
from tessera.hal.cuda.quant_kernels import QUANT_ROW_MAX, quant_row_fp8


def _check_inner_contiguous(name: str, t: torch.Tensor) -> None:
    if t.stride(-1) != 1:
        raise ValueError(f"{name} must be contiguous in its last dimension, got strides "
                         f"{t.stride()} for shape {tuple(t.shape)}")


@triton.jit
def _rotary_kernel(pos_ptr, q_ptr, k_ptr, qo_ptr, ko_ptr, cs_ptr, q_s0, q_s1, k_s0, k_s1,
                   qo_s0, qo_s1, ko_s0, ko_s1, cs_s0, n_q_heads, n_k_heads,
                   HALF: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_HALF: tl.constexpr,
                   Q_BLOCKS: tl.constexpr, USE_PDL: tl.constexpr = False):
    # One launch rotates q and k: head blocks 0 .. Q_BLOCKS-1 are q's, the rest k's.
    pdl_enter(USE_PDL)
    t = tl.program_id(0).to(tl.int64)
    blk = tl.program_id(1)
    pos = tl.load(pos_ptr + t).to(tl.int64)
    d = tl.arange(0, BLOCK_HALF)
    dmask = d < HALF
    cos = tl.load(cs_ptr + pos * cs_s0 + d, mask=dmask, other=0.0).to(tl.float32)
    sin = tl.load(cs_ptr + pos * cs_s0 + HALF + d, mask=dmask, other=0.0).to(tl.float32)
    is_q = blk < Q_BLOCKS
    h = tl.where(is_q, blk, blk - Q_BLOCKS) * BLOCK_H + tl.arange(0, BLOCK_H)
    n_heads = tl.where(is_q, n_q_heads, n_k_heads)
    mask = (h[:, None] < n_heads) & dmask[None, :]
    if is_q:
        src = q_ptr + t * q_s0 + h[:, None] * q_s1 + d[None, :]
        dst = qo_ptr + t * qo_s0 + h[:, None] * qo_s1 + d[None, :]
    else:
        src = k_ptr + t * k_s0 + h[:, None] * k_s1 + d[None, :]
        dst = ko_ptr + t * ko_s0 + h[:, None] * ko_s1 + d[None, :]
    x1 = tl.load(src, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(src + HALF, mask=mask, other=0.0).to(tl.float32)
    o1 = x1 * cos[None, :] - x2 * sin[None, :]
    o2 = x2 * cos[None, :] + x1 * sin[None, :]
    tl.store(dst, o1.to(qo_ptr.dtype.element_ty), mask=mask)
    tl.store(dst + HALF, o2.to(qo_ptr.dtype.element_ty), mask=mask)


def rotary_embedding(positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
                     cos_sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    for name, t in (("q", q), ("k", k), ("cos_sin", cos_sin)):
        _check_inner_contiguous(f"rotary_embedding {name}", t)
    tokens, q_heads, dim = q.shape
    k_heads = k.shape[1]
    if dim % 2 or cos_sin.shape[-1] != dim or k.shape[2] != dim or q.dtype != k.dtype:
        raise ValueError(f"rotary_embedding: q {tuple(q.shape)} {q.dtype} and k "
                         f"{tuple(k.shape)} {k.dtype} need one even head dim and dtype matching "
                         f"cos_sin's last dimension {cos_sin.shape[-1]}")
    q_out = torch.empty((tokens, q_heads, dim), dtype=q.dtype, device=q.device)
    k_out = torch.empty((tokens, k_heads, dim), dtype=k.dtype, device=k.device)
    if tokens == 0:
        return q_out, k_out
    half = dim // 2
    block_half = triton.next_power_of_2(half)
    block_h = max(1, min(triton.next_power_of_2(max(q_heads, k_heads)), 4096 // block_half))
    q_blocks = triton.cdiv(q_heads, block_h)
    grid = (tokens, q_blocks + triton.cdiv(k_heads, block_h))
    _rotary_kernel[grid](positions, q, k, q_out, k_out, cos_sin, q.stride(0), q.stride(1),
                         k.stride(0), k.stride(1), q_out.stride(0), q_out.stride(1),
                         k_out.stride(0), k_out.stride(1), cos_sin.stride(0), q_heads, k_heads,
                         HALF=half, BLOCK_H=block_h, BLOCK_HALF=block_half, Q_BLOCKS=q_blocks,
                         num_warps=4, **pdl.launch_options())
    return q_out, k_out


@triton.jit
def _act_and_mul_kernel(x_ptr, out_ptr, x_s0, o_s0, inter, BLOCK: tl.constexpr,
                        GELU: tl.constexpr, USE_PDL: tl.constexpr = False):
    pdl_enter(USE_PDL)
    t = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < inter
    out = _act_and_mul_cols(x_ptr, t, x_s0, inter, cols, mask, GELU)
    tl.store(out_ptr + t * o_s0 + cols, out.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _silu_and_mul_quant_fp8_kernel(x_ptr, q_ptr, scale_ptr, x_s0, q_s0, inter,
                                   BLOCK: tl.constexpr, USE_PDL: tl.constexpr = False):
    """silu_and_mul's row (one block holds it) quantized to e4m3 for a W8A8 product
    (quant_rows_fp8_kernel's scale a row) instead of stored, rounded to x's dtype first as
    the composition stores it."""
    pdl_enter(USE_PDL)
    t = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < inter
    out = _act_and_mul_cols(x_ptr, t, x_s0, inter, cols, mask, False)
    q, scale = quant_row_fp8(tl.where(mask, out.to(x_ptr.dtype.element_ty).to(tl.float32),
                                      0.0))
    tl.store(q_ptr + t * q_s0 + cols, q.to(q_ptr.dtype.element_ty), mask=mask)
    tl.store(scale_ptr + t, scale)


@triton.jit
def _act_and_mul_cols(x_ptr, t, x_s0, inter, cols, mask, GELU: tl.constexpr):
    """act(gate) * up over these columns of row t of [gate | up], in float32."""
    gate = tl.load(x_ptr + t * x_s0 + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + t * x_s0 + inter + cols, mask=mask, other=0.0).to(tl.float32)
    if GELU:
        # tanh(z) = 1 - 2 / (exp(2z) + 1)
        # |z| <= 20 already gives tanh = +-1 in fp32; the clamp keeps exp finite.
        z = 0.7978845608028654 * (gate + 0.044715 * gate * gate * gate)
        z = tl.minimum(tl.maximum(z, -20.0), 20.0)
        act = 0.5 * gate * (2.0 - 2.0 / (tl.exp(2.0 * z) + 1.0))
    else:
        act = gate / (1.0 + tl.exp(-gate))
    return act * up


def _act_and_mul(x: torch.Tensor, name: str, gelu: bool) -> torch.Tensor:
    _check_inner_contiguous(f"{name} input", x)
    tokens, width = x.shape
    if width % 2:
        raise ValueError(f"{name} expects an even last dimension (gate | up), got {width}")
    inter = width // 2
    out = torch.empty((tokens, inter), dtype=x.dtype, device=x.device)
    if tokens == 0:
        return out
    block = min(1024, triton.next_power_of_2(inter))
    _act_and_mul_kernel[(tokens, triton.cdiv(inter, block))](
        x, out, x.stride(0), out.stride(0), inter, BLOCK=block, GELU=gelu, num_warps=4,
        **pdl.launch_options())
    return out


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    return _act_and_mul(x, "silu_and_mul", gelu=False)


def silu_and_mul_quant_fp8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(q e4m3 [T, I], scales float32 [T, 1]): silu_and_mul of x [T, 2I] then
    quantize_rows_fp8 of its output, in one launch and with the composition's values; I up
    to QUANT_ROW_MAX."""
    _check_inner_contiguous("silu_and_mul_quant_fp8 input", x)
    tokens, width = x.shape
    if width % 2 or width // 2 > QUANT_ROW_MAX:
        raise ValueError(f"silu_and_mul_quant_fp8 expects an even last dimension of at most "
                         f"{2 * QUANT_ROW_MAX} (gate | up), got {width}")
    inter = width // 2
    q = torch.empty((tokens, inter), dtype=torch.float8_e4m3fn, device=x.device)
    scales = torch.empty((tokens, 1), dtype=torch.float32, device=x.device)
    if tokens:
        block = triton.next_power_of_2(inter)
        _silu_and_mul_quant_fp8_kernel[(tokens,)](
            x, q, scales, x.stride(0), q.stride(0), inter, BLOCK=block,
            num_warps=min(max(block // 512, 1), 16), **pdl.launch_options())
    return q, scales


def gelu_tanh_and_mul(x: torch.Tensor) -> torch.Tensor:
    return _act_and_mul(x, "gelu_tanh_and_mul", gelu=True)


@triton.jit
def _store_kv_kernel(kc_ptr, vc_ptr, k_ptr, v_ptr, slot_ptr, k_s0, k_s1, v_s0, v_s1, c_s0, c_s1,
                     n_heads, k_scale, v_scale, HEAD_DIM: tl.constexpr,
                     BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr, FP8: tl.constexpr,
                     USE_PDL: tl.constexpr = False):
    pdl_enter(USE_PDL)
    t = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_ptr + t).to(tl.int64)
    h = tl.arange(0, BLOCK_H)
    d = tl.arange(0, BLOCK_D)
    mask = (h[:, None] < n_heads) & (d[None, :] < HEAD_DIM)
    k = tl.load(k_ptr + t * k_s0 + h[:, None] * k_s1 + d[None, :], mask=mask)
    v = tl.load(v_ptr + t * v_s0 + h[:, None] * v_s1 + d[None, :], mask=mask)
    if FP8:  # k / k_scale saturated to e4m3's finite range (a plain cast would make NaN)
        k = tl.minimum(tl.maximum(tl.div_rn(k.to(tl.float32), k_scale), -448.0), 448.0)
        v = tl.minimum(tl.maximum(tl.div_rn(v.to(tl.float32), v_scale), -448.0), 448.0)
    dst = slot * c_s0 + h[:, None] * c_s1 + d[None, :]
    tl.store(kc_ptr + dst, k.to(kc_ptr.dtype.element_ty), mask=mask)
    tl.store(vc_ptr + dst, v.to(vc_ptr.dtype.element_ty), mask=mask)


def store_kv(k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
             slots: torch.Tensor, *, k_scale: float = 1.0, v_scale: float = 1.0) -> None:
    for name, t in (("k", k), ("v", v), ("k_cache", k_cache), ("v_cache", v_cache)):
        _check_inner_contiguous(name, t)
    if k_cache.stride() != v_cache.stride():
        raise ValueError("store_kv: k_cache and v_cache must have the same layout")
    tokens, heads, dim = k.shape
    if tokens == 0:
        return
    _store_kv_kernel[(tokens,)](
        k_cache, v_cache, k, v, slots, k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        k_cache.stride(0), k_cache.stride(1), heads, float(k_scale), float(v_scale), HEAD_DIM=dim,
        BLOCK_H=triton.next_power_of_2(heads), BLOCK_D=triton.next_power_of_2(dim),
        FP8=k_cache.dtype == torch.float8_e4m3fn, num_warps=4, **pdl.launch_options())


@triton.jit
def _cos_sin(pos_ptr, cs_ptr, t, cs_s0, d, dmask, HALF: tl.constexpr):
    """Token t's rows of the cos | sin table, float32."""
    pos = tl.load(pos_ptr + t).to(tl.int64)
    cos = tl.load(cs_ptr + pos * cs_s0 + d, mask=dmask, other=0.0).to(tl.float32)
    sin = tl.load(cs_ptr + pos * cs_s0 + HALF + d, mask=dmask, other=0.0).to(tl.float32)
    return cos, sin


@triton.jit
def _rotary_store_kv_kernel(pos_ptr, slot_ptr, q_ptr, k_ptr, v_ptr, qo_ptr, kc_ptr, vc_ptr,
                            cs_ptr, q_s0, q_s1, k_s0, k_s1, v_s0, v_s1, qo_s0, qo_s1, c_s0, c_s1,
                            cs_s0, n_q_heads, n_k_heads, k_scale, v_scale,
                            HALF: tl.constexpr, BLOCK_H: tl.constexpr,
                            BLOCK_HALF: tl.constexpr, Q_BLOCKS: tl.constexpr,
                            FP8: tl.constexpr, USE_PDL: tl.constexpr = False):
    # Head blocks 0 .. Q_BLOCKS-1 rotate q into q_out; the others rotate k and store it, and
    # v, into the cache slot of their token.
    pdl_enter(USE_PDL)
    t = tl.program_id(0).to(tl.int64)
    blk = tl.program_id(1)
    d = tl.arange(0, BLOCK_HALF)
    dmask = d < HALF
    # The two branches name their values apart: Triton merges a name bound in both branches
    # into one value, which must then have one type. Each loads its heads before the table
    # row, whose address waits on the position: a GPU issues in order, so loads after that
    # one would wait a round trip for it.
    if blk < Q_BLOCKS:
        qh = blk * BLOCK_H + tl.arange(0, BLOCK_H)
        qmask = (qh[:, None] < n_q_heads) & dmask[None, :]
        q_src = q_ptr + t * q_s0 + qh[:, None] * q_s1 + d[None, :]
        q1 = tl.load(q_src, mask=qmask, other=0.0).to(tl.float32)
        q2 = tl.load(q_src + HALF, mask=qmask, other=0.0).to(tl.float32)
        cos, sin = _cos_sin(pos_ptr, cs_ptr, t, cs_s0, d, dmask, HALF)
        q_dst = qo_ptr + t * qo_s0 + qh[:, None] * qo_s1 + d[None, :]
        tl.store(q_dst, (q1 * cos[None, :] - q2 * sin[None, :]).to(qo_ptr.dtype.element_ty),
                 mask=qmask)
        tl.store(q_dst + HALF,
                 (q2 * cos[None, :] + q1 * sin[None, :]).to(qo_ptr.dtype.element_ty),
                 mask=qmask)
    else:
        kh = (blk - Q_BLOCKS) * BLOCK_H + tl.arange(0, BLOCK_H)
        kmask = (kh[:, None] < n_k_heads) & dmask[None, :]
        slot = tl.load(slot_ptr + t).to(tl.int64)
        k_src = k_ptr + t * k_s0 + kh[:, None] * k_s1 + d[None, :]
        x1 = tl.load(k_src, mask=kmask, other=0.0).to(tl.float32)
        x2 = tl.load(k_src + HALF, mask=kmask, other=0.0).to(tl.float32)
        v_src = v_ptr + t * v_s0 + kh[:, None] * v_s1 + d[None, :]
        v1 = tl.load(v_src, mask=kmask, other=0.0).to(tl.float32)
        v2 = tl.load(v_src + HALF, mask=kmask, other=0.0).to(tl.float32)
        kcos, ksin = _cos_sin(pos_ptr, cs_ptr, t, cs_s0, d, dmask, HALF)
        # Rounded to k's dtype first, as the unfused rotary returns it to store_kv.
        k1 = (x1 * kcos[None, :] - x2 * ksin[None, :]).to(k_ptr.dtype.element_ty).to(tl.float32)
        k2 = (x2 * kcos[None, :] + x1 * ksin[None, :]).to(k_ptr.dtype.element_ty).to(tl.float32)
        if FP8:  # x / scale saturated to e4m3's finite range, as store_kv does
            k1 = tl.minimum(tl.maximum(tl.div_rn(k1, k_scale), -448.0), 448.0)
            k2 = tl.minimum(tl.maximum(tl.div_rn(k2, k_scale), -448.0), 448.0)
            v1 = tl.minimum(tl.maximum(tl.div_rn(v1, v_scale), -448.0), 448.0)
            v2 = tl.minimum(tl.maximum(tl.div_rn(v2, v_scale), -448.0), 448.0)
        c_off = slot * c_s0 + kh[:, None] * c_s1 + d[None, :]
        tl.store(kc_ptr + c_off, k1.to(kc_ptr.dtype.element_ty), mask=kmask)
        tl.store(kc_ptr + c_off + HALF, k2.to(kc_ptr.dtype.element_ty), mask=kmask)
        tl.store(vc_ptr + c_off, v1.to(vc_ptr.dtype.element_ty), mask=kmask)
        tl.store(vc_ptr + c_off + HALF, v2.to(vc_ptr.dtype.element_ty), mask=kmask)


def rotary_store_kv(positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                    cos_sin: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                    slots: torch.Tensor, *, k_scale: float = 1.0, v_scale: float = 1.0
                    ) -> torch.Tensor:
    """rotary_embedding then store_kv in one launch (hal/ops.py); returns the rotated q."""
    for name, t in (("q", q), ("k", k), ("v", v), ("cos_sin", cos_sin), ("k_cache", k_cache),
                    ("v_cache", v_cache)):
        _check_inner_contiguous(f"rotary_store_kv {name}", t)
    if k_cache.stride() != v_cache.stride():
        raise ValueError("rotary_store_kv: k_cache and v_cache must have the same layout")
    tokens, q_heads, dim = q.shape
    k_heads = k.shape[1]
    if (dim % 2 or cos_sin.shape[-1] != dim or k.shape[2] != dim or v.shape != k.shape
            or q.dtype != k.dtype or k_cache.shape[1:] != k.shape[1:]):
        raise ValueError(f"rotary_store_kv: q {tuple(q.shape)} {q.dtype}, k {tuple(k.shape)} "
                         f"{k.dtype}, v {tuple(v.shape)} and the cache "
                         f"{tuple(k_cache.shape)} need one even head dim matching cos_sin's "
                         f"last dimension {cos_sin.shape[-1]}, one dtype for q and k, and "
                         f"the cache's heads")
    q_out = torch.empty((tokens, q_heads, dim), dtype=q.dtype, device=q.device)
    if tokens == 0:
        return q_out
    half = dim // 2
    block_half = triton.next_power_of_2(half)
    block_h = max(1, min(triton.next_power_of_2(max(q_heads, k_heads)), 4096 // block_half))
    q_blocks = triton.cdiv(q_heads, block_h)
    grid = (tokens, q_blocks + triton.cdiv(k_heads, block_h))
    _rotary_store_kv_kernel[grid](
        positions, slots, q, k, v, q_out, k_cache, v_cache, cos_sin, q.stride(0), q.stride(1),
        k.stride(0), k.stride(1), v.stride(0), v.stride(1), q_out.stride(0), q_out.stride(1),
        k_cache.stride(0), k_cache.stride(1), cos_sin.stride(0), q_heads, k_heads,
        float(k_scale), float(v_scale), HALF=half, BLOCK_H=block_h, BLOCK_HALF=block_half,
        Q_BLOCKS=q_blocks, FP8=k_cache.dtype == torch.float8_e4m3fn, num_warps=4,
        **pdl.launch_options())
    return q_out
