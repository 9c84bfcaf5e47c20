"""The one-token quantized GEMV written in CUDA C, compiled at run time by NVRTC and launched
through the driver API (cuda-python's `cuda.bindings`), beside the Triton qgemv.

Why a second GEMV: the Triton one-token GEMVs stream int4 at 1.4-2.1 TB/s and fp8 at
2.6-3.9 (docs/performance.md, "int4's one-token GEMV"): a Triton program loads its weight
tile, waits, then computes, and reduces every tile across its threads; a 4096-input row is
only 2-4 tiles, so the loads and the arithmetic run in series. Here each thread owns 16-byte
runs of R rows' weights and keeps one float32 sum a row in its registers over the whole row:
no reduction until the row's end (warp shuffles, then one shared-memory pass across the
block's warps), no barrier in the loop, every load of an iteration (U runs of each of R rows,
their group scales and x) issued before any arithmetic.

    fp8     16 weights a run; `cvt.rn.f16x2.e4m3x2` two at a time, then float32 FMAs with x;
            the row's scale once at the end.
    int4    32 weights a run ("halves<T>" tiles with T >= 32, or "nibbles"); a run lies within
            one group. A nibble at bit position p of a 32-bit word, masked in place
            (`w & 0xF << p`, one LOP3, p <= 20), read as a float32 is q * 2^(p - 149) exactly
            (a denormal below bit 23, and the next exponent's values continue it), so with x
            scaled by 2^(85 - p) one FMA gives q * x * 2^-64 exactly; a word's top byte is
            shifted down by 8 first (bits 24-31 would reach the exponent). Two instructions a
            weight and one shift a word, no int -> float conversion; each run's sum is scaled
            by its group's scale (times 2^64) and the offset times x's sum over the run.

The kernel computes the definition y = x @ dequantize(w)^T up to float32 summation order,
like the Triton kernels (tests/hal_cuda/test_native_gemv_gpu.py holds it to them and to the
float reference). Where NVRTC or the driver bindings are missing, `nvrtc.available()` is False
and quant_tune's native candidates fail their measurement and are skipped (autotune.pick),
so the Triton GEMV runs as before; `fits` says which weights and inputs the kernel takes, and
quant_tune falls back to the Triton GEMV for any other.
"""

from __future__ import annotations

import ctypes
import functools

import torch

from tessera.hal.cuda import env, nvrtc, pdl
from tessera.hal.cuda.nvrtc import NativeError
from tessera.hal.platform import RotaryStore
from tessera.hal.quant.weight import QuantizedWeight, half_tile

KIND = {"fp8": 0, "int4": 2}
RUN_BYTES = 16  # one thread's load: 16 fp8 weights or 32 int4 ones

# the typedefs, the weights' load and x's conversions, shared with native_gemv_mma
PRELUDE = r"""
typedef unsigned int u32;
typedef unsigned short u16;

// weights: read once, not kept in L1 (x is, for every block of the SM)
__device__ __forceinline__ uint4 ld_weights(const unsigned char* p) {
    uint4 v;
    asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    return v;
}

// two 16-bit floats of x (one 32-bit word) to float32
__device__ __forceinline__ void x_pair(u32 w, float& lo, float& hi) {
#if XF16
    asm("{ .reg .f16 a, b; mov.b32 {a, b}, %2; cvt.f32.f16 %0, a; cvt.f32.f16 %1, b; }"
        : "=f"(lo), "=f"(hi) : "r"(w));
#else
    lo = __uint_as_float(w << 16);
    hi = __uint_as_float(w & 0xffff0000u);
#endif
}

__device__ __forceinline__ float x_one(u16 h) {
#if XF16
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
#else
    return __uint_as_float(((u32)h) << 16);
#endif
}

__device__ __forceinline__ u16 to_x(float v) {
    u16 h;
#if XF16
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(v));
#else
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(v));
#endif
    return h;
}
"""

