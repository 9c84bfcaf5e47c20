"""Decode attention over paged KV: split-KV "flash decoding", GQA-aware.

Stage 1 runs one program per (request, KV head, split). The program holds the whole query
group of that KV head (Hq // Hk heads, padded to the 16 rows a tensor-core dot needs), so each
KV row is read once per group rather than once per query head. Each split covers a
contiguous range of the request's positions and writes a partial output and its log-sum-exp.
Stage 2 merges the splits.

The split count depends only on the batch shape (B, Hk) and the device, never on the
sequence lengths, so the launch is static and can be captured in a CUDA graph: each row works
out its own split length from seq_lens on the device.
"""

from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl

from tessera.hal.cuda import autotune, native_attention, pdl
from tessera.hal.cuda.pdl import enter as pdl_enter

# Tunables, overridable by benchmarks (kept here so the graph runner and the bench agree).
# The H200 sweep at e748886 (`run_gpu.sh attnbench`, attention_sweep_h200/): over a bf16
# cache three stages beat two by 1-8% from 32 requests up (4.3 TB/s at 128 x 4096) and
# matched it below; over fp8 words two warps and three stages were the fastest of 13 tiles
# at every batch of 64 and more (2.4-2.9 TB/s of fp8 bytes, 1.25-1.35x the bf16 cache's
# time), the words' conversion and second crossing to the dot making each block's chain
# longer, so more programs a multiprocessor pay.
BLOCK_N = 64
NUM_WARPS = 4
NUM_STAGES = 3
# The same over an fp8 cache read as words (FP8_WORDS).
FP8_BLOCK_N = 64
FP8_NUM_WARPS = 2
FP8_NUM_STAGES = 3
# Registers a thread of the fp8 tile may hold (Triton's `maxnreg`; None: what ptxas picks). At
# the default tile call 55's counters found 182 registers and 39 KB of shared memory a
# program: four programs, 8 warps an SM, too few to cover the loads.
FP8_MAXNREG: int | None = None
# Call 57 timed these caps (76ac3f5: eight programs an SM at (32, 2, *, 128), 16 warps) and
# none beat the default from 64 requests up (25-65% slower at 128); nor did the keys
# unconverted in an e4m3 wgmma at call 58 (7da3f49: 6-22% slower, B12's fp8 B2 over the fp8
# cache 11650-11696 tok/s against 12451; removed after).
# From FP8_SMALL_BATCH[0] to [1] requests the fp8 tile is FP8_SMALL_TILE: 128 keys a step,
# four warps, two stages (the same tunables' order). Calls 57-58 (B2's spreads of context,
# longest first): 16 requests 29.0 us against 39.2, 32 requests 46.4-46.6 against 55.9-56.0,
# B3's 32 33.0-33.4 against 42.1-42.3; slower at 64 (69.5 against 65.1), 128 and at one
# request of 2048 (6.7-6.8 against 5.7: its 32 splits hold 64 keys each). None: one tile.
FP8_SMALL_BATCH = (16, 32)
FP8_SMALL_TILE: tuple[int, int, int, int | None] | None = (128, 4, 2, None)
FP8_AS_WORDS = True  # False: an fp8 cache read element by element (the benchmarks' before)
# Stage 1's grid order. The chip hands out programs in the order of their linear index, the
# grid's first dimension fastest. HEADS_FIRST (the default) puts the KV heads there, so one
# request's programs start together and in the batch's order: a batch whose requests come
# longest first (the scheduler orders a step's decodes so) is then dispatched longest first,
# the short ones filling in at the end, and the programs running at once read neighbouring
# 256-byte pieces of the same cache rows. False: the batch first (the order before), as
# HAL_CUDA_DECODE_GRID=batch asks (heads, the default) for A/B runs.
GRID_VARIABLE = "HAL_CUDA_DECODE_GRID"


def _heads_first(value: str | None) -> bool:
    text = (value or "heads").strip().lower()
    if text not in ("heads", "batch"):
        raise ValueError(f"{GRID_VARIABLE}={value!r}: expected heads (the default) or batch")
    return text == "heads"


