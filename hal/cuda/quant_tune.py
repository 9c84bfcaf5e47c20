"""Launch configurations of the quantized kernels: a few candidates, measured once per
(kernel, scheme, shape, group, batch bucket, dtype) on the device, the fastest kept.

The measurement (autotune.pick) runs the first time a shape is seen outside CUDA graph capture
(the worker's warm-up runs come before its captures, so every captured shape is measured);
during a capture, or under the Triton interpreter, the first candidate is taken as it is.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import torch

from tessera.hal.cuda import env, native_gemv, native_gemv_mma
from tessera.hal.cuda.autotune import pick as _pick
from tessera.hal.cuda.quant_kernels import (
    GEMV_ACC,
    GEMV_COLUMN,
    GEMV_DOT,
    GEMV_EXP_CVT,
    GEMV_MMA,
    GEMV_NATIVE,
    GEMV_STAGES2,
    GEMV_STAGES3,
    GEMV_X_VEC,
    gemv_acc_fits,
)
from tessera.hal.quant.weight import QuantizedWeight

# (BLOCK_N, BLOCK_K, num_warps, variant); each thread should have several 16-byte loads in
# flight. The bf16 GEMV's best moves 8 KiB of weight per program per iteration; the wider
# tiles give fp8 / int8 / int4 as many bytes in flight (int4: 16 KiB at 8 x 4096, that is
# 64 products a thread at 8 warps). variant: flags GEMV_COLUMN | GEMV_EXP_CVT | GEMV_X_VEC |
# GEMV_ACC (quant_kernels.py); the formulations are listed side by side so the device
# measures which wins, the first candidate (taken where nothing is measured) the one B12
# measured.
_COL, _EXP, _XV, _ACC = GEMV_COLUMN, GEMV_EXP_CVT, GEMV_X_VEC, GEMV_ACC
_S2, _S3 = GEMV_STAGES2, GEMV_STAGES3
# every combination of the first three flags; GEMV_ACC (one scale a row, fp8 / int8) with
# the conversion and load flags (GEMV_COLUMN changes nothing without groups); the plain tile
# software-pipelined 2 and 3 stages deep
GEMV_VARIANTS = tuple(range(8)) + (_ACC, _ACC | _EXP, _ACC | _XV, _ACC | _EXP | _XV, _S2, _S3)
_B12_8BIT = [(2, 2048, 8), (4, 2048, 8), (4, 1024, 4), (8, 1024, 8), (1, 4096, 8)]
_WIDE_8BIT = [(2, 4096, 8), (4, 4096, 8), (8, 2048, 8)]
_GROUPED = (0, _COL, _EXP, _COL | _EXP, _EXP | _XV)  # per wide tile
GEMV_CANDIDATES: dict[str, list[tuple[int, int, int, int]]] = {
    # The H200's sweep of a grid of tiles and formulations inside CUDA graphs at fed5136
    # (benchmarks/results/quant_gemv_wide_h200.json: 60 fp8 and 60 int4 tiles on the 8B
    # shape's qkv, o, gate_up and down). fp8: 4 x 2048 at 4 warps fastest over the four
    # (63.2 us a layer; 4 x 1024, the list's first before, 68.2), the 2-D accumulator tiles
    # (GEMV_ACC | GEMV_X_VEC) fastest on down (16.9 us against 19.4). The tuner measures
    # these per shape; the first is taken where nothing is measured.
    # (fp8's tiles software-pipelined, GEMV_STAGES2 / 3, lost on every shape in call 35,
    # quant_gemv_stages_h200.json: down 19.2-20.7 us against 16.1; not listed)
    "fp8": [(4, 2048, 4, 0), (8, 2048, 4, 0), (2, 1024, 4, _ACC | _XV),
            (4, 1024, 4, _ACC | _XV), (4, 1024, 4, 0)],
    "int8": [(*c, 0) for c in _B12_8BIT] + [(*c, v) for c in _WIDE_8BIT for v in _GROUPED]
    + [(*c, _EXP | _XV) for c in _B12_8BIT[:2]],
    # int4: 16 x 2048 and 8 x 2048 at 4 warps, the plain reshaped tile, fastest (74.5-74.6 us
    # a layer, 1.5-1.9 TB/s; 8 x 4096 at 8 warps, the list's first before, 83.3), then these
    "int4": [(16, 2048, 4, 0), (8, 2048, 4, 0), (16, 4096, 8, 0), (16, 2048, 4, _EXP),
             (8, 4096, 8, _EXP | _XV),
             # software-pipelined (GEMV_STAGES2 / 3), for the long rows: in call 35
             # (quant_gemv_stages_h200.json) 16 x 1024 at 3 stages took down from 23.4 to
             # 20.5 us, within 1-3% of the plain tiles' best elsewhere
             (8, 1024, 4, _S3), (16, 1024, 4, _S3), (8, 2048, 4, _S2), (16, 2048, 4, _S2)]
    # GEMV_DOT: the token through qgemm_wt_kernel's tensor-core tile (BLOCK_M 16, the
    # nibbles made 16-bit floats by their exponent bits, no FMA per weight), for a "halves"
    # weight: (BLOCK_N, num_stages, num_warps, GEMV_DOT). They took 1.8-5.6x the GEMV's time
    # through qgemm_kernel's tile at 4817dba, 1.4-5.6x through qgemm_wt_kernel's since.
    + [(64, 4, 4, GEMV_DOT), (128, 4, 4, GEMV_DOT), (128, 3, 8, GEMV_DOT)],
}
_NAT = GEMV_NATIVE
# GEMV_NATIVE: the CUDA C GEMV (native_gemv.py), (rows a block, 16-byte runs a thread an
# iteration, warps a block, GEMV_NATIVE). An 8B row is 256 runs of fp8 (4096 inputs) or 896
# (14336): 8 warps take a 4096-input row in one pass, 7 / 14 / 28 a 14336-input one; int4's
# are 128 runs of 32 nibbles (4 warps) and 448 (7 or 14). Where NVRTC or cuda-python is
# missing they fail their measurement and are skipped.
# (call 41, quant_kernels_h200.json and its _b3d1fea_ / _2a47a3e_ / _cc3c1c4_ runs: blocks of
# 14 and 28 warps 2-3x slower; two register sets with the next loads ahead, the L2's 256-byte
# hint and int4 through mma.m16n8k16 correct but no faster: not kept)
NATIVE_CANDIDATES: dict[str, list[tuple[int, int, int, int]]] = {
    "fp8": [(4, 1, 8, _NAT), (8, 1, 8, _NAT), (2, 1, 8, _NAT), (4, 2, 4, _NAT),
            (4, 1, 4, _NAT), (8, 1, 4, _NAT), (4, 2, 2, _NAT), (8, 1, 2, _NAT),
            (4, 1, 2, _NAT)],
    "int4": [(8, 1, 2, _NAT), (8, 1, 4, _NAT), (4, 1, 4, _NAT), (4, 2, 2, _NAT),
             (4, 1, 2, _NAT), (8, 2, 1, _NAT), (16, 1, 4, _NAT)],
}
for _scheme, _natives in NATIVE_CANDIDATES.items():  # after the Triton tiles: never first
    GEMV_CANDIDATES[_scheme] = GEMV_CANDIDATES[_scheme] + _natives
# GEMV_MMA: int4's GEMV on the tensor cores over an interleaved copy of the weight
# (native_gemv_mma.py; rows a block, k-tiles a warp loads ahead, warps a block), after the
# CUDA-core configs; only where HAL_CUDA_INT4_MMA=1 (the copy doubles the weight's bytes)
MMA_CANDIDATES: list[tuple[int, int, int, int]] = [
    (16, 1, 4, GEMV_MMA), (32, 1, 4, GEMV_MMA), (16, 2, 4, GEMV_MMA), (32, 1, 8, GEMV_MMA),
    (64, 1, 4, GEMV_MMA), (16, 2, 8, GEMV_MMA), (32, 2, 4, GEMV_MMA)]
GEMV_CANDIDATES["int4"] = GEMV_CANDIDATES["int4"] + MMA_CANDIDATES
# The weight expanded to x's dtype once (dequant_kernel), then the library GEMM: a candidate
# where the batch makes the GEMM compute-bound (prefill chunks, B2's largest decode batches).
# At f64b807 the step profile's int4 prefill of 512 tokens took 29.8 ms against bf16's 11.3
# through qgemm_wt_kernel's best tiles (2.5-3.5x bf16's GEMM time from 64 tokens up). Its
# first measure (4256177, gate_up at 256 tokens: 1277 us) had the expansion load a scale per
# element; it loads one per row and tile since ce0e86f, not yet measured.
DEQUANT_MM: tuple[int, ...] = (1,)
# (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages) by batch bucket; BLOCK_K is cut to the
# group size where the group is smaller
GEMM_CANDIDATES: dict[int, list[tuple[int, ...]]] = {
    16: [(16, 32, 128, 4, 4), (16, 64, 128, 4, 4), (16, 16, 256, 4, 4), (16, 64, 256, 4, 3)],
    32: [(32, 32, 128, 4, 4), (32, 64, 128, 4, 4), (16, 64, 128, 4, 4), (32, 64, 256, 4, 3)],
    64: [(64, 64, 128, 4, 4), (64, 128, 64, 8, 3), (32, 64, 128, 4, 4)],
    128: [(128, 128, 64, 8, 3), (64, 128, 64, 4, 4), (128, 64, 128, 8, 3)],
    256: [(128, 128, 64, 8, 3), (128, 256, 64, 8, 3), (64, 128, 64, 4, 4), DEQUANT_MM],
}
# A qgemm config: (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages[, flag]); flag A8: W8A8
# (fp8 weights: the activations quantized per token, the fp8 dot), WT: qgemm_wt_kernel (the
# weight tile as the dot's first operand, fed to the tensor cores from registers, the tokens
# the instruction's narrow side).
A8, WT, A8F = 1, 2, 3  # A8F: A8 with the fp8 dots accumulating in place (FAST_ACC)
# int4 weights in "halves<T>" tiles: BLOCK_K is the tile (T), so only M, N, warps, stages and
# the K split vary. The H200 at 195304e (quant_kernels_h200.json's gemm_candidates): WT tiles
# won everywhere (gate_up at 16 tokens 45.6 us against 68.5 for the best plain tile, bf16
# 55.9), while down (4096 rows of 14336 inputs: 64 programs at BLOCK_N 64) stayed at 2x
# bf16's time for want of programs; split-K tiles (a 7th entry) give it more.
INT4_GEMM_CANDIDATES: dict[int, list[tuple[int, ...]]] = {
    16: [(16, 64, 128, 4, 4, WT), (16, 128, 128, 4, 4, WT), (16, 64, 128, 4, 4, WT, 4),
         (16, 64, 128, 4, 4, WT, 2), (16, 128, 128, 4, 4)],
    32: [(32, 64, 128, 4, 4, WT), (32, 128, 128, 8, 3, WT), (32, 64, 128, 4, 4, WT, 4),
         (32, 64, 128, 4, 4, WT, 2)],
    64: [(64, 128, 128, 8, 3, WT), (64, 64, 128, 4, 4, WT), (64, 64, 128, 4, 4, WT, 4),
         (64, 64, 128, 4, 4, WT, 2)],
    128: [(128, 128, 128, 8, 3, WT), (128, 64, 128, 4, 4, WT), (128, 64, 128, 4, 4, WT, 2),
          (64, 128, 128, 4, 4), DEQUANT_MM],
    256: [(128, 128, 128, 8, 3, WT), (128, 64, 128, 4, 4, WT), (128, 64, 128, 4, 4, WT, 2),
          (128, 128, 128, 8, 3, WT, 2), DEQUANT_MM],
}
# fp8 weights at several tokens: W8A16 qgemm tiles (the weight converted to x's dtype; WT,
# split or not), W8A8 ones and SCALED_MM, cuBLASLt through torch._scaled_mm; fp8 dots need
# BLOCK_K >= 32. At 195304e the H200 measured W8A8 fastest for gate_up at 16-64 tokens, the
# plain W8A16 16 x 32 tile for down at 16 (40.8 us, bf16 33.0), cuBLASLt for down from 64
# and for both at 256; WT without a split lost everywhere.
SCALED_MM: tuple[int, ...] = (0,)
W8A8_CANDIDATES: dict[int, list[tuple[int, ...]]] = {
    16: [(16, 32, 128, 4, 4), (16, 128, 128, 4, 4, A8), (16, 64, 128, 4, 4, WT, 4),
         (16, 64, 128, 4, 4, WT, 2), SCALED_MM],
    32: [(32, 32, 128, 4, 4), (32, 128, 128, 4, 4, A8), (32, 64, 128, 4, 4, WT, 4),
         (32, 64, 128, 4, 4, WT, 2), SCALED_MM,
         (64, 64, 128, 4, 4, A8F, 4), (64, 128, 128, 4, 4, A8F, 4), (64, 128, 128, 4, 4, A8F),
         (64, 64, 128, 4, 4, A8F, 2)],
    64: [(64, 128, 128, 8, 3, A8), (64, 64, 128, 4, 4, A8), (64, 64, 128, 4, 4, WT, 4),
         (64, 128, 128, 4, 4, A8, 2), (64, 64, 256, 4, 3, A8), SCALED_MM,
         (64, 64, 128, 4, 4, A8F, 4), (64, 64, 128, 4, 4, A8F, 2), (64, 128, 128, 4, 4, A8F),
         (64, 128, 128, 4, 4, A8F, 4)],
    128: [(128, 128, 128, 8, 3, A8), (64, 128, 128, 4, 4, A8), (64, 64, 128, 4, 4, A8),
          (64, 128, 128, 4, 4, A8, 2), SCALED_MM,
          (64, 64, 128, 4, 4, A8F), (128, 64, 128, 4, 4, A8F, 2), (64, 64, 128, 4, 4, A8F, 2),
          (64, 128, 128, 4, 4, A8F, 4), (128, 128, 128, 8, 3, A8F)],
    256: [(64, 128, 128, 4, 4, A8), (128, 128, 128, 8, 3, A8), SCALED_MM],
}
# At 64 and 128 tokens, W8A8 tiles with more programs: a K split of 2 (float32 partials),
# 64 x 64, K steps of 256. Call 55's counters had the W8A8 tiles at 256 tokens running
# less than one wave of programs (o, qkv, down). In graphs (call 56,
# quant_kernels_w8a8_h200.json), us with the activations' quantization: the split was the
# fastest for down at 128 tokens (38.9 against cuBLASLt's 44.4; bf16 36.9) and at 64 (36.8,
# the WT split 37.0), 64 x 64 for o at 128 (16.1 against 16.8) and K steps of 256 for qkv
# and o at 64 (15.5 and 14.7 against 17.2 and 15.4). At 256 tokens cuBLASLt stayed the
# fastest on every shape (qkv 17.9, o 17.5, gate_up 57.2, down 46.5; bf16 21.4, 17.3, 87.9,
# 47.4), the new tiles 4-163% slower: none of them is listed there.
# The fp8 dots accumulating in place (A8F) at 17-128 tokens. The H200 in graphs (1f731d3,
# tests/hal_cuda/fp8_gemm_probe.py, fp8_gemm_probe_triton_h200.json), us, cuBLASLt against
# the fastest A8F tile: at 64 tokens qkv 14.6 / 12.7, o 14.0 / 10.2, gate_up 43.2 / 34.2,
# down 38.4 / 21.9 (64 x 64, split 4); at 128 qkv 14.4 / 14.3, o 14.1 / 12.1, gate_up 37.0 /
# 37.5, down 37.5 / 28.9 (split 2) and 29.6 (split 4). The in-place sums lose accuracy with
# the length of the run they accumulate: max error over the largest output 3e-3 (cuBLASLt,
# the promoting A8 tiles) against 5-6e-3 for runs of 4096 and 1e-2 for down's 14336, so an
# A8F tile is a candidate only where its K split leaves runs of A8F_MAX_RUN or less. At 256
# tokens (the bucket that also serves prefill chunks) cuBLASLt won qkv and gate_up and lost
# o and down by 4%: none is listed there.
# At 17-32 tokens (fp8_gemm_probe_small_h200.json, at 6eaf447) the 64-row A8F tiles,
# half their rows idle, beat every other candidate listed for 32 tokens (wgmma takes 64 rows; a
# 32-row tile is an mma.sync one): qkv 11.4 against 15.7 us, o 9.2 against 12.1, gate_up
# 32.8 against 37.7, down 20.3 against 29.1 (from already-quantized activations, against the
# candidates run from bf16 ones).
A8F_MAX_RUN = 4096
A8F_VARIABLE = "HAL_CUDA_FP8_A8F"  # 0: no A8F candidates (A/B against the promoting tiles)


def a8f_fits(config: tuple[int, ...], in_features: int) -> bool:
    """Whether a config may run over this many inputs: any but an A8F tile whose K split
    leaves runs longer than A8F_MAX_RUN."""
    if len(config) < 6 or config[5] != A8F:
        return True
    return _a8f_on() and -(-in_features // split_k(config)) <= A8F_MAX_RUN


@functools.lru_cache(maxsize=1)
def _a8f_on() -> bool:
    return env.switch(A8F_VARIABLE, True)


@functools.lru_cache(maxsize=256)
def _fp8_candidates(bucket: int, in_features: int, scaled_mm_ok: bool
                    ) -> tuple[tuple[int, ...], ...]:
    """W8A8_CANDIDATES[bucket] that can run here (cached: every fp8 product of an eager step
    asks, its choice already kept or not)."""
    return tuple(c for c in W8A8_CANDIDATES[bucket]
                 if (c != SCALED_MM or scaled_mm_ok) and a8f_fits(c, in_features))


def tile(config: tuple[int, ...]) -> tuple[int, int, int, int, int]:
    """A qgemm tile (block_m, block_n, block_k, num_warps, num_stages) from a chosen config
    (its flag and K split dropped)."""
    block_m, block_n, block_k, num_warps, num_stages = config[:5]
    return block_m, block_n, block_k, num_warps, num_stages


def is_w8a8(config: tuple[int, ...]) -> bool:
    """An fp8 config that quantizes the activations: a tile flagged A8 (a 7th entry is its K
    split), or SCALED_MM."""
    return config == SCALED_MM or (len(config) >= 6 and config[5] in (A8, A8F))


def is_wt(config: tuple[int, ...]) -> bool:
    """A qgemm tile flagged WT (qgemm_wt_kernel; a 7th entry is its K split)."""
    return len(config) >= 6 and config[5] == WT


def split_k(config: tuple[int, ...]) -> int:
    """A WT or A8 tile's K split: its 7th entry, else 1."""
    return config[6] if len(config) == 7 and config[5] in (A8, A8F, WT) else 1


