"""Does int4's one-token GEMV gain from the tensor cores once its loads stay contiguous? A
probe, not a pytest module (its numpy model is checked in test_int4_mma_probe_cpu.py).

Call 42 left int4's CUDA C GEMV (hal/cuda/native_gemv.py) at the sum of its loads and its
arithmetic: two instructions a weight on the CUDA cores (a LOP3 on the integer pipe, which
Hopper runs at half the FMA rate, and an FMA). Call 41's `mma.m16n8k16` variant cut the loop
to 1.25 instructions a weight but lost on its loads (a warp instruction read 64 bytes of each
of 8 rows). This kernel keeps every warp load 512 contiguous bytes by reading a copy of the
weight whose "halves128" tiles (64 bytes: one row's 128 columns, one group) are interleaved
8 rows at a time: [N / 8][K / 128][8][64]. Lane 4g + t then holds row g's bytes 16t .. 16t + 15
of a tile, which is the mma's A fragment layout (rows g and g + 8 from two such loads).

    weights  a word's nibbles become four f16 pairs by the exponent bits 0x6400: a low
             nibble at bits 0-3 is 1024 + q, a high one at bits 4-7 1024 + 16q (both within
             f16's mantissa, so no shift but one a word); one f16x2 subtraction makes them
             q - 8 and 16 (q - 8) exactly. Five integer instructions for eight weights.
    x        staged once a block in shared memory as f16 in the B fragment's order, each
             tile of 128 columns scaled by its own power of two so its largest element is
             2^14 (exact: bf16's 8 bits fit f16's 11), the high nibbles' columns / 16;
             with the tile's sum of x and the power's inverse.
    sums     C = sum (q - 8) x 2^e over a tile (8 mma a 16-row tile, float32 accumulation),
             so a group adds s 2^-e C + (8 s + o) sum(x) to its row.

Against the plugin's kernel on Llama-3-8B's linears (bf16 x, groups of 128), inside CUDA
graphs over rotating weight copies, both checked against the float reference:

    python3 tests/hal_cuda/int4_mma_probe.py OUT.json         # on the GPU, about a minute
    python3 tests/hal_cuda/int4_mma_probe.py OUT.json --cpu   # dry run: compiles each
                                                              # config for sm_90 where
                                                              # NVRTC is there
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from pathlib import Path
from typing import Any

import torch

SHAPES = {"gate_up": (28672, 4096), "down": (4096, 14336), "qkv": (6144, 4096),
          "o": (4096, 4096)}
# (16-row tiles a block, k-tiles a warp loads ahead, warps a block)
MMA_CONFIGS = [(1, 1, 4), (1, 2, 4), (2, 1, 4), (2, 2, 2), (2, 1, 8), (4, 1, 4), (1, 2, 8)]
VARIANT_CONFIGS = [(1, 1, 4), (2, 1, 4)]  # those the variants run at too
PLAIN_CONFIGS = [(8, 1, 2), (8, 1, 4), (4, 1, 4), (4, 2, 2)]  # native_gemv's, rows x U x W
COPIES = 3  # weight copies rotated through (together more than the L2)
TILE = 128  # columns a k-tile: one "halves128" tile, one group

# The kernel takes qgemv_native's arguments (so native_gemv.qgemv launches it with its
# `source`): R = 16 RT rows a block, U, WARPS, PDL / PRE as there, and KTMAX (the k-tiles a
# row, for the shared memory) defined before it. Rows, K and the group are the probe's
# (N a multiple of R, K of 128, groups of 128); the fusions' arguments are unused.
SOURCE = r"""
typedef unsigned int u32;
typedef unsigned short u16;
#define RT (R / 16)

__device__ __forceinline__ uint4 ld_weights(const unsigned char* p) {
    uint4 v;
    asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    return v;
}

// f16 pair from two float32: lo in the low half
__device__ __forceinline__ u32 f16_pair(float lo, float hi) {
    u32 d;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo));
    return d;
}