SOURCE = PRELUDE + r"""
// 8 consecutive x elements (16 bytes) to float32
__device__ __forceinline__ void x_eight(const u16* p, float* f) {
    uint4 v = __ldg(reinterpret_cast<const uint4*>(p));
    x_pair(v.x, f[0], f[1]);
    x_pair(v.y, f[2], f[3]);
    x_pair(v.z, f[4], f[5]);
    x_pair(v.w, f[6], f[7]);
}

// x's elements c .. c + 7 as the product reads them. With NORM (an RMSNorm of x before the
// product) each is also summed squared into ss and multiplied by the norm's weight g: the
// product is then rstd * sum_k w[k] x[k] g[k], rstd = rsqrt(ss / k + eps) applied once to
// each row's sum (every block reads each element of x exactly once).
__device__ __forceinline__ void x_load(const u16* __restrict__ x, const u16* __restrict__ g,
                                       int c, float* f, float& ss) {
    x_eight(x + c, f);
#if NORM
    float gf[8];
    x_eight(g + c, gf);
#pragma unroll
    for (int e = 0; e < 8; ++e) { ss = fmaf(f[e], f[e], ss); f[e] *= gf[e]; }
#endif
}

#if KIND == 0
// an fp8 (e4m3) word: four weights to float32
__device__ __forceinline__ void fp8_four(u32 w, float* f) {
    u32 h0, h1;
    asm("{ .reg .b16 lo, hi; mov.b32 {lo, hi}, %2; cvt.rn.f16x2.e4m3x2 %0, lo; "
        "cvt.rn.f16x2.e4m3x2 %1, hi; }" : "=r"(h0), "=r"(h1) : "r"(w));
    asm("{ .reg .f16 a, b; mov.b32 {a, b}, %2; cvt.f32.f16 %0, a; cvt.f32.f16 %1, b; }"
        : "=f"(f[0]), "=f"(f[1]) : "r"(h0));
    asm("{ .reg .f16 a, b; mov.b32 {a, b}, %2; cvt.f32.f16 %0, a; cvt.f32.f16 %1, b; }"
        : "=f"(f[2]), "=f"(f[3]) : "r"(h1));
}
#endif

// float32 2^e, exactly
#define POW2(e) __uint_as_float((u32)(127 + (e)) << 23)

// the group of a 16-byte int4 run i (GSHIFT: log2 of the group size, -1 one group a row)
__device__ __forceinline__ int run_group(int i) {
#if KIND == 2 && GSHIFT >= 0
    const int col = TILE == 2 ? 32 * i : (16 * i / (TILE / 2)) * TILE;
    return col >> GSHIFT;
#else
    return 0;
#endif
}

// one iteration's loads: U runs of each of the R rows (and, int4, their groups' scales)
__device__ __forceinline__ void load_runs(uint4 (&wv)[U][R], float (&sv)[U][R],
                                          float (&ov)[U][R], const unsigned char* const (&qrow)[R],
                                          const float* const (&srow)[R],
                                          const float* const (&orow)[R], int i0, int runs) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
        const int i = i0 + u * WARPS * 32;
#pragma unroll
        for (int r = 0; r < R; ++r) {
            wv[u][r] = i < runs ? ld_weights(qrow[r] + 16 * i) : make_uint4(0, 0, 0, 0);
#if KIND == 2
            const int g = i < runs ? run_group(i) : 0;
            sv[u][r] = srow[r][g];
            ov[u][r] = orow[r][g];
#endif
        }
    }
}

// one iteration's arithmetic, into the R row sums
__device__ __forceinline__ void compute_runs(const uint4 (&wv)[U][R], const float (&sv)[U][R],
                                             const float (&ov)[U][R], float (&acc)[R],
                                             float& ss, const u16* __restrict__ x,
                                             const u16* __restrict__ g, int i0, int runs) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
        const int i = i0 + u * WARPS * 32;
        if (i >= runs) continue;
#if KIND == 0
        float xf[16];
        x_load(x, g, 16 * i, xf, ss);
        x_load(x, g, 16 * i + 8, xf + 8, ss);
#pragma unroll
        for (int r = 0; r < R; ++r) {
            const u32 w[4] = {wv[u][r].x, wv[u][r].y, wv[u][r].z, wv[u][r].w};
            float p0 = 0.0f, p1 = 0.0f, p2 = 0.0f, p3 = 0.0f;
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                float f[4];
                fp8_four(w[j], f);
                p0 = fmaf(f[0], xf[4 * j], p0);
                p1 = fmaf(f[1], xf[4 * j + 1], p1);
                p2 = fmaf(f[2], xf[4 * j + 2], p2);
                p3 = fmaf(f[3], xf[4 * j + 3], p3);
            }
            acc[r] += (p0 + p1) + (p2 + p3);
        }
#else
        // the run's 32 columns: byte e's low nibble xl[e], its high one xh[e]
        float xl[16], xh[16];
        if (TILE == 2) {  // "nibbles": byte e holds columns 32 i + 2 e and + 1
            float xr[32];
#pragma unroll
            for (int c = 0; c < 4; ++c) x_load(x, g, 32 * i + 8 * c, xr + 8 * c, ss);
#pragma unroll
            for (int e = 0; e < 16; ++e) { xl[e] = xr[2 * e]; xh[e] = xr[2 * e + 1]; }
        } else {  // "halves<T>": the low nibbles a run of 16 columns, the high T / 2 on
            const int base = (16 * i / (TILE / 2)) * TILE + (16 * i) % (TILE / 2);
            x_load(x, g, base, xl, ss);
            x_load(x, g, base + 8, xl + 8, ss);
            x_load(x, g, base + TILE / 2, xh, ss);
            x_load(x, g, base + TILE / 2 + 8, xh + 8, ss);
        }
        float xsum = 0.0f;
#pragma unroll
        for (int e = 0; e < 16; ++e) xsum += xl[e] + xh[e];
        // x scaled by 2^(85 - p), p the bit position its nibble is read at
#pragma unroll
        for (int e = 0; e < 16; ++e) {
            const int b = e % 4;
            xl[e] *= b == 0 ? POW2(85) : b == 1 ? POW2(77) : POW2(69);
            xh[e] *= b == 0 ? POW2(81) : b == 1 ? POW2(73) : POW2(65);
        }
#pragma unroll
        for (int r = 0; r < R; ++r) {
            const u32 w[4] = {wv[u][r].x, wv[u][r].y, wv[u][r].z, wv[u][r].w};
            float p0 = 0.0f, p1 = 0.0f, p2 = 0.0f, p3 = 0.0f;
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                const u32 a = w[j], t = w[j] >> 8;
                const int e = 4 * j;
                p0 = fmaf(__uint_as_float(a & 0xFu), xl[e], p0);
                p1 = fmaf(__uint_as_float(a & 0xF0u), xh[e], p1);
                p2 = fmaf(__uint_as_float(a & 0xF00u), xl[e + 1], p2);
                p3 = fmaf(__uint_as_float(a & 0xF000u), xh[e + 1], p3);
                p0 = fmaf(__uint_as_float(a & 0xF0000u), xl[e + 2], p0);
                p1 = fmaf(__uint_as_float(a & 0xF00000u), xh[e + 2], p1);
                p2 = fmaf(__uint_as_float(t & 0xF0000u), xl[e + 3], p2);
                p3 = fmaf(__uint_as_float(t & 0xF00000u), xh[e + 3], p3);
            }
            const float part = ((p0 + p1) + (p2 + p3)) * POW2(64);
            acc[r] = fmaf(sv[u][r], part, fmaf(ov[u][r], xsum, acc[r]));
        }
#endif
    }
}

// One row's result as the epilogue finishes it: its fp8 scale, the bias, rounded to x's type
__device__ __forceinline__ float row_value(float v, int row, const float* __restrict__ s,
                                           long long s_s0, const u16* __restrict__ bias,
                                           int has_bias, float rstd) {
#if NORM
    v *= rstd;
#endif
#if KIND == 0
    v *= s[row * s_s0];
#endif
    if (has_bias) v += x_one(bias[row]);
    return x_one(to_x(v));  // rounded as the plain linear's output is
}

// Each block computes R rows of y = x @ w^T. Three fusions, each the composition of the plain
// ops it replaces (hal/platform.py QuantLinearKernel.one_token_fused):
//   NORM  x is RMSNorm(x; g, eps) (x_load, and rstd below);
//   RES   y + res[row], rounded as the residual add rounds (the o / down projection's add);
//   SILU  the weight's rows are [gate (n / 2) | up (n / 2)]: a block takes R / 2 rows of
//         each, and writes silu(gate) * up for its R / 2 outputs (silu_and_mul after the
//         gate_up projection);
//   ROPE  the weight's rows are [q (q_rows) | k (kv_rows) | v (kv_rows)], heads of HD:
//         rotary on q (written out) and k, k and v stored in the KV cache at the token's
//         slot (rotary_store_kv after the qkv projection).
extern "C" __global__ void __launch_bounds__(WARPS * 32)
qgemv_native(const u16* __restrict__ x, const unsigned char* __restrict__ q,
             const float* __restrict__ s, const float* __restrict__ o,
             const u16* __restrict__ bias, u16* __restrict__ out,
             int n, int k, long long q_s0, long long s_s0, int has_bias,
             const u16* __restrict__ g, float eps, const u16* __restrict__ res,
             const long long* __restrict__ pos, const long long* __restrict__ slot,
             const u16* __restrict__ cs, long long cs_s0, u16* __restrict__ kc,
             u16* __restrict__ vc, long long c_s0, long long c_s1, int q_rows, int kv_rows)
{
#if SILU
    const int half = n / 2;                 // the gate rows, then as many up rows
    const int out0 = blockIdx.x * (R / 2);  // this block's first output
#elif ROPE
    // Blocks [0, rot_blocks) take R / 2 pairs of rows (i, i + HD / 2) of the q and k heads,
    // the rest R rows of v each.
    const int rot_blocks = (q_rows + kv_rows) / R;
    const bool rot_blk = (int)blockIdx.x < rot_blocks;
    const int row0 = q_rows + kv_rows + ((int)blockIdx.x - rot_blocks) * R;  // v blocks
#else
    const int row0 = blockIdx.x * R;
#endif
    const int runs = (KIND == 2 ? k / 2 : k) / 16;  // 16-byte runs a row
    const int step = WARPS * 32 * U;
    const unsigned char* qrow[R];
    const float* srow[R];
    const float* orow[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
#if SILU
        const long long row = r < R / 2 ? min(out0 + r, half - 1)
                                        : half + min(out0 + r - R / 2, half - 1);
#elif ROPE
        long long row;
        if (rot_blk) {
            const int p = blockIdx.x * (R / 2) + r % (R / 2);
            row = (long long)(p / (HD / 2)) * HD + p % (HD / 2) + (r >= R / 2 ? HD / 2 : 0);
        } else {
            row = min(row0 + r, n - 1);
        }
#else
        const long long row = min(row0 + r, n - 1);  // past the end: the last row, unwritten
#endif
        qrow[r] = q + row * q_s0;
        srow[r] = s + row * s_s0;
        orow[r] = o + row * s_s0;
    }
    float acc[R];
#pragma unroll
    for (int r = 0; r < R; ++r) acc[r] = 0.0f;
    float ss = 0.0f;  // NORM: this thread's share of sum(x^2)
    uint4 wa[U][R];
    float sa[U][R], oa[U][R];
    int i0 = threadIdx.x;
#if PDL && !PRE
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
    // the first iteration's weight runs (and group scales): nothing a kernel writes, so
    // under PDL with PRE they are loaded before the wait
    load_runs(wa, sa, oa, qrow, srow, orow, i0, runs);
#if PDL && PRE
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
    while (true) {
        compute_runs(wa, sa, oa, acc, ss, x, g, i0, runs);
        i0 += step;
        if (i0 >= runs) break;
        load_runs(wa, sa, oa, qrow, srow, orow, i0, runs);
    }
    // the row sums (and NORM's sum of squares): across the warp, then the block's warps
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
        for (int off = 16; off > 0; off >>= 1)
            acc[r] += __shfl_xor_sync(0xffffffffu, acc[r], off);
#if NORM
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, off);
#endif
    __shared__ float red[WARPS][R + 1];
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    if (lane == 0) {
#pragma unroll
        for (int r = 0; r < R; ++r) red[warp][r] = acc[r];
        red[warp][R] = ss;
    }
    __syncthreads();
    float rstd = 1.0f;
#if NORM
    {
        float t = 0.0f;
#pragma unroll
        for (int w = 0; w < WARPS; ++w) t += red[w][R];
        rstd = rsqrtf(t / (float)k + eps);
    }
#endif
#if SILU
    if (threadIdx.x < R / 2) {
        const int j = out0 + threadIdx.x;
        if (j < half) {
            float vg = 0.0f, vu = 0.0f;
#pragma unroll
            for (int w = 0; w < WARPS; ++w) {
                vg += red[w][threadIdx.x];
                vu += red[w][threadIdx.x + R / 2];
            }
            vg = row_value(vg, j, s, s_s0, bias, has_bias, rstd);
            vu = row_value(vu, half + j, s, s_s0, bias, has_bias, rstd);
            out[j] = to_x(vg / (1.0f + expf(-vg)) * vu);
        }
    }
#elif ROPE
    // rotate-half on q and k (cos | sin of the token's position), q out, k and v into the
    // token's cache slot; each value rounded first as the plain linear's output is
    if (rot_blk) {
        if (threadIdx.x < R / 2) {
            const int p = blockIdx.x * (R / 2) + threadIdx.x;
            const int head = p / (HD / 2), i = p % (HD / 2);
            const int r1 = head * HD + i, r2 = r1 + HD / 2;
            float a = 0.0f, b = 0.0f;
#pragma unroll
            for (int w = 0; w < WARPS; ++w) {
                a += red[w][threadIdx.x];
                b += red[w][threadIdx.x + R / 2];
            }
            a = row_value(a, r1, s, s_s0, bias, has_bias, rstd);
            b = row_value(b, r2, s, s_s0, bias, has_bias, rstd);
            const long long at = pos[0] * cs_s0;
            const float c = x_one(cs[at + i]), sn = x_one(cs[at + HD / 2 + i]);
            const u16 o1 = to_x(a * c - b * sn), o2 = to_x(b * c + a * sn);
            if (r1 < q_rows) {
                out[r1] = o1;
                out[r2] = o2;
            } else {
                const long long off = slot[0] * c_s0 + (long long)(head - q_rows / HD) * c_s1 + i;
                kc[off] = o1;
                kc[off + HD / 2] = o2;
            }
        }
    } else if (threadIdx.x < R) {
        const int row = row0 + threadIdx.x;
        if (row < n) {
            float v = 0.0f;
#pragma unroll
            for (int w = 0; w < WARPS; ++w) v += red[w][threadIdx.x];
            const int vr = row - q_rows - kv_rows;
            vc[slot[0] * c_s0 + (long long)(vr / HD) * c_s1 + vr % HD] =
                to_x(row_value(v, row, s, s_s0, bias, has_bias, rstd));
        }
    }
#else
    if (threadIdx.x < R) {
        const int row = row0 + threadIdx.x;
        if (row < n) {
            float v = 0.0f;
#pragma unroll
            for (int w = 0; w < WARPS; ++w) v += red[w][threadIdx.x];
            v = row_value(v, row, s, s_s0, bias, has_bias, rstd);
#if RES
            v += x_one(res[row]);
#endif
            out[row] = to_x(v);
        }
    }
#endif
}
"""