HEADS_FIRST = _heads_first(os.environ.get(GRID_VARIABLE))
# The fp8 tile for A/B runs: HAL_CUDA_DECODE_FP8_TILE=BLOCK_N,WARPS,STAGES[,MAXNREG].
FP8_TILE_VARIABLE = "HAL_CUDA_DECODE_FP8_TILE"


def parse_tile(value: str) -> tuple[int, int, int, int | None]:
    """(BLOCK_N, warps, stages, maxnreg or None) from "64,2,3" or "32,2,3,128"."""
    parts = [p.strip() for p in value.split(",")]
    try:
        nums = [int(p) for p in parts]
    except ValueError:
        nums = []
    ok = len(nums) in (3, 4) and all(n > 0 for n in nums)
    if ok:
        block_n, warps, stages = nums[:3]
        ok = block_n >= 16 and block_n & (block_n - 1) == 0 and warps in (1, 2, 4, 8, 16)
    if ok and len(nums) == 4:
        ok = 24 <= nums[3] <= 255
    if not ok:
        raise ValueError(f"{FP8_TILE_VARIABLE}={value!r}: expected BLOCK_N,WARPS,STAGES[,MAXNREG] "
                         f"(BLOCK_N a power of two >= 16, warps 1-16 a power of two, maxnreg "
                         f"24-255)")
    return nums[0], nums[1], nums[2], (nums[3] if len(nums) == 4 else None)


if os.environ.get(FP8_TILE_VARIABLE):  # one tile at every batch
    FP8_BLOCK_N, FP8_NUM_WARPS, FP8_NUM_STAGES, FP8_MAXNREG = parse_tile(
        os.environ[FP8_TILE_VARIABLE])
    FP8_SMALL_TILE = None
MAX_SPLITS = 32
LOG2E = 1.4426950408889634
LOG2E_C: tl.constexpr = tl.constexpr(LOG2E)
# e4m3 bits moved into float16 (e4m3_words_to_f16 without ASM_CVT) read 2^-8 of the value
E4M3_F16_SHIFT: tl.constexpr = tl.constexpr(2.0 ** -8)


@triton.jit
def tanh(x):
    """tanh through exp (the interpreter has no libdevice); |x| <= 20 is already +-1."""
    x = tl.minimum(tl.maximum(x, -20.0), 20.0)
    return 1.0 - 2.0 / (tl.exp(2.0 * x) + 1.0)


@triton.jit
def scores_log2(qk, sm_scale_log2, logit_cap, HAS_CAP: tl.constexpr):
    """Raw q.k products -> the softmax's scores in log2 units, soft-capped if HAS_CAP:
    cap * tanh(q.k * scale / cap)."""
    if HAS_CAP:
        s = qk * (sm_scale_log2 / LOG2E_C)
        out = logit_cap * tanh(s / logit_cap) * LOG2E_C
    else:
        out = qk * sm_scale_log2
    return out


@triton.jit
def e4m3_words_to_f16(w, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, ASM_CVT: tl.constexpr):
    """A [BLOCK_N, BLOCK_D / 2] tile of uint16 words, each two e4m3 elements (the low byte the
    even one) -> the [BLOCK_N, BLOCK_D] float16 tile they stand for. ASM_CVT: the hardware's
    conversion (sm_89+), exact. Otherwise (Triton's interpreter, older GPUs) the bits are
    moved into place, exact too but 2^-8 of the value (E4M3_F16_SHIFT), which the caller
    folds into its scales: e4m3 s.eeee.mmm becomes float16 s.0eeee.mmm0000000, subnormals
    included.

    Converted in registers as words and joined back in element order: the words stay in the
    load's 16-byte vectors (an e4m3 tile cast to float16 is loaded in the dot's layout, one
    or two bytes an instruction), and the tile crosses to the dot in float16, as bf16 does."""
    if ASM_CVT:
        even, odd = tl.inline_asm_elementwise(
            "{ .reg .b32 t; cvt.rn.f16x2.e4m3x2 t, $2; mov.b32 {$0, $1}, t; }",
            "=h,=h,h", [w], dtype=(tl.float16, tl.float16), is_pure=True, pack=1)
    else:
        even = (((w & 0x7F) << 7) | ((w & 0x80) << 8)).to(tl.float16, bitcast=True)
        odd = (((w >> 1) & 0x3F80) | (w & 0x8000)).to(tl.float16, bitcast=True)
    return tl.join(even, odd).reshape(BLOCK_N, BLOCK_D)


