"""Extend (prefill) attention over paged KV: ragged causal queries, cached prefix included.

The launch is static: its grid depends only on the shapes (T tokens, B requests), never on
the lengths, so a mixed or prefill step can be captured in a graph at a padded size and no
length is read back to the host.

- Requests extending by one token (the decodes of a mixed batch) go to the split-KV decode
  kernel (`decode_attention.launch_decode`), which reads each KV row once per query group
  instead of once per query head and wastes no tile rows on a single query.
- The others are cut into blocks of BLOCK_M new tokens, numbered request by request; the
  blocks of the padding rows after the last request (rows qo_indptr[B] .. T-1, which a step
  captured at a padded size has) follow and are written as zeros. Each program finds the
  request of a block on the device, from a prefix sum of the requests' block counts, and
  takes every G-th block, G programs per query head (`extend_programs`): as many as a single
  prefill of T tokens needs, plus a few spare for the partial blocks of further requests.

Within a block, one loop over the request's slots covers the cached prefix and the new tokens
alike (their KV is already stored); the causal mask only bites in the last blocks. The loop
stops at the block's last query position, so work grows with the causal triangle.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tessera.hal.cuda import pdl
from tessera.hal.cuda.decode_attention import (
    E4M3_F16_SHIFT,
    LOG2E,
    asm_cvt,
    check_paged_inputs,
    dot_precision,
    e4m3_words_to_f16,
    fp8_words,
    launch_decode,
    scores_log2,
)
from tessera.hal.cuda.pdl import enter as pdl_enter

# Tunables, overridable by benchmarks (tests/hal_cuda/gpu_step_profile.py sweeps them).
BLOCK_M = 64
BLOCK_N = 64
NUM_WARPS = 4
# Three stages over a bf16 / f16 cache: the H200 sweep at 2133961 (step_profile sweep_extend)
# found them 1-9% faster than two on every shape (prefill 512 / 2048, a chunk after 3584
# cached tokens, 32 decodes beside a 256-token chunk). An fp8 cache keeps two (not swept).
NUM_STAGES = 3
FP8_NUM_STAGES = 2
SPARE_PROGRAMS = 16  # per head, beyond one per BLOCK_M tokens (see extend_programs)


@triton.jit
def _attend_tile(q, kc_ptr, vc_ptr, row_base, n0, end, qpos, kh, d, m_i, l_i, acc, c_s0, c_s1,
                 sm_scale_log2, window, logit_cap, HAS_CAP: tl.constexpr,
                 HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                 DOT_PREC: tl.constexpr, MASKED: tl.constexpr, FP8_WORDS: tl.constexpr,
                 ASM_CVT: tl.constexpr):
    """One BLOCK_N tile of keys for a block of queries. Unmasked tiles (every key visible to
    every query of the block: before its first query position and, with a sliding window,
    inside the window of its last) skip the position masks entirely. FP8_WORDS: an fp8 cache
    read as uint16 words of two elements (decode_attention.e4m3_words_to_f16)."""
    pos = n0 + tl.arange(0, BLOCK_N)
    pmask = pos < end
    if MASKED:
        slot = tl.load(row_base + pos, mask=pmask, other=0).to(tl.int64)
    else:
        slot = tl.load(row_base + pos).to(tl.int64)
    if FP8_WORDS:
        col = tl.arange(0, BLOCK_D // 2)
        width = HEAD_DIM // 2
        other = 0  # uint16 words
    else:
        col = d
        width = HEAD_DIM
        other = 0.0  # type: ignore[assignment]  # (Triton casts no int to fp8)
    kv_off = slot[:, None] * c_s0 + kh * c_s1 + col[None, :]
    if MASKED:
        kvmask = pmask[:, None] & (col < width)[None, :]
        k = tl.load(kc_ptr + kv_off, mask=kvmask, other=other)
        v = tl.load(vc_ptr + kv_off, mask=kvmask, other=other)
    elif HEAD_DIM == BLOCK_D:
        k = tl.load(kc_ptr + kv_off)
        v = tl.load(vc_ptr + kv_off)
    else:
        k = tl.load(kc_ptr + kv_off, mask=(col < width)[None, :], other=other)
        v = tl.load(vc_ptr + kv_off, mask=(col < width)[None, :], other=other)
    if FP8_WORDS:
        k = e4m3_words_to_f16(k, BLOCK_N, BLOCK_D, ASM_CVT)
        v = e4m3_words_to_f16(v, BLOCK_N, BLOCK_D, ASM_CVT)
    # an fp8 cache is read as q's dtype (exact); its scales are folded in by the caller
    k = k.to(q.dtype)
    v = v.to(q.dtype)
    qk = scores_log2(tl.dot(q, tl.trans(k), input_precision=DOT_PREC), sm_scale_log2,
                     logit_cap, HAS_CAP)
    if MASKED:
        allowed = pmask[None, :] & (pos[None, :] <= qpos[:, None]) & \
            ((window <= 0) | (pos[None, :] > qpos[:, None] - window))
        qk = tl.where(allowed, qk, float("-inf"))
    # A row may see nothing in a masked tile (before its window, or past its position): its
    # max stays -inf; subtracting 0 instead keeps p = 0 and alpha = 0 or 1, not NaN.
    m_new = tl.maximum(m_i, tl.max(qk, 1))
    m_sub = tl.where(m_new == float("-inf"), 0.0, m_new)
    p = tl.exp2(qk - m_sub[:, None])
    alpha = tl.exp2(m_i - m_sub)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PREC)
    return m_new, l_i, acc


@triton.jit
def _attend_block(q_ptr, kc_ptr, vc_ptr, rtt_ptr, out_ptr, b, mblk, ext, seq, q_start, h,
                  q_s0, q_s1, c_s0, c_s1, rtt_s0, o_s0, o_s1, sm_scale_log2, window, logit_cap,
                  HAS_CAP: tl.constexpr, GROUP: tl.constexpr, HEAD_DIM: tl.constexpr,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                  DOT_PREC: tl.constexpr, FP8_WORDS: tl.constexpr, ASM_CVT: tl.constexpr):
    """Block `mblk` of request b's new tokens, query head h. With a sliding window the loop
    starts at the tile of the first position the block's first query sees."""
    prefix = seq - ext
    kh = h // GROUP
    d = tl.arange(0, BLOCK_D)
    dmask = d < HEAD_DIM
    i = mblk * BLOCK_M + tl.arange(0, BLOCK_M)
    imask = i < ext
    rows = q_start + i
    q = tl.load(q_ptr + rows[:, None] * q_s0 + h * q_s1 + d[None, :],
                mask=imask[:, None] & dmask[None, :], other=0.0)
    qpos = prefix + i
    if FP8_WORDS:  # as decode_attention's stage 1: float16 dots for a 16-bit q
        if q.dtype != tl.float32:
            q = q.to(tl.float16)
        if not ASM_CVT:
            sm_scale_log2 = sm_scale_log2 / E4M3_F16_SHIFT

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    end = tl.minimum(seq, prefix + (mblk + 1) * BLOCK_M)
    row_base = rtt_ptr + b * rtt_s0
    # Tiles [lo, full) may hold keys some rows do not see (before their window) and tiles
    # from `diag` on keys at or past the first query position: both masked. Tiles between
    # are visible to every query of the block.
    first_q = prefix + mblk * BLOCK_M
    last_q = prefix + tl.minimum(ext, (mblk + 1) * BLOCK_M) - 1
    diag = first_q // BLOCK_N * BLOCK_N
    lo = tl.where(window > 0, tl.maximum(first_q - window + 1, 0) // BLOCK_N * BLOCK_N, 0)
    full = tl.where(window > 0, tl.maximum(last_q - window + 1, 0), 0)
    full = tl.minimum(tl.maximum((full + BLOCK_N - 1) // BLOCK_N * BLOCK_N, lo), diag)
    for n0 in range(lo, full, BLOCK_N):
        m_i, l_i, acc = _attend_tile(q, kc_ptr, vc_ptr, row_base, n0, end, qpos, kh, d, m_i,
                                     l_i, acc, c_s0, c_s1, sm_scale_log2, window, logit_cap,
                                     HAS_CAP=HAS_CAP, HEAD_DIM=HEAD_DIM, BLOCK_N=BLOCK_N,
                                     BLOCK_D=BLOCK_D, DOT_PREC=DOT_PREC, MASKED=True,
                                     FP8_WORDS=FP8_WORDS, ASM_CVT=ASM_CVT)
    for n0 in range(full, diag, BLOCK_N):
        m_i, l_i, acc = _attend_tile(q, kc_ptr, vc_ptr, row_base, n0, end, qpos, kh, d, m_i,
                                     l_i, acc, c_s0, c_s1, sm_scale_log2, window, logit_cap,
                                     HAS_CAP=HAS_CAP, HEAD_DIM=HEAD_DIM, BLOCK_N=BLOCK_N,
                                     BLOCK_D=BLOCK_D, DOT_PREC=DOT_PREC, MASKED=False,
                                     FP8_WORDS=FP8_WORDS, ASM_CVT=ASM_CVT)
    for n0 in range(diag, end, BLOCK_N):
        m_i, l_i, acc = _attend_tile(q, kc_ptr, vc_ptr, row_base, n0, end, qpos, kh, d, m_i,
                                     l_i, acc, c_s0, c_s1, sm_scale_log2, window, logit_cap,
                                     HAS_CAP=HAS_CAP, HEAD_DIM=HEAD_DIM, BLOCK_N=BLOCK_N,
                                     BLOCK_D=BLOCK_D, DOT_PREC=DOT_PREC, MASKED=True,
                                     FP8_WORDS=FP8_WORDS, ASM_CVT=ASM_CVT)

    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]  # l_i = 0 only on rows past the request
    if FP8_WORDS and not ASM_CVT:
        out = out / E4M3_F16_SHIFT  # v as read was 2^-8 of the cache's values
    tl.store(out_ptr + rows[:, None] * o_s0 + h * o_s1 + d[None, :],
             out.to(out_ptr.dtype.element_ty), mask=imask[:, None] & dmask[None, :])


# The request and token counts change every step: not specialized on their values (Triton
# compiles integer arguments apart when they equal 1 or divide by 16), so a new count never
# compiles a kernel while serving. The page table's row stride is specialized (16 divides it:
# its rows load as vectors), and the worker pads every step's table to such a width
# (forward_inputs.TABLE_WIDTH_MULTIPLE). REQS, the only constant that follows the batch, takes
# powers of two from 32 (reqs_block): exactly the values the start-up's mixed-step graphs
# compile (a bucket of T tokens holds min(T, max requests) requests, T from 32), so an eager
# step beyond the graphs reuses their kernels. An H200 B2 run with whole 2048-token chunks
# compiled this kernel five times mid-run, 1.5-2.3 s each, while the table's width followed
# the longest sequence and REQS started at 16.
@triton.jit(do_not_specialize=["num_reqs", "num_tokens"])
def _extend_kernel(q_ptr, kc_ptr, vc_ptr, rtt_ptr, seq_lens_ptr, ext_lens_ptr, qo_ptr, out_ptr,
                   num_reqs, num_tokens, q_s0, q_s1, c_s0, c_s1, rtt_s0, o_s0, o_s1,
                   sm_scale_log2, window, logit_cap, HAS_CAP: tl.constexpr,
                   GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
                   BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                   REQS: tl.constexpr, DOT_PREC: tl.constexpr, FP8_WORDS: tl.constexpr,
                   ASM_CVT: tl.constexpr, USE_PDL: tl.constexpr = False):
    pdl_enter(USE_PDL)
    h = tl.program_id(1)
    # The work, numbered: the blocks of the requests that extend by more than one token,
    # request by request, then the blocks of padding rows after the last request.
    r = tl.arange(0, REQS)
    ext_all = tl.load(ext_lens_ptr + r, mask=r < num_reqs, other=0).to(tl.int32)
    blocks = tl.where(ext_all > 1, (ext_all + BLOCK_M - 1) // BLOCK_M, 0)
    ends = tl.cumsum(blocks, 0)
    total = tl.sum(blocks, 0)
    tail = tl.load(qo_ptr + num_reqs).to(tl.int32)
    tail_blocks = (num_tokens - tail + BLOCK_M - 1) // BLOCK_M
    for work in range(tl.program_id(0), total + tail_blocks, tl.num_programs(0)):
        if work < total:
            b = tl.sum((ends <= work).to(tl.int32), 0)
            mine = r == b
            mblk = work - tl.sum(tl.where(mine, ends - blocks, 0), 0)
            ext = tl.sum(tl.where(mine, ext_all, 0), 0)
            b64 = b.to(tl.int64)
            seq = tl.load(seq_lens_ptr + b64).to(tl.int32)
            q_start = tl.load(qo_ptr + b64).to(tl.int64)
            _attend_block(q_ptr, kc_ptr, vc_ptr, rtt_ptr, out_ptr, b64, mblk, ext, seq, q_start,
                          h, q_s0, q_s1, c_s0, c_s1, rtt_s0, o_s0, o_s1, sm_scale_log2,
                          window, logit_cap, HAS_CAP=HAS_CAP, GROUP=GROUP, HEAD_DIM=HEAD_DIM,
                          BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_D=BLOCK_D, DOT_PREC=DOT_PREC,
                          FP8_WORDS=FP8_WORDS, ASM_CVT=ASM_CVT)
        else:
            # Padding rows belong to no request: zeros.
            rows = (tail + (work - total) * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
            d = tl.arange(0, BLOCK_D)
            zeros = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
            tl.store(out_ptr + rows[:, None] * o_s0 + h * o_s1 + d[None, :],
                     zeros.to(out_ptr.dtype.element_ty),
                     mask=(rows < num_tokens)[:, None] & (d < HEAD_DIM)[None, :])


def reqs_block(batch: int) -> int:
    """The REQS constant for a batch of this many requests (see _extend_kernel)."""
    return max(32, triton.next_power_of_2(batch))


def extend_programs(tokens: int, batch: int, block_m: int) -> int:
    """Programs per query head. One per block of T tokens covers a single prefill or chunk
    (and the padding rows); the spare ones take the extra partial blocks of further requests.
    With more work than programs, each takes every G-th item: right for any composition."""
    return triton.cdiv(tokens, block_m) + min(batch, SPARE_PROGRAMS) + 1


def attention_extend(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                     req_to_token: torch.Tensor, seq_lens: torch.Tensor,
                     extend_lens: torch.Tensor, qo_indptr: torch.Tensor, scale: float,
                     max_extend_len: int | None = None, *, sliding_window: int = 0,
                     logit_cap: float = 0.0, k_scale: float = 1.0,
                     v_scale: float = 1.0) -> torch.Tensor:
    """`max_extend_len` is accepted for the contract and not needed: the launch is static.
    An fp8 cache's scales: k_scale folds into the softmax scale (q . k_cache * k_scale), and
    v_scale multiplies the output (a sum of probabilities times v_cache * v_scale)."""
    del max_extend_len
    scale = scale * k_scale
    tokens, q_heads, head_dim = q.shape
    kv_heads = k_cache.shape[1]
    check_paged_inputs("attention_extend", q, k_cache, req_to_token)
    out = torch.empty((tokens, q_heads, head_dim), dtype=q.dtype, device=q.device)
    if tokens == 0:
        return out
    batch = seq_lens.shape[0]
    launch_decode(q, k_cache, v_cache, req_to_token, seq_lens, out, scale,
                  extend_lens=extend_lens, qo_indptr=qo_indptr, sliding_window=sliding_window,
                  logit_cap=logit_cap)
    block_m = BLOCK_M if q.dtype != torch.float32 else min(BLOCK_M, 32)
    block_n = BLOCK_N if q.dtype != torch.float32 else min(BLOCK_N, 32)
    grid = (extend_programs(tokens, batch, block_m), q_heads)
    words = fp8_words(k_cache, v_cache)
    if words:  # an fp8 cache as uint16 words of two elements (strides in words)
        k_cache, v_cache = k_cache.view(torch.uint16), v_cache.view(torch.uint16)
    _extend_kernel[grid](
        q, k_cache, v_cache, req_to_token, seq_lens, extend_lens, qo_indptr, out, batch, tokens,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), req_to_token.stride(0),
        out.stride(0), out.stride(1), float(scale) * LOG2E, int(sliding_window),
        float(logit_cap), HAS_CAP=logit_cap > 0, GROUP=q_heads // kv_heads,
        HEAD_DIM=head_dim, BLOCK_M=block_m, BLOCK_N=block_n,
        BLOCK_D=triton.next_power_of_2(head_dim), REQS=reqs_block(batch),
        DOT_PREC=dot_precision(q.dtype), FP8_WORDS=words,
        ASM_CVT=words and asm_cvt(q.device), num_warps=NUM_WARPS,
        num_stages=FP8_NUM_STAGES if words else NUM_STAGES,
        **pdl.launch_options())
    return out if v_scale == 1.0 else out.mul_(v_scale)
