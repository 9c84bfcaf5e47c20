"""Decode attention's stage 1 over an fp8 (e4m3) KV cache, written in CUDA C (compiled and
launched by hal/cuda/nvrtc.py, like native_gemv), beside the Triton stage 1 of
decode_attention.

Why: the Triton kernel reads an fp8 cache at 2.4-2.9 TB/s where a bf16 cache reads 4.0-4.4
(docs/performance.md, "Decode attention over an fp8 cache"). Converted in registers, the
keys' words must cross shared memory a second time to reach the dot's layout, because
Triton's layouts cannot say "this register holds key g, dims 32t + 4i ..". Here every thread
loads exactly the bytes its tensor-core fragments hold, 16 bytes a copy, and reads back only
those: no tile is rearranged across threads:

  * The scores are computed transposed, S^T = K Q^T (mma m16n8k16: 16 keys x 8 heads x 16
    dims), so the query group (up to 8 heads) fills the n side instead of padding 16 rows.
    The dot's sum over dims does not care about their order, so the k index of chunk i,
    column c maps to the cache's dim 64 (i / 4) + 16 (c / 2) + 4 (i % 4) + (c % 2) (c < 8;
    c >= 8 adds 2): the thread (g, t) of a fragment loads key g's bytes [16 t, 16 t + 16)
    and [64 + 16 t, 80 + 16 t) (call 86 read [32 t, 32 t + 32): half of a 32-byte sector a
    load) and the q it holds is read in the same order. Each 16-bit pair converts with
    `cvt.rn.f16x2.e4m3x2`.
  * The output is O^T = V^T P^T (m16n8k16: 16 dims x 8 heads x 16 keys). The dims are
    permuted too (m-tile j, row g -> dim 16 g + 2 j, row g + 8 -> 16 g + 2 j + 1), so a
    thread loads 16 bytes of each of its four keys; the fragment pairs two keys of one dim,
    which one `prmt` makes of two keys' words before the conversion. P^T's fragments are the
    scores' accumulators transposed by `movmatrix`.
  * Each warp walks its own 16-key tiles of the split (the warps of a block interleave
    them) through its own ring of STAGES tiles in shared memory, STAGES - 1 in flight by
    cp.async: each lane copies exactly the 16-byte runs it will read back, so no barrier is
    needed; its slots are read a tile ahead of their copies. The block's warps merge their
    softmax states once, at the end, in shared memory. The output and log-sum-exp are what
    the Triton stage 1 writes (the final output with one split, else the partials stage 2
    merges), in the same buffers. (The first version held one tile ahead in registers: 149
    registers, 2.0-2.4 TB/s on an H100 where Triton read 2.2-2.6, call 86.)

What it takes (`fits`): an fp8 cache with rows of 128 elements, 16-byte aligned rows; a
bf16 / fp16 q, 16-byte aligned; query groups of 1 to 8 heads; int32 tables; sm_89 or
later. The kernel is used where `HAL_CUDA_DECODE_NATIVE=1` (off by default: at 0.92-1.08x of
Triton's stage 1, bound by its loads, calls 87 and 89) and it fits, at
`HAL_CUDA_DECODE_NATIVE_TILE=WARPS,STAGES` (default 4,3); anything else, and any machine
without cuda-python, runs the Triton stage 1.
The GPU tests (tests/hal_cuda/test_native_attention_gpu.py) hold it to the reference and to
the Triton kernel; tests/hal_cuda/test_native_attention_cpu_side.py models its fragment
mapping in numpy and compiles it for sm_90 where NVRTC is installed.
"""

from __future__ import annotations

import ctypes
import functools
import os

import torch

from tessera.hal.cuda import env, nvrtc, pdl

HEAD_DIM = 128
MAX_GROUP = 8
WARPS = 4  # a block's warps (each walks its own tiles of the split)
STAGES = 3  # tiles in a warp's ring of shared memory (STAGES - 1 in flight)
STAGE_BYTES = 4096  # one tile of 16 keys, K and V
MAX_SHARED = 227 * 1024  # a block's dynamic shared memory on sm_90
VARIABLE = "HAL_CUDA_DECODE_NATIVE"
TILE_VARIABLE = "HAL_CUDA_DECODE_NATIVE_TILE"
NAME = b"attn_fp8_decode"

