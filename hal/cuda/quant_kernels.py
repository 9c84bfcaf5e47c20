"""Triton kernels for quantized linears: the weights are read in their packed form and
dequantized in registers, so a decode step streams fp8 / int8 bytes or int4 nibbles instead of
bf16 (layouts: hal/quant/weight.py).

    qgemv   one token (batch-1 decode): each program reduces BLOCK_N weight rows against x.
            int4 bytes are split into their low / high nibbles and multiplied with the even /
            odd elements of x, so nothing is interleaved. The launch config's variant (flags,
            measured per shape by quant_tune) picks among formulations:
            - default: each group's partial sums scaled once, sum_g s_g * sum_{k in g} x_k q_k
              + o_g * sum_{k in g} x_k, through a reshape of the product tile to [rows,
              groups, group] (free in registers: each thread's columns lie in one group).
            - GEMV_COLUMN: no reshape at all: every column's product times its group's scale
              (plus the offset times x), the scales gathered per column (repeated addresses
              hit L1), x's even / odd elements loaded by stride.
            - GEMV_EXP_CVT: integers to float32 through the exponent bits (_int_to_f32).
            - GEMV_X_VEC: weight loads no wider than x's 16-byte vectors (fp8 / int8: 8 bytes
              a thread for bf16 x, int4: 4). The compiler lays out the weight tile by its
              loads (16 bytes a thread) and x by its own; x then goes through shared memory,
              with barriers, every iteration to reach the tile's columns (the sm_90 code of
              the fp8 2 x 2048 tile: 4 KiB of shared memory and 8 barriers, none with this
              flag, where the bf16 GEMV's x and weight layouts already agree).
            - GEMV_ACC (fp8 / int8 with one scale a row): the products summed into a
              [BLOCK_N, BLOCK_K] float32 tile across the iterations, the row sums taken once
              after the loop. Without it every iteration reduces its product tile across
              threads (shuffles, and across warps through shared memory with barriers): in
              the sm_90 code of the fp8 4 x 1024 tile at 4 warps that is 171 instructions and
              6 barriers an iteration for 32 weight bytes a thread; with GEMV_ACC |
              GEMV_X_VEC, 122 and none (8 x 1024: 218 for 64 bytes), the conversion (e4m3
              pairs to f16, f16 to f32) and one FMA a weight being most of what is left.
    qgemm   several tokens: tl.dot on tiles of x [BLOCK_M, BLOCK_K] and of the integer (or
            e4m3) values [BLOCK_N, BLOCK_K] converted exactly to x's dtype; every K tile lies
            within one group (BLOCK_K divides the group size), so its product is scaled by the
            group's scale (and the offset times the tile's row sums of x) in float32. With a
            small BLOCK_M it is the skinny GEMM of decode batches; with a large one, prefill.
            For fp8 weights it also runs W8A8: activations quantized per token to e4m3, the
            dot on fp8 tensor cores (twice bf16's rate), both scales on the float32 sums.

Both compute the definition y = x @ dequantize(w)^T exactly up to float32 summation order
(the weight values are never rounded). `KIND`: 0 fp8, 1 int8, 2 int4. `PER_ROW`: one scale
per output row (fp8, GPTQ without groups), applied once at the end.
"""

from __future__ import annotations

import triton
import triton.language as tl

from tessera.hal.cuda.pdl import enter as pdl_enter
from tessera.hal.cuda.pdl import prefetch_rows_l2

FP8, INT8, INT4 = 0, 1, 2
# qgemv formulations, flags of a GEMV config's `variant` (0: group sums through a reshape of
# the product tile, the integer -> float conversion instruction, 16-byte weight loads)
GEMV_COLUMN = 1  # no reshape: each column's group scale / offset gathered, x split by stride
GEMV_EXP_CVT = 2  # int8 / int4 converted to float32 through the exponent bits (_int_to_f32)
GEMV_X_VEC = 4  # weight loads as wide as x's, so x needs no layout conversion
GEMV_DOT = 8  # not a qgemv formulation: the token through qgemm's tile (quant_tune)
GEMV_ACC = 16  # fp8 / int8 per row: a 2-D float32 accumulator, reduced once after the loop
# the loop software-pipelined 2 or 3 stages deep (the weight tiles ahead in shared memory):
# in int4_gemv_probe_stages_h200.json it took a word-tile down projection (14336 inputs, 7-14
# iterations a program) from 32.1 to 19.0 us and left the 4096-input shapes (2-4
# iterations) as they were; qgemv_kernel's int4 down 23.4 -> 20.5 us (call 35)
GEMV_STAGES2 = 64
GEMV_STAGES3 = 128
# not a qgemv formulation: the CUDA C GEMV of native_gemv.py, config (rows a block, runs a
# thread an iteration, warps a block, GEMV_NATIVE)
GEMV_NATIVE = 256
# with GEMV_NATIVE: int4's tensor-core GEMV of native_gemv_mma.py, config (rows a block, k-tiles
# a warp loads ahead, warps a block, GEMV_MMA); listed where HAL_CUDA_INT4_MMA=1
GEMV_MMA = 512 | GEMV_NATIVE


