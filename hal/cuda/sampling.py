"""Sampling: greedy argmax fast path; temperature + top-k / top-p / min-p + a seeded draw.

Every filter is turned into one per-row logit threshold (keep x >= threshold), so the draw is
a single pass over the vocabulary: a Gumbel-max race, argmax(x_i + g_i) over kept tokens with
g_i = -log(-log u_i), which picks token i with probability softmax(x)_i over the kept set.
u_i comes from Philox keyed by the row's seed with counter (offset << 32) + i, so a seeded
row's draw depends on (seed, offset) only.

Thresholds come from the row's top candidates (torch.topk of at most CANDIDATES values, not a
sort of the whole vocabulary). A top-p row whose candidates hold less mass than top_p (a flat
distribution) gets its exact threshold from a bisection kernel instead, decided on the device:
nothing in the op waits for the device when the worker says which filters are in use
(SamplingTensors.any_*). When every row is greedy (params.all_greedy) the op is one argmax,
so it can sit inside a captured decode graph.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tessera.hal.cuda import pdl
from tessera.hal.cuda.pdl import enter as pdl_enter
from tessera.hal.ops import SamplingTensors

CANDIDATES = 1024
DRAW_BLOCK = 2048
MIN_P_SLACK = 1e-5
ARGMAX_BLOCK = 2048  # vocabulary entries per program of the split argmax


@triton.jit
def _argmax_partial_kernel(x_ptr, val_ptr, idx_ptr, x_s0, vocab, n_parts,
                           BLOCK: tl.constexpr, USE_PDL: tl.constexpr = False):
    pdl_enter(USE_PDL)
    row = tl.program_id(0).to(tl.int64)
    part = tl.program_id(1)
    idx = part * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * x_s0 + idx, mask=idx < vocab,
                other=float("-inf")).to(tl.float32)  # bf16 / fp16 logits: exact in fp32
    best = tl.max(x, 0)
    first = part * BLOCK + tl.argmax(x, 0, tie_break_left=True)
    tl.store(val_ptr + row * n_parts + part, best)
    tl.store(idx_ptr + row * n_parts + part, first.to(tl.int64))


@triton.jit
def _argmax_merge_kernel(val_ptr, idx_ptr, out_ptr, n_parts, PARTS: tl.constexpr,
                         USE_PDL: tl.constexpr = False):
    pdl_enter(USE_PDL)
    row = tl.program_id(0).to(tl.int64)
    p = tl.arange(0, PARTS)
    vals = tl.load(val_ptr + row * n_parts + p, mask=p < n_parts, other=float("-inf"))
    # The leftmost part holding the maximum holds its lowest index.
    winner = tl.argmax(vals, 0, tie_break_left=True)
    tl.store(out_ptr + row, tl.load(idx_ptr + row * n_parts + winner))


def argmax_rows(logits: torch.Tensor) -> torch.Tensor:
    """argmax over the last dimension, lowest index on ties, as int64 [B]: the vocabulary is
    split over many programs (one program per row takes tens of microseconds for 128k
    entries), then the parts are merged."""
    batch, vocab = logits.shape
    out = torch.empty((batch,), dtype=torch.int64, device=logits.device)
    if batch == 0 or vocab == 0 or logits.stride(-1) != 1:
        return torch.argmax(logits, dim=-1) if batch and vocab else out
    block = min(ARGMAX_BLOCK, triton.next_power_of_2(vocab))
    n_parts = triton.cdiv(vocab, block)
    vals = torch.empty((batch, n_parts), dtype=torch.float32, device=logits.device)
    idxs = torch.empty((batch, n_parts), dtype=torch.int64, device=logits.device)
    pdl_options = pdl.launch_options()
    _argmax_partial_kernel[(batch, n_parts)](logits, vals, idxs, logits.stride(0), vocab,
                                             n_parts, BLOCK=block, num_warps=8, **pdl_options)
    _argmax_merge_kernel[(batch,)](vals, idxs, out, n_parts,
                                   PARTS=max(16, triton.next_power_of_2(n_parts)), num_warps=1,
                                   **pdl_options)
    return out


@triton.jit
def _gumbel_draw_kernel(x_ptr, thresh_ptr, seed_ptr, offset_ptr, out_ptr, x_s0, vocab,
                        BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    thresh = tl.load(thresh_ptr + row)
    seed = tl.load(seed_ptr + row)
    step = tl.load(offset_ptr + row).to(tl.int64)
    best = tl.full([], float("-inf"), tl.float32)
    best_idx = tl.full([], 0, tl.int64)
    for v0 in range(0, vocab, BLOCK):
        idx = v0 + tl.arange(0, BLOCK)
        mask = idx < vocab
        x = tl.load(x_ptr + row * x_s0 + idx, mask=mask, other=float("-inf"))
        u = tl.rand(seed, (step << 32) + idx.to(tl.int64))
        g = -tl.log(-tl.log(u))
        score = tl.where(mask & (x >= thresh), x + g, float("-inf"))
        blk_best = tl.max(score, 0)
        blk_idx = v0 + tl.argmax(score, 0)
        take = blk_best > best  # strict: the earliest block wins ties
        best_idx = tl.where(take, blk_idx.to(tl.int64), best_idx)
        best = tl.where(take, blk_best, best)
    tl.store(out_ptr + row, best_idx)


@triton.jit
def _float_key(x):
    """An int32 whose order is the float's order (negative floats: the low 31 bits flipped)."""
    bits = x.to(tl.int32, bitcast=True)
    return tl.where(bits >= 0, bits, bits ^ 0x7FFFFFFF)


