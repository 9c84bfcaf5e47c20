"""bf16 linears of 2-256 tokens (decode steps of a few to a few hundred streams), where
cuBLAS leaves the weights' bandwidth unused.

A decode step of M streams reads every weight once: up to ~128 tokens on an H200 its linears
are bound by those reads (Llama-3-8B's four projections: 436 MB a layer, 103 us at 4.22 TB/s),
and from ~190 by the tensor cores. cuBLAS's kernels inside graphs, with the weights out of L2
(tests/hal_cuda/fp8_gemm_probe.py, benchmarks/results/fp8_gemm_probe*_h200.json), take 119 us
a layer at 16 tokens, 128 at 64 and 139 at 128 (3.1-3.7 TB/s): the small projections (o:
12-14 us for 33.5 MB, qkv: 16-17 us for 50 MB) run short of programs, and B2's profiled drain
(benchmarks/results/b2_profile_summary_call64_h200.json, 80 tokens) spent 4.45 ms a step in
linears whose weights take 3.55 ms to read.

On an H100 (call 78, benchmarks/results/token_gemm_probe_h100.json) cuBLAS reads the large
weights at 87% of the bandwidth already and this kernel beat it only on gate_up and the LM
head up to ~96 tokens (B2 +0.1%): TUNED has no H100 table. The H200's probe is to come.

This kernel computes out^T's tile: acc[BLOCK_N, BLOCK_M] += W[BLOCK_N, BLOCK_K] @
x[BLOCK_M, BLOCK_K]^T, the weight rows as the tensor cores' wide side and the tokens as their
narrow side (as narrow as 16), stored transposed; SPLIT_K > 1 spreads a weight with few output
rows over every multiprocessor (program (m, n, s) sums the s-th of SPLIT_K runs of K tiles into
a float32 workspace [SPLIT_K, M, N], quant_kernels.splitk_sum_kernel adds the partials in order
and the bias: the same sum every run). The token tiles of one weight tile are the grid's
fastest axis, so with M > BLOCK_M they read it while it is in L2.

Which product takes it (HAL_CUDA_TOKEN_GEMM):

- `table` (unset, the default): the shapes and token counts of TUNED for this card, picked on
  it ahead of time (`tests/hal_cuda/token_gemm_probe.py`), cuBLAS for everything else. A
  `HAL_CUDA_TOKEN_GEMM_TABLE=PATH` JSON (the probe's `picks`) replaces TUNED for the process:
  the same call's A/B runs, before a table is committed. Every rank of a group reads the same
  table, so every rank runs the same kernels.
- `measure`: a (shape, token count) TUNED does not hold is measured the first time it runs
  outside a graph capture (the graph runner's eager warm-up comes before every capture):
  cuBLAS against candidates(), the fastest kept for the process (autotune.pick). One rank
  of a group may choose another kernel than the next: for single-device runs and probes.
- `off`: cuBLAS always (A/B runs).
"""

from __future__ import annotations

import functools
import json
import os
from typing import Any

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from tessera.hal.cuda import autotune, pdl
from tessera.hal.cuda.pdl import enter as pdl_enter
from tessera.hal.cuda.quant_kernels import splitk_sum_kernel, store_wt_tile, wt_tile

VARIABLE = "HAL_CUDA_TOKEN_GEMM"
TABLE_VARIABLE = "HAL_CUDA_TOKEN_GEMM_TABLE"
MODES = ("table", "measure", "off")
MIN_TOKENS, MAX_TOKENS = 2, 256  # one token: gemv.py's GEMV; more: cuBLAS
CAPABILITY = (9, 0)
SMEM_LIMIT = 200 * 1024  # bytes of staged tiles a program may hold (sm_90: 227 KB)

# (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages, SPLIT_K)
Config = autotune.Config  # six ints: the line above

Table = dict[tuple[int, int], tuple[tuple[int, Config | None], ...]]

# The card (a word of its device name) -> (out_features, in_features) -> ((largest token
# count, config or None for cuBLAS), ...), token counts ascending: a product of M tokens takes
# the first row whose count is >= M. Filled from the probe's picks on that card: an H100 and
# an H200 share sm_90 but not their memory's bandwidth, so one card's picks are not the
# other's.
TUNED: dict[str, Table] = {}


