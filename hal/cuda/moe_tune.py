"""Launch configurations of the fused MoE's two grouped GEMMs (moe.py), measured once per
(GEMM, token bucket, E, N, K, top-k, dtype, device) by autotune.pick; where nothing is
measured (a graph capture, the interpreter) the first candidate, the fixed heuristic the op
used before it was tuned.

A tile is (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages). BLOCK_M is also the alignment's
block (align_by_expert pads each expert's run of pairs to a multiple of it), and both GEMMs of
one call read the same alignment, so they share BLOCK_M. It is chosen with the gate/up GEMM
(the larger: 2 * inter outputs, two thirds of the FLOPs and weight bytes), each candidate
measured on its own alignment; the down GEMM then measures the candidates' (BLOCK_N, BLOCK_K,
num_warps, num_stages) at that BLOCK_M. Measuring both GEMMs for every joint combination would
square the warm-up's measurements for little: the down GEMM's best BLOCK_M is the one that
pads the pairs least, as it is the gate/up's.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
import triton

from tessera.hal.cuda import autotune

Tile = tuple[int, int, int, int, int]
# Decode-size batches: each expert holds a few pairs, BLOCK_M = 16 (tl.dot's smallest) pads
# least, and the GEMM streams weights, so the candidates move 8-64 KiB of weight per program
# per K iteration (the heuristic, first, moves 4 KiB) with 2-4 iterations' loads in flight, in
# tiles wide (fewer programs, more bytes each) or narrow (more programs for the down GEMM,
# whose N is only hidden).
DECODE: list[Tile] = [
    (16, 32, 64, 4, 3),
    (16, 32, 128, 4, 5), (16, 32, 256, 4, 4), (16, 64, 128, 4, 4), (16, 64, 128, 8, 5),
    (16, 64, 256, 4, 3), (16, 64, 256, 8, 4), (16, 128, 64, 4, 4), (16, 128, 128, 4, 4),
    (16, 128, 128, 8, 4), (16, 128, 256, 8, 3), (16, 256, 128, 8, 3),
]
# 9-64 tokens: up to ~16 pairs per expert; BLOCK_M 32 wastes less than it saves there.
SMALL: list[Tile] = DECODE + [(32, 64, 128, 4, 4), (32, 128, 64, 4, 4), (32, 128, 128, 8, 3)]
# Larger batches: the usual GEMM tiles, the heuristic first.
LARGE: list[Tile] = [
    (64, 128, 64, 4, 3),
    (64, 128, 64, 8, 3), (64, 128, 128, 4, 3), (64, 256, 64, 8, 3), (128, 128, 64, 8, 3),
    (128, 128, 128, 8, 3), (128, 256, 64, 8, 3), (32, 128, 64, 4, 4),
]
# Upper bounds of the token buckets (the last takes every larger batch) and their candidates.
BUCKETS: dict[int, list[Tile]] = {1: DECODE, 4: DECODE, 8: DECODE, 64: SMALL, 256: LARGE,
                                  1024: LARGE, 1 << 62: LARGE}
# Shared memory of a tile: at most `stages` buffers of the A and B tiles (Triton 3.9 at sm_90
# allocates stages - 1 for BLOCK_M 16 and stages for the wgmma tiles of BLOCK_M >= 64,
# tests/hal_cuda/compile_for_sm90.py checks it); the H100/H200 allow a program 227 KiB.
SMEM_BYTES = 224 * 1024


def token_bucket(tokens: int) -> int:
    return next(b for b in BUCKETS if tokens <= b)


def _fit(tile: Tile, n: int, k: int) -> Tile:
    """The tile cut to the GEMM: no wider than N's power of two (at least 16), and BLOCK_K no
    longer than K's (at least 64, the heuristic's, so the first candidate is kept as is)."""
    bm, bn, bk, warps, stages = tile
    return bm, min(bn, max(16, triton.next_power_of_2(n))), \
        min(bk, max(64, triton.next_power_of_2(k))), warps, stages


def shared_bytes(tile: Tile, elem_bytes: int) -> int:
    bm, bn, bk, _, stages = tile
    return stages * bk * (bm + bn) * elem_bytes


def candidates(tokens: int, n: int, k: int, dtype: torch.dtype,
               block_m: int | None = None) -> list[Tile]:
    """The bucket's tiles fitted to an [*, K] x [K, N] GEMM, first the heuristic; with block_m,
    every tile at that BLOCK_M (the down GEMM's after the gate/up chose it)."""
    return list(_candidates(token_bucket(tokens), n, k, dtype, block_m))


@functools.lru_cache(maxsize=256)
def _candidates(bucket: int, n: int, k: int, dtype: torch.dtype,
                block_m: int | None) -> tuple[Tile, ...]:
    # Cached: fused_moe asks on every call, the tuner's choice already kept or not.
    elem = torch.empty((), dtype=dtype).element_size()
    out: list[Tile] = []
    for i, tile in enumerate(BUCKETS[bucket]):
        if block_m is not None:
            tile = (block_m, *tile[1:])
        tile = _fit(tile, n, k)
        if tile not in out and (i == 0 or shared_bytes(tile, elem) <= SMEM_BYTES):
            out.append(tile)
    return tuple(out)


def _key(gemm: str, tokens: int, experts: int, n: int, k: int, top_k: int,
         x: torch.Tensor, *rest: int) -> tuple[Any, ...]:
    return ("moe_" + gemm, token_bucket(tokens), experts, n, k, top_k, x.dtype,
            x.device.index, *rest)


def gate_up_tile(x: torch.Tensor, experts: int, n: int, top_k: int,
                 run: Callable[[Tile], Any]) -> Tile:
    """The gate/up GEMM's tile (and with it the alignment's BLOCK_M); run(tile) launches it."""
    tokens, k = x.shape
    cands = candidates(tokens, n, k, x.dtype)
    key = _key("gate_up", tokens, experts, n, k, top_k, x)
    return autotune.pick(key, cands, x, run)  # type: ignore[arg-type, return-value]


def down_tile(x: torch.Tensor, experts: int, n: int, k: int, top_k: int, block_m: int,
              run: Callable[[Tile], Any]) -> Tile:
    """The down GEMM's tile at the gate/up's BLOCK_M; x is the op's input (tokens, dtype)."""
    tokens = x.shape[0]
    cands = candidates(tokens, n, k, x.dtype, block_m)
    key = _key("down", tokens, experts, n, k, top_k, x, block_m)
    return autotune.pick(key, cands, x, run)  # type: ignore[arg-type, return-value]