SOURCE = r"""
typedef unsigned int u32;
typedef unsigned short u16;
typedef unsigned char u8;
#define D 128
#define TK 16
#define FULL 0xffffffffu
#define STAGE_U4 (8 * 32)  // a warp's stage: 8 runs of 16 bytes a lane
#define NEG_INF __int_as_float(0xff800000)

struct Tile { uint4 k[2][2]; uint4 v[4]; };

// a shared-memory address for cp.async
__device__ __forceinline__ u32 smem_addr(const void* p) {
    u32 a;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
    return a;
}

// 16 bytes global -> shared (its shared-window address), not kept in L1; zeros where the slot
// is past the end (s < 0: nothing read)
__device__ __forceinline__ void cp16(u32 dst, const u8* src, int s) {
    asm volatile("{ .reg .pred skip; setp.lt.s32 skip, %2, 0; "
                 "cp.async.cg.shared.global [%0], [%1], 16, skip; }"
                 :: "r"(dst), "l"(src), "r"(s) : "memory");
}

// a slot's bytes: base + slot x stride in one wide multiply-add (32 x 32 + 64 bits)
__device__ __forceinline__ const u8* at_slot(const u8* base, int s, u32 stride) {
    const u8* p;
    asm("mad.wide.u32 %0, %1, %2, %3;" : "=l"(p) : "r"((u32)max(s, 0)), "r"(stride), "l"(base));
    return p;
}

__device__ __forceinline__ void commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }

template <int N> __device__ __forceinline__ void wait_groups() {
    asm volatile("cp.async.wait_group %0;" :: "n"(N) : "memory");
}

// a word's four e4m3 -> two f16x2: lo from bytes 0-1, hi from bytes 2-3 (the halves taken as
// the register's own, no shift or mask)
__device__ __forceinline__ void cvt4(u32 w, u32& lo, u32& hi) {
    asm("{ .reg .b16 a, b; mov.b32 {a, b}, %2; cvt.rn.f16x2.e4m3x2 %0, a; "
        "cvt.rn.f16x2.e4m3x2 %1, b; }" : "=r"(lo), "=r"(hi) : "r"(w));
}

// f16x2 of two floats, lo in the low half
__device__ __forceinline__ u32 pack_f16(float lo, float hi) {
    u32 r;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

// a 32-bit word of two q elements -> f16x2
__device__ __forceinline__ u32 q_pair(u32 w) {
#if XF16
    return w;
#else
    return pack_f16(__uint_as_float(w << 16), __uint_as_float(w & 0xffff0000u));
#endif
}

__device__ __forceinline__ u16 to_out(float v) {
    u16 h;
#if XF16
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(v));
#else
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(v));
#endif
    return h;
}

__device__ __forceinline__ float ex2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

__device__ __forceinline__ void mma16816(float* c, u32 a0, u32 a1, u32 a2, u32 a3, u32 b0,
                                         u32 b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, "
                 "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ u32 trans8x8(u32 x) {
    u32 y;
    asm("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;" : "=r"(y) : "r"(x));
    return y;
}

__device__ __forceinline__ u32 word(const uint4& v, int i) {
    return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

// this lane's slot of key (lane % 16) of the tile at n (-1 past the end)
__device__ __forceinline__ int tile_slot(const int* row, int n, int end, int lane) {
    const int p = n + (lane & 15);
    return p < end ? row[p] : -1;
}

// One tile's 16-byte runs as this lane's fragments read them, into its own places of the
// warp's stage (run c of the lane at stage[c * 32 + lane]: no other thread reads them, so
// no barrier, and a warp's 128-bit accesses fall on consecutive addresses). Runs 0-3: keys
// g and g + 8, bytes [16 t, 16 t + 16) and [64 + 16 t, 80 + 16 t) (each copy reads whole
// 32-byte sectors: lanes t and t + 1 share one); runs 4-7: keys 2t, 2t+1, 2t+8, 2t+9,
// bytes [16 g, 16 g + 16). sl: this lane's slot of key (lane % 16), -1 past the end (zeros).
__device__ __forceinline__ void issue_tile(u32 stage, int sl, const u8* kb, const u8* vb,
                                           u32 c_s0, int g, int t) {
#if PROBE == 2
    // the bench's probe of whole-line K requests: copy r takes keys 4 r to 4 r + 3, 8 lanes
    // a key's 128 bytes (into places no fragment reads: loads alone)
    const int lane = 4 * g + t;
#pragma unroll
    for (int r = 0; r < 4; ++r) {
        const int s = __shfl_sync(FULL, sl, 4 * r + (lane >> 3));
        cp16(stage + r * 512, at_slot(kb - 16 * t + 16 * (lane & 7), s, c_s0), s);
    }
#else
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const int s = __shfl_sync(FULL, sl, g + 8 * r);
        const u8* p = at_slot(kb, s, c_s0);
        cp16(stage + (2 * r) * 512, p, s);
        cp16(stage + (2 * r + 1) * 512, p + 64, s);
    }
#endif
#pragma unroll
    for (int e = 0; e < 4; ++e) {
        const int s = __shfl_sync(FULL, sl, (e >> 1) * 8 + 2 * t + (e & 1));
        cp16(stage + (4 + e) * 512, at_slot(vb, s, c_s0), s);
    }
}

extern "C" __global__ void __launch_bounds__(WARPS * 32)
attn_fp8_decode(const u16* __restrict__ q, const u8* __restrict__ kc,
                const u8* __restrict__ vc, const int* __restrict__ rtt,
                const int* __restrict__ seq_lens, const int* __restrict__ ext_lens,
                const int* __restrict__ qo, float* __restrict__ mid_o,
                float* __restrict__ mid_lse, u16* __restrict__ out,
                long long q_s0, long long q_s1, long long c_s0, long long c_s1,
                long long rtt_s0, long long mo_s0, long long mo_s1, long long mo_s2,
                long long ml_s0, long long ml_s1, long long o_s0, long long o_s1,
                float scale_log2, int window, float cap, int num_splits) {
#if PROBE >= 3
    // the bench's probes of a block over every KV head of a request: warp w takes head w
    // (WARPS = the KV heads) and all of the split's keys
    const int kh = threadIdx.x >> 5;
    const long long b = blockIdx.y;
#elif HEADS_FIRST
    const int kh = blockIdx.x;
    const long long b = blockIdx.y;
#else
    const long long b = blockIdx.x;
    const int kh = blockIdx.y;
#endif
    const int split = blockIdx.z;
#if PDL
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
    long long q_row = b;
#if MIXED
    if (ext_lens[b] != 1) return;
    q_row = qo[b];
#endif
    const int seq_len = seq_lens[b];
    const int lo = window > 0 ? max(seq_len - window, 0) : 0;
    const int per = ((seq_len - lo + num_splits - 1) / num_splits + TK - 1) / TK * TK;
    const int start = lo + split * per;
    const int end = min(start + per, seq_len);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int* row = rtt + b * rtt_s0;
    // this lane's bytes of a key's K (and 64 on) and of a key's V
    const u8* kb = kc + (long long)kh * c_s1 + 16 * t;
    const u8* vb = vc + (long long)kh * c_s1 + 16 * g;

    // q^T's fragments: head g, dims 64 (i / 4) + 16 t + 4 (i % 4) + (0, 1) and (2, 3) of
    // chunk i
    u32 qf[8][2];
    if (g < GROUP) {
        const u16* qp = q + q_row * q_s0 + (long long)(kh * GROUP + g) * q_s1 + 16 * t;
#pragma unroll
        for (int u = 0; u < 4; ++u) {
            const uint4 v = *reinterpret_cast<const uint4*>(qp + (u >> 1) * 64 + (u & 1) * 8);
            qf[2 * u][0] = q_pair(v.x);
            qf[2 * u][1] = q_pair(v.y);
            qf[2 * u + 1][0] = q_pair(v.z);
            qf[2 * u + 1][1] = q_pair(v.w);
        }
    } else {
#pragma unroll
        for (int i = 0; i < 8; ++i) qf[i][0] = qf[i][1] = 0u;
    }

    // heads 2 t and 2 t + 1: running max (log2 units, the same on every g), this thread's
    // share of the sum, and O^T's accumulators (m-tile j: dims 16 g + 2 j (+1))
    float m0 = NEG_INF, m1 = NEG_INF, l0 = 0.0f, l1 = 0.0f;
    float acc[8][4];
#pragma unroll
    for (int j = 0; j < 8; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;

    // Each warp's ring of STAGES tiles in shared memory (cp.async), STAGES - 1 in flight
    extern __shared__ uint4 ring[];
    uint4* mine = ring + (long long)warp * STAGES * STAGE_U4 + lane;
    const u32 mine_s = smem_addr(mine);  // its shared-window address, for cp.async
    const u32 c_s0_32 = (u32)c_s0;  // a slot's bytes (fits: below 2^32)
#if PROBE >= 3
    const int step = TK;
    const int n0 = start;
#else
    const int step = WARPS * TK;
    const int n0 = start + warp * TK;
#endif
#pragma unroll
    for (int i = 0; i < STAGES - 1; ++i) {
        const int n = n0 + i * step;
        const int sl = tile_slot(row, n, end, lane);
        if (n < end) issue_tile(mine_s + i * STAGE_U4 * 16, sl, kb, vb, c_s0_32, g, t);
        commit();
    }
    int sl_next = tile_slot(row, n0 + (STAGES - 1) * step, end, lane);
    int stage = 0;
    for (int n = n0; n < end; n += step) {
        wait_groups<STAGES - 2>();  // this tile's runs have landed
        const int ahead = n + (STAGES - 1) * step;
        const int free_stage = stage == 0 ? STAGES - 1 : stage - 1;  // read last iteration
        if (ahead < end)
            issue_tile(mine_s + free_stage * STAGE_U4 * 16, sl_next, kb, vb, c_s0_32, g, t);
        commit();
        sl_next = tile_slot(row, ahead + step, end, lane);
        Tile cur;
        const uint4* src = mine + stage * STAGE_U4;
        cur.k[0][0] = src[0];
        cur.k[0][1] = src[32];
        cur.k[1][0] = src[64];
        cur.k[1][1] = src[96];
#pragma unroll
        for (int e = 0; e < 4; ++e) cur.v[e] = src[(4 + e) * 32];
        stage = stage == STAGES - 1 ? 0 : stage + 1;
#if PROBE && PROBE != 4
        // the bench's probes of the loads alone: every word read back, nothing computed
        u32 x = 0u;
#pragma unroll
        for (int e = 0; e < 4; ++e)
            x ^= cur.v[e].x ^ cur.v[e].y ^ cur.v[e].z ^ cur.v[e].w ^ word(cur.k[e >> 1][e & 1], 0)
                 ^ word(cur.k[e >> 1][e & 1], 1) ^ word(cur.k[e >> 1][e & 1], 2)
                 ^ word(cur.k[e >> 1][e & 1], 3);
        acc[0][0] += __uint_as_float(x & 0x3fffffffu);
        l0 = 1.0f;
        l1 = 1.0f;
        m0 = m1 = 0.0f;
        continue;
#endif

        // S^T = K Q^T: s[0], s[1] key g heads 2t, 2t+1; s[2], s[3] key g + 8
        float s[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            const u32 w0 = word(cur.k[0][i >> 2], i & 3), w1 = word(cur.k[1][i >> 2], i & 3);
            u32 f0, f1, f2, f3;
            cvt4(w0, f0, f2);
            cvt4(w1, f1, f3);
            mma16816(s, f0, f1, f2, f3, qf[i][0], qf[i][1]);
        }
#pragma unroll
        for (int e = 0; e < 4; ++e) {
#if HAS_CAP
            s[e] = cap * tanhf(s[e] * (scale_log2 / 1.4426950408889634f) / cap) *
                   1.4426950408889634f;
#else
            s[e] *= scale_log2;
#endif
        }
        if (n + g >= end) s[0] = s[1] = NEG_INF;
        if (n + g + 8 >= end) s[2] = s[3] = NEG_INF;
        float x0 = fmaxf(s[0], s[2]), x1 = fmaxf(s[1], s[3]);
#pragma unroll
        for (int off = 4; off < 32; off <<= 1) {
            x0 = fmaxf(x0, __shfl_xor_sync(FULL, x0, off));
            x1 = fmaxf(x1, __shfl_xor_sync(FULL, x1, off));
        }
        const float n0 = fmaxf(m0, x0), n1 = fmaxf(m1, x1);
        const float a0 = ex2(m0 - n0), a1 = ex2(m1 - n1);
        const float p0 = ex2(s[0] - n0), p1 = ex2(s[1] - n1);
        const float p2 = ex2(s[2] - n0), p3 = ex2(s[3] - n1);
        // the accumulators' rescale, where a max moved (else a0 = a1 = 1: skipping it changes
        // no bit); the whole warp takes the same branch
        if (__any_sync(FULL, n0 != m0 || n1 != m1)) {
#pragma unroll
            for (int j = 0; j < 8; ++j) {
                acc[j][0] *= a0; acc[j][1] *= a1; acc[j][2] *= a0; acc[j][3] *= a1;
            }
        }
        l0 = l0 * a0 + p0 + p2;
        l1 = l1 * a1 + p1 + p3;
        m0 = n0;
        m1 = n1;
        // P^T's fragments: keys 2t, 2t+1 (and 8 more) of head g
        const u32 b0 = trans8x8(pack_f16(p0, p1)), b1 = trans8x8(pack_f16(p2, p3));
        // O^T += V^T P^T
#pragma unroll
        for (int m = 0; m < 4; ++m) {
            const u32 v0 = word(cur.v[0], m), v1 = word(cur.v[1], m);
            const u32 v2 = word(cur.v[2], m), v3 = word(cur.v[3], m);
            const u32 e01 = __byte_perm(v0, v1, 0x5140), f01 = __byte_perm(v0, v1, 0x7362);
            const u32 e89 = __byte_perm(v2, v3, 0x5140), f89 = __byte_perm(v2, v3, 0x7362);
            u32 h0, h1, h2, h3;
            cvt4(e01, h0, h1);
            cvt4(e89, h2, h3);
            mma16816(acc[2 * m], h0, h1, h2, h3, b0, b1);
            cvt4(f01, h0, h1);
            cvt4(f89, h2, h3);
            mma16816(acc[2 * m + 1], h0, h1, h2, h3, b0, b1);
        }
    }
    wait_groups<0>();
    // head's output at dim d: the final one with one split, else the split's partial and (at
    // d == 0) its log-sum-exp
    auto store = [&](long long head, int d, float o, float lse) {
        if (num_splits == 1) {
            out[q_row * o_s0 + head * o_s1 + d] = to_out(o);
        } else {
            mid_o[b * mo_s0 + head * mo_s1 + split * mo_s2 + d] = o;
            if (d == 0) mid_lse[b * ml_s0 + head * ml_s1 + split] = lse;
        }
    };

    // the block's warps merged: each warp's state through shared memory
#pragma unroll
    for (int off = 4; off < 32; off <<= 1) {
        l0 += __shfl_xor_sync(FULL, l0, off);
        l1 += __shfl_xor_sync(FULL, l1, off);
    }
#if PROBE == 4
    // the bench's probe 4: a warp owns its head group whole, so no merge across warps
    // (no key in this split, every warp alike: zeros, and an lse of -inf that stage 2 skips)
    const bool none = m0 == NEG_INF;
#pragma unroll
    for (int e = 0; e < 2; ++e) {
        const int h = 2 * t + e;
        if (h >= GROUP) continue;
        const float l = e ? l1 : l0;
        const float inv = none ? 0.0f : 1.0f / l;
        const float lse = none ? NEG_INF : (e ? m1 : m0) + __log2f(l);
#pragma unroll
        for (int j = 0; j < 8; ++j) {
#pragma unroll
            for (int c = 0; c < 2; ++c)
                store((long long)kh * GROUP + h, 16 * g + 2 * j + c, acc[j][2 * c + e] * inv,
                      lse);
        }
    }
    return;
#endif
    __shared__ float sm_m[WARPS][8], sm_l[WARPS][8];
    // a warp's partial output in its own ring's first stage (4 KB: 8 heads x 128 floats)
    float (*sm_o)[8][D] = reinterpret_cast<float (*)[8][D]>(ring);
    static_assert(8 * D * 4 == STAGE_U4 * 16, "a stage holds 8 heads x 128 floats");
    __syncwarp();  // every lane's reads of its ring are behind it (the last mma.sync)
    if (g == 0) {
        sm_m[warp][2 * t] = m0; sm_m[warp][2 * t + 1] = m1;
        sm_l[warp][2 * t] = l0; sm_l[warp][2 * t + 1] = l1;
    }
#pragma unroll
    for (int j = 0; j < 8; ++j) {
        sm_o[warp * STAGES][2 * t][16 * g + 2 * j] = acc[j][0];
        sm_o[warp * STAGES][2 * t + 1][16 * g + 2 * j] = acc[j][1];
        sm_o[warp * STAGES][2 * t][16 * g + 2 * j + 1] = acc[j][2];
        sm_o[warp * STAGES][2 * t + 1][16 * g + 2 * j + 1] = acc[j][3];
    }
    __syncthreads();
    for (int idx = threadIdx.x; idx < GROUP * D; idx += WARPS * 32) {
        const int h = idx / D, d = idx % D;
        float mx = NEG_INF;
#pragma unroll
        for (int w = 0; w < WARPS; ++w) mx = fmaxf(mx, sm_m[w][h]);
        float o = 0.0f, lse = NEG_INF;
        if (mx != NEG_INF) {
            float lsum = 0.0f, osum = 0.0f;
#pragma unroll
            for (int w = 0; w < WARPS; ++w) {
                const float f = ex2(sm_m[w][h] - mx);
                lsum += sm_l[w][h] * f;
                osum += sm_o[w * STAGES][h][d] * f;
            }
            o = osum / lsum;
            lse = mx + __log2f(lsum);
        }
        store((long long)kh * GROUP + h, d, o, lse);
    }
}
"""