def run_gemm(x: torch.Tensor, w: QuantizedWeight, bias: torch.Tensor | None,
             config: tuple[int, ...]) -> torch.Tensor:
    """The several-token int8 / int4 linear under a gemm_config."""
    from tessera.hal.cuda.quant_linear import dequant_mm, qgemm

    if config == DEQUANT_MM:
        return dequant_mm(x, w, bias)
    return qgemm(x, w, bias, *tile(config), weights_as_a=is_wt(config),
                 split_k=split_k(config))


def dot_tile(config: tuple[int, ...]) -> tuple[int, int, int, int, int]:
    """The qgemm_wt_kernel tile of a GEMV_DOT config (BLOCK_N, num_stages, num_warps,
    GEMV_DOT): BLOCK_M 16; its BLOCK_K is the weight's tile (qgemm sets it)."""
    block_n, num_stages, num_warps, _ = config
    return 16, block_n, 0, num_warps, num_stages


def batch_bucket(m: int) -> int:
    for bucket in (16, 32, 64, 128):
        if m <= bucket:
            return bucket
    return 256


def _key(kernel: str, w: QuantizedWeight, x: torch.Tensor, bucket: int) -> tuple[Any, ...]:
    return (kernel, w.scheme, w.out_features, w.in_features, w.group_size, bucket, x.dtype,
            x.device.index)


