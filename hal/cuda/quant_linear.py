"""The cuda plugin's quantized linears (schemes and layouts: hal/quant/weight.py).

    one token                       qgemv: streams the packed weight once (decode, batch 1),
                                    or, for int4, qgemm's tensor-core tile at BLOCK_M 16
                                    (GEMV_DOT), or the CUDA C GEMV (native_gemv.py,
                                    GEMV_NATIVE), whichever measures faster
    several tokens, int8 / int4     qgemm: a small BLOCK_M for decode batches, prefill tiles
                                    beyond
    several tokens, fp8             W8A16 qgemm, W8A8 (activations quantized per token to
                                    e4m3, then qgemm's fp8 dot or cuBLASLt's fp8 GEMM with
                                    row-wise scales, torch._scaled_mm), whichever measures
                                    faster for the shape and batch bucket

Launch configurations come from a short measurement per (kernel, shape, batch bucket) the
first time a shape runs outside graph capture (`quant_tune.py`); under the Triton interpreter
the first candidate is used.
"""

from __future__ import annotations

import functools
import os
from dataclasses import replace

import torch
import triton

from tessera.hal.cuda import env, native_gemv, native_gemv_mma, nvrtc, pdl, quant_tune
from tessera.hal.cuda.quant_kernels import (
    FP8,
    GEMV_ACC,
    GEMV_COLUMN,
    GEMV_EXP_CVT,
    GEMV_X_VEC,
    INT4,
    INT8,
    QUANT_ROW_MAX,
    dequant_kernel,
    gemv_acc_fits,
    gemv_stages,
    qgemm_kernel,
    qgemm_wt_kernel,
    qgemv_kernel,
    quant_rows_fp8_kernel,
    splitk_sum_kernel,
)
from tessera.hal.platform import QuantLinearKernel, RotaryStore
from tessera.hal.quant.reference import check_fusions, check_rows_fusions, rotate_and_store
from tessera.hal.quant.weight import (
    HALF_TILES,
    SCHEMES,
    QuantizationError,
    QuantizedWeight,
    half_tile,
    pack_int4,
    unpack_int4,
)

KINDS = {"fp8": FP8, "int8": INT8, "int4": INT4}
# the 16-bit float a nibble q becomes with the exponent bits set (qgemm_kernel's NIB_BIAS)
NIB_BIAS = {torch.bfloat16: 128.0, torch.float16: 1024.0}


def _pow2_group(w: QuantizedWeight) -> QuantizedWeight:
    """The kernels take power-of-two groups of at least 16. A group of, say, 96 is the same
    weight as three groups of 32 sharing one scale: repeat the scales."""
    gs = w.group_size
    if w.scheme == "fp8" or gs == w.in_features or (gs >= 16 and gs & (gs - 1) == 0):
        return w
    sub = gs & -gs  # the largest power of two dividing gs
    if sub < 16:
        raise QuantizationError(f"{w.scheme} group size {gs}: the cuda kernels need groups "
                                f"of a multiple of 16 columns; serve with --quantization none")
    rep = gs // sub
    return replace(w, scales=w.scales.repeat_interleave(rep, dim=1).contiguous(),
                   offsets=None if w.offsets is None else
                   w.offsets.repeat_interleave(rep, dim=1).contiguous(), group_size=sub)


def half_tile_for(w: QuantizedWeight) -> int:
    """The widest "halves<T>" tile the int4 weight takes: T divides the input width and lies
    within a group (T <= group size), so a tile's two halves share their group; 2 (the
    "nibbles" layout as it is) where no T in HALF_TILES does."""
    for t in sorted(HALF_TILES, reverse=True):
        if w.in_features % t == 0 and (w.num_groups == 1 or t <= w.group_size):
            return t
    return 2


def prepare(w: QuantizedWeight) -> QuantizedWeight:
    if w.scheme == "int4" and half_tile(w.packing) is None:
        raise QuantizationError("the cuda plugin reads int4 packed two per byte")
    if w.scheme == "fp8" and w.qweight.is_cuda and \
            torch.cuda.get_device_capability(w.qweight.device) < (8, 9):
        raise QuantizationError(
            f"fp8 weights need a GPU of compute capability 8.9 or newer (Ada, Hopper); this "
            f"one is {torch.cuda.get_device_capability(w.qweight.device)}: serve with "
            f"--quantization none or int8")
    w = _pow2_group(w)
    if w.scheme == "int4":
        tile, have = half_tile_for(w), half_tile(w.packing) or 2
        if tile != have:  # repacked into half-split tiles (weight.py): two dots, no interleave
            q = unpack_int4(w.qweight, have)
            w = replace(w, qweight=pack_int4(q, tile), packing="nibbles" if tile == 2
                        else f"halves{tile}")
    w = replace(w, qweight=w.qweight.contiguous(), scales=w.scales.contiguous(),
                offsets=None if w.offsets is None else w.offsets.contiguous())
    if native_gemv_mma.enabled() and w.qweight.is_cuda and native_gemv_mma.weight_fits(w):
        native_gemv_mma.interleaved(w)  # the tensor-core GEMV's copy, made now (its switch)
    return w


