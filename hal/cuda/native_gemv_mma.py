"""int4's one-token GEMV on the tensor cores, in CUDA C (NVRTC, launched as native_gemv.py
launches its kernel), over a copy of the weight laid out for it. Off unless
`HAL_CUDA_INT4_MMA=1`: a measurement switch, since the copy doubles an int4 weight's bytes
on the device (the Triton kernels read the "halves128" original).

Why: the CUDA-core GEMV (native_gemv.py) spends two instructions a weight (a LOP3 on the
integer pipe, which Hopper runs at half the FMA rate, and an FMA), and call 42 put int4 at
the sum of its loads and that arithmetic. Call 41's mma variant had a third of the
instructions but read 64 bytes of each of 8 rows a warp instruction and lost on its loads.
Here a warp still loads 512 contiguous bytes: the copy interleaves the "halves128" tiles
(64 bytes: one row's 128 columns, one group) 8 rows at a time, [N / 8][K / 128][8][64], so
lane 4g + t holds row g's bytes 16t .. 16t + 15 of a tile, the mma A fragment's layout (rows
g and g + 8 from two such loads).

    weights  a word's nibbles become four f16 pairs by the exponent bits 0x6400: a low
             nibble at bits 0-3 is 1024 + q, a high one at bits 4-7 1024 + 16q (both within
             f16's mantissa: one shift a word, not one a nibble); one f16x2 subtraction makes
             them q - 8 and 16 (q - 8) exactly. Five integer instructions for eight weights.
    x        staged once a block in shared memory as f16 in the B fragment's order, each
             tile of 128 columns scaled by its own power of two so its largest element is in
             [2^14, 2^15) (exact: a bf16's 8 bits fit f16's 11, down to 2^-17 of the tile's
             largest), the high nibbles' columns / 16; with the tile's sum of x and 2^-e.
    sums     C = sum (q - 8) x 2^e over a tile (8 mma.m16n8k16 a 16-row tile, float32
             accumulation; every B column holds the token, so every lane's C is its rows'),
             and a group adds s 2^-e C + (8 s + o) sum(x) to its row.

The result is the definition y = x @ dequantize(w)^T up to float32 summation order and the
f16 staging of x's smallest elements (tests/hal_cuda/test_int4_mma_probe_cpu.py models the
kernel lane by lane against it; tests/hal_cuda/test_quant_gpu.py runs it).
"""

from __future__ import annotations

import ctypes
import functools

import torch
from torch.utils.weak import WeakIdKeyDictionary

from tessera.hal.cuda import env, nvrtc, pdl
from tessera.hal.cuda.native_gemv import PRELUDE, NotTaken
from tessera.hal.quant.weight import QuantizedWeight

VARIABLE = "HAL_CUDA_INT4_MMA"
TILE = 128  # columns a k-tile: one "halves128" tile, one group

SOURCE = PRELUDE + r"""
#define RT (R / 16)

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

// one iteration's loads: U k-tiles of each 16-row tile's rows g and g + 8, and their groups'
// scales and offsets
__device__ __forceinline__ void load_tiles(uint4 (&wv)[U][RT][2], float (&sv)[U][RT][2],
                                           float (&ov)[U][RT][2],
                                           const unsigned char* const (&qb)[RT],
                                           const float* const (&sp)[RT][2],
                                           const float* const (&op)[RT][2], int base, int kt_n) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
        const int kt = base + u * WARPS;
        const bool in = kt < kt_n;
#pragma unroll
        for (int j = 0; j < RT; ++j)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                wv[u][j][h] = in ? ld_weights(qb[j] + ((long long)h * kt_n + kt) * 512)
                                 : make_uint4(0, 0, 0, 0);
                sv[u][j][h] = in ? sp[j][h][kt] : 0.0f;
                ov[u][j][h] = in ? op[j][h][kt] : 0.0f;
            }
    }
}

// Each block computes R = 16 RT rows of y = x @ w^T; its warps split the k-tiles, each
// warp's 32 lanes the mma fragments of RT 16-row tiles, then one shared-memory pass across
// the warps.
// (at least one block a multiprocessor: without it ptxas keeps a few of the loop's pointers in
// local memory at 72-80 registers)
extern "C" __global__ void __launch_bounds__(WARPS * 32, 1)
qgemv_mma(const u16* __restrict__ x, const unsigned char* __restrict__ q,
          const float* __restrict__ s, const float* __restrict__ o,
          const u16* __restrict__ bias, u16* __restrict__ out, int k, long long s_s0,
          int has_bias)
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
    load_tiles(wv, sv, ov, qb, sp, op, kt0, kt_n);  // nothing a kernel before writes
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
            float v[4];
            x_pair(raw[i].x, v[0], v[1]);
            x_pair(raw[i].y, v[2], v[3]);
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
        load_tiles(wv, sv, ov, qb, sp, op, kt0, kt_n);
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
        if (has_bias) v += x_one(bias[row]);
        out[row] = to_x(v);
    }
}
"""

# the interleaved copies, by the identity of the prepared weight's qweight (made at prepare
# or at a weight's first use outside a graph capture, dropped with the weight); by identity,
# since a tensor's == is elementwise
_COPIES = WeakIdKeyDictionary()