def gemv_candidates(w: QuantizedWeight) -> list[tuple[int, int, int, int]]:
    """The configs that fit the weight: a grouped weight's BLOCK_K holds whole groups;
    GEMV_DOT ones only for int4 in "halves" tiles (the tile is qgemm's BLOCK_K)."""
    return list(_gemv_candidates(w.scheme, w.num_groups == 1, w.group_size, w.packing))


@functools.lru_cache(maxsize=64)
def _gemv_candidates(scheme: str, per_row: bool, group_size: int, packing: str
                     ) -> tuple[tuple[int, int, int, int], ...]:
    # Cached: every one-token quantized linear asks, its choice already kept or not.
    halves = packing.startswith("halves")

    def fits(c: tuple[int, int, int, int]) -> bool:
        if c[3] & GEMV_MMA == GEMV_MMA:
            return native_gemv_mma.enabled() and \
                native_gemv_mma.layout_fits(scheme, per_row, group_size, packing)
        if c[3] & GEMV_NATIVE:
            return native_gemv.layout_fits(scheme, per_row, group_size, packing)
        if c[3] & GEMV_DOT:
            return halves
        if c[3] & GEMV_ACC:
            return gemv_acc_fits(scheme, per_row)
        return per_row or c[1] % group_size == 0

    return tuple(c for c in GEMV_CANDIDATES[scheme] if fits(c)) or \
        ((4, max(group_size, 256), 8, 0),)