def _half(w: QuantizedWeight) -> int:
    """The kernels' HALF: the column distance between a byte's two nibbles."""
    return (half_tile(w.packing) or 2) // 2 if w.scheme == "int4" else 1


def _per_row(w: QuantizedWeight) -> bool:
    return w.num_groups == 1


def qgemv(x: torch.Tensor, w: QuantizedWeight, bias: torch.Tensor | None,
          block_n: int, block_k: int, num_warps: int, variant: int = 0) -> torch.Tensor:
    """variant: GEMV_COLUMN | GEMV_EXP_CVT | GEMV_X_VEC | GEMV_ACC flags (quant_kernels.py),
    0 none, and GEMV_STAGES2 or GEMV_STAGES3 (the loop software-pipelined); GEMV_ACC only for
    fp8 / int8 weights with one scale a row."""
    n, k = w.shape
    per_row = _per_row(w)
    acc = bool(variant & GEMV_ACC)
    if acc and not gemv_acc_fits(w.scheme, per_row):
        raise ValueError(f"GEMV_ACC is for fp8 / int8 weights with one scale a row, not "
                         f"{w.scheme} with groups of {w.group_size}")
    out = torch.empty((1, n), dtype=x.dtype, device=x.device)
    group = k if per_row else w.group_size
    block_k = max(block_k, 2 if per_row else group)
    qgemv_kernel[(triton.cdiv(n, block_n),)](
        x, w.qweight, w.scales, w.offsets if w.offsets is not None else w.scales,
        bias if bias is not None else out, out, n, k, w.qweight.stride(0), w.scales.stride(0),
        KIND=KINDS[w.scheme], GROUP=group if not per_row else 1, PER_ROW=per_row,
        HAS_BIAS=bias is not None, BLOCK_N=block_n, BLOCK_K=block_k,
        COLUMN=bool(variant & GEMV_COLUMN), EXP_CVT=bool(variant & GEMV_EXP_CVT),
        X_VEC=bool(variant & GEMV_X_VEC), HALF=_half(w), ACC=acc,
        STAGES=gemv_stages(variant), num_warps=num_warps,
        **pdl.gemv_launch_options(w.qweight.shape[1] * w.qweight.element_size()))
    return out