@functools.lru_cache(maxsize=1)
def enabled() -> bool:
    """Whether the tuner lists this kernel's configs (HAL_CUDA_INT4_MMA, read once a
    process; off by default)."""
    return env.switch(VARIABLE, False)


def interleave(qweight: torch.Tensor) -> torch.Tensor:
    """A "halves128" uint8 [N, K / 2] as the kernel reads it: its 64-byte tiles 8 rows at a
    time, [N / 8][K / 128][8][64], viewed [N, K / 2] again."""
    n, half = qweight.shape
    return qweight.reshape(n // 8, 8, half // 64, 64).permute(0, 2, 1, 3).contiguous() \
        .reshape(n, half)


def layout_fits(scheme: str, per_row: bool, group_size: int, packing: str) -> bool:
    """int4 in "halves128" tiles with groups of 128 (the tile is the group)."""
    return scheme == "int4" and not per_row and group_size == TILE and \
        packing == f"halves{TILE}"


def weight_fits(w: QuantizedWeight, rows: int = 16) -> bool:
    """layout_fits, whole blocks of `rows` rows, offsets, and scales [N, K / 128] with unit
    inner stride (offsets strided alike)."""
    n, k = w.shape
    return layout_fits(w.scheme, w.num_groups == 1, w.group_size, w.packing) and \
        rows % 16 == 0 and n % rows == 0 and k % TILE == 0 and w.offsets is not None and \
        w.input_perm is None and w.scales.stride(1) == 1 and \
        w.offsets.stride() == w.scales.stride() and w.qweight.is_contiguous()


def input_fits(x: torch.Tensor) -> bool:
    """x [1, K] bf16 / fp16 on a GPU, 8-byte aligned."""
    return x.is_cuda and x.dtype in (torch.bfloat16, torch.float16) and x.dim() == 2 and \
        x.shape[0] == 1 and x.is_contiguous() and x.data_ptr() % 8 == 0


def interleaved(w: QuantizedWeight) -> torch.Tensor | None:
    """w's interleaved copy, made now where none is yet (not under a graph capture: None)."""
    qi = _COPIES.get(w.qweight)
    if qi is None and not (w.qweight.is_cuda and torch.cuda.is_current_stream_capturing()):
        qi = _COPIES[w.qweight] = interleave(w.qweight)
    return qi


def qgemv(x: torch.Tensor, w: QuantizedWeight, bias: torch.Tensor | None, rows: int,
          unroll: int, warps: int) -> torch.Tensor:
    """y = x @ w^T (+ bias) for one token through the interleaved copy of w. Raises NotTaken
    for a weight or x it does not read (or no copy under a capture)."""
    qi = interleaved(w) if weight_fits(w, rows) and input_fits(x) else None
    if qi is None:
        raise NotTaken(f"the int4 mma GEMV does not take {w.scheme} {w.packing} "
                       f"{tuple(w.shape)} at {rows} rows with x {x.dtype} {tuple(x.shape)}")
    return launch(x, w, qi, bias, rows, unroll, warps)


def defines(rows: int, unroll: int, warps: int, k: int, x_f16: bool, use_pdl: bool) -> str:
    return "".join(f"#define {name} {int(value)}\n" for name, value in (
        ("R", rows), ("U", unroll), ("WARPS", warps), ("KTMAX", k // TILE), ("XF16", x_f16),
        ("PDL", use_pdl)))


def launch(x: torch.Tensor, w: QuantizedWeight, qi: torch.Tensor, bias: torch.Tensor | None,
           rows: int, unroll: int, warps: int, source: str = SOURCE) -> torch.Tensor:
    """The kernel over qi (w's interleaved qweight) on the current stream, with PDL where the
    process's kernels use it. source: the kernel's text (a probe's variant of SOURCE)."""
    n, k = w.shape
    assert w.offsets is not None  # weight_fits
    out = torch.empty((1, n), dtype=x.dtype, device=x.device)
    if bias is not None and (bias.dtype != x.dtype or not bias.is_contiguous()):
        bias = bias.to(x.dtype).contiguous()
    use_pdl = pdl.mode() in ("on", "prefetch")
    device = x.device.index if x.device.index is not None else torch.cuda.current_device()
    fn = nvrtc.function(defines(rows, unroll, warps, k, x.dtype == torch.float16, use_pdl),
                        source, b"qgemv_mma", device)
    args = [ctypes.c_void_p(x.data_ptr()), ctypes.c_void_p(qi.data_ptr()),
            ctypes.c_void_p(w.scales.data_ptr()), ctypes.c_void_p(w.offsets.data_ptr()),
            ctypes.c_void_p(bias.data_ptr() if bias is not None else 0),
            ctypes.c_void_p(out.data_ptr()), ctypes.c_int(k),
            ctypes.c_longlong(w.scales.stride(0)), ctypes.c_int(bias is not None)]
    params = (ctypes.c_void_p * len(args))(*[ctypes.addressof(a) for a in args])
    nvrtc.launch(fn, n // rows, warps * 32, torch.cuda.current_stream(x.device),
                 ctypes.addressof(params), use_pdl)
    return out