__device__ __forceinline__ u32 hsub2(u32 a, u32 b) {
    u32 d;
    asm("sub.rn.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
    return d;
}

// (a & b) | c in one LOP3 (the compiler splits it in two when b and c are both immediates)
__device__ __forceinline__ u32 and_or(u32 a, u32 b, u32 c) {
    u32 d;
    asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}

// a word of a tile (bytes c .. c + 3: columns c + i low, 64 + c + i high) as four f16 pairs:
// r0 (c, c + 2) and r2 (c + 1, c + 3) as q - 8, r1 (64 + c, 66 + c) and r3 (65 + c, 67 + c)
// as 16 (q - 8). Five integer instructions: one shift and four LOP3.
__device__ __forceinline__ void unpack(u32 w, u32& r0, u32& r1, u32& r2, u32& r3) {
    const u32 m = 0x64006400u, w8 = w >> 8;
    r0 = hsub2(and_or(w, 0x000F000Fu, m), 0x64086408u);
    r1 = hsub2(and_or(w, 0x00F000F0u, m), 0x64806480u);
    r2 = hsub2(and_or(w8, 0x000F000Fu, m), 0x64086408u);
    r3 = hsub2(and_or(w8, 0x00F000F0u, m), 0x64806480u);
}

__device__ __forceinline__ void mma(float (&c)[4], u32 a0, u32 a1, u32 a2, u32 a3, u32 b0,
                                    u32 b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

#define POW2(e) __uint_as_float((u32)(127 + (e)) << 23)

extern "C" __global__ void __launch_bounds__(WARPS * 32)
qgemv_native(const u16* __restrict__ x, const unsigned char* __restrict__ q,
             const float* __restrict__ s, const float* __restrict__ o,
             const u16* __restrict__ bias, u16* __restrict__ out,
             int n, int k, long long q_s0, long long s_s0, int has_bias,
             const u16* __restrict__ g_, float eps, const u16* __restrict__ res,
             const long long* __restrict__ pos, const long long* __restrict__ slot,
             const u16* __restrict__ cs, long long cs_s0, u16* __restrict__ kc,
             u16* __restrict__ vc, long long c_s0, long long c_s1, int q_rows, int kv_rows)
{
    __shared__ uint4 xb[KTMAX * 16];  // x as B fragments: [tile][t][word m][r0 r2 r1 r3]
    __shared__ float xsum[KTMAX], xinv[KTMAX];
    __shared__ float red[WARPS][R];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int kt_n = k / 128;
    const unsigned char* qb[RT];
    const float* sp[RT][2];
    const float* op[RT][2];
#pragma unroll
    for (int j = 0; j < RT; ++j) {
        const long long tile16 = (long long)blockIdx.x * RT + j;
        qb[j] = q + 2 * tile16 * kt_n * 512 + 16 * lane;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const long long row = 16 * tile16 + 8 * h + g;
            sp[j][h] = s + row * s_s0;
            op[j][h] = o + row * s_s0;
        }
    }
    uint4 wv[U][RT][2];
    float sv[U][RT][2], ov[U][RT][2];
    float acc[RT][2];
#pragma unroll
    for (int j = 0; j < RT; ++j) acc[j][0] = acc[j][1] = 0.0f;
    int kt0 = warp;
    auto load = [&](int base) {
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int kt = base + u * WARPS;
#pragma unroll
            for (int j = 0; j < RT; ++j)
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    const bool in = kt < kt_n;
                    wv[u][j][h] = in ? ld_weights(qb[j] + ((long long)h * kt_n + kt) * 512)
                                     : make_uint4(0, 0, 0, 0);
                    sv[u][j][h] = in ? sp[j][h][kt] : 0.0f;
                    ov[u][j][h] = in ? op[j][h][kt] : 0.0f;
                }
        }
    };
    load(kt0);  // weights and scales: nothing a kernel before writes
#if PDL
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
    // x staged: a warp a tile, lane L its columns 4L .. 4L + 3; eight tiles' loads a warp in
    // flight at once (a row of 14336 inputs is 112 tiles: 28 a warp at 4 warps)
    for (int base = warp; base < kt_n; base += 8 * WARPS) {
        uint2 raw[8];
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            const int kt = base + i * WARPS;
            raw[i] = kt < kt_n ? *reinterpret_cast<const uint2*>(x + 128 * kt + 4 * lane)
                               : make_uint2(0, 0);
        }
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            const int kt = base + i * WARPS;
            if (kt >= kt_n) break;
            float v[4] = {__uint_as_float(raw[i].x << 16), __uint_as_float(raw[i].x & 0xffff0000u),
                          __uint_as_float(raw[i].y << 16), __uint_as_float(raw[i].y & 0xffff0000u)};
            float mx = fmaxf(fmaxf(fabsf(v[0]), fabsf(v[1])), fmaxf(fabsf(v[2]), fabsf(v[3])));
            float sum = (v[0] + v[1]) + (v[2] + v[3]);