def gemv_stages(variant: int) -> int:
    """The software-pipelining depth a GEMV variant asks for (1: none)."""
    return 3 if variant & GEMV_STAGES3 else 2 if variant & GEMV_STAGES2 else 1


def gemv_acc_fits(scheme: str, per_row: bool) -> bool:
    """GEMV_ACC sums raw products, scaled once a row after the loop: 8-bit weights with one
    scale a row only (qgemv refuses it otherwise, the tuner does not list it)."""
    return per_row and scheme != "int4"


@triton.jit
def _int_to_f32(q, KIND: tl.constexpr, EXP_CVT: tl.constexpr):
    """Small integers (int4 0..15 as int32, int8 sign-extended) to float32, exactly. EXP_CVT:
    through the float's bits, 2^23 + v has v in its mantissa, so an integer OR / add and one
    float subtract replace the int -> float conversion instruction, which runs at a quarter
    of the FMA rate and bounds a narrow-weight GEMV before the memory does."""
    if EXP_CVT:
        if KIND == 2:
            f = (q | 0x4B000000).to(tl.float32, bitcast=True) - 8388608.0
        else:
            f = (q + 0x4B000080).to(tl.float32, bitcast=True) - 8388736.0
    else:
        f = q.to(tl.float32)
    return f


@triton.jit
def qgemv_kernel(x_ptr, q_ptr, s_ptr, o_ptr, b_ptr, out_ptr, n_out, n_in, q_s0, s_s0,
                 KIND: tl.constexpr, GROUP: tl.constexpr, PER_ROW: tl.constexpr,
                 HAS_BIAS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                 COLUMN: tl.constexpr, EXP_CVT: tl.constexpr, X_VEC: tl.constexpr,
                 HALF: tl.constexpr, ACC: tl.constexpr = False, PF_LINES: tl.constexpr = 1,
                 USE_PDL: tl.constexpr = False, PREFETCH: tl.constexpr = False,
                 STAGES: tl.constexpr = 1):
    # HALF (int4): byte j pairs columns lo(j) = (j // HALF) * 2 HALF + j % HALF (low nibble)
    # and lo(j) + HALF (high): 1 for "nibbles" (2j, 2j + 1), T / 2 for "halves<T>". Either
    # way a run of GROUP / 2 bytes holds the columns of one group (T <= GROUP).
    if PREFETCH:  # HAL_CUDA_PDL=prefetch: the weight rows into L2 before the wait (pdl.py)
        prefetch_rows_l2(q_ptr, tl.program_id(0) * BLOCK_N, n_out, q_s0,
                         n_in // 2 if KIND == 2 else n_in, BLOCK_N, PF_LINES)
    pdl_enter(USE_PDL)
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    rmask = rows < n_out
    q_rows = q_ptr + rows[:, None].to(tl.int64) * q_s0
    s_rows = rows[:, None].to(tl.int64) * s_s0
    acc = tl.zeros([BLOCK_N], tl.float32)
    xsum = tl.zeros([BLOCK_K // 2], tl.float32)  # PER_ROW int4: sum of x, for the offset
    acc2 = tl.zeros([BLOCK_N, BLOCK_K if ACC else 1], tl.float32)  # ACC: products so far
    # STAGES > 1 (GEMV_STAGES2 / 3): Triton software-pipelines the loop, the next tiles'
    # weights copied ahead into shared memory (cp.async) while this one's arithmetic runs
    for k0 in tl.range(0, n_in, BLOCK_K, num_stages=STAGES):
        if KIND == 2:
            j = k0 // 2 + tl.arange(0, BLOCK_K // 2)  # byte index: columns 2j, 2j + 1
            jmask = j < n_in // 2
            jq = j
            if X_VEC:  # a byte holds two columns: half of x's elements per 16 bytes
                jq = tl.max_contiguous(j, 64 // x_ptr.dtype.element_ty.primitive_bitwidth)
            packed = tl.load(q_rows + jq[None, :], mask=rmask[:, None] & jmask[None, :],
                             other=0).to(tl.int32)
            if HALF > 1:  # each nibble's columns: runs of HALF
                c_lo = tl.max_contiguous((j // HALF) * (2 * HALF) + j % HALF, HALF)
                x_even = tl.load(x_ptr + c_lo, mask=jmask, other=0.0).to(tl.float32)
                x_odd = tl.load(x_ptr + c_lo + HALF, mask=jmask, other=0.0).to(tl.float32)
            elif COLUMN:  # x's even / odd elements loaded straight into the tile's columns
                x_even = tl.load(x_ptr + 2 * j, mask=jmask, other=0.0).to(tl.float32)
                x_odd = tl.load(x_ptr + 2 * j + 1, mask=jmask, other=0.0).to(tl.float32)
            else:
                k = k0 + tl.arange(0, BLOCK_K)
                x = tl.load(x_ptr + k, mask=k < n_in, other=0.0).to(tl.float32)
                x_even, x_odd = tl.split(tl.reshape(x, [BLOCK_K // 2, 2]))
            prod = _int_to_f32(packed & 0xF, KIND, EXP_CVT) * x_even[None, :] + \
                _int_to_f32(packed >> 4, KIND, EXP_CVT) * x_odd[None, :]  # [BLOCK_N, BLOCK_K/2]
            pair = x_even + x_odd
            if PER_ROW:
                acc += tl.sum(prod, 1)
                xsum += pair
            elif COLUMN:  # each column's group scale / offset, repeated addresses hit L1
                cmask = rmask[:, None] & jmask[None, :]
                g = j[None, :] // (GROUP // 2)
                s = tl.load(s_ptr + s_rows + g, mask=cmask, other=0.0)
                o = tl.load(o_ptr + s_rows + g, mask=cmask, other=0.0)
                acc += tl.sum(prod * s + o * pair[None, :], 1)
            else:
                NG: tl.constexpr = BLOCK_K // GROUP
                part = tl.sum(tl.reshape(prod, [BLOCK_N, NG, GROUP // 2]), 2)
                xs = tl.sum(tl.reshape(pair, [NG, GROUP // 2]), 1)
                g = k0 // GROUP + tl.arange(0, NG)
                gmask = rmask[:, None] & (g < n_in // GROUP)[None, :]
                s = tl.load(s_ptr + s_rows + g[None, :], mask=gmask, other=0.0)
                o = tl.load(o_ptr + s_rows + g[None, :], mask=gmask, other=0.0)
                acc += tl.sum(part * s + o * xs[None, :], 1)
        else:
            k = k0 + tl.arange(0, BLOCK_K)
            kmask = k < n_in
            kq = k
            if X_VEC:  # as many weight bytes per load as x elements in 16 bytes
                kq = tl.max_contiguous(k, 128 // x_ptr.dtype.element_ty.primitive_bitwidth)
            w = tl.load(q_rows + kq[None, :], mask=rmask[:, None] & kmask[None, :], other=0.0)
            x = tl.load(x_ptr + k, mask=kmask, other=0.0).to(tl.float32)
            if KIND == 1:
                prod = _int_to_f32(w.to(tl.int32), KIND, EXP_CVT) * x[None, :]
            else:
                prod = w.to(tl.float32) * x[None, :]
            if ACC:  # PER_ROW (qgemv refuses ACC otherwise)
                acc2 += prod
            elif PER_ROW:
                acc += tl.sum(prod, 1)
            elif COLUMN:
                cmask = rmask[:, None] & kmask[None, :]
                s = tl.load(s_ptr + s_rows + k[None, :] // GROUP, mask=cmask, other=0.0)
                acc += tl.sum(prod * s, 1)
            else:
                NG2: tl.constexpr = BLOCK_K // GROUP
                part = tl.sum(tl.reshape(prod, [BLOCK_N, NG2, GROUP]), 2)
                g = k0 // GROUP + tl.arange(0, NG2)
                gmask = rmask[:, None] & (g < n_in // GROUP)[None, :]
                s = tl.load(s_ptr + s_rows + g[None, :], mask=gmask, other=0.0)
                acc += tl.sum(part * s, 1)
    if ACC:
        acc = tl.sum(acc2, 1)
    if PER_ROW:
        acc = acc * tl.load(s_ptr + rows.to(tl.int64) * s_s0, mask=rmask, other=0.0)
        if KIND == 2:
            acc += tl.load(o_ptr + rows.to(tl.int64) * s_s0, mask=rmask, other=0.0) * \
                tl.sum(xsum, 0)
    if HAS_BIAS:
        acc += tl.load(b_ptr + rows, mask=rmask, other=0.0).to(tl.float32)
    tl.store(out_ptr + rows, acc.to(out_ptr.dtype.element_ty), mask=rmask)


@triton.jit
def _halves_tile(x_ptr, x_rows, q_rows, k0, mmask, nmask, HALF: tl.constexpr,
                 NIB_BIAS: tl.constexpr):
    """One "halves" K tile of int4: x's two halves [BLOCK_M, HALF], the weight's low and high
    nibbles [BLOCK_N, HALF] in x's dtype, and x's row sums over the tile (for the offsets). NIB_BIAS (16-bit x): a nibble q becomes the
    float NIB_BIAS + q by setting the exponent bits (one OR, no conversion instruction: 0x4300
    is bf16 128, 0x6400 fp16 1024); the caller takes the bias back out (_group_scales)."""
    kh = k0 + tl.arange(0, HALF)
    x_lo = tl.load(x_rows + kh[None, :], mask=mmask[:, None], other=0.0)
    x_hi = tl.load(x_rows + HALF + kh[None, :], mask=mmask[:, None], other=0.0)
    packed = tl.load(q_rows + (k0 // 2 + tl.arange(0, HALF))[None, :], mask=nmask[:, None],
                     other=0)
    if NIB_BIAS != 0.0:
        bits = 0x4300 if x_ptr.dtype.element_ty == tl.bfloat16 else 0x6400
        lo = ((packed & 0xF).to(tl.int32) | bits).to(tl.int16).to(x_ptr.dtype.element_ty,
                                                                   bitcast=True)
        hi = ((packed >> 4).to(tl.int32) | bits).to(tl.int16).to(x_ptr.dtype.element_ty,
                                                                  bitcast=True)
    else:
        lo = (packed & 0xF).to(x_ptr.dtype.element_ty)
        hi = (packed >> 4).to(x_ptr.dtype.element_ty)
    rsum = tl.sum(x_lo.to(tl.float32), 1) + tl.sum(x_hi.to(tl.float32), 1)
    return x_lo, x_hi, lo, hi, rsum


@triton.jit
def _group_scales(s_ptr, o_ptr, s_rows, g, nmask, NIB_BIAS: tl.constexpr):
    """Group g's scale and offset of each row, the offset less NIB_BIAS times the scale (the
    nibbles' exponent-bit bias taken back out through x's row sums)."""
    s = tl.load(s_ptr + s_rows + g, mask=nmask, other=0.0)
    o = tl.load(o_ptr + s_rows + g, mask=nmask, other=0.0) - NIB_BIAS * s
    return s, o


# The token count M follows the batch: Triton would compile apart the M that are 1 or
# multiples of 16 from the others (a 1025-token prefill chunk compiled qgemm_wt_kernel in the
# middle of serving on the H200 at 4256177, 1.9 s): M is not specialized.
@triton.jit(do_not_specialize=["M"])
def qgemm_kernel(x_ptr, q_ptr, s_ptr, o_ptr, b_ptr, out_ptr, xs_ptr, M, N, K, x_s0, q_s0, s_s0,
                 out_s0, KIND: tl.constexpr, GROUP: tl.constexpr, PER_ROW: tl.constexpr,
                 HAS_BIAS: tl.constexpr, A_FP8: tl.constexpr, BLOCK_M: tl.constexpr,
                 BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, DOT_PREC: tl.constexpr,
                 HALF: tl.constexpr, NIB_BIAS: tl.constexpr, SPLIT_K: tl.constexpr = 1,
                 FAST_ACC: tl.constexpr = False):
    # FAST_ACC (A_FP8 with one scale a row): each K tile's fp8 dot accumulates into acc
    # itself, so the tensor cores' products of consecutive tiles overlap; without it every
    # tile's dot starts from zero and its sum is added in float32 after it (the promotion
    # that waits on each dot).
    # SPLIT_K > 1: as in qgemm_wt_kernel, program (n, m, s) sums the s-th of SPLIT_K runs of
    # K tiles into a float32 partial [SPLIT_K, M, N] at out_ptr (every scale applied: they
    # are linear), and splitk_sum_kernel adds them in order with the bias. A weight with few
    # output rows (o, down: 4096) then runs more than one program a multiprocessor at 256
    # tokens (ncu, call 55: one W8A8 program an SM, each waiting on its own wgmma).
    # A_FP8 (fp8 weights only, W8A8): x holds e4m3 activations scaled per row by xs; the dot
    # runs on the fp8 tensor cores and both scales are applied to the float32 sums.
    # HALF (int4, "halves<T>" with BLOCK_K == T == 2 HALF): the low nibbles of the tile's
    # bytes are its first HALF columns and the high ones the rest, so the tile is two dots of
    # contiguous halves, nothing interleaved. NIB_BIAS (16-bit x): a nibble becomes the
    # 16-bit float NIB_BIAS + q by setting the exponent bits (one OR, no conversion
    # instruction: 0x4300 is bf16 128, 0x6400 fp16 1024); the bias comes back out with the
    # tile's row sums of x, folded into the offset term (o - NIB_BIAS * s).
    # program ids: N fastest, so the programs running together share the same x rows
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    k_start = 0
    k_end = K
    if SPLIT_K > 1:
        k_tiles = tl.cdiv(tl.cdiv(K, BLOCK_K), SPLIT_K)
        k_start = tl.program_id(2) * k_tiles * BLOCK_K
        k_end = tl.minimum(K, k_start + k_tiles * BLOCK_K)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mmask = rm < M
    nmask = rn < N
    x_rows = x_ptr + rm[:, None].to(tl.int64) * x_s0
    q_rows = q_ptr + rn[:, None].to(tl.int64) * q_s0
    s_rows = rn.to(tl.int64) * s_s0
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    xsum = tl.zeros([BLOCK_M], tl.float32)
    for k0 in range(k_start, k_end, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        kmask = k < K
        if KIND == 2 and HALF > 1:
            x_lo, x_hi, lo, hi, rsum = _halves_tile(x_ptr, x_rows, q_rows, k0, mmask, nmask,
                                                    HALF, NIB_BIAS)
            part = tl.dot(x_lo, tl.trans(lo), input_precision=DOT_PREC)
            part = tl.dot(x_hi, tl.trans(hi), part, input_precision=DOT_PREC)
            if PER_ROW:
                acc += part
                xsum += rsum
            else:
                s, o = _group_scales(s_ptr, o_ptr, s_rows, k0 // GROUP, nmask, NIB_BIAS)
                acc += part * s[None, :] + rsum[:, None] * o[None, :]
        else:
            x = tl.load(x_rows + k[None, :], mask=mmask[:, None] & kmask[None, :], other=0.0)
            if KIND == 2:
                j = k0 // 2 + tl.arange(0, BLOCK_K // 2)
                packed = tl.load(q_rows + j[None, :],
                                 mask=nmask[:, None] & (j < K // 2)[None, :], other=0)
                # Interleaved back into column order. Two half-width dots instead (x's even
                # columns with the low nibbles, its odd ones, loaded by stride, with the high)
                # measured 2-4x slower on the H200 at 16-256 tokens (b61f5f1, 14.6 / 45.2 / 92.1
                # ms of linears a step against 7.1 / 11.0 / 35.5 at batch 16 / 64 / 256).
                q = tl.reshape(tl.join(packed & 0xF, packed >> 4), [BLOCK_N, BLOCK_K])
            else:
                q = tl.load(q_rows + k[None, :], mask=nmask[:, None] & kmask[None, :], other=0.0)
            if A_FP8 and FAST_ACC and PER_ROW:
                acc = tl.dot(x, tl.trans(q), acc)
            else:
                if A_FP8:
                    part = tl.dot(x, tl.trans(q))
                else:
                    part = tl.dot(x, tl.trans(q.to(x.dtype)), input_precision=DOT_PREC)
                if PER_ROW:
                    acc += part
                    if KIND == 2:
                        xsum += tl.sum(x.to(tl.float32), 1)
                else:
                    g = k0 // GROUP
                    s = tl.load(s_ptr + s_rows + g, mask=nmask, other=0.0)
                    acc += part * s[None, :]
                    if KIND == 2:
                        o = tl.load(o_ptr + s_rows + g, mask=nmask, other=0.0)
                        acc += tl.sum(x.to(tl.float32), 1)[:, None] * o[None, :]
    if A_FP8:
        acc = acc * tl.load(xs_ptr + rm, mask=mmask, other=0.0)[:, None]
    if PER_ROW:
        s_row = tl.load(s_ptr + s_rows, mask=nmask, other=0.0)
        acc = acc * s_row[None, :]
        if KIND == 2:
            o_row = tl.load(o_ptr + s_rows, mask=nmask, other=0.0) - NIB_BIAS * s_row
            acc += xsum[:, None] * o_row[None, :]
    if SPLIT_K > 1:  # the float32 partial, into the workspace [SPLIT_K, M, N]
        part_out = out_ptr + (tl.program_id(2) * M + rm[:, None]).to(tl.int64) * N + rn[None, :]
        tl.store(part_out, acc, mask=mmask[:, None] & nmask[None, :])
    else:
        if HAS_BIAS:
            acc += tl.load(b_ptr + rn, mask=nmask, other=0.0).to(tl.float32)[None, :]
        out = out_ptr + rm[:, None].to(tl.int64) * out_s0 + rn[None, :]
        tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=mmask[:, None] & nmask[None, :])


# The widest row a kernel that quantizes its own output (rows_fused's norm and SiLU) holds in
# one block: the fp8 product takes activations from those kernels up to this many a row.
QUANT_ROW_MAX = 16384


@triton.jit
def quant_row_fp8(x):
    """One row in float32 (lanes past its end 0) -> (x / scale clamped to e4m3's range, as
    float32, and scale = max|x| / 448): quant_rows_fp8_kernel's arithmetic, which the
    kernels that quantize their own output (a norm's, the SiLU's) share."""
    scale = tl.maximum(tl.div_rn(tl.max(tl.abs(x), 0), 448.0), 1e-12)
    # div_rn: IEEE division, as torch's (Triton's `/` may be off by an ulp in fp32)
    return tl.minimum(tl.maximum(tl.div_rn(x, scale), -448.0), 448.0), scale


@triton.jit
def quant_rows_fp8_kernel(x_ptr, out_ptr, scale_ptr, K, x_s0, out_s0,
                          BLOCK_K: tl.constexpr, USE_PDL: tl.constexpr = False):
    """Dynamic per-token fp8 quantization (W8A8): scale = max|x| / 448, out = x / scale.
    A row that fits one block (BLOCK_K >= K: every Llama-3-8B input up to 16384 wide) is
    read once and kept in registers; a wider one is read twice."""
    pdl_enter(USE_PDL)
    row = tl.program_id(0).to(tl.int64)
    if BLOCK_K >= K:
        k = tl.arange(0, BLOCK_K)
        x = tl.load(x_ptr + row * x_s0 + k, mask=k < K, other=0.0).to(tl.float32)
        q, scale = quant_row_fp8(x)
        tl.store(out_ptr + row * out_s0 + k, q.to(out_ptr.dtype.element_ty), mask=k < K)
        tl.store(scale_ptr + row, scale)
        return
    amax = tl.zeros([BLOCK_K], tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        x = tl.load(x_ptr + row * x_s0 + k, mask=k < K, other=0.0).to(tl.float32)
        amax = tl.maximum(amax, tl.abs(x))
    scale = tl.maximum(tl.div_rn(tl.max(amax, 0), 448.0), 1e-12)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        x = tl.load(x_ptr + row * x_s0 + k, mask=k < K, other=0.0).to(tl.float32)
        # div_rn: IEEE division, as torch's (Triton's `/` may be off by an ulp in fp32)
        q = tl.minimum(tl.maximum(tl.div_rn(x, scale), -448.0), 448.0)
        tl.store(out_ptr + row * out_s0 + k, q.to(out_ptr.dtype.element_ty), mask=k < K)
    tl.store(scale_ptr + row, scale)


@triton.jit
def wt_tile(pid_m, pid_n, pid_k, M, N, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
            BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr):
    """Program (pid_m, pid_n, pid_k)'s part of a weights-as-A product: its K range [start,
    end) (split pid_k of SPLIT_K: whole runs of BLOCK_K tiles, the last shorter or empty),
    its token rows and weight rows, and their masks."""
    k_tiles = tl.cdiv(tl.cdiv(K, BLOCK_K), SPLIT_K)
    k_start = pid_k * k_tiles * BLOCK_K
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    return (k_start, tl.minimum(K, k_start + k_tiles * BLOCK_K), rm, rn, rm < M, rn < N)


@triton.jit
def store_wt_tile(acc, out_ptr, b_ptr, rm, rn, mmask, nmask, pid_k, M, N, out_s0,
                  HAS_BIAS: tl.constexpr, SPLIT_K: tl.constexpr):
    """Store out^T's tile acc [BLOCK_N, BLOCK_M]: with SPLIT_K > 1 the float32 partial into
    the workspace [SPLIT_K, M, N] (splitk_sum_kernel adds the bias), else with the bias into
    out [M, N] (row stride out_s0) in its dtype."""
    if SPLIT_K > 1:
        part_out = out_ptr + (pid_k * M + rm[None, :]).to(tl.int64) * N + rn[:, None]
        tl.store(part_out, acc, mask=nmask[:, None] & mmask[None, :])
    else:
        if HAS_BIAS:
            acc += tl.load(b_ptr + rn, mask=nmask, other=0.0).to(tl.float32)[:, None]
        out = out_ptr + rm[None, :].to(tl.int64) * out_s0 + rn[:, None]
        tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=nmask[:, None] & mmask[None, :])


@triton.jit(do_not_specialize=["M"])
def qgemm_wt_kernel(x_ptr, q_ptr, s_ptr, o_ptr, b_ptr, out_ptr, M, N, K, x_s0, q_s0, s_s0,
                    out_s0, KIND: tl.constexpr, GROUP: tl.constexpr, PER_ROW: tl.constexpr,
                    HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                    BLOCK_K: tl.constexpr, DOT_PREC: tl.constexpr, HALF: tl.constexpr,
                    NIB_BIAS: tl.constexpr, SPLIT_K: tl.constexpr):
    """qgemm with the weight as the dot's first operand (weights-as-A, "swap AB"): the
    accumulator is out^T's tile [BLOCK_N, BLOCK_M] += W[BLOCK_N, BLOCK_K] @ x[BLOCK_M,
    BLOCK_K]^T, stored transposed. On Hopper the dequantized weight tile then feeds the
    tensor cores from registers (wgmma's A side, 64 rows a warpgroup) instead of going back
    through shared memory, and the tokens are the instruction's N side, which may be as
    narrow as the batch (qgemm_kernel pads a skinny batch up to the A side's 64). Same
    arguments and definition as qgemm_kernel, without W8A8; int4 only in "halves" tiles
    (HALF > 1, BLOCK_K == 2 HALF).

    SPLIT_K > 1: program (n, m, s) sums the s-th of SPLIT_K runs of K tiles and writes its
    float32 partial (scales and offsets applied: they are linear) to out_ptr, a workspace
    [SPLIT_K, M, N]; splitk_sum_kernel adds the partials in order and the bias. A weight with
    few output rows (down: 4096 of 14336 inputs) then still spreads over every SM."""
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    pid_k = tl.program_id(2)
    k_start, k_end, rm, rn, mmask, nmask = wt_tile(pid_m, pid_n, pid_k, M, N, K, BLOCK_M,
                                                   BLOCK_N, BLOCK_K, SPLIT_K)
    x_rows = x_ptr + rm[:, None].to(tl.int64) * x_s0
    q_rows = q_ptr + rn[:, None].to(tl.int64) * q_s0
    s_rows = rn.to(tl.int64) * s_s0
    acc = tl.zeros([BLOCK_N, BLOCK_M], tl.float32)
    xsum = tl.zeros([BLOCK_M], tl.float32)
    for k0 in range(k_start, k_end, BLOCK_K):
        if KIND == 2:
            x_lo, x_hi, lo, hi, rsum = _halves_tile(x_ptr, x_rows, q_rows, k0, mmask, nmask,
                                                    HALF, NIB_BIAS)
            part = tl.dot(lo, tl.trans(x_lo), input_precision=DOT_PREC)
            part = tl.dot(hi, tl.trans(x_hi), part, input_precision=DOT_PREC)
            if PER_ROW:
                acc += part
                xsum += rsum
            else:
                s, o = _group_scales(s_ptr, o_ptr, s_rows, k0 // GROUP, nmask, NIB_BIAS)
                acc += part * s[:, None] + o[:, None] * rsum[None, :]
        else:
            k = k0 + tl.arange(0, BLOCK_K)
            kmask = k < K
            x = tl.load(x_rows + k[None, :], mask=mmask[:, None] & kmask[None, :], other=0.0)
            q = tl.load(q_rows + k[None, :], mask=nmask[:, None] & kmask[None, :], other=0.0)
            part = tl.dot(q.to(x_ptr.dtype.element_ty), tl.trans(x), input_precision=DOT_PREC)
            if PER_ROW:
                acc += part
            else:
                s = tl.load(s_ptr + s_rows + k0 // GROUP, mask=nmask, other=0.0)
                acc += part * s[:, None]
    if PER_ROW:
        s_row = tl.load(s_ptr + s_rows, mask=nmask, other=0.0)
        acc = acc * s_row[:, None]
        if KIND == 2:
            o_row = tl.load(o_ptr + s_rows, mask=nmask, other=0.0) - NIB_BIAS * s_row
            acc += o_row[:, None] * xsum[None, :]
    store_wt_tile(acc, out_ptr, b_ptr, rm, rn, mmask, nmask, pid_k, M, N, out_s0, HAS_BIAS,
                  SPLIT_K)


@triton.jit(do_not_specialize=["M"])
def splitk_sum_kernel(ws_ptr, b_ptr, out_ptr, M, N, SPLIT_K: tl.constexpr,
                      HAS_BIAS: tl.constexpr, BLOCK: tl.constexpr):
    """out[m, n] = sum_s ws[s, m, n] (+ bias[n]), the partials added in s order (the same
    sum every run), out contiguous [M, N]."""
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = i < M * N
    acc = tl.zeros([BLOCK], tl.float32)
    for s in tl.static_range(SPLIT_K):
        acc += tl.load(ws_ptr + s * M * N + i, mask=mask, other=0.0)
    if HAS_BIAS:
        acc += tl.load(b_ptr + i % N, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + i, acc.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def dequant_kernel(q_ptr, s_ptr, o_ptr, out_ptr, N, K, q_s0, s_s0, out_s0,
                   KIND: tl.constexpr, GROUP: tl.constexpr, PER_ROW: tl.constexpr,
                   HALF: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """The dense weight out[N, K] = dequantize(w) in out's dtype (each value computed in
    float32, then rounded once): for a batch large enough that the GEMM is compute-bound
    (prefill), the weight is expanded once and the library GEMM does the rest. int4 in
    "halves" tiles (BLOCK_K == 2 HALF) or, with HALF 1, interleaved nibbles."""
    rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    k0 = tl.program_id(1) * BLOCK_K
    nmask = rn < N
    q_rows = q_ptr + rn[:, None].to(tl.int64) * q_s0
    o_rows = out_ptr + rn[:, None].to(tl.int64) * out_s0
    s_rows = rn[:, None].to(tl.int64) * s_s0
    if KIND == 2:
        j = tl.arange(0, BLOCK_K // 2)
        jmask = k0 + 2 * j < K
        packed = tl.load(q_rows + k0 // 2 + j[None, :], mask=nmask[:, None] & jmask[None, :],
                         other=0).to(tl.int32)
        if HALF > 1:
            c_lo = (j // HALF) * (2 * HALF) + j % HALF
            c_hi = c_lo + HALF
        else:
            c_lo = 2 * j
            c_hi = 2 * j + 1
        c_lo = k0 + c_lo
        c_hi = k0 + c_hi
        cmask = nmask[:, None] & jmask[None, :]
        if PER_ROW or HALF > 1:  # one scale a row for the tile: [BLOCK_N, 1], broadcast
            g = 0 if PER_ROW else k0 // GROUP  # a "halves" tile lies within one group
            s_lo = tl.load(s_ptr + s_rows + g, mask=nmask[:, None], other=0.0)
            o_lo = tl.load(o_ptr + s_rows + g, mask=nmask[:, None], other=0.0)
            s_hi = s_lo
            o_hi = o_lo
        else:
            g_lo = s_rows + (c_lo // GROUP)[None, :]
            g_hi = s_rows + (c_hi // GROUP)[None, :]
            s_lo = tl.load(s_ptr + g_lo, mask=cmask, other=0.0)
            s_hi = tl.load(s_ptr + g_hi, mask=cmask, other=0.0)
            o_lo = tl.load(o_ptr + g_lo, mask=cmask, other=0.0)
            o_hi = tl.load(o_ptr + g_hi, mask=cmask, other=0.0)
        lo = (packed & 0xF).to(tl.float32) * s_lo + o_lo
        hi = (packed >> 4).to(tl.float32) * s_hi + o_hi
        tl.store(o_rows + c_lo[None, :], lo.to(out_ptr.dtype.element_ty), mask=cmask)
        tl.store(o_rows + c_hi[None, :], hi.to(out_ptr.dtype.element_ty), mask=cmask)
    else:
        k = k0 + tl.arange(0, BLOCK_K)
        cmask = nmask[:, None] & (k < K)[None, :]
        if KIND == 0:
            q = tl.load(q_rows + k[None, :], mask=cmask, other=0.0).to(tl.float32)
        else:
            q = tl.load(q_rows + k[None, :], mask=cmask, other=0).to(tl.float32)
        if PER_ROW:
            s = tl.load(s_ptr + s_rows, mask=nmask[:, None], other=0.0)
        else:
            s = tl.load(s_ptr + s_rows + (k // GROUP)[None, :], mask=cmask, other=0.0)
        tl.store(o_rows + k[None, :], (q * s).to(out_ptr.dtype.element_ty), mask=cmask)