@triton.jit(do_not_specialize=["M"])
def _token_gemm_kernel(x_ptr, w_ptr, b_ptr, out_ptr, M, N, K, x_s0, w_s0, out_s0,
                       HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                       BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr, EVEN_N: tl.constexpr,
                       EVEN_K: tl.constexpr, USE_PDL: tl.constexpr = False):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    pid_k = tl.program_id(2)
    pdl_enter(USE_PDL)
    k_start, k_end, rm, rn, mmask, nmask = wt_tile(pid_m, pid_n, pid_k, M, N, K, BLOCK_M,
                                                   BLOCK_N, BLOCK_K, SPLIT_K)
    x_rows = x_ptr + rm[:, None].to(tl.int64) * x_s0
    w_rows = w_ptr + rn[:, None].to(tl.int64) * w_s0
    acc = tl.zeros([BLOCK_N, BLOCK_M], tl.float32)
    for k0 in range(k_start, k_end, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        if EVEN_K:
            x = tl.load(x_rows + k[None, :], mask=mmask[:, None], other=0.0)
            if EVEN_N:
                w = tl.load(w_rows + k[None, :])
            else:
                w = tl.load(w_rows + k[None, :], mask=nmask[:, None], other=0.0)
        else:
            kmask = k < k_end
            x = tl.load(x_rows + k[None, :], mask=mmask[:, None] & kmask[None, :], other=0.0)
            w = tl.load(w_rows + k[None, :], mask=nmask[:, None] & kmask[None, :], other=0.0)
        acc = tl.dot(w, tl.trans(x), acc)
    store_wt_tile(acc, out_ptr, b_ptr, rm, rn, mmask, nmask, pid_k, M, N, out_s0, HAS_BIAS,
                  SPLIT_K)


def fits(k: int, config: Config) -> bool:
    """Whether `config` can run a product over k inputs (any tokens and weight rows: the
    tiles' masks take the rest): tiles the tensor cores take (powers of two, at least 16), at
    most SMEM_LIMIT bytes of staged bf16 tiles, and every split a whole number of K tiles,
    none empty."""
    block_m, block_n, block_k, warps, stages, split = config
    pow2 = all(v >= 16 and v & (v - 1) == 0 for v in (block_m, block_n, block_k))
    if not pow2 or warps not in (4, 8) or stages < 1 or split < 1:
        return False
    if stages * (block_m + block_n) * block_k * 2 > SMEM_LIMIT:
        return False
    k_tiles = triton.cdiv(k, block_k)
    per_split = triton.cdiv(k_tiles, split)
    return split == 1 or (split <= k_tiles and (split - 1) * per_split < k_tiles)


def token_gemm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
               config: Config) -> torch.Tensor:
    """x [M, K] @ weight [N, K]^T (+ bias) -> [M, N] in x's dtype, float32 accumulation."""
    block_m, block_n, block_k, warps, stages, split = config
    m, k = x.shape
    n = weight.shape[0]
    if weight.shape[1] != k or x.stride(-1) != 1 or weight.stride(-1) != 1:
        raise ValueError(f"token_gemm expects x [M, {weight.shape[1]}] and row-major "
                         f"operands, got x {tuple(x.shape)} strides {x.stride()}, weight "
                         f"{tuple(weight.shape)} strides {weight.stride()}")
    if not fits(k, config):
        raise ValueError(f"token_gemm config {config} does not fit [{m}, {k}] x [{n}, {k}]")
    out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    grid = (triton.cdiv(m, block_m), triton.cdiv(n, block_n), split)
    even_k = k % (block_k * split) == 0
    target = out if split == 1 else torch.empty((split, m, n), dtype=torch.float32,
                                                device=x.device)
    _token_gemm_kernel[grid](
        x, weight, bias if bias is not None else out, target, m, n, k, x.stride(0),
        weight.stride(0), out.stride(0), HAS_BIAS=bias is not None, BLOCK_M=block_m,
        BLOCK_N=block_n, BLOCK_K=block_k, SPLIT_K=split, EVEN_N=n % block_n == 0,
        EVEN_K=even_k, num_warps=warps, num_stages=stages, **pdl.launch_options())
    if split > 1:
        block = 1024
        splitk_sum_kernel[(triton.cdiv(m * n, block),)](
            target, bias if bias is not None else out, out, m, n, SPLIT_K=split,
            HAS_BIAS=bias is not None, BLOCK=block)
    return out


def token_tile(m: int) -> int:
    """The token tile of m tokens: the next power of two, 16 to 128."""
    return min(128, max(16, triton.next_power_of_2(m)))