def qgemm(x: torch.Tensor, w: QuantizedWeight, bias: torch.Tensor | None, block_m: int,
          block_n: int, block_k: int, num_warps: int, num_stages: int,
          w8a8: bool = False, x_scales: torch.Tensor | None = None,
          out_dtype: torch.dtype | None = None, weights_as_a: bool = False,
          split_k: int = 1, fast_acc: bool = False) -> torch.Tensor:
    """Several tokens. w8a8 (fp8 weights): the activations are quantized per token to e4m3
    first (or come quantized: x e4m3 with x_scales [M, 1]) and the dot runs in fp8.
    weights_as_a: qgemm_wt_kernel (the weight tile as the dot's first operand; not with
    w8a8, and int4 only in "halves" tiles). Either kernel splits K split_k ways (float32
    partials in a workspace, summed in order by a second kernel). fast_acc (w8a8): the fp8
    dots accumulate into one sum in the tensor cores (qgemm_kernel's FAST_ACC)."""
    m = x.shape[0]
    n, k = w.shape
    out = torch.empty((m, n), dtype=out_dtype or x.dtype, device=x.device)
    per_row = _per_row(w)
    half = _half(w)
    if half > 1:
        block_k = 2 * half  # one half-split tile per K step
    elif not per_row:
        block_k = min(block_k, w.group_size)  # one group per K tile
    xs = w.scales  # unread unless w8a8
    if w8a8:
        if w.scheme != "fp8":
            raise ValueError("W8A8 needs fp8 weights")
        x, xs = (x, x_scales) if x_scales is not None else quantize_rows_fp8(x)
    grid = (triton.cdiv(n, block_n), triton.cdiv(m, block_m))
    # what both kernels take: the weight, its scales and offsets (unread without), the bias
    # (unread without), then the sizes and the constants
    weight = (w.qweight, w.scales, w.offsets if w.offsets is not None else w.scales,
              bias if bias is not None else out)
    consts = dict(KIND=KINDS[w.scheme], GROUP=1 if per_row else w.group_size, PER_ROW=per_row,
                  HAS_BIAS=bias is not None, BLOCK_M=block_m, BLOCK_N=block_n,
                  BLOCK_K=block_k, DOT_PREC="ieee" if out.dtype == torch.float32 else "tf32",
                  HALF=half, NIB_BIAS=NIB_BIAS.get(x.dtype, 0.0) if half > 1 else 0.0,
                  num_warps=num_warps, num_stages=num_stages)
    strides = (x.stride(0), w.qweight.stride(0), w.scales.stride(0), out.stride(0))
    if weights_as_a and (w8a8 or (w.scheme == "int4" and half == 1)):
        raise ValueError("weights as the first operand: not with W8A8, and int4 only in "
                         "'halves' tiles")
    split_k = max(1, min(split_k, triton.cdiv(k, block_k)))
    target = out if split_k == 1 else \
        torch.empty((split_k, m, n), dtype=torch.float32, device=x.device)
    if not weights_as_a:
        qgemm_kernel[grid + (split_k,)](x, *weight, target, xs, m, n, k, *strides, A_FP8=w8a8,
                                        SPLIT_K=split_k, FAST_ACC=w8a8 and fast_acc, **consts)
    else:
        qgemm_wt_kernel[grid + (split_k,)](x, *weight, target, m, n, k, *strides,
                                           SPLIT_K=split_k, **consts)
    if split_k > 1:
        splitk_sum_kernel[(triton.cdiv(m * n, 1024),)](
            target, weight[3], out, m, n, SPLIT_K=split_k, HAS_BIAS=bias is not None,
            BLOCK=1024, num_warps=4)
    return out


def dequantize_weight(w: QuantizedWeight, dtype: torch.dtype) -> torch.Tensor:
    """The dense weight [N, K] in dtype, each value s * q (+ o) computed in float32 and
    rounded once (dequant_kernel)."""
    n, k = w.shape
    out = torch.empty((n, k), dtype=dtype, device=w.qweight.device)
    half = _half(w)
    block_k = 2 * half if half > 1 else 128
    per_row = _per_row(w)
    dequant_kernel[(triton.cdiv(n, 32), triton.cdiv(k, block_k))](
        w.qweight, w.scales, w.offsets if w.offsets is not None else w.scales, out, n, k,
        w.qweight.stride(0), w.scales.stride(0), out.stride(0), KIND=KINDS[w.scheme],
        GROUP=1 if per_row else w.group_size, PER_ROW=per_row, HALF=half, BLOCK_N=32,
        BLOCK_K=block_k, num_warps=4)
    return out


def dequant_mm(x: torch.Tensor, w: QuantizedWeight, bias: torch.Tensor | None
               ) -> torch.Tensor:
    """A batch large enough to be compute-bound (prefill): the weight expanded to x's dtype
    once (rounded there, unlike the kernels that read it packed), then the library GEMM."""
    return torch.nn.functional.linear(x, dequantize_weight(w, x.dtype), bias)


ROW_BLOCK_MAX = 16384  # quantize_rows_fp8 reads a row this wide or less once