@functools.lru_cache(maxsize=1)
def enabled() -> bool:
    """`HAL_CUDA_DECODE_NATIVE`: the native stage 1 where it fits (off unless 1). Read once a
    process, like the tile (tests and the bench clear the cache)."""
    return env.switch(VARIABLE, False)


def parse_tile(text: str) -> tuple[int, int]:
    """(warps a block, stages a warp's ring) from "4,3"."""
    parts = text.split(",")
    ok = len(parts) == 2 and all(p.strip().isdigit() for p in parts)
    if ok:
        nw, st = (int(p) for p in parts)
        ok = nw in (1, 2, 4, 8) and 2 <= st <= 8 and nw * st * STAGE_BYTES <= MAX_SHARED
    if not ok:
        raise ValueError(f"{TILE_VARIABLE}={text!r}: expected WARPS,STAGES (warps 1, 2, 4 or 8; "
                         f"stages 2-8; warps x stages x {STAGE_BYTES} bytes <= {MAX_SHARED})")
    return nw, st


@functools.lru_cache(maxsize=1)
def tile() -> tuple[int, int]:
    """(warps, stages): HAL_CUDA_DECODE_NATIVE_TILE, else (WARPS, STAGES). Read once."""
    text = os.environ.get(TILE_VARIABLE, "").strip()
    return parse_tile(text) if text else (WARPS, STAGES)