#pragma unroll
            for (int off = 16; off > 0; off >>= 1) {
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
                sum += __shfl_xor_sync(0xffffffffu, sum, off);
            }
            // the tile's largest element to [2^14, 2^15): f16 holds it and every bf16 below
            // it down to 2^-17 of it exactly
            const int e = min(100, max(-100, 14 - ((int)(__float_as_uint(mx) >> 23) - 127)));
            const float f = lane < 16 ? POW2(e) : POW2(e - 4);  // the high nibbles' x / 16
            // the pairs of r0 and r2 (low nibbles' columns) or of r1 and r3 (high ones')
            *reinterpret_cast<uint2*>(reinterpret_cast<u32*>(xb) + 64 * kt + 4 * (lane & 15) +
                                      2 * (lane >> 4)) =
                make_uint2(f16_pair(v[0] * f, v[2] * f), f16_pair(v[1] * f, v[3] * f));
            if (lane == 0) {
                xsum[kt] = sum;
                xinv[kt] = POW2(-e);
            }
        }
    }
    __syncthreads();
    while (true) {
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int kt = kt0 + u * WARPS;
            if (kt >= kt_n) continue;
            uint4 b[4];
#pragma unroll
            for (int m = 0; m < 4; ++m) b[m] = xb[16 * kt + 4 * t + m];
            const float xs = xsum[kt], inv = xinv[kt];
#pragma unroll
            for (int j = 0; j < RT; ++j) {
                float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
                const u32 wg[4] = {wv[u][j][0].x, wv[u][j][0].y, wv[u][j][0].z, wv[u][j][0].w};
                const u32 w8[4] = {wv[u][j][1].x, wv[u][j][1].y, wv[u][j][1].z, wv[u][j][1].w};
#pragma unroll
                for (int m = 0; m < 4; ++m) {
                    u32 a0, a1, a2, a3, c0, c1, c2, c3;
                    unpack(wg[m], a0, a1, a2, a3);
                    unpack(w8[m], c0, c1, c2, c3);
                    mma(c, a0, c0, a2, c2, b[m].x, b[m].y);
                    mma(c, a1, c1, a3, c3, b[m].z, b[m].w);
                }
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    const float sg = sv[u][j][h];
                    acc[j][h] = fmaf(sg * inv, c[2 * h],
                                     fmaf(fmaf(8.0f, sg, ov[u][j][h]), xs, acc[j][h]));
                }
            }
        }
        kt0 += WARPS * U;
        if (kt0 >= kt_n) break;
        load(kt0);
    }
    if (t == 0) {
#pragma unroll
        for (int j = 0; j < RT; ++j) {
            red[warp][16 * j + g] = acc[j][0];
            red[warp][16 * j + 8 + g] = acc[j][1];
        }
    }
    __syncthreads();
    if (threadIdx.x < R) {
        const int row = blockIdx.x * R + threadIdx.x;
        float v = 0.0f;
#pragma unroll
        for (int w = 0; w < WARPS; ++w) v += red[w][threadIdx.x];
        if (has_bias) v += __uint_as_float(((u32)bias[row]) << 16);
        u16 h;
        asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(v));
        out[row] = h;
    }
}
"""


def variants() -> dict[str, str]:
    """The kernel ("mma") and two variants of its text that each leave one thing out:
    "mma_loads" its weight and scale loads alone (XOR-ed into the sums: the interleaved
    pattern's ceiling), "mma_unstaged" without x's staging (what the prologue costs; wrong
    sums)."""
    loop = "            uint4 b[4];\n"
    loop_end = "        kt0 += WARPS * U;\n"
    xor = """#pragma unroll
            for (int j = 0; j < RT; ++j)
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    const uint4 v = wv[u][j][h];
                    acc[j][h] += __uint_as_float((v.x ^ v.y ^ v.z ^ v.w) & 0x007FFFFFu) *
                                 sv[u][j][h] + ov[u][j][h];
                }
        }