def gemv_config(w: QuantizedWeight, x: torch.Tensor, bias: torch.Tensor | None
                ) -> tuple[int, int, int, int]:

    candidates = _gemv_candidates(w.scheme, w.num_groups == 1, w.group_size, w.packing)
    cfg = _pick(_key("gemv", w, x, 1), candidates, x, lambda c: one_token(x, w, bias, c))
    return cfg  # type: ignore[return-value]


def one_token(x: torch.Tensor, w: QuantizedWeight, bias: torch.Tensor | None,
              config: tuple[int, ...]) -> torch.Tensor:
    """The one-token linear with a GEMV config (qgemv, or qgemm for GEMV_DOT)."""
    from tessera.hal.cuda.quant_linear import qgemm, qgemv

    if config[3] & GEMV_NATIVE:
        rows, unroll, warps, _ = config
        kernel = native_gemv_mma if config[3] & GEMV_MMA == GEMV_MMA else native_gemv
        try:
            return kernel.qgemv(x, w, bias, rows, unroll, warps)
        except native_gemv.NotTaken:
            # an x or weight the kernel cannot read 16 bytes at a time (an unaligned view):
            # the list's first Triton tile
            config = _gemv_candidates(w.scheme, w.num_groups == 1, w.group_size,
                                      w.packing)[0]
    if config[3] & GEMV_DOT:
        return qgemm(x, w, bias, *dot_tile(config), weights_as_a=True)
    return qgemv(x, w, bias, *config)