# The split count is a run-time argument, not a constant of the compiled kernel: it follows
# the batch size (num_splits), and a mixed step's batch is any number of requests, so as a
# constexpr every new count compiled a kernel in the middle of serving (an H200 run's first
# c=32 tier: TTFT p90 520 ms against 51 ms once warm). Nor is it specialized on its value
# (Triton compiles integer arguments apart when they equal 1 or divide by 16), and neither
# are the merge buffers' strides that follow it; ONE_SPLIT is the only constant that does.
# The page table's row stride is specialized: the worker pads every step's table to a width
# 16 divides (forward_inputs.TABLE_WIDTH_MULTIPLE), as the graphs' static table is.
_SPLIT_DEPENDENT = ["num_splits", "mo_s0", "mo_s1", "ml_s0", "ml_s1"]


@triton.jit
def _load_kv_tile(kc_ptr, vc_ptr, slot, rows, kh, c_s0, c_s1, HEAD_DIM: tl.constexpr,
                  BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, FP8_WORDS: tl.constexpr,
                  ASM_CVT: tl.constexpr, DTYPE: tl.constexpr):
    """The K and V rows of these cache slots where `rows` holds (zeros elsewhere), in DTYPE.
    An fp8 cache read as words has its scales folded in by the caller. V is issued with K:
    at small batch each program runs only a block or two, so the time is memory latency and
    the two loads should overlap."""
    if FP8_WORDS:  # c_s0, c_s1 count words of two elements
        j = tl.arange(0, BLOCK_D // 2)
        w_off = slot[:, None] * c_s0 + kh * c_s1 + j[None, :]
        wmask = rows[:, None] & (j < HEAD_DIM // 2)[None, :]
        k = e4m3_words_to_f16(tl.load(kc_ptr + w_off, mask=wmask, other=0), BLOCK_N,
                              BLOCK_D, ASM_CVT).to(DTYPE)
        v = e4m3_words_to_f16(tl.load(vc_ptr + w_off, mask=wmask, other=0), BLOCK_N,
                              BLOCK_D, ASM_CVT).to(DTYPE)
    else:  # a cache in q's dtype, or fp8 with odd rows, read as q's dtype (exact)
        d = tl.arange(0, BLOCK_D)
        kv_off = slot[:, None] * c_s0 + kh * c_s1 + d[None, :]
        kvmask = rows[:, None] & (d < HEAD_DIM)[None, :]
        k = tl.load(kc_ptr + kv_off, mask=kvmask, other=0.0).to(DTYPE)
        v = tl.load(vc_ptr + kv_off, mask=kvmask, other=0.0).to(DTYPE)
    return k, v


@triton.jit
def _online_softmax_tile(q, k, v, pmask, m_i, l_i, acc, scale_log2, logit_cap,
                         HAS_CAP: tl.constexpr, DOT_PREC: tl.constexpr):
    """One key tile of flash decoding: the running max, sum and output updated."""
    qk = scores_log2(tl.dot(q, tl.trans(k), input_precision=DOT_PREC), scale_log2,
                     logit_cap, HAS_CAP)
    qk = tl.where(pmask[None, :], qk, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(qk, 1))
    p = tl.exp2(qk - m_new[:, None])
    alpha = tl.exp2(m_i - m_new)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PREC)
    return m_new, l_i, acc


@triton.jit(do_not_specialize=_SPLIT_DEPENDENT)
def _decode_stage1(q_ptr, kc_ptr, vc_ptr, rtt_ptr, seq_lens_ptr, ext_lens_ptr, qo_ptr,
                   mid_o_ptr, mid_lse_ptr, out_ptr,
                   q_s0, q_s1, c_s0, c_s1, rtt_s0, mo_s0, mo_s1, mo_s2, ml_s0, ml_s1, o_s0, o_s1,
                   sm_scale_log2, window, logit_cap, num_splits, HAS_CAP: tl.constexpr,
                   GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, ONE_SPLIT: tl.constexpr,
                   BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
                   DOT_PREC: tl.constexpr, MIXED: tl.constexpr, FP8_WORDS: tl.constexpr,
                   ASM_CVT: tl.constexpr, HEADS_FIRST: tl.constexpr = False,
                   USE_PDL: tl.constexpr = False):
    pdl_enter(USE_PDL)
    if HEADS_FIRST:
        kh = tl.program_id(0)
        b = tl.program_id(1).to(tl.int64)
    else:
        b = tl.program_id(0).to(tl.int64)
        kh = tl.program_id(1)
    split = tl.program_id(2)
    q_row = b
    if MIXED:
        # Rows of a mixed batch: only one-token extends are this kernel's (the extend kernel
        # takes the others); the query sits at the request's offset in the token list.
        if tl.load(ext_lens_ptr + b) != 1:
            return
        q_row = tl.load(qo_ptr + b).to(tl.int64)
    seq_len = tl.load(seq_lens_ptr + b).to(tl.int32)
    # A sliding window: the query (position seq_len - 1) sees only the last `window`
    # positions; the splits share out just those.
    lo = tl.where(window > 0, tl.maximum(seq_len - window, 0), 0)
    per_split = tl.cdiv(tl.cdiv(seq_len - lo, num_splits), BLOCK_N) * BLOCK_N
    start = lo + split * per_split
    end = tl.minimum(start + per_split, seq_len)
    # The dtype of the dots: q's, a 16-bit q's over fp8 words float16 (it holds every e4m3
    # value exactly, and bf16's 8 bits of mantissa fit in its 11; an fp32 q keeps fp32 dots)
    DTYPE: tl.constexpr = q_ptr.dtype.element_ty
    if FP8_WORDS and q_ptr.dtype.element_ty != tl.float32:
        DTYPE = tl.float16
    row_base = rtt_ptr + b * rtt_s0

    hrow = tl.arange(0, BLOCK_H)
    heads = kh * GROUP + hrow
    hmask = hrow < GROUP
    d = tl.arange(0, BLOCK_D)
    dmask = d < HEAD_DIM
    q = tl.load(q_ptr + q_row * q_s0 + heads[:, None] * q_s1 + d[None, :],
                mask=hmask[:, None] & dmask[None, :], other=0.0).to(DTYPE)
    scale_log2 = sm_scale_log2
    if FP8_WORDS and not ASM_CVT:
        scale_log2 = sm_scale_log2 / E4M3_F16_SHIFT

    m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_D], tl.float32)
    for n0 in range(start, end, BLOCK_N):
        pos = n0 + tl.arange(0, BLOCK_N)
        pmask = pos < end
        slot = tl.load(row_base + pos, mask=pmask, other=0).to(tl.int64)
        k, v = _load_kv_tile(kc_ptr, vc_ptr, slot, pmask, kh, c_s0, c_s1, HEAD_DIM, BLOCK_N,
                             BLOCK_D, FP8_WORDS, ASM_CVT, DTYPE)
        m_i, l_i, acc = _online_softmax_tile(q, k, v, pmask, m_i, l_i, acc, scale_log2,
                                             logit_cap, HAS_CAP, DOT_PREC)

    has = end > start
    safe_l = tl.where(l_i > 0, l_i, 1.0)
    out = acc / safe_l[:, None]
    if FP8_WORDS and not ASM_CVT:
        out = out / E4M3_F16_SHIFT  # v as read was 2^-8 of the cache's values
    omask = hmask[:, None] & dmask[None, :]
    if ONE_SPLIT:
        # Nothing to merge (large batches): the final output, exactly what stage 2 would give.
        tl.store(out_ptr + q_row * o_s0 + heads[:, None] * o_s1 + d[None, :],
                 out.to(out_ptr.dtype.element_ty), mask=omask)
    else:
        lse = tl.where(has, m_i + tl.log2(safe_l), float("-inf"))
        tl.store(mid_o_ptr + b * mo_s0 + heads[:, None] * mo_s1 + split * mo_s2 + d[None, :],
                 out, mask=omask)
        tl.store(mid_lse_ptr + b * ml_s0 + heads * ml_s1 + split, lse, mask=hmask)