def quantize_rows_fp8(x: torch.Tensor, block_k: int | None = None
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """(x_q e4m3 [M, K], scales float32 [M, 1]) with scale = max|x[m]| / 448. block_k (tests):
    the kernel's block, else the row's width rounded up to a power of two, at most
    ROW_BLOCK_MAX."""
    m, k = x.shape
    out = torch.empty((m, k), dtype=torch.float8_e4m3fn, device=x.device)
    scales = torch.empty((m, 1), dtype=torch.float32, device=x.device)
    block = block_k or min(ROW_BLOCK_MAX, triton.next_power_of_2(k))
    if m:
        quant_rows_fp8_kernel[(m,)](x, out, scales, k, x.stride(0), out.stride(0),
                                    BLOCK_K=block, num_warps=4 if block <= 4096 else 8,
                                    **pdl.launch_options())
    return out, scales


def fp8_scaled_mm(x: torch.Tensor, w: QuantizedWeight, bias: torch.Tensor | None
                  ) -> torch.Tensor:
    """W8A8 through cuBLASLt: per-token activation scales, per-row weight scales."""
    return scaled_mm_quantized(*quantize_rows_fp8(x), w, bias, x.dtype)


def scaled_mm_quantized(xq: torch.Tensor, x_scales: torch.Tensor, w: QuantizedWeight,
                        bias: torch.Tensor | None, out_dtype: torch.dtype) -> torch.Tensor:
    """fp8_scaled_mm of activations already quantized (quantize_rows_fp8's pair)."""
    out = torch._scaled_mm(xq, w.qweight.t(), scale_a=x_scales,
                           scale_b=w.scales.view(1, -1), out_dtype=out_dtype)
    return out if bias is None else out + bias


def scaled_mm_fits(x: torch.Tensor, w: QuantizedWeight) -> bool:
    n, k = w.shape
    return (x.is_cuda and x.dtype in (torch.bfloat16, torch.float16) and k % 16 == 0
            and n % 16 == 0)


def apply(x: torch.Tensor, w: QuantizedWeight, bias: torch.Tensor | None) -> torch.Tensor:
    if x.dim() != 2 or x.shape[1] != w.in_features:
        raise ValueError(f"quantized linear: x {tuple(x.shape)} for a weight of "
                         f"{w.in_features} inputs")
    if w.input_perm is not None:
        x = x.index_select(1, w.input_perm)
    if x.stride(-1) != 1:
        x = x.contiguous()
    m = x.shape[0]
    if m == 0:
        return torch.empty((0, w.out_features), dtype=x.dtype, device=x.device)
    if m == 1:
        return quant_tune.one_token(x, w, bias, quant_tune.gemv_config(w, x, bias))
    if w.scheme == "fp8":
        return quant_tune.run_fp8(x, w, bias, quant_tune.fp8_config(w, x, bias))
    return quant_tune.run_gemm(x, w, bias, quant_tune.gemm_config(w, x, bias))


ROWS_FUSION_VARIABLE = "HAL_CUDA_FP8_ROWS_FUSION"


@functools.lru_cache(maxsize=1)
def rows_fusion_on() -> bool:
    """HAL_CUDA_FP8_ROWS_FUSION (read once a process): on (the default) or off (0), for A/B
    runs of rows_fused's fp8 fusion."""
    return env.switch(ROWS_FUSION_VARIABLE, True)


def _rows_quantized(x: torch.Tensor, w: QuantizedWeight, bias: torch.Tensor | None,
                    width: int) -> tuple[int, ...] | None:
    """The W8A8 config the fp8 product of x's rows (width inputs each) runs at when
    rows_fused can hand it activations its norm or SiLU kernel quantized, else None (another
    scheme, one token, a permuted or misshapen input, a W8A16 pick, fusion off)."""
    if w.scheme != "fp8" or x.shape[0] < 2 or w.input_perm is not None or \
            width != w.in_features or width > QUANT_ROW_MAX or x.stride(-1) != 1 or \
            not rows_fusion_on():
        return None
    config = quant_tune.fp8_config(w, x[:, :width], bias)
    return config if quant_tune.is_w8a8(config) and not quant_tune.is_wt(config) else None


def rows_fused(x: torch.Tensor, w: QuantizedWeight, bias: torch.Tensor | None, *,
               norm: tuple[torch.Tensor, float] | None = None,
               residual: torch.Tensor | None = None, silu: bool = False
               ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """QuantLinearKernel.rows_fused: for an fp8 weight whose product at this many tokens is
    W8A8 (cuBLASLt or a Triton A8 tile), the norm's or the SiLU's kernel quantizes the
    activations (rms_norm_quant_fp8, silu_and_mul_quant_fp8) and the product takes them, one
    launch fewer; otherwise the composition of this plugin's ops."""
    from tessera.hal.cuda.elementwise import silu_and_mul, silu_and_mul_quant_fp8
    from tessera.hal.cuda.norm import fused_add_rms_norm, rms_norm, rms_norm_quant_fp8

    check_rows_fusions(norm, residual, silu)
    width = x.shape[1] // 2 if silu else x.shape[1]
    config = _rows_quantized(x, w, bias, width) if x.dim() == 2 else None
    if config is not None:
        if norm is not None:
            xq, scales, residual_out = rms_norm_quant_fp8(x, norm[0], norm[1], residual)
        else:
            (xq, scales), residual_out = silu_and_mul_quant_fp8(x), None
        return quant_tune.run_fp8_quantized(xq, scales, w, bias, config, x.dtype), \
            residual_out
    residual_out = None
    if norm is not None and residual is not None:
        h, residual_out = fused_add_rms_norm(x, residual, norm[0], norm[1])
    elif norm is not None:
        h = rms_norm(x, norm[0], norm[1])
    else:
        h = silu_and_mul(x)
    return apply(h, w, bias), residual_out


FUSION_VARIABLE = "HAL_CUDA_ONE_TOKEN_FUSION"
FUSION_MODES = ("auto", "all", "epilogues", "off")
# The schemes fused under "auto" (the default), each fusion included. int4's GEMV is bound by
# its arithmetic: the norm prologue adds a multiply, a squared sum and a load of the norm's
# weight per element of x in every block, and B12 B1 int4 measured 2.20-2.23 ms a step with
# every fusion and 2.16-2.20 with the epilogues alone, against 2.145-2.151 without (calls
# 44-46), where fp8's, bound by its loads, went from 2.58 to 2.43-2.46.
AUTO_SCHEMES = ("fp8",)


@functools.lru_cache(maxsize=1)
def fusion_mode() -> str:
    """HAL_CUDA_ONE_TOKEN_FUSION (read once a process): auto (the default: every fusion for
    AUTO_SCHEMES, none for the others), all (every scheme), epilogues (every scheme, the
    norm kept a kernel of its own), or off (0: `fuses` says no, the model keeps its plain
    path)."""
    value = (os.environ.get(FUSION_VARIABLE) or "auto").strip().lower()
    value = "all" if value in env.ON else "off" if value in env.OFF else value
    if value not in FUSION_MODES:
        raise ValueError(f"{FUSION_VARIABLE}={value!r}: expected one of "
                         f"{', '.join(FUSION_MODES)} (or 1 / 0)")
    return value


def fuses(w: QuantizedWeight) -> bool:
    """Whether one_token_fused runs the native GEMV with its fusions for this prepared
    weight: the mode fuses its scheme (fusion_mode), and the CUDA C GEMV takes it
    (native_gemv.weight_fits) and can run here, without an input permutation."""
    mode = fusion_mode()
    return mode != "off" and (mode != "auto" or w.scheme in AUTO_SCHEMES) and \
        w.input_perm is None and nvrtc.available() and native_gemv.weight_fits(w)


def _norm_prologue(w: QuantizedWeight) -> bool:
    return fusion_mode() != "epilogues"


def one_token_fused(x: torch.Tensor, w: QuantizedWeight, bias: torch.Tensor | None, *,
                    norm: tuple[torch.Tensor, float] | None = None,
                    residual: torch.Tensor | None = None, silu: bool = False,
                    rope: RotaryStore | None = None) -> torch.Tensor:
    """QuantLinearKernel.one_token_fused: the native GEMV with its prologue / epilogue where
    it takes the weight and x, else the composition of this plugin's ops."""
    check_fusions(silu, residual, rope)
    if x.dim() != 2 or x.shape[0] != 1 or x.shape[1] != w.in_features:
        raise ValueError(f"one_token_fused: x {tuple(x.shape)} is not one token of "
                         f"{w.in_features} inputs")
    from tessera.hal.cuda.elementwise import silu_and_mul
    from tessera.hal.cuda.norm import rms_norm

    if fuses(w):
        h = x
        if norm is not None and not _norm_prologue(w):
            h, norm = rms_norm(x, norm[0], norm[1]), None  # its own kernel, then the GEMV
        try:
            return quant_tune.one_token_fused(h, w, bias, norm, residual, silu, rope)
        except native_gemv.NotTaken:
            x = h  # an unaligned x, norm weight or residual, an fp8 cache: composed below
    h = x if norm is None else rms_norm(x, norm[0], norm[1])
    y = apply(h, w, bias)
    if silu:
        y = silu_and_mul(y)
    if rope is not None:
        from tessera.hal.cuda.elementwise import rotary_embedding, store_kv

        y = rotate_and_store(y, rope, rotary_embedding, store_kv)
    return y if residual is None else y + residual


def quant_linears() -> dict[str, QuantLinearKernel]:
    # rows_fused for fp8 alone: the other schemes' products take x unquantized, nothing to fuse
    return {scheme: QuantLinearKernel(scheme, apply, prepare, one_token_fused=one_token_fused,
                                      fuses=fuses,
                                      rows_fused=rows_fused if scheme == "fp8" else None)
            for scheme in SCHEMES}
