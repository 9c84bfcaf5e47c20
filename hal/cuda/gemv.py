"""Matrix-vector product for one-token linears (batch-1 decode), where cuBLAS leaves
bandwidth unused (an H200 measured 2.5-3.3 TB/s for Llama-3-8B's o and qkv projections
against 4.2 TB/s of copy bandwidth; this kernel: 3.3-3.6, and 4.3-4.4 on the large ones).

One program per BLOCK_N output rows streams its weight rows once in BLOCK_K-wide tiles; the
wide tiles put many 16-byte loads in flight per thread, which is what keeps the memory system
busy when there are only a few programs per multiprocessor. The `linear` op takes this path
for shapes in TUNED (measured faster than cuBLAS on the device ahead of time). Any other
bf16 one-token shape on the same device kind (a tensor-parallel rank's share of a model:
Llama-3-8B at --tp-size 4 has o [4096, 1024], down [4096, 3584], ...) is measured the first
time it runs outside a graph capture (the graph runner's eager warm-up comes before every
capture): cuBLAS against a few launch configurations, with the L2 cache flushed between runs
(triton's do_bench), and the fastest kept for the process. Everything else stays on cuBLAS.

The gated MLP's activation as this kernel's prologue (the optional fused op
`silu_and_mul_linear`) was built and measured on the H200 at 9806725: 32.8-40.3 us against
30.4 us for silu_and_mul's kernel then this GEMV at the down projection, and B1 4.59 against
4.29 ms/step (benchmarks/results/b1_fusion_h200.json): every program re-reads and re-computes
the activation of its tiles. The cuda plugin does not offer that op.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from tessera.hal.cuda import autotune, pdl, token_gemm
from tessera.hal.cuda.pdl import enter as pdl_enter
from tessera.hal.cuda.pdl import prefetch_rows_l2

# (out_features, in_features) -> (BLOCK_N, BLOCK_K, num_warps), bf16, used on Hopper (sm_90)
# only. Measured on an H200 inside CUDA graphs, weights not in L2 (tests/hal_cuda/gpu_run.py
# gemv_sweep; benchmarks/results/h200_cuda_gemv.json), Llama-3-8B shapes, cuBLAS -> GEMV:
# qkv 16.3 -> 13.9 us, o 13.3 -> 10.1, gate_up 56.4 -> 54.3, down 32.0 -> 28.7,
# lm_head 249 -> 232. Other shapes stay on cuBLAS until measured.
_LLAMA3_8B = (2, 2048, 8)
# A rank of Llama-3-8B at --tp-size 2 (qkv, o, gate_up, down, lm_head): each rank measured its
# shapes for itself, and in the two-H200 B5 run at c62ab61 rank 0 chose this configuration
# for all five while rank 1 chose cuBLAS for o and down, whose kernels then took 6.8 and
# 19.1 us a layer in its decode graph against rank 0's 5.8 and 16.2; rank 0 waited for rank 1
# at every all-reduce (benchmarks/results/b5_profile_summary_h200.json). Ranks of one group
# must run the same kernels: the measured picks are fixed here.
TUNED: dict[tuple[int, int], tuple[int, int, int]] = {
    (6144, 4096): _LLAMA3_8B,
    (4096, 4096): _LLAMA3_8B,
    (28672, 4096): _LLAMA3_8B,
    (4096, 14336): _LLAMA3_8B,
    (128256, 4096): _LLAMA3_8B,
    (3072, 4096): _LLAMA3_8B,
    (4096, 2048): _LLAMA3_8B,
    (14336, 4096): _LLAMA3_8B,
    (4096, 7168): _LLAMA3_8B,
    (64128, 4096): _LLAMA3_8B,
}
TUNED_CAPABILITY = (9, 0)


@triton.jit
def _gemv_kernel(x_ptr, w_ptr, b_ptr, out_ptr, n_out, n_in, w_s0,
                 HAS_BIAS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                 PF_LINES: tl.constexpr = 1, USE_PDL: tl.constexpr = False,
                 PREFETCH: tl.constexpr = False):
    if PREFETCH:  # HAL_CUDA_PDL=prefetch: the weight rows into L2 before the wait (pdl.py)
        prefetch_rows_l2(w_ptr, tl.program_id(0) * BLOCK_N, n_out, w_s0, n_in, BLOCK_N,
                         PF_LINES)
    pdl_enter(USE_PDL)
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    rmask = rows < n_out
    cols = tl.arange(0, BLOCK_K)
    w_rows = w_ptr + rows[:, None].to(tl.int64) * w_s0
    acc = tl.zeros([BLOCK_N], tl.float32)
    for k0 in range(0, n_in, BLOCK_K):
        k = k0 + cols
        kmask = k < n_in
        x = tl.load(x_ptr + k, mask=kmask, other=0.0).to(tl.float32)
        w = tl.load(w_rows + k[None, :], mask=rmask[:, None] & kmask[None, :], other=0.0)
        acc += tl.sum(w.to(tl.float32) * x[None, :], 1)
    if HAS_BIAS:
        acc += tl.load(b_ptr + rows, mask=rmask, other=0.0).to(tl.float32)
    tl.store(out_ptr + rows, acc.to(out_ptr.dtype.element_ty), mask=rmask)


def gemv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, block_n: int,
         block_k: int, num_warps: int) -> torch.Tensor:
    """x [1, In] @ weight[Out, In]^T (+ bias) -> [1, Out], fp32 accumulation."""
    n_out, n_in = weight.shape
    if x.shape != (1, n_in) or x.stride(-1) != 1 or weight.stride(-1) != 1:
        raise ValueError(f"gemv expects x [1, {n_in}] and a row-major weight, got x "
                         f"{tuple(x.shape)} strides {x.stride()}, weight strides "
                         f"{weight.stride()}")
    out = torch.empty((1, n_out), dtype=x.dtype, device=x.device)
    _gemv_kernel[(triton.cdiv(n_out, block_n),)](
        x, weight, bias if bias is not None else out, out, n_out, n_in, weight.stride(0),
        HAS_BIAS=bias is not None, BLOCK_N=block_n, BLOCK_K=block_k, num_warps=num_warps,
        **pdl.gemv_launch_options(n_in * weight.element_size()))
    return out


# Launch configurations tried for a shape TUNED does not hold; CUBLAS stands for F.linear.
CANDIDATES: tuple[tuple[int, int, int], ...] = ((2, 2048, 8), (4, 2048, 8), (4, 1024, 4),
                                                (1, 4096, 8))
CUBLAS = (0, 0, 0)
_measured: dict[tuple[int, int, int | None, bool], tuple[int, int, int]] = {}


def _measure(x: torch.Tensor, weight: torch.Tensor,
             bias: torch.Tensor | None) -> tuple[int, int, int]:
    """The fastest of cuBLAS and CANDIDATES for this one-token product (CUBLAS when none
    of the candidates runs or beats it)."""
    from triton.testing import do_bench

    timings = [(float(do_bench(lambda: F.linear(x, weight, bias), warmup=2, rep=10)), CUBLAS)]
    for cand in CANDIDATES:
        try:
            ms = do_bench(lambda c=cand: gemv(x, weight, bias, *c), warmup=2, rep=10)
        except Exception:  # noqa: BLE001 - a configuration the compiler rejects is skipped
            continue
        timings.append((float(ms), cand))
    return min(timings, key=lambda t: t[0])[1]


def _config(x: torch.Tensor, weight: torch.Tensor,
            bias: torch.Tensor | None) -> tuple[int, int, int] | None:
    """The GEMV configuration for this bf16 one-token product on sm_90, or None (cuBLAS)."""
    shape = (int(weight.shape[0]), int(weight.shape[1]))
    tuned = TUNED.get(shape)
    if tuned is not None:
        return tuned
    key = (*shape, x.device.index, bias is not None)
    choice = _measured.get(key)
    if choice is None:
        if torch.cuda.is_current_stream_capturing():
            return None  # not measured before this capture: cuBLAS in this graph
        choice = _measured[key] = _measure(x, weight, bias)
    return None if choice == CUBLAS else choice


def _one_token(x: torch.Tensor, weight: torch.Tensor) -> bool:
    return (x.dim() == 2 and x.shape[0] == 1 and x.stride(-1) == 1 and weight.stride(-1) == 1
            and x.dtype == weight.dtype == torch.bfloat16 and x.is_cuda
            and autotune.capability(x.device) == TUNED_CAPABILITY)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """The plugin's bf16 linear: the one-token GEMV, the token GEMM of 2-256 tokens
    (token_gemm.py), or cuBLAS, whichever its tables pick."""
    if _one_token(x, weight):
        config = _config(x, weight, bias)
        if config is not None:
            return gemv(x, weight, bias, *config)
    elif token_gemm.applies(x, weight):
        tile = token_gemm.config_for(x, weight, bias)
        if tile is not None:
            return token_gemm.token_gemm(x, weight, bias, tile)
    return F.linear(x, weight, bias)