@triton.jit(do_not_specialize=_SPLIT_DEPENDENT)
def _decode_stage2(mid_o_ptr, mid_lse_ptr, out_ptr, ext_lens_ptr, qo_ptr, mo_s0, mo_s1, mo_s2,
                   ml_s0, ml_s1, o_s0, o_s1, num_splits, HEAD_DIM: tl.constexpr,
                   BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr, MIXED: tl.constexpr,
                   USE_PDL: tl.constexpr = False):
    pdl_enter(USE_PDL)
    b = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1).to(tl.int64)
    o_row = b
    if MIXED:
        if tl.load(ext_lens_ptr + b) != 1:
            return
        o_row = tl.load(qo_ptr + b).to(tl.int64)
    s = tl.arange(0, BLOCK_S)
    smask = s < num_splits
    d = tl.arange(0, BLOCK_D)
    dmask = d < HEAD_DIM
    lse = tl.load(mid_lse_ptr + b * ml_s0 + h * ml_s1 + s, mask=smask, other=float("-inf"))
    m = tl.max(lse, 0)
    m = tl.where(m == float("-inf"), 0.0, m)  # an empty row (seq_len 0) gives zeros, not NaN
    w = tl.exp2(lse - m)
    o = tl.load(mid_o_ptr + b * mo_s0 + h * mo_s1 + s[:, None] * mo_s2 + d[None, :],
                mask=smask[:, None] & dmask[None, :], other=0.0)
    denom = tl.sum(w, 0)
    denom = tl.where(denom > 0, denom, 1.0)
    out = tl.sum(o * w[:, None], 0) / denom
    tl.store(out_ptr + o_row * o_s0 + h * o_s1 + d, out.to(out_ptr.dtype.element_ty), mask=dmask)