@functools.lru_cache(maxsize=64)
def defines(group: int, warps: int, stages: int, mixed: bool, has_cap: bool, x_f16: bool,
            use_pdl: bool, heads_first: bool, probe: int = 0) -> str:
    """The source's switches. `probe` is the bench's alone (native_attention_bench.py):
    - 1: the loads without the arithmetic (a wrong result);
    - 2: the same with K requested in whole lines, 8 lanes a key's 128 bytes, instead of the
      fragments' half lines (a wrong result);
    - 3: probe 1's loads with a block over all the KV heads of a request (warp w head w,
      grid (1, batch, splits)), so a slot's heads are read together (a wrong result);
    - 4: the whole kernel laid out as probe 3, each warp writing its own heads (the bench
      checks its result against Triton's)."""
    return "".join(f"#define {name} {int(value)}\n" for name, value in (
        ("GROUP", group), ("WARPS", warps), ("STAGES", stages), ("MIXED", mixed),
        ("HAS_CAP", has_cap), ("XF16", x_f16), ("PDL", use_pdl), ("HEADS_FIRST", heads_first),
        ("PROBE", probe)))


def _aligned(t: torch.Tensor, elements: int) -> bool:
    return t.data_ptr() % 16 == 0 and all(s % elements == 0 for s in t.stride()[:-1])


