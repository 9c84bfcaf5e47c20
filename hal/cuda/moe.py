"""The fused Mixture-of-Experts MLP (semantics: hal/ops.py `fused_moe`) as a grouped GEMM.

1. Align: the T*K (token, choice) pairs are grouped by expert (stably) and each expert's run
   is padded to a multiple of BLOCK_M, so that every block of BLOCK_M grouped pairs belongs to
   one expert (`block_expert`; -1 for blocks past the end). Pairs of experts this rank does
   not hold are dropped. Plain torch ops with shapes that depend only on T, K and E, and no
   sort: the step can be captured in a graph.
2. Grouped GEMM 1: each block multiplies its tokens' rows of x by its expert's w13 -> the
   pairs' [gate | up] rows.
3. act_and_mul (the elementwise kernel) -> [T*K, I].
4. Grouped GEMM 2: each block multiplies its pairs' rows by its expert's w2 and scales them by
   the routing weight -> fp32 [T*K, H] (rows of dropped pairs stay zero).
5. The K choices of each token are summed (fp32) and rounded to x.dtype.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from tessera.hal.cuda.decode_attention import dot_precision
from tessera.hal.cuda.elementwise import gelu_tanh_and_mul, silu_and_mul
from tessera.hal.cuda.moe_tune import Tile, down_tile, gate_up_tile

_ACTIVATIONS = {"silu": silu_and_mul, "gelu_tanh": gelu_tanh_and_mul}


@dataclass(frozen=True)
class Alignment:
    """Pairs grouped by expert: sorted_pairs[i] is a pair index (t * K + k), or num_pairs for
    padding; block b of BLOCK_M entries belongs to expert block_expert[b] (-1: unused)."""

    sorted_pairs: torch.Tensor  # int32 [num_blocks * block_m]
    block_expert: torch.Tensor  # int32 [num_blocks]
    block_m: int


# Up to this many (token, choice) pairs the alignment is one kernel (_align_kernel, one
# program); beyond (prefill), the torch ops of align_by_expert_ops. The ops are about thirty
# launches of a few microseconds each: in a decode step's graph, Mixtral-8x7B's B1 on an H200
# spent about 2 of its 9.3 ms in them (32 layers), against 3.2 ms above the roofline.
ALIGN_KERNEL_MAX_PAIRS = 2048


def align_by_expert(topk_ids: torch.Tensor, num_experts: int, block_m: int) -> Alignment:
    """The pairs grouped by expert (Alignment): one kernel for decode-sized batches, the
    reference torch ops beyond ALIGN_KERNEL_MAX_PAIRS; the same result either way."""
    if 0 < topk_ids.numel() <= ALIGN_KERNEL_MAX_PAIRS:
        return align_by_expert_kernel(topk_ids, num_experts, block_m)
    return align_by_expert_ops(topk_ids, num_experts, block_m)


def num_align_blocks(pairs: int, num_experts: int, block_m: int) -> int:
    """At most min(E, pairs) experts hold pairs, each padded by under block_m: the grid's
    bound on used blocks (launching programs only to return costs at decode, where 2 of 8
    experts hold 1 pair each). Depends on the shapes only: capturable."""
    return triton.cdiv(pairs + min(num_experts, pairs) * (block_m - 1), block_m)


@triton.jit
def _align_kernel(ids_ptr, sorted_ptr, block_expert_ptr, num_pairs, num_experts, num_blocks,
                  BLOCK_M: tl.constexpr, E_BLOCK: tl.constexpr, P_BLOCK: tl.constexpr,
                  B_BLOCK: tl.constexpr):
    # One program. Pairs of an expert keep their order (stable); pairs of experts this rank
    # does not hold (ids < 0 or >= num_experts) are dropped; every other slot of the
    # num_blocks * BLOCK_M holds num_pairs (padding). No slot is written twice.
    e = tl.arange(0, E_BLOCK)
    emask = e < num_experts
    counts = tl.zeros([E_BLOCK], tl.int32)
    for p0 in range(0, num_pairs, P_BLOCK):
        p = p0 + tl.arange(0, P_BLOCK)
        ids = tl.load(ids_ptr + p, mask=p < num_pairs, other=-1).to(tl.int32)
        counts += tl.sum(((ids[:, None] == e[None, :]) & emask[None, :]).to(tl.int32), 0)
    padded = (counts + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    padded_end = tl.cumsum(padded, 0)
    start = padded_end - padded
    used_end = tl.sum(tl.where(emask, padded, 0), 0)
    # each block's expert: how many experts end at or before its first slot (-1 past the end)
    for b0 in range(0, num_blocks, B_BLOCK):
        b = b0 + tl.arange(0, B_BLOCK)
        first = b * BLOCK_M
        expert = tl.sum(((padded_end[None, :] <= first[:, None]) & emask[None, :])
                        .to(tl.int32), 1)
        expert = tl.where(first < used_end, expert, -1)
        tl.store(block_expert_ptr + b, expert, mask=b < num_blocks)
    # padding: each expert's slots beyond its count, and every slot past the last expert's
    length = num_blocks * BLOCK_M
    for i0 in range(0, length, P_BLOCK):
        i = i0 + tl.arange(0, P_BLOCK)
        owner = tl.sum(((padded_end[None, :] <= i[:, None]) & emask[None, :]).to(tl.int32), 1)
        mine = owner[:, None] == e[None, :]
        own_start = tl.sum(tl.where(mine, start[None, :], 0), 1)
        own_count = tl.sum(tl.where(mine, counts[None, :], 0), 1)
        pad = (i >= used_end) | (i - own_start >= own_count)
        tl.store(sorted_ptr + i, tl.zeros([P_BLOCK], tl.int32) + num_pairs,
                 mask=(i < length) & pad)
    # the pairs: slot start[expert] + the pair's rank among the earlier pairs of its expert
    seen = tl.zeros([E_BLOCK], tl.int32)
    for p0 in range(0, num_pairs, P_BLOCK):
        p = p0 + tl.arange(0, P_BLOCK)
        ids = tl.load(ids_ptr + p, mask=p < num_pairs, other=-1).to(tl.int32)
        onehot = ((ids[:, None] == e[None, :]) & emask[None, :]).to(tl.int32)
        running = tl.cumsum(onehot, 0)  # rank within the chunk, plus one, in its column
        rank = tl.sum(onehot * (running - 1 + seen[None, :] + start[None, :]), 1)
        held = (ids >= 0) & (ids < num_experts) & (p < num_pairs)
        tl.store(sorted_ptr + rank, p.to(tl.int32), mask=held)
        seen += tl.sum(onehot, 0)


def align_by_expert_kernel(topk_ids: torch.Tensor, num_experts: int, block_m: int
                           ) -> Alignment:
    """align_by_expert in one launch (one program; for decode-sized batches)."""
    flat = topk_ids.reshape(-1)
    if not flat.is_contiguous():
        flat = flat.contiguous()
    pairs = flat.numel()
    num_blocks = num_align_blocks(pairs, num_experts, block_m)
    sorted_pairs = torch.empty(num_blocks * block_m, dtype=torch.int32, device=flat.device)
    block_expert = torch.empty(num_blocks, dtype=torch.int32, device=flat.device)
    e_block = max(16, triton.next_power_of_2(num_experts))
    _align_kernel[(1,)](flat, sorted_pairs, block_expert, pairs, num_experts, num_blocks,
                        BLOCK_M=block_m, E_BLOCK=e_block, P_BLOCK=max(16, 4096 // e_block),
                        B_BLOCK=max(16, 2048 // e_block), num_warps=4)
    return Alignment(sorted_pairs, block_expert, block_m)


def align_by_expert_ops(topk_ids: torch.Tensor, num_experts: int, block_m: int) -> Alignment:
    """align_by_expert in torch ops (every shape; the kernel's reference)."""
    dev = topk_ids.device
    flat = topk_ids.reshape(-1).long()
    pairs = flat.numel()
    held = (flat >= 0) & (flat < num_experts)
    key = torch.where(held, flat, num_experts)  # bucket E: experts of other ranks, dropped
    # Each pair's rank among the earlier pairs of its expert, from a running count per expert
    # (no sort: every op here has a fixed shape and never waits for the host).
    onehot = (key[:, None] == torch.arange(num_experts + 1, device=dev)[None, :]).to(torch.int32)
    running = torch.cumsum(onehot, 0, dtype=torch.int32)  # [pairs, E + 1]
    rank = running.gather(1, key[:, None]).squeeze(1).long() - 1
    counts = running[-1, :num_experts].long() if pairs else \
        torch.zeros(num_experts, dtype=torch.int64, device=dev)
    padded = (counts + block_m - 1) // block_m * block_m
    padded_end = torch.cumsum(padded, 0)
    num_blocks = num_align_blocks(pairs, num_experts, block_m)
    length = num_blocks * block_m
    start = (padded_end - padded)[key.clamp(max=num_experts - 1)]
    dest = torch.where(held, start + rank, length)  # index `length`: dropped
    sorted_pairs = torch.full((length + 1,), pairs, dtype=torch.int32, device=dev)
    sorted_pairs.scatter_(0, dest, torch.arange(pairs, dtype=torch.int32, device=dev))
    block_start = torch.arange(num_blocks, device=dev) * block_m
    expert = torch.searchsorted(padded_end, block_start, right=True)
    block_expert = torch.where(expert < num_experts, expert, -1).to(torch.int32)
    return Alignment(sorted_pairs[:length], block_expert, block_m)


@triton.jit
def _grouped_gemm_kernel(a_ptr, b_ptr, c_ptr, w_ptr, pairs_ptr, expert_ptr, num_pairs, N, K,
                         a_s0, b_s0, b_s1, c_s0, TOP_K: tl.constexpr,
                         A_ROW_IS_TOKEN: tl.constexpr, MUL_WEIGHT: tl.constexpr,
                         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                         DOT_PREC: tl.constexpr):
    # c[pair, n] = sum_k a[row(pair), k] * b[expert, n, k] (* w[pair]) for this block's pairs.
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    expert = tl.load(expert_ptr + pid_m).to(tl.int64)
    if expert < 0:
        return
    pairs = tl.load(pairs_ptr + pid_m * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    valid = pairs < num_pairs
    if A_ROW_IS_TOKEN:
        rows = pairs // TOP_K
    else:
        rows = pairs
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    n_mask = offs_n < N
    a_ptrs = a_ptr + rows[:, None] * a_s0 + offs_k[None, :]
    b_ptrs = b_ptr + expert * b_s0 + offs_n[None, :] * b_s1 + offs_k[:, None]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k_mask = offs_k + k0 < K
        a = tl.load(a_ptrs, mask=valid[:, None] & k_mask[None, :], other=0.0)
        b = tl.load(b_ptrs, mask=k_mask[:, None] & n_mask[None, :], other=0.0)
        acc += tl.dot(a, b, input_precision=DOT_PREC)
        a_ptrs += BLOCK_K
        b_ptrs += BLOCK_K
    if MUL_WEIGHT:
        acc *= tl.load(w_ptr + pairs, mask=valid, other=0.0)[:, None]
    c_ptrs = c_ptr + pairs[:, None] * c_s0 + offs_n[None, :]
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=valid[:, None] & n_mask[None, :])


def grouped_gemm(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, align: Alignment,
                 top_k: int, *, a_row_is_token: bool, weights: torch.Tensor | None = None,
                 block_n: int = 128, block_k: int = 64, num_warps: int = 4,
                 num_stages: int = 3) -> None:
    """out[pair] = a[row(pair)] @ b[expert(pair)]^T (* weights[pair]) for every held pair;
    b is [E, N, K] (contiguous in K), a [rows, K], out [pairs, N]."""
    num_pairs, n = out.shape[0], b.shape[1]
    k = b.shape[2]
    if a.stride(-1) != 1 or b.stride(-1) != 1 or out.stride(-1) != 1:
        raise ValueError("fused_moe: activations and expert weights must be contiguous in "
                         "their last dimension")
    grid = (align.block_expert.shape[0], triton.cdiv(n, block_n))
    _grouped_gemm_kernel[grid](
        a, b, out, weights if weights is not None else out, align.sorted_pairs,
        align.block_expert, num_pairs, n, k, a.stride(0), b.stride(0), b.stride(1),
        out.stride(0), TOP_K=top_k, A_ROW_IS_TOKEN=a_row_is_token,
        MUL_WEIGHT=weights is not None, BLOCK_M=align.block_m, BLOCK_N=block_n,
        BLOCK_K=block_k, DOT_PREC=dot_precision(a.dtype), num_warps=num_warps,
        num_stages=num_stages)


@dataclass(frozen=True)
class MoETiles:
    """The two GEMMs' tiles (moe_tune.Tile); both BLOCK_Ms must be equal (one alignment)."""

    gate_up: Tile
    down: Tile


def _tiled(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, align: Alignment, top_k: int,
           tile: Tile, *, a_row_is_token: bool, weights: torch.Tensor | None = None) -> None:
    if tile[0] != align.block_m:
        raise ValueError(f"fused_moe: tile {tile} does not fit an alignment of "
                         f"BLOCK_M {align.block_m}")
    _, block_n, block_k, num_warps, num_stages = tile
    grouped_gemm(a, b, out, align, top_k, a_row_is_token=a_row_is_token, weights=weights,
                 block_n=block_n, block_k=block_k, num_warps=num_warps, num_stages=num_stages)


def fused_moe(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
              topk_ids: torch.Tensor, activation: str = "silu",
              tiles: MoETiles | None = None) -> torch.Tensor:
    """tiles: both GEMMs' tiles as given (tests, benchmarks); else moe_tune's (measured once
    per shape outside graph capture)."""
    if activation not in _ACTIVATIONS:
        raise ValueError(f"fused_moe: unknown activation {activation!r}; have "
                         f"{', '.join(_ACTIVATIONS)}")
    tokens, hidden = x.shape
    num_experts, two_inter, _ = w13.shape
    top_k = topk_ids.shape[1]
    if w2.shape != (num_experts, hidden, two_inter // 2) or w13.shape[2] != hidden:
        raise ValueError(f"fused_moe: w13 {tuple(w13.shape)} and w2 {tuple(w2.shape)} do not "
                         f"fit x {tuple(x.shape)}")
    if tokens == 0:
        return torch.empty_like(x)
    pairs = tokens * top_k
    aligns: dict[int, Alignment] = {}

    def align_for(block_m: int) -> Alignment:
        if block_m not in aligns:
            aligns[block_m] = align_by_expert(topk_ids, num_experts, block_m)
        return aligns[block_m]

    gate_up = torch.empty((pairs, two_inter), dtype=x.dtype, device=x.device)

    def run_gate_up(tile: Tile) -> None:
        _tiled(x, w13, gate_up, align_for(tile[0]), top_k, tile, a_row_is_token=True)

    tile1 = tiles.gate_up if tiles is not None else \
        gate_up_tile(x, num_experts, two_inter, top_k, run_gate_up)
    run_gate_up(tile1)
    hidden_act = _ACTIVATIONS[activation](gate_up)
    # rows of dropped pairs (experts of other ranks) stay unwritten: the combine skips them
    out = torch.empty((pairs, hidden), dtype=torch.float32, device=x.device)
    weights = topk_weights.reshape(-1).float().contiguous()

    def run_down(tile: Tile) -> None:
        _tiled(hidden_act, w2, out, align_for(tile1[0]), top_k, tile, a_row_is_token=False,
               weights=weights)

    tile2 = tiles.down if tiles is not None else \
        down_tile(x, num_experts, hidden, two_inter // 2, top_k, tile1[0], run_down)
    run_down(tile2)
    return combine_choices(out, topk_ids, num_experts, x.dtype)


@triton.jit
def _combine_kernel(src_ptr, ids_ptr, out_ptr, hidden, num_experts, TOP_K: tl.constexpr,
                    BLOCK_H: tl.constexpr):
    # out[t] = sum over the held choices k of src[t * TOP_K + k], in float32, then rounded
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    hmask = h < hidden
    acc = tl.zeros([BLOCK_H], tl.float32)
    for k in tl.static_range(TOP_K):
        e = tl.load(ids_ptr + t * TOP_K + k)
        held = (e >= 0) & (e < num_experts)
        row = tl.load(src_ptr + (t * TOP_K + k) * hidden + h, mask=hmask, other=0.0)
        acc += tl.where(held, row, 0.0)  # an unwritten row may hold anything, NaN included
    tl.store(out_ptr + t * hidden + h, acc.to(out_ptr.dtype.element_ty), mask=hmask)


def combine_choices(src: torch.Tensor, topk_ids: torch.Tensor, num_experts: int,
                    dtype: torch.dtype) -> torch.Tensor:
    """[T * K, H] float32 rows of each token's K choices -> [T, H] of their sum (choices of
    experts this rank does not hold, whose rows were never written, left out), in one
    launch where zeroing the rows, summing and rounding were three."""
    tokens, top_k = topk_ids.shape
    hidden = src.shape[1]
    ids = topk_ids.contiguous()
    out = torch.empty((tokens, hidden), dtype=dtype, device=src.device)
    block_h = min(1024, triton.next_power_of_2(hidden))
    _combine_kernel[(tokens, triton.cdiv(hidden, block_h))](
        src, ids, out, hidden, num_experts, TOP_K=top_k, BLOCK_H=block_h, num_warps=4)
    return out


@triton.jit
def _softmax_topk_kernel(logits_ptr, weights_ptr, ids_ptr, num_experts, l_s0,
                         TOP_K: tl.constexpr, K_BLOCK: tl.constexpr, E_BLOCK: tl.constexpr,
                         RENORMALIZE: tl.constexpr):
    # One program per token: softmax of its logits in float32, then the top_k largest by
    # repeated argmax (the lower expert first among equal ones), optionally renormalized.
    row = tl.program_id(0).to(tl.int64)
    e = tl.arange(0, E_BLOCK)
    emask = e < num_experts
    x = tl.load(logits_ptr + row * l_s0 + e, mask=emask, other=float("-inf")).to(tl.float32)
    x = x - tl.max(x, 0)
    num = tl.where(emask, tl.exp(x), 0.0)
    probs = num / tl.sum(num, 0)
    left = tl.where(emask, probs, -1.0)
    k = tl.arange(0, K_BLOCK)
    vals = tl.zeros([K_BLOCK], tl.float32)
    idxs = tl.zeros([K_BLOCK], tl.int32)
    for i in tl.static_range(TOP_K):
        best = tl.max(left, 0)
        idx = tl.min(tl.where(left == best, e, E_BLOCK), 0)
        vals = tl.where(k == i, best, vals)
        idxs = tl.where(k == i, idx, idxs)
        left = tl.where(e == idx, -2.0, left)
    if RENORMALIZE:
        vals = vals / tl.sum(vals, 0)
    kmask = k < TOP_K
    tl.store(weights_ptr + row * TOP_K + k, vals, mask=kmask)
    tl.store(ids_ptr + row * TOP_K + k, idxs, mask=kmask)


def moe_softmax_topk(logits: torch.Tensor, top_k: int, renormalize: bool
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """The fused op (hal/ops.py): a router's softmax top-k in one launch."""
    tokens, num_experts = logits.shape
    if not 1 <= top_k <= num_experts:
        raise ValueError(f"moe_softmax_topk: top_k {top_k} with {num_experts} experts")
    weights = torch.empty((tokens, top_k), dtype=torch.float32, device=logits.device)
    ids = torch.empty((tokens, top_k), dtype=torch.int32, device=logits.device)
    if tokens == 0:
        return weights, ids
    if logits.stride(-1) != 1:
        logits = logits.contiguous()
    _softmax_topk_kernel[(tokens,)](logits, weights, ids, num_experts, logits.stride(0),
                                    TOP_K=top_k, K_BLOCK=triton.next_power_of_2(top_k),
                                    E_BLOCK=max(16, triton.next_power_of_2(num_experts)),
                                    RENORMALIZE=renormalize, num_warps=1)
    return weights, ids