PRELOAD_VARIABLE = "HAL_CUDA_GEMV_PRELOAD"


@functools.lru_cache(maxsize=1)
def preload_default() -> bool:
    """Whether the tuner's native configs load their first weight runs (and int4's scales)
    before their PDL wait, so the weights stream while the kernel before finishes: on
    unless `HAL_CUDA_GEMV_PRELOAD=0` (call 43, B12 B1 alternated twice: int4 2.13 against
    2.22 ms a step, fp8 2.54 against 2.56). Read once a process."""
    return env.switch(PRELOAD_VARIABLE, True)


class NotTaken(NativeError):
    """A weight or x the kernel does not read (layout, alignment, dtype): use another
    GEMV."""


@functools.lru_cache(maxsize=256)
def defines(scheme: str, rows: int, unroll: int, warps: int, tile: int, x_f16: bool,
            use_pdl: bool, preload: bool, group_shift: int = -1, norm: bool = False,
            residual: bool = False, silu: bool = False, rope_dim: int = 0) -> str:
    """The kernel's compile-time constants. group_shift: log2 of the int4 group size, -1 for
    one group a row (and fp8); norm / residual / silu / rope_dim (the head dim, 0: off):
    the fusions (qgemv)."""
    return "".join(f"#define {name} {int(value)}\n" for name, value in (
        ("KIND", KIND[scheme]), ("R", rows), ("U", unroll), ("WARPS", warps),
        ("TILE", tile), ("XF16", x_f16), ("PDL", use_pdl), ("PRE", preload),
        ("GSHIFT", group_shift), ("NORM", norm), ("RES", residual), ("SILU", silu),
        ("ROPE", rope_dim > 0), ("HD", rope_dim or 2)))