def fits(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
         req_to_token: torch.Tensor, seq_lens: torch.Tensor,
         *tables: torch.Tensor) -> bool:
    """Whether the native stage 1 computes this batch: see the module's text. (sm_89 and
    later, which its e4m3 conversion needs, the caller asks: decode_attention.asm_cvt.)"""
    if not (q.is_cuda and nvrtc.available()):
        return False
    if q.dtype not in (torch.bfloat16, torch.float16) or q.shape[-1] != HEAD_DIM:
        return False
    q_heads, kv_heads = q.shape[1], k_cache.shape[1]
    if q_heads % kv_heads or not 1 <= q_heads // kv_heads <= MAX_GROUP:
        return False
    caches = (k_cache, v_cache)
    if any(c.dtype != torch.float8_e4m3fn or c.dim() != 3 or c.shape[-1] != HEAD_DIM or
           c.stride(-1) != 1 or not _aligned(c, 16) for c in caches):
        return False
    if k_cache.stride() != v_cache.stride() or k_cache.stride(0) >= 2 ** 32:
        return False  # (a slot's bytes are a 32-bit factor of its address)
    if q.stride(-1) != 1 or not _aligned(q, 8):
        return False
    return all(
        t.dtype == torch.int32 and t.stride(-1) == 1 for t in (req_to_token, seq_lens, *tables))