@triton.jit
def _top_p_bisect_kernel(x_ptr, top_p_ptr, done_ptr, thresh_ptr, x_s0, vocab,
                         BLOCK: tl.constexpr, STEPS: tl.constexpr):
    """The exact top-p threshold of a row over the whole vocabulary: the smallest logit v
    with mass(x > v) < top_p, i.e. the value of the last token the sorted cumulative rule
    keeps. mass(x > v) only changes at the row's own values, so a bisection over the ordered
    keys of the floats ends on one of them. Rows marked done keep their threshold."""
    row = tl.program_id(0).to(tl.int64)
    if tl.load(done_ptr + row) != 0:
        return
    p = tl.load(top_p_ptr + row)
    base = x_ptr + row * x_s0
    m = tl.full([], float("-inf"), tl.float32)
    total = tl.zeros([], tl.float32)
    low = tl.full([], 2147483647, tl.int32)
    for v0 in range(0, vocab, BLOCK):
        idx = v0 + tl.arange(0, BLOCK)
        x = tl.load(base + idx, mask=idx < vocab, other=float("-inf"))
        m_new = tl.maximum(m, tl.max(x, 0))
        total = total * tl.exp(m - m_new) + tl.sum(tl.exp(x - m_new), 0)
        m = m_new
        low = tl.minimum(low, tl.min(tl.where(idx < vocab, _float_key(x), 2147483647), 0))
    lse = m + tl.log(total)
    # Invariant: mass(x > value(lo)) >= p (lo starts below every value) and
    # mass(x > value(hi)) = 0 < p (hi starts at the row's largest value).
    lo = low.to(tl.int64) - 1
    hi = _float_key(m).to(tl.int64)
    for _ in range(STEPS):
        mid = (lo + hi) // 2
        bits = mid.to(tl.int32)
        v = tl.where(bits >= 0, bits, bits ^ 0x7FFFFFFF).to(tl.float32, bitcast=True)
        mass = tl.zeros([], tl.float32)
        for v0 in range(0, vocab, BLOCK):
            idx = v0 + tl.arange(0, BLOCK)
            x = tl.load(base + idx, mask=idx < vocab, other=float("-inf"))
            mass += tl.sum(tl.where(x > v, tl.exp(x - lse), 0.0), 0)
        go_down = (mass < p) & (hi - lo > 1)
        go_up = (mass >= p) & (hi - lo > 1)
        hi = tl.where(go_down, mid, hi)
        lo = tl.where(go_up, mid, lo)
    bits = hi.to(tl.int32)
    tl.store(thresh_ptr + row,
             tl.where(bits >= 0, bits, bits ^ 0x7FFFFFFF).to(tl.float32, bitcast=True))