def group_shift(w: QuantizedWeight) -> int:
    """defines' group_shift for a weight: -1 with one group a row (fp8, per-row int4), else
    log2 of the group (a power of two after quant_linear.prepare)."""
    if w.scheme != "int4" or w.num_groups == 1:
        return -1
    gs = w.group_size
    if gs & (gs - 1):
        raise NativeError(f"int4 groups of {gs}: the native GEMV takes powers of two")
    return gs.bit_length() - 1


def layout_tile(w: QuantizedWeight) -> int:
    """The kernel's TILE for a weight: the int4 "halves<T>" T (2 for "nibbles"), 0 for
    fp8."""
    return (half_tile(w.packing) or 0) if w.scheme == "int4" else 0


def layout_fits(scheme: str, per_row: bool, group_size: int, packing: str) -> bool:
    """The schemes and layouts the kernel takes: fp8 with one scale a row; int4 two a byte
    in "halves<T>" tiles of T >= 32 (groups of whole tiles) or "nibbles" (groups of a
    multiple of 32), groups of a power of two (quant_linear.prepare makes them so), or one
    a row. (quant_tune lists the native configs for these.)"""
    if scheme == "fp8":
        return per_row
    if scheme != "int4":
        return False
    if not per_row and group_size & (group_size - 1):
        return False
    tile = half_tile(packing)
    if tile == 2:
        return per_row or group_size % 32 == 0
    return tile is not None and tile >= 32 and (per_row or group_size % tile == 0)