def num_splits(batch: int, kv_heads: int, device: torch.device) -> int:
    """Splits per request (splits_for)."""
    if device.type != "cuda":
        return 4  # the interpreter: any value exercises the merge
    index = device.index if device.index is not None else torch.cuda.current_device()
    sms = autotune.sm_count(index)
    return splits_for(batch, kv_heads, sms)


# Splits: enough programs for about two waves over the chip (two a multiprocessor), and at
# least two splits while the batch has fewer than TWO_SPLITS_BELOW programs a
# multiprocessor. With one, requests of 33 to 66 decodes (8 KV heads, 132 multiprocessors)
# ran unsplit, and over contexts of unequal lengths (B2's 400-2048 tokens) the longest ran on
# alone at the end: 64 requests took 99.4 us longest first against 86.9 with two splits, 48
# requests 80.8 against 65.7, 80 requests 97.8 against 92.8, while from 89 requests up one
# split stayed the fastest (81.7 against 85.1 at 89, 115.5 against 122.2 at 96; calls 48 and
# 49, `attention_order_h200/`). Five: two splits from 33 to 82 requests, one from 83.
TWO_SPLITS_BELOW = 5


def splits_for(batch: int, kv_heads: int, sms: int) -> int:
    programs = max(1, batch * kv_heads)
    waves = max(1, min(MAX_SPLITS, triton.cdiv(2 * sms, programs)))
    return max(waves, 2) if programs < TWO_SPLITS_BELOW * sms else waves


def dot_precision(dtype: torch.dtype) -> str:
    # fp32 through the tensor cores would be tf32 (about 1e-3 off); fp32 is the exact dtype.
    return "ieee" if dtype == torch.float32 else "tf32"