def launch_stage1(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                  req_to_token: torch.Tensor, seq_lens: torch.Tensor, ext: torch.Tensor,
                  qo: torch.Tensor, mid_o: torch.Tensor, mid_lse: torch.Tensor,
                  out: torch.Tensor, scale_log2: float, window: int, logit_cap: float,
                  n_split: int, mixed: bool, heads_first: bool, probe: int = 0) -> None:
    """The Triton stage 1's contract (decode_attention._decode_stage1) for a batch that
    `fits`: the final output with one split, else the partials and log-sum-exps. (`probe`:
    the bench's, see `defines`.)"""
    batch, q_heads = seq_lens.shape[0], q.shape[1]
    kv_heads = k_cache.shape[1]
    group = q_heads // kv_heads
    nw, stages = tile()
    heads_block = probe >= 3  # the probes' block over a request's KV heads, a warp a head
    if heads_block:
        nw = kv_heads
    use_pdl = pdl.mode() in ("on", "prefetch")
    device = q.device.index if q.device.index is not None else torch.cuda.current_device()
    defs = defines(group, nw, stages, mixed, logit_cap > 0, q.dtype == torch.float16, use_pdl,
                   heads_first, probe)
    # the ring is dynamic shared memory, opted in at its size (static + dynamic may not pass
    # 48 KB otherwise, and 4 warps x 3 stages is 48 KB of ring alone)
    shared = nw * stages * STAGE_BYTES
    fn = nvrtc.function(defs, SOURCE, NAME, device, dynamic_shared=shared)
    ptr = ctypes.c_void_p
    args: list[ctypes._SimpleCData] = [
        ptr(q.data_ptr()), ptr(k_cache.data_ptr()), ptr(v_cache.data_ptr()),
        ptr(req_to_token.data_ptr()), ptr(seq_lens.data_ptr()), ptr(ext.data_ptr()),
        ptr(qo.data_ptr()), ptr(mid_o.data_ptr()), ptr(mid_lse.data_ptr()),
        ptr(out.data_ptr())]
    args += [ctypes.c_longlong(v) for v in (
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), req_to_token.stride(0),
        mid_o.stride(0), mid_o.stride(1), mid_o.stride(2), mid_lse.stride(0),
        mid_lse.stride(1), out.stride(0), out.stride(1))]
    args += [ctypes.c_float(scale_log2), ctypes.c_int(int(window)),
             ctypes.c_float(float(logit_cap)), ctypes.c_int(n_split)]
    params = (ctypes.c_void_p * len(args))(*[ctypes.addressof(a) for a in args])
    grid = ((1, batch, n_split) if heads_block else
            (kv_heads, batch, n_split) if heads_first else (batch, kv_heads, n_split))
    nvrtc.launch(fn, grid, nw * 32, torch.cuda.current_stream(q.device),
                 ctypes.addressof(params), use_pdl, shared)
