"""What bounds int4's one-token GEMV on the GPU: variants of one word-tile kernel that differ
in a single thing, timed side by side on Llama-3-8B's gate_up and down (bf16 x, groups of
128, inside CUDA graphs over rotating weight copies). Not a pytest module, and not the
plugin's kernel (docs/performance.md, "int4's one-token GEMV is not bound by its
instructions"): calls 32-34 measured the word-tile GEMV (3.0 sm_90 instructions a weight, no
int -> float conversion) at the half-split tiles' speed (5.3 a weight, one I2F each), so
something other than the instruction count bounds both. The variants:

    denormal  a nibble masked in place is the float32 denormal q 2^(e - 149); one FMA with
              x scaled by 2^(85 - e) makes the exact product q x 2^-64 (what 7b747f3 ran)
    magic     the same nibble OR-ed with 2^23's exponent bits: a normal float 2^23 + c q,
              an FMA back to q, a second FMA with x (no denormal operand anywhere)
    loads     the words loaded and XOR-ed together, no arithmetic: the memory ceiling of
              the same tiles and access pattern
    _s<N>     denormal with the loop software-pipelined N stages deep (tl.range's
              num_stages: the words copied ahead into shared memory)

Layout ("words16"): nibble p of 32-bit word w of a tile of 128 columns holds column 16 p + w.

    python3 tests/hal_cuda/int4_gemv_probe.py OUT.json          # on the GPU, about a minute
    python3 tests/hal_cuda/int4_gemv_probe.py OUT.json --cpu    # interpreter, tiny shapes:
                                                                # each variant against the
                                                                # definition
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

SHAPES = {"gate_up": (28672, 4096), "down": (4096, 14336), "qkv": (6144, 4096)}
TILES = [(16, 1024, 1), (8, 2048, 2), (8, 1024, 1)]  # (BLOCK_N, BLOCK_K, warps)
CPU_SHAPES = {"gate_up": (48, 512), "down": (32, 1024)}
CPU_TILES = [(8, 256, 1), (4, 512, 1)]
VARIANTS = {"denormal": (0, 1), "magic": (1, 1), "loads": (2, 1), "denormal_s2": (0, 2),
            "denormal_s3": (0, 3), "denormal_s4": (0, 4)}


if __name__ == "__main__" and "--cpu" in sys.argv:
    os.environ["TRITON_INTERPRET"] = "1"  # before triton is first imported

import triton  # noqa: E402
import triton.language as tl  # noqa: E402


@triton.jit
def _nib(src, MASK: tl.constexpr, E: tl.constexpr, MODE: tl.constexpr):
    if MODE == 1:  # 2^23 + 2^E q, times 2^-E less 2^(23-E): q exactly
        v = ((src & MASK) | 0x4B000000).to(tl.float32, bitcast=True)
        out = v * (2.0 ** -E) - 2.0 ** (23 - E)
    else:  # the denormal q 2^(E - 149), paired with x 2^(85 - E)
        out = (src & MASK).to(tl.float32, bitcast=True)
    return out

@triton.jit
def _xs(x, E: tl.constexpr, MODE: tl.constexpr):
    if MODE == 1:
        out = x * 2.0 ** -64
    else:
        out = x * 2.0 ** (85 - E)
    return out

@triton.jit
def probe(x_ptr, q_ptr, s_ptr, o_ptr, out_ptr, n_out, n_in, q_s0, s_s0,
          BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, MODE: tl.constexpr,
          STAGES: tl.constexpr = 1):
    # groups of 128 = one tile of 16 words; sums kept at 2^-64, scaled back at the end
    TILES: tl.constexpr = BLOCK_K // 128
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    rmask = rows < n_out
    rows_ld = tl.minimum(rows, n_out - 1).to(tl.int64)
    ti = tl.arange(0, TILES)
    wi = tl.arange(0, 16)
    q_rows = q_ptr + rows_ld[:, None, None] * q_s0
    s_rows = rows_ld[:, None] * s_s0
    acc = tl.zeros([BLOCK_N, TILES, 16], tl.float32)
    oacc = tl.zeros([BLOCK_N, TILES], tl.float32)
    bits = tl.zeros([BLOCK_N, TILES, 16], tl.int32)
    # STAGES > 1: the loop software-pipelined by Triton (the words copied ahead into shared
    # memory while this iteration computes)
    for k0 in tl.range(0, n_in, BLOCK_K, num_stages=STAGES):
        words = tl.load(q_rows + (k0 // 8 + ti[:, None] * 16 + wi[None, :])[None, :, :])
        if MODE == 2:
            bits = bits ^ words
        else:
            col = k0 + ti[:, None] * 128 + wi[None, :]
            x0 = tl.load(x_ptr + col).to(tl.float32)
            x1 = tl.load(x_ptr + col + 16).to(tl.float32)
            x2 = tl.load(x_ptr + col + 32).to(tl.float32)
            x3 = tl.load(x_ptr + col + 48).to(tl.float32)
            x4 = tl.load(x_ptr + col + 64).to(tl.float32)
            x5 = tl.load(x_ptr + col + 80).to(tl.float32)
            x6 = tl.load(x_ptr + col + 96).to(tl.float32)
            x7 = tl.load(x_ptr + col + 112).to(tl.float32)
            hi = words >> 12
            part = _nib(words, 0xF, 0, MODE) * _xs(x0, 0, MODE)[None]
            part += _nib(words, 0xF0, 4, MODE) * _xs(x1, 4, MODE)[None]
            part += _nib(words, 0xF00, 8, MODE) * _xs(x2, 8, MODE)[None]
            part += _nib(words, 0xF000, 12, MODE) * _xs(x3, 12, MODE)[None]
            part += _nib(words, 0xF0000, 16, MODE) * _xs(x4, 16, MODE)[None]
            part += _nib(hi, 0xF00, 8, MODE) * _xs(x5, 8, MODE)[None]
            part += _nib(hi, 0xF000, 12, MODE) * _xs(x6, 12, MODE)[None]
            part += _nib(hi, 0xF0000, 16, MODE) * _xs(x7, 16, MODE)[None]
            xsum = (((x0 + x1) + (x2 + x3)) + ((x4 + x5) + (x6 + x7))) * 2.0 ** -64
            g = (k0 + ti * 128) // 128
            s = tl.load(s_ptr + s_rows + g[None, :])
            o = tl.load(o_ptr + s_rows + g[None, :])
            acc = tl.fma(part, s[:, :, None], acc)
            oacc = tl.fma(o, tl.sum(xsum, 1)[None, :], oacc)
    if MODE == 2:
        res = tl.sum(tl.sum(bits, 2), 1).to(tl.float32)
    else:
        res = (tl.sum(tl.sum(acc, 2), 1) + tl.sum(oacc, 1)) * 2.0 ** 64
    tl.store(out_ptr + rows, res.to(out_ptr.dtype.element_ty), mask=rmask)


def pack_words16(q: torch.Tensor) -> torch.Tensor:
    """uint8 [N, K] of 0..15 -> int32 [N, K // 8]: nibble p of word w of each 128-column tile
    holds column 16 p + w."""
    n, k = q.shape
    t = q.to(torch.int32).reshape(n, k // 128, 8, 16)  # [.., p, w]
    words = torch.zeros((n, k // 128, 16), dtype=torch.int64)
    for p in range(8):
        words |= t[:, :, p, :].to(torch.int64) << (4 * p)
    return (words - (words >= 2 ** 31).to(torch.int64) * 2 ** 32).to(torch.int32).reshape(
        n, k // 8)


def _weights(n: int, k: int, dev: torch.device, seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 16, (n, k), generator=gen, dtype=torch.uint8)
    s = torch.rand((n, k // 128), generator=gen) * 0.01 + 0.001
    o = -s * torch.randint(0, 16, (n, k // 128), generator=gen).float()
    dense = q.float().view(n, k // 128, 128) * s[..., None] + o[..., None]
    return {"q": pack_words16(q).to(dev), "s": s.to(dev), "o": o.to(dev),
            "dense": dense.view(n, k).to(dev)}


def run(x: torch.Tensor, w: dict[str, torch.Tensor], tile: tuple[int, int, int],
        mode: tuple[int, int]) -> torch.Tensor:
    n, k = w["dense"].shape
    block_n, block_k, warps = tile
    out = torch.empty((1, n), dtype=x.dtype, device=x.device)
    probe[((n + block_n - 1) // block_n,)](
        x, w["q"], w["s"], w["o"], out, n, k, w["q"].stride(0), w["s"].stride(0),
        BLOCK_N=block_n, BLOCK_K=block_k, MODE=mode[0], STAGES=mode[1], num_warps=warps)
    return out


def main(argv: list[str]) -> int:
    out_path = Path(argv[0])
    cpu = "--cpu" in argv
    dev = torch.device("cpu" if cpu else "cuda")
    dtype = torch.float32 if cpu else torch.bfloat16
    shapes, tiles = (CPU_SHAPES, CPU_TILES) if cpu else (SHAPES, TILES)
    if cpu:
        def timer(call: Callable[[], torch.Tensor]) -> float:
            t0 = time.perf_counter()
            call()
            return (time.perf_counter() - t0) * 1e6
    else:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from gpu_bench import graph_time_us

        def timer(call: Callable[[], torch.Tensor]) -> float:
            return graph_time_us(call, reps=12)
    res: dict[str, Any] = {"commit": os.environ.get("TESSERA_COMMIT"),
                           "device": "cpu (interpreter)" if cpu else
                           torch.cuda.get_device_name(), "shapes": {}}
    for name, (n, k) in shapes.items():
        ws = [_weights(n, k, dev, seed) for seed in range(1 if cpu else 3)]
        x = torch.randn((1, k), device=dev).to(dtype)
        want = x.float() @ ws[0]["dense"].t()
        nbytes = ws[0]["q"].numel() * 4 + ws[0]["s"].numel() * 8
        rows: list[dict[str, Any]] = []
        for tile in tiles:
            for vname, mode in VARIANTS.items():
                row: dict[str, Any] = {"tile": list(tile), "variant": vname}
                got = run(x, ws[0], tile, mode)
                if mode[0] != 2:
                    row["rel_err"] = float((got.float() - want).norm() / want.norm())
                turn = [0]  # rotates the weight copies: L2 never holds the one read

                def call(t: tuple[int, int, int] = tile, m: tuple[int, int] = mode,
                         x: torch.Tensor = x, ws: list[dict[str, torch.Tensor]] = ws,
                         turn: list[int] = turn) -> torch.Tensor:
                    turn[0] += 1
                    return run(x, ws[turn[0] % len(ws)], t, m)
                row["us"] = timer(call)
                if not cpu:
                    row["TBps"] = nbytes / (row["us"] * 1e-6) / 1e12
                rows.append(row)
                print(f"{name} {tile} {vname}: {row['us']:.1f} us "
                      f"{row.get('TBps', 0):.2f} TB/s err {row.get('rel_err', '-')}",
                      file=sys.stderr, flush=True)
        res["shapes"][name] = {"weight_bytes": nbytes, "rows": rows}
        out_path.write_text(json.dumps(res, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