def tunables(words: bool, batch: int = 0) -> tuple[int, int, int, int | None]:
    """(BLOCK_N, num_warps, num_stages, maxnreg) of stage 1 for a batch of `batch` requests:
    the fp8-words ones (FP8_SMALL_TILE from FP8_SMALL_BATCH[0] to [1] requests) or the
    others (maxnreg None: the compiler's choice)."""
    if words and FP8_SMALL_TILE is not None and \
            FP8_SMALL_BATCH[0] <= batch <= FP8_SMALL_BATCH[1]:
        return FP8_SMALL_TILE
    if words:
        return FP8_BLOCK_N, FP8_NUM_WARPS, FP8_NUM_STAGES, FP8_MAXNREG
    return BLOCK_N, NUM_WARPS, NUM_STAGES, None


def fp8_words(*caches: torch.Tensor) -> bool:
    """Whether the attention kernels read these caches as uint16 words of two e4m3 elements
    (e4m3_words_to_f16): fp8 caches whose rows have an even length (every model's head_dim)
    and whose views as words exist (even strides and offset). Others keep the element-wise
    path."""
    return FP8_AS_WORDS and all(
        c.dtype == torch.float8_e4m3fn and c.shape[-1] % 2 == 0 and c.storage_offset() % 2 == 0
        and all(st % 2 == 0 for st in c.stride()[:-1]) for c in caches)


@functools.lru_cache(maxsize=8)
def _native_e4m3_cvt(device_index: int) -> bool:
    return torch.cuda.get_device_capability(device_index) >= (8, 9)


def asm_cvt(device: torch.device) -> bool:
    """Whether e4m3_words_to_f16 may use the hardware's conversion (sm_89 and later); the
    interpreter and older GPUs move the bits instead."""
    if device.type != "cuda":
        return False
    return _native_e4m3_cvt(device.index if device.index is not None
                            else torch.cuda.current_device())


def check_paged_inputs(op: str, q: torch.Tensor, k_cache: torch.Tensor,
                       req_to_token: torch.Tensor) -> None:
    """What both attention kernels assume of their inputs, said as an error naming the op."""
    if q.shape[1] % k_cache.shape[1]:
        raise ValueError(f"{op}: {q.shape[1]} query heads is not a multiple of "
                         f"{k_cache.shape[1]} KV heads")
    if q.stride(-1) != 1 or k_cache.stride(-1) != 1 or req_to_token.stride(-1) != 1:
        raise ValueError(f"{op}: q, the caches and req_to_token must be contiguous in their "
                         "last dimension")


def attention_decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                     req_to_token: torch.Tensor, seq_lens: torch.Tensor, scale: float,
                     splits: int | None = None, *, sliding_window: int = 0,
                     logit_cap: float = 0.0, k_scale: float = 1.0,
                     v_scale: float = 1.0) -> torch.Tensor:
    """An fp8 cache's scales: k_scale folds into the softmax scale (q . k_cache * k_scale)
    and v_scale multiplies the output (a sum of probabilities times v_cache * v_scale)."""
    batch, q_heads, head_dim = q.shape
    check_paged_inputs("attention_decode", q, k_cache, req_to_token)
    out = torch.empty((batch, q_heads, head_dim), dtype=q.dtype, device=q.device)
    launch_decode(q, k_cache, v_cache, req_to_token, seq_lens, out, scale * k_scale,
                  splits=splits, sliding_window=sliding_window, logit_cap=logit_cap)
    return out if v_scale == 1.0 else out.mul_(v_scale)