def candidates(m: int, n: int, k: int) -> list[Config]:
    """The configurations the probe and `measure` time for an [m, k] x [n, k]^T product:
    weight tiles of 64 rows (one warpgroup, K tiles of 128 or 256) and of 128 (one or two
    warpgroups), each at the deepest pipeline that fits in shared memory, unsplit where the
    tiles alone make two waves of a 132-SM chip, else split in K until they make one and two;
    beyond 128 tokens both a 128-token tile (two over the batch) and a 256-token one."""
    tiles = [token_tile(m)] + ([256] if m > 128 else [])
    out: list[Config] = []
    for block_m in tiles:
        for block_n, shapes in ((64, ((128, 4), (256, 4))),
                                (128, ((128, 4), (128, 8), (256, 8)))):
            programs = triton.cdiv(m, block_m) * triton.cdiv(n, block_n)
            if programs >= 264:
                splits = [1]
            elif programs >= 132:
                splits = [1, 2]
            else:
                reach = next((s for s in (2, 4, 8) if programs * s >= 132), 8)
                splits = sorted({reach, min(8, reach * 2)})
            for split in splits:
                for block_k, warps in shapes:
                    # the deepest pipeline up to 6 stages that fits in shared memory
                    stages = min(6, SMEM_LIMIT // ((block_m + block_n) * block_k * 2))
                    config = (block_m, block_n, block_k, warps, stages, split)
                    if stages >= 2 and fits(k, config):
                        out.append(config)
    return out


def setting(value: str | None) -> str:
    text = (value or "").strip().lower()
    if text in ("", "table", "1", "on"):
        return "table"
    if text in ("0", "off"):
        return "off"
    if text == "measure":
        return "measure"
    raise ValueError(f"{VARIABLE}={value!r}: expected table (the default), measure or off")


@functools.lru_cache(maxsize=1)
def _mode() -> str:
    return setting(os.environ.get(VARIABLE))


def parse_table(data: Any) -> Table:
    """A probe's `picks` ({"N,K": [[tokens, config or null], ...]}) as TUNED's rows, or a
    clear error."""
    if not isinstance(data, dict):
        raise ValueError("a token GEMM table is an object {\"N,K\": [[tokens, config], ...]}")
    table: Table = {}
    for key, rows in data.items():
        try:
            n, k = (int(v) for v in str(key).split(","))
            parsed = []
            for tokens, config in rows:
                parsed.append((int(tokens), None if config is None
                               else tuple(int(v) for v in config)))
        except (TypeError, ValueError) as e:
            raise ValueError(f"token GEMM table entry {key!r}: {e}") from None
        for _, config in parsed:
            if config is not None and len(config) != 6:
                raise ValueError(f"token GEMM table entry {key!r}: config {config} is not "
                                 "(BLOCK_M, BLOCK_N, BLOCK_K, warps, stages, split)")
        table[(n, k)] = tuple(sorted(parsed))  # type: ignore[arg-type]
    return table


@functools.lru_cache(maxsize=4)
def _table(device_name: str = "") -> Table:
    """The process's table: HAL_CUDA_TOKEN_GEMM_TABLE's when set, else TUNED's for the card
    whose word the device's name holds (none: an empty table, cuBLAS)."""
    path = os.environ.get(TABLE_VARIABLE)
    if not path:
        return next((t for card, t in TUNED.items() if card in device_name.split()), {})
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    return parse_table(data.get("picks", data) if isinstance(data, dict) else data)


def lookup(table: Table, m: int, n: int, k: int) -> tuple[bool, Config | None]:
    """(whether the table holds this product, its config or None for cuBLAS)."""
    rows = table.get((n, k))
    if not rows:
        return False, None
    for tokens, config in rows:
        if tokens >= m:
            return True, config if config is not None and fits(k, config) else None
    return False, None


CUBLAS: Config = (0, 0, 0, 0, 0, 0)  # autotune's candidate for F.linear


def _measure(x: torch.Tensor, weight: torch.Tensor,
             bias: torch.Tensor | None) -> Config | None:
    """autotune.pick over cuBLAS and candidates() for this product, keyed by its shape, token
    count, device and bias (measured once, outside captures; inside one, cuBLAS unkept);
    None for cuBLAS."""
    m, k = x.shape
    n = weight.shape[0]

    def run(config: Config) -> torch.Tensor:
        return F.linear(x, weight, bias) if config == CUBLAS else token_gemm(x, weight, bias,
                                                                           config)

    key = ("token_gemm", m, n, k, x.device.index, bias is not None)
    chosen = autotune.pick(key, [CUBLAS, *candidates(m, n, k)], x, run)
    return None if chosen == CUBLAS else chosen


@functools.lru_cache(maxsize=16)
def _device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else ""


def applies(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether this product is one the kernel may take: bf16, 2-256 row-major tokens on a
    Hopper device, a row-major weight."""
    return (x.dim() == 2 and MIN_TOKENS <= x.shape[0] <= MAX_TOKENS and x.stride(-1) == 1
            and weight.dim() == 2 and weight.stride(-1) == 1
            and x.dtype == weight.dtype == torch.bfloat16 and x.is_cuda
            and autotune.capability(x.device) == CAPABILITY)


def config_for(x: torch.Tensor, weight: torch.Tensor,
               bias: torch.Tensor | None) -> Config | None:
    """The config this process runs the product with, or None (cuBLAS)."""
    mode = _mode()
    if mode == "off":
        return None
    m, k = x.shape
    n = weight.shape[0]
    held, config = lookup(_table(_device_name(x.device)), m, n, k)
    return config if held or mode != "measure" else _measure(x, weight, bias)