def _thresholds(x: torch.Tensor, params: SamplingTensors) -> torch.Tensor:
    """Per-row logit threshold that applies top-k, then top-p, then min-p."""
    batch, vocab = x.shape
    neg_inf = torch.full((batch,), float("-inf"), dtype=torch.float32, device=x.device)
    top_k = params.top_k.to(torch.int64)
    k_on = (top_k > 0) & (top_k < vocab)
    p_on = params.top_p < 1.0
    m_on = params.min_p > 0.0
    known = (params.any_top_k, params.any_top_p, params.any_min_p, params.max_top_k)
    if all(flag is not None for flag in known):
        any_k, any_p, any_m, k_max = known  # from the host: no wait for the device
    else:
        any_k, any_p, any_m, k_max = torch.stack(
            [k_on.any().long(), p_on.any().long(), m_on.any().long(),
             torch.where(k_on, top_k, 0).max()]).tolist()
    thresh = neg_inf
    if any_k or any_p:
        n_cand = min(vocab, max(CANDIDATES, int(k_max or 0)))
        cand = torch.topk(x, n_cand, dim=-1, sorted=True).values
        k_clamped = torch.where(k_on, top_k, n_cand).clamp(1, n_cand)
        kth = cand.gather(1, (k_clamped - 1)[:, None]).squeeze(1)
        thresh = torch.where(k_on, kth, thresh)
        if any_p:
            cand, thresh_p = _top_p_threshold(x, cand, k_on, k_clamped, params.top_p)
            thresh = torch.where(p_on, torch.maximum(thresh, thresh_p), thresh)
    if any_m:
        row_max = x.max(dim=-1).values
        # p_i >= min_p * p_max  <=>  x_i >= x_max + log(min_p). A token that lands on the
        # boundary within rounding is dropped (MIN_P_SLACK), as the reference's rounding does.
        thresh_m = row_max + torch.log(params.min_p.clamp(min=1e-30)) + MIN_P_SLACK
        thresh = torch.where(m_on, torch.maximum(thresh, thresh_m), thresh)
    return thresh


def _top_p_threshold(x: torch.Tensor, cand: torch.Tensor, k_on: torch.Tensor,
                     k_clamped: torch.Tensor, top_p: torch.Tensor,
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    n_cand = cand.shape[1]
    pos = torch.arange(n_cand, device=x.device)[None, :]
    in_k = ~k_on[:, None] | (pos < k_clamped[:, None])
    # Top-p renormalises over what top-k kept; without top-k, over the whole vocabulary.
    kept = cand.masked_fill(~in_k, float("-inf"))
    lse = torch.where(k_on, torch.logsumexp(kept, dim=-1), torch.logsumexp(x, dim=-1))
    probs = torch.exp(kept - lse[:, None])
    mass = probs.sum(dim=-1)
    complete = k_on | (mass >= top_p) | (n_cand == x.shape[1]) | (top_p >= 1.0)
    before = torch.cumsum(probs, dim=-1) - probs
    n_keep = ((before < top_p[:, None]) & in_k).sum(dim=-1).clamp(min=1)
    thresh = cand.gather(1, (n_keep - 1)[:, None]).squeeze(1).contiguous()
    # Rare: a flat distribution whose top CANDIDATES tokens hold less than top_p. The device
    # decides which rows need the exact threshold; the host does not wait to find out.
    _top_p_bisect_kernel[(x.shape[0],)](
        x, top_p.contiguous(), complete.to(torch.int8), thresh, x.stride(0), x.shape[1],
        BLOCK=min(DRAW_BLOCK, triton.next_power_of_2(x.shape[1])), STEPS=33, num_warps=8)
    return cand, thresh


def sample(logits: torch.Tensor, params: SamplingTensors) -> torch.Tensor:
    greedy_ids = argmax_rows(logits)
    if params.all_greedy:
        return greedy_ids
    batch, vocab = logits.shape
    greedy = (params.temperature <= 0) | (params.top_k == 1)
    temperature = torch.where(greedy, torch.ones_like(params.temperature), params.temperature)
    x = (logits.float() / temperature[:, None]).contiguous()
    thresh = _thresholds(x, params).contiguous()
    seeded = params.seeds >= 0
    fresh = torch.randint(0, 2**62, (batch,), device=logits.device, dtype=torch.int64)
    seeds = torch.where(seeded, params.seeds.to(torch.int64), fresh).contiguous()
    offsets = torch.where(seeded, params.offsets.to(torch.int64), 0).contiguous()
    drawn = torch.empty((batch,), dtype=torch.int64, device=logits.device)
    if batch:
        _gumbel_draw_kernel[(batch,)](x, thresh, seeds, offsets, drawn, x.stride(0), vocab,
                                      BLOCK=min(DRAW_BLOCK, triton.next_power_of_2(vocab)),
                                      num_warps=8)
    return torch.where(greedy, greedy_ids, drawn)