def weight_fits(w: QuantizedWeight) -> bool:
    """layout_fits for this weight, and its tensors as the kernel reads them: rows of
    whole 16-byte runs, 16-byte aligned; int4's offsets shaped and strided like its scales.
    (An input_perm is applied to x before: quant_linear.apply.)"""
    if not layout_fits(w.scheme, w.num_groups == 1, w.group_size, w.packing):
        return False
    row_bytes = w.in_features // 2 if w.scheme == "int4" else w.in_features
    if row_bytes % RUN_BYTES or w.qweight.stride(1) != 1 or \
            (w.qweight.stride(0) * w.qweight.element_size()) % RUN_BYTES or \
            w.qweight.data_ptr() % RUN_BYTES:
        return False
    return w.scheme == "fp8" or (w.offsets is not None and
                                 w.offsets.shape == w.scales.shape and
                                 w.offsets.stride() == w.scales.stride())


def fits(w: QuantizedWeight, x: torch.Tensor) -> bool:
    """Whether the kernel computes y = x @ w^T for this weight and x."""
    return weight_fits(w) and input_fits(x)


def input_fits(x: torch.Tensor) -> bool:
    """x [1, K] bf16 / fp16 on a GPU, 16-byte aligned (the kernel loads it 16 bytes at a
    time)."""
    return x.is_cuda and x.dtype in (torch.bfloat16, torch.float16) and x.dim() == 2 and \
        x.shape[0] == 1 and x.stride(-1) == 1 and x.data_ptr() % 16 == 0