def one_token_fused(x: torch.Tensor, w: QuantizedWeight, bias: torch.Tensor | None,
                    norm: tuple[torch.Tensor, float] | None, residual: torch.Tensor | None,
                    silu: bool, rope: Any = None) -> torch.Tensor:
    """The native GEMV with its fusions (quant_linear.one_token_fused), at the fastest of its
    configs measured with those fusions (even rows only for the SiLU epilogue, which pairs
    gate and up rows). Raises native_gemv.NotTaken for what the kernel does not read."""
    if not native_gemv.input_fits(x):
        raise native_gemv.NotTaken(f"x {x.dtype} {tuple(x.shape)} for the native GEMV")
    paired = silu or rope is not None  # row pairs: gate / up, or the halves of a head
    candidates = tuple(c for c in NATIVE_CANDIDATES[w.scheme] if not paired or (
        c[0] % 2 == 0 and (rope is None or (rope.head_dim // 2) % (c[0] // 2) == 0)))
    if not candidates:
        raise native_gemv.NotTaken("no native config pairs these rows")

    def run(c: tuple[int, ...]) -> torch.Tensor:
        return native_gemv.qgemv(x, w, bias, c[0], c[1], c[2], norm=norm, residual=residual,
                                 silu=silu, rope=rope)

    key = _key("gemv_fused", w, x, 1) + (norm is not None, residual is not None, silu,
                                          rope is not None)
    return run(_pick(key, candidates, x, run))


def gemm_config(w: QuantizedWeight, x: torch.Tensor, bias: torch.Tensor | None
                ) -> tuple[int, ...]:
    bucket = batch_bucket(x.shape[0])
    candidates: list[tuple[int, ...]] = list(GEMM_CANDIDATES[bucket])
    if w.packing.startswith("halves"):
        candidates = INT4_GEMM_CANDIDATES[bucket]
    if x.dtype == torch.float32:  # fp32 tiles are twice the registers and shared memory
        candidates = [(min(bm, 32), min(bn, 32), min(bk, 64), nw, min(ns, 2))
                      for bm, bn, bk, nw, ns in (c[:5] for c in candidates[:1])]
    cfg = _pick(_key("gemm", w, x, bucket), candidates, x, lambda c: run_gemm(x, w, bias, c))
    return cfg


def fp8_config(w: QuantizedWeight, x: torch.Tensor, bias: torch.Tensor | None
               ) -> tuple[int, ...]:
    """fp8 weights at two or more tokens: a W8A16 qgemm tile, a W8A8 one (the fp8 dot) or
    SCALED_MM (where torch._scaled_mm can take the shapes; a device or torch without it fails
    its measurement and is skipped), whichever measures fastest. Under the interpreter: a
    small W8A16 tile up to 32 tokens, a W8A8 one beyond (the dispatch the GPU had before it
    measured both)."""
    from tessera.hal.cuda.quant_linear import scaled_mm_fits

    bucket = batch_bucket(x.shape[0])
    candidates: Sequence[tuple[int, ...]] = _fp8_candidates(bucket, w.in_features,
                                                             scaled_mm_fits(x, w))
    if x.dtype == torch.float32:  # the interpreter: small tiles
        candidates = [(32, 32, 32, 4, 1, 1)] if bucket > 32 else [(16, 32, 64, 4, 2)]
    return _pick(_key("fp8", w, x, bucket), candidates, x,
                 lambda c: run_fp8(x, w, bias, c))


def run_fp8_quantized(xq: torch.Tensor, x_scales: torch.Tensor, w: QuantizedWeight,
                      bias: torch.Tensor | None, config: tuple[int, ...],
                      out_dtype: torch.dtype) -> torch.Tensor:
    """run_fp8 of activations already quantized (xq e4m3 [M, K], x_scales [M, 1], as
    quantize_rows_fp8 makes them) under a W8A8 config (is_w8a8, not weights-as-A)."""
    from tessera.hal.cuda.quant_linear import qgemm, scaled_mm_quantized

    if config == SCALED_MM:
        return scaled_mm_quantized(xq, x_scales, w, bias, out_dtype)
    if not is_w8a8(config):
        raise ValueError(f"fp8 config {config}: not a W8A8 one, which takes quantized "
                         f"activations")
    return qgemm(xq, w, bias, *tile(config), w8a8=True, x_scales=x_scales, out_dtype=out_dtype,
                 split_k=split_k(config), fast_acc=config[5] == A8F)


def run_fp8(x: torch.Tensor, w: QuantizedWeight, bias: torch.Tensor | None,
            config: tuple[int, ...]) -> torch.Tensor:
    """The fp8 linear of several tokens under an fp8_config: a W8A8 one quantizes the
    activations per token and hands them to run_fp8_quantized."""
    from tessera.hal.cuda.quant_linear import qgemm, quantize_rows_fp8

    if is_w8a8(config):
        xq, x_scales = quantize_rows_fp8(x)
        return run_fp8_quantized(xq, x_scales, w, bias, config, x.dtype)
    return qgemm(x, w, bias, *tile(config), weights_as_a=is_wt(config),
                 split_k=split_k(config))