def launch_decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                  req_to_token: torch.Tensor, seq_lens: torch.Tensor, out: torch.Tensor,
                  scale: float, *, extend_lens: torch.Tensor | None = None,
                  qo_indptr: torch.Tensor | None = None, splits: int | None = None,
                  sliding_window: int = 0, logit_cap: float = 0.0) -> None:
    """Decode attention of the B requests into `out`. With extend_lens and qo_indptr (a mixed
    batch, q and out [T, Hq, D]) only the requests extending by one token are computed, each
    at its row qo_indptr[b]; the other rows of `out` are left alone. The launch depends only
    on the shapes, never on the lengths, so it can be captured."""
    batch = seq_lens.shape[0]
    q_heads, head_dim = q.shape[1], q.shape[2]
    kv_heads = k_cache.shape[1]
    if batch == 0:
        return
    mixed = extend_lens is not None
    if mixed and qo_indptr is None:
        raise ValueError("launch_decode: a mixed batch needs qo_indptr with extend_lens")
    ext = extend_lens if extend_lens is not None else seq_lens  # unread unless mixed
    qo = qo_indptr if qo_indptr is not None else seq_lens
    group = q_heads // kv_heads
    n_split = splits or num_splits(batch, kv_heads, q.device)
    if not 1 <= n_split <= MAX_SPLITS:
        raise ValueError(f"attention_decode: {n_split} splits; 1 to {MAX_SPLITS} are merged")
    # One split needs no merge: stage 1 then writes `out` and the buffers are not touched.
    mid_shape = (batch, q_heads, n_split, head_dim) if n_split > 1 else (1, 1, 1, 1)
    mid_o = torch.empty(mid_shape, dtype=torch.float32, device=q.device)
    mid_lse = torch.empty(mid_shape[:3], dtype=torch.float32, device=q.device)
    block_d = triton.next_power_of_2(head_dim)
    words = fp8_words(k_cache, v_cache)
    block_n, num_warps, num_stages, maxnreg = tunables(words, batch)
    pdl_options = pdl.launch_options()
    if maxnreg is not None:
        pdl_options = {**pdl_options, "maxnreg": maxnreg}
    heads_first = HEADS_FIRST and batch <= 65535  # a grid's second dimension holds 65535
    grid = (kv_heads, batch, n_split) if heads_first else (batch, kv_heads, n_split)
    if words and native_attention.enabled() and asm_cvt(q.device) and native_attention.fits(
            q, k_cache, v_cache, req_to_token, seq_lens, ext, qo):
        native_attention.launch_stage1(  # the CUDA C stage 1 (byte strides: fp8 caches)
            q, k_cache, v_cache, req_to_token, seq_lens, ext, qo, mid_o, mid_lse, out,
            float(scale) * LOG2E, int(sliding_window), float(logit_cap), n_split, mixed,
            heads_first)
    else:
        if words:
            k_cache, v_cache = k_cache.view(torch.uint16), v_cache.view(torch.uint16)
        _decode_stage1[grid](
            q, k_cache, v_cache, req_to_token, seq_lens, ext, qo, mid_o, mid_lse, out,
            q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1),
            req_to_token.stride(0), mid_o.stride(0), mid_o.stride(1), mid_o.stride(2),
            mid_lse.stride(0), mid_lse.stride(1), out.stride(0), out.stride(1),
            float(scale) * LOG2E, int(sliding_window), float(logit_cap), n_split,
            HAS_CAP=logit_cap > 0, GROUP=group, HEAD_DIM=head_dim, ONE_SPLIT=n_split == 1,
            BLOCK_H=max(16, triton.next_power_of_2(group)), BLOCK_D=block_d, BLOCK_N=block_n,
            DOT_PREC=dot_precision(q.dtype), MIXED=mixed, FP8_WORDS=words,
            ASM_CVT=words and asm_cvt(q.device), HEADS_FIRST=heads_first,
            num_warps=num_warps, num_stages=num_stages, **pdl_options)
    if n_split == 1:
        return
    _decode_stage2[(batch, q_heads)](
        mid_o, mid_lse, out, ext, qo, mid_o.stride(0), mid_o.stride(1), mid_o.stride(2),
        mid_lse.stride(0), mid_lse.stride(1), out.stride(0), out.stride(1), n_split,
        HEAD_DIM=head_dim, BLOCK_S=MAX_SPLITS, BLOCK_D=block_d, MIXED=mixed, num_warps=4,
        **pdl_options)