def qgemv(x: torch.Tensor, w: QuantizedWeight, bias: torch.Tensor | None, rows: int,
          unroll: int, warps: int, preload: bool | None = None, source: str = SOURCE, *,
          norm: tuple[torch.Tensor, float] | None = None,
          residual: torch.Tensor | None = None, silu: bool = False,
          rope: RotaryStore | None = None) -> torch.Tensor:
    """y = x @ w^T (+ bias) for one token, on the current stream (also under graph
    capture), launched with PDL where the process's kernels use it (pdl.py). preload: the
    first weight loads before the PDL wait (None: preload_default()). source: the kernel's
    text (a probe's variant of SOURCE: tests/hal_cuda/native_gemv_probe.py). Raises
    NotTaken for a weight or x it does not read, NativeError where it cannot run.

    The fusions, each the composition it replaces: norm = (g, eps): x is rms_norm(x, g, eps)
    first; residual [1, N]: the result is y + residual; silu: w's rows are [gate | up] and
    the result is silu_and_mul(y) [1, N / 2] (rows even); rope (a RotaryStore, rows even):
    w's rows are [q | k | v], k rotated and v stored into the caches at rope.slots[0], the
    result the rotated q [1, q_heads * head_dim]."""
    if not fits(w, x):
        raise NotTaken(f"the native GEMV does not take {w.scheme} {w.packing} "
                       f"{tuple(w.shape)} with x {x.dtype} {tuple(x.shape)}")
    if preload is None:
        preload = preload_default()
    n, k = w.shape
    if silu and (rows % 2 or n % 2 or residual is not None):
        raise NotTaken(f"the gated SiLU epilogue takes an even number of rows ({rows}) and "
                       f"of outputs ({n}), without a residual")
    if rope is not None and not _rope_fits(rope, w, x, rows, residual is not None or silu):
        raise NotTaken(f"the rotary epilogue does not take this layout ({rows} rows, "
                       f"{rope.q_heads}/{rope.kv_heads} heads of {rope.head_dim}, cache "
                       f"{rope.k_cache.dtype})")
    gain, eps = norm if norm is not None else (None, 0.0)
    if gain is not None and not _vector_fits(gain, x, k):
        raise NotTaken("the RMSNorm weight must be x's dtype, [K], contiguous and aligned")
    if residual is not None and not _vector_fits(residual, x, n):
        raise NotTaken("the residual must be x's dtype, [1, N], contiguous")
    width = n // 2 if silu else n
    if rope is not None:
        width = rope.q_heads * rope.head_dim
    out = torch.empty((1, width), dtype=x.dtype, device=x.device)
    if bias is not None and (bias.dtype != x.dtype or not bias.is_contiguous()):
        bias = bias.to(x.dtype).contiguous()
    use_pdl = pdl.mode() in ("on", "prefetch")
    device = x.device.index if x.device.index is not None else torch.cuda.current_device()
    fn = nvrtc.function(defines(w.scheme, rows, unroll, warps, layout_tile(w),
                                x.dtype == torch.float16, use_pdl, preload and use_pdl,
                                group_shift(w), gain is not None, residual is not None, silu,
                                rope.head_dim if rope is not None else 0),
                        source, b"qgemv_native", device)
    offsets = w.offsets if w.offsets is not None else w.scales
    args = [ctypes.c_void_p(x.data_ptr()), ctypes.c_void_p(w.qweight.data_ptr()),
            ctypes.c_void_p(w.scales.data_ptr()), ctypes.c_void_p(offsets.data_ptr()),
            ctypes.c_void_p(bias.data_ptr() if bias is not None else 0),
            ctypes.c_void_p(out.data_ptr()), ctypes.c_int(n), ctypes.c_int(k),
            ctypes.c_longlong(w.qweight.stride(0) * w.qweight.element_size()),
            ctypes.c_longlong(w.scales.stride(0)), ctypes.c_int(bias is not None),
            ctypes.c_void_p(gain.data_ptr() if gain is not None else 0),
            ctypes.c_float(eps),
            ctypes.c_void_p(residual.data_ptr() if residual is not None else 0)]
    if rope is not None:
        d = rope.head_dim
        q_rows, kv_rows = rope.q_heads * d, rope.kv_heads * d
        args += [ctypes.c_void_p(rope.positions.data_ptr()),
                 ctypes.c_void_p(rope.slots.data_ptr()), ctypes.c_void_p(rope.cos_sin.data_ptr()),
                 ctypes.c_longlong(rope.cos_sin.stride(0)),
                 ctypes.c_void_p(rope.k_cache.data_ptr()),
                 ctypes.c_void_p(rope.v_cache.data_ptr()),
                 ctypes.c_longlong(rope.k_cache.stride(0)),
                 ctypes.c_longlong(rope.k_cache.stride(1)), ctypes.c_int(q_rows),
                 ctypes.c_int(kv_rows)]
        grid = (q_rows + kv_rows) // rows + (kv_rows + rows - 1) // rows
    else:
        args += [ctypes.c_void_p(0)] * 3 + [ctypes.c_longlong(0)] + [ctypes.c_void_p(0)] * 2 + \
            [ctypes.c_longlong(0)] * 2 + [ctypes.c_int(0)] * 2
        per_block = rows // 2 if silu else rows
        grid = (width + per_block - 1) // per_block
    params = (ctypes.c_void_p * len(args))(*[ctypes.addressof(a) for a in args])
    nvrtc.launch(fn, grid, warps * 32, torch.cuda.current_stream(x.device),
                 ctypes.addressof(params), use_pdl)
    return out