"""
    stage = "    for (int base = warp; base < kt_n; base += 8 * WARPS) {"
    stage_end = "    __syncthreads();\n    while (true) {"
    out = {"mma": SOURCE, "mma_loads": _cut(SOURCE, loop, loop_end, xor),
           "mma_unstaged": _cut(SOURCE, stage, stage_end, "")}
    assert len(set(out.values())) == 3
    return out


def _cut(source: str, start: str, end: str, body: str) -> str:
    """source with the text from `start` up to (not including) `end` replaced by body."""
    a = source.index(start)
    b = source.index(end, a)
    return source[:a] + body + source[b:]


def interleave(qweight: torch.Tensor) -> torch.Tensor:
    """A "halves128" uint8 [N, K / 2] as the kernel reads it: its 64-byte tiles 8 rows at a
    time, [N / 8][K / 128][8][64], viewed [N, K / 2] again."""
    n, half = qweight.shape
    return qweight.reshape(n // 8, 8, half // 64, 64).permute(0, 2, 1, 3).contiguous() \
        .reshape(n, half)


def source_for(k: int, text: str = SOURCE) -> str:
    return f"#define KTMAX {k // TILE}\n" + text


def _fits(n: int, k: int, rt: int) -> bool:
    return n % (16 * rt) == 0 and k % TILE == 0


def main(argv: list[str]) -> int:
    here = str(Path(__file__).resolve().parent)
    if here not in sys.path:
        sys.path.insert(0, here)

    from tessera.hal.cuda import native_gemv, nvrtc

    out_path = Path(argv[0])
    if "--cpu" in argv:
        built: dict[str, Any] = {"configs": [list(c) for c in MMA_CONFIGS]}
        if nvrtc.can_compile():
            regs = {}
            for rt, u, warps in MMA_CONFIGS:
                for k in sorted({k for _, k in SHAPES.values()}):
                    defs = native_gemv.defines("int4", 16 * rt, u, warps, TILE, False, True,
                                               True, 7)
                    for text in variants().values():
                        nvrtc.compile_cubin(defs + source_for(k, text), 90)
                regs[f"{rt},{u},{warps}"] = "compiled"
            built["compiled_for"] = "sm_90"
            built["compiled"] = regs
        out_path.parent.mkdir(parents=True, exist_ok=True)
        out_path.write_text(json.dumps({"dry_run": True, **built}, indent=1) + "\n")
        return 0
    return _measure(out_path)


def _measure(out_path: Path) -> int:
    from gpu_bench import graph_time_us

    from tessera.hal.cuda import native_gemv
    from tessera.hal.cuda.quant_linear import prepare
    from tessera.hal.quant import quant_linear_reference, quantize

    res: dict[str, Any] = {"commit": os.environ.get("TESSERA_COMMIT"),
                           "device": torch.cuda.get_device_name(), "runs": []}

    def keep(row: dict[str, Any]) -> None:
        res["runs"].append(row)
        print(json.dumps(row), flush=True)
        out_path.parent.mkdir(parents=True, exist_ok=True)
        out_path.write_text(json.dumps(res, indent=1) + "\n")

    for name, (n, k) in SHAPES.items():
        ws = [prepare(quantize(torch.randn((n, k), device="cuda") * 0.02, "int4", None))
              for _ in range(COPIES)]
        assert ws[0].packing == f"halves{TILE}" and ws[0].group_size == TILE, ws[0].packing
        wi = [dataclasses.replace(w, qweight=interleave(w.qweight)) for w in ws]
        x = torch.randn((1, k), device="cuda").to(torch.bfloat16)
        exact = quant_linear_reference(x.float(), ws[0])
        nbytes = ws[0].nbytes
        runs = [("plain", c, ws, native_gemv.SOURCE) for c in PLAIN_CONFIGS] + \
            [(kernel, (16 * rt, u, warps), wi, source_for(k, text))
             for rt, u, warps in MMA_CONFIGS if _fits(n, k, rt)
             for kernel, text in variants().items()
             if kernel == "mma" or (rt, u, warps) in VARIANT_CONFIGS]
        for kernel, cfg, weights, src in runs:
            row: dict[str, Any] = {"shape": name, "kernel": kernel, "config": list(cfg)}
            try:
                y = native_gemv.qgemv(x, weights[0], None, *cfg, source=src)
                rel = float((y.float() - exact).norm() / exact.norm())
                row["rel_err"] = rel
                assert rel < 4e-3 or kernel not in ("plain", "mma"), rel
                us = graph_time_us(_rotating(x, weights, cfg, src), reps=COPIES * 4)
                row.update(us=us, GBps=nbytes / (us * 1e-6) / 1e9)
            except Exception as e:  # noqa: BLE001 - every config's outcome is kept
                row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
            keep(row)
    best: dict[str, dict[str, float]] = {}
    for r in res["runs"]:
        if "us" in r:
            b = best.setdefault(r["shape"], {})
            b[r["kernel"]] = min(b.get(r["kernel"], float("inf")), r["us"])
    res["best_us"] = best
    out_path.write_text(json.dumps(res, indent=1) + "\n")
    print(json.dumps({"best_us": best}), flush=True)
    return 0


def _rotating(x: torch.Tensor, ws: list[Any], cfg: tuple[int, int, int], text: str) -> Any:
    """A call of the kernel that takes the next weight copy each time."""
    from tessera.hal.cuda import native_gemv

    t = [0]

    def call() -> torch.Tensor:
        t[0] += 1
        return native_gemv.qgemv(x, ws[t[0] % COPIES], None, *cfg, source=text)
    return call


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
