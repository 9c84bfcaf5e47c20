"""Extend (prefill) attention over paged KV: ragged causal queries, cached prefix included.

One program per (request, query head, block of BLOCK_M new tokens). The new tokens' KV is
already in the cache, so a single loop over the request's slots covers the cached prefix and
the new tokens alike; the causal mask only bites in the last blocks. The loop stops at the
block's last query position, so work grows with the causal triangle, not the square.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tessera.hal.cuda.decode_attention import LOG2E, check_paged_inputs, dot_precision

BLOCK_M = 64
BLOCK_N = 64
NUM_WARPS = 4
NUM_STAGES = 2


@triton.jit
def _extend_kernel(q_ptr, kc_ptr, vc_ptr, rtt_ptr, seq_lens_ptr, ext_lens_ptr, qo_ptr, out_ptr,
                   q_s0, q_s1, c_s0, c_s1, rtt_s0, o_s0, o_s1, sm_scale_log2,
                   GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
                   BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, DOT_PREC: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    mblk = tl.program_id(2)
    ext = tl.load(ext_lens_ptr + b).to(tl.int32)
    if mblk * BLOCK_M >= ext:
        return
    seq = tl.load(seq_lens_ptr + b).to(tl.int32)
    prefix = seq - ext
    q_start = tl.load(qo_ptr + b).to(tl.int64)
    kh = h // GROUP

    i = mblk * BLOCK_M + tl.arange(0, BLOCK_M)
    imask = i < ext
    d = tl.arange(0, BLOCK_D)
    dmask = d < HEAD_DIM
    rows = q_start + i
    q = tl.load(q_ptr + rows[:, None] * q_s0 + h * q_s1 + d[None, :],
                mask=imask[:, None] & dmask[None, :], other=0.0)
    qpos = prefix + i

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    end = tl.minimum(seq, prefix + (mblk + 1) * BLOCK_M)
    row_base = rtt_ptr + b * rtt_s0
    for n0 in range(0, end, BLOCK_N):
        pos = n0 + tl.arange(0, BLOCK_N)
        pmask = pos < end
        slot = tl.load(row_base + pos, mask=pmask, other=0).to(tl.int64)
        kv_off = slot[:, None] * c_s0 + kh * c_s1 + d[None, :]
        kvmask = pmask[:, None] & dmask[None, :]
        k = tl.load(kc_ptr + kv_off, mask=kvmask, other=0.0)
        qk = tl.dot(q, tl.trans(k), input_precision=DOT_PREC) * sm_scale_log2
        allowed = pmask[None, :] & (pos[None, :] <= qpos[:, None])
        qk = tl.where(allowed, qk, float("-inf"))
        # Position 0 is allowed for every row, so the first block gives each row a finite max
        # and later fully-masked blocks cannot produce -inf - -inf.
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        p = tl.exp2(qk - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(vc_ptr + kv_off, mask=kvmask, other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PREC)
        m_i = m_new

    out = acc / l_i[:, None]
    tl.store(out_ptr + rows[:, None] * o_s0 + h * o_s1 + d[None, :],
             out.to(out_ptr.dtype.element_ty), mask=imask[:, None] & dmask[None, :])


def attention_extend(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                     req_to_token: torch.Tensor, seq_lens: torch.Tensor,
                     extend_lens: torch.Tensor, qo_indptr: torch.Tensor, scale: float,
                     max_extend_len: int | None = None) -> torch.Tensor:
    """`max_extend_len` (optional) spares a device-to-host read when the caller knows it."""
    tokens, q_heads, head_dim = q.shape
    kv_heads = k_cache.shape[1]
    check_paged_inputs("attention_extend", q, k_cache, req_to_token)
    out = torch.empty((tokens, q_heads, head_dim), dtype=q.dtype, device=q.device)
    batch = seq_lens.shape[0]
    if tokens == 0 or batch == 0:
        return out
    if max_extend_len is None:
        max_extend_len = int(extend_lens.max())
    if max_extend_len <= 0:
        return out
    block_m = BLOCK_M if q.dtype != torch.float32 else min(BLOCK_M, 32)
    block_n = BLOCK_N if q.dtype != torch.float32 else min(BLOCK_N, 32)
    grid = (batch, q_heads, triton.cdiv(max_extend_len, block_m))
    _extend_kernel[grid](
        q, k_cache, v_cache, req_to_token, seq_lens, extend_lens, qo_indptr, out,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), req_to_token.stride(0),
        out.stride(0), out.stride(1), float(scale) * LOG2E, GROUP=q_heads // kv_heads,
        HEAD_DIM=head_dim, BLOCK_M=block_m, BLOCK_N=block_n,
        BLOCK_D=triton.next_power_of_2(head_dim), DOT_PREC=dot_precision(q.dtype),
        num_warps=NUM_WARPS, num_stages=NUM_STAGES)
    return out