def _rope_fits(rope: RotaryStore, w: QuantizedWeight, x: torch.Tensor, rows: int,
               other_epilogue: bool) -> bool:
    """What the ROPE epilogue takes: no other epilogue, an even row count whose pairs tile
    the q and k heads, [q | k | v] rows, a cache in x's dtype (not fp8) with unit inner
    stride, the cos | sin table in x's dtype, one int64 position and slot."""
    d = rope.head_dim
    q_rows, kv_rows = rope.q_heads * d, rope.kv_heads * d
    kc, vc, cs = rope.k_cache, rope.v_cache, rope.cos_sin
    return (not other_epilogue and rows % 2 == 0 and d % 2 == 0 and (d // 2) % (rows // 2) == 0
            and w.out_features == q_rows + 2 * kv_rows and kc.dtype == x.dtype
            and vc.dtype == x.dtype and kc.stride() == vc.stride() and kc.dim() == 3
            and kc.shape[1:] == (rope.kv_heads, d) and kc.stride(2) == 1
            and cs.dtype == x.dtype and cs.dim() == 2 and cs.shape[1] == d and cs.stride(1) == 1
            and rope.positions.dtype == torch.int64 and rope.slots.dtype == torch.int64
            and rope.positions.numel() == 1 and rope.slots.numel() == 1
            and kc.device == x.device and cs.device == x.device)


def _vector_fits(t: torch.Tensor, x: torch.Tensor, size: int) -> bool:
    """A norm weight or residual the kernel reads: x's dtype and device, `size` elements,
    contiguous, 16-byte aligned."""
    return t.dtype == x.dtype and t.device == x.device and t.numel() == size and \
        t.is_contiguous() and t.data_ptr() % 16 == 0
