"""The CUDA C decode attention over an fp8 cache (hal/cuda/native_attention.py) without a GPU:
its warp's data movement modelled lane by lane in numpy (which bytes each lane loads, the
byte permutes, the e4m3 pairs, and the tensor-core fragments of mma m16n8k16 and movmatrix
as the PTX ISA lays them out), run over whole splits against the float reference; which
batches it takes; and, where cuda-python's NVRTC is installed, that every variant compiles
for sm_90. The kernel itself runs in tests/hal_cuda/test_native_attention_gpu.py."""

from __future__ import annotations

import numpy as np
import pytest
import torch

LANES = 32


E4M3 = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(torch.float8_e4m3fn) \
    .float().numpy().astype(np.float64)


def e4m3(byte: np.ndarray | int) -> np.ndarray:
    """The float values of e4m3 bytes (the hardware's cvt is exact into float16)."""
    return E4M3[np.asarray(byte, dtype=np.int64)]


def cvt2(pair: np.ndarray) -> np.ndarray:
    """cvt.rn.f16x2.e4m3x2 of a 16-bit pair: (low half, high half) = (low byte, high byte)."""
    return np.stack([e4m3(pair & 0xFF), e4m3(pair >> 8)], axis=-1)


def words(raw: np.ndarray) -> np.ndarray:
    """16 bytes -> four little-endian 32-bit words."""
    return raw.astype(np.uint8).view(np.uint32)


def byte_perm(a: int, b: int, sel: int) -> int:
    """prmt.b32 (default mode): byte k of the result is byte (sel >> 4k) & 7 of {b, a}."""
    src = int(a) | (int(b) << 32)
    out = 0
    for k in range(4):
        idx = (sel >> (4 * k)) & 7
        out |= ((src >> (8 * idx)) & 0xFF) << (8 * k)
    return out


def lane_gt(lane: int) -> tuple[int, int]:
    return lane >> 2, lane & 3


def mma16816(c: np.ndarray, a: np.ndarray, b: np.ndarray) -> None:
    """c [32, 4] += A @ B for the warp: a [32, 4, 2] (A 16x16, row-major fragments), b
    [32, 2, 2] (B 16x8, column-major), as the PTX ISA's m16n8k16 figures give them."""
    A = np.zeros((16, 16))
    B = np.zeros((16, 8))
    for lane in range(LANES):
        g, t = lane_gt(lane)
        for r, (row, col) in enumerate(((g, 2 * t), (g + 8, 2 * t), (g, 2 * t + 8),
                                        (g + 8, 2 * t + 8))):
            A[row, col:col + 2] = a[lane, r]
        for r, k in enumerate((2 * t, 2 * t + 8)):
            B[k:k + 2, g] = b[lane, r]
    C = A @ B
    for lane in range(LANES):
        g, t = lane_gt(lane)
        c[lane] += [C[g, 2 * t], C[g, 2 * t + 1], C[g + 8, 2 * t], C[g + 8, 2 * t + 1]]


def movmatrix_trans(x: np.ndarray) -> np.ndarray:
    """movmatrix.m8n8.trans.b16: x [32, 2], lane (g, t) holding row g, columns 2t, 2t+1."""
    M = np.zeros((8, 8))
    for lane in range(LANES):
        g, t = lane_gt(lane)
        M[g, 2 * t:2 * t + 2] = x[lane]
    T = M.T
    return np.stack([T[lane >> 2, 2 * (lane & 3):2 * (lane & 3) + 2] for lane in range(LANES)])


def k_base(t: int, i: int) -> int:
    """The first of the 4 dims a lane of column pair t holds in chunk i (K and q)."""
    return 64 * (i >> 2) + 16 * t + 4 * (i & 3)


def f16(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float16).astype(np.float64)


def model_split(q: np.ndarray, k8: np.ndarray, v8: np.ndarray, scale_log2: float,
                warps: int = 1) -> tuple[np.ndarray, float | np.ndarray]:
    """The kernel's stage 1 for one (request, KV head, split): q [group, 128] (float16
    values), k8 / v8 [L, 128] the split's e4m3 bytes in position order. Returns the output
    [group, 128] and log-sum-exp (log2 units) per head, as the kernel writes them."""
    group = q.shape[0]
    n_keys = k8.shape[0]
    # q^T fragments: lane (g, t), chunk i: head g, dims k_base(t, i) + (0, 1) and (2, 3)
    qf = np.zeros((LANES, 8, 2, 2))
    for lane in range(LANES):
        g, t = lane_gt(lane)
        if g < group:
            for i in range(8):
                base = k_base(t, i)
                qf[lane, i, 0] = q[g, base:base + 2]
                qf[lane, i, 1] = q[g, base + 2:base + 4]
    states = []
    for warp in range(warps):
        m = np.full((LANES, 2), -np.inf)
        ls = np.zeros((LANES, 2))
        acc = np.zeros((LANES, 8, 4))
        for n in range(16 * warp, n_keys, 16 * warps):
            def key_bytes(key: int, lo: int, size: int, table: np.ndarray,
                          n: int = n) -> np.ndarray:
                return table[n + key, lo:lo + size] if n + key < n_keys else \
                    np.zeros(size, np.uint8)
            s = np.zeros((LANES, 4))
            a = np.zeros((LANES, 8, 4, 2))
            for lane in range(LANES):
                g, t = lane_gt(lane)
                w0 = np.concatenate([words(key_bytes(g, 16 * t + 64 * h, 16, k8))
                                     for h in range(2)])
                w1 = np.concatenate([words(key_bytes(g + 8, 16 * t + 64 * h, 16, k8))
                                     for h in range(2)])
                for i in range(8):
                    a[lane, i] = [cvt2(w0[i] & 0xFFFF), cvt2(w1[i] & 0xFFFF), cvt2(w0[i] >> 16),
                                  cvt2(w1[i] >> 16)]
            for i in range(8):
                mma16816(s, a[:, i], qf[:, i])
            s *= scale_log2
            for lane in range(LANES):
                g, _ = lane_gt(lane)
                if n + g >= n_keys:
                    s[lane, 0:2] = -np.inf
                if n + g + 8 >= n_keys:
                    s[lane, 2:4] = -np.inf
            # the tile's max per head across the lanes of one t (xor 4, 8, 16)
            x = np.maximum(s[:, 0:2], s[:, 2:4])
            for lane in range(LANES):
                x[lane] = np.max(x[lane & 3::4], axis=0)
            new = np.maximum(m, x)
            alpha = np.exp2(m - new)
            p = np.exp2(s - np.concatenate([new, new], axis=1))
            ls = ls * alpha + p[:, 0:2] + p[:, 2:4]
            m = new
            acc *= np.concatenate([alpha, alpha], axis=1)[:, None, :]
            ph = f16(p)
            b = np.stack([movmatrix_trans(ph[:, 0:2]), movmatrix_trans(ph[:, 2:4])], axis=1)
            av = np.zeros((LANES, 8, 4, 2))
            for lane in range(LANES):
                g, t = lane_gt(lane)
                vw = [words(key_bytes((e >> 1) * 8 + 2 * t + (e & 1), 16 * g, 16, v8))
                      for e in range(4)]
                for mm in range(4):
                    e01 = byte_perm(vw[0][mm], vw[1][mm], 0x5140)
                    f01 = byte_perm(vw[0][mm], vw[1][mm], 0x7362)
                    e89 = byte_perm(vw[2][mm], vw[3][mm], 0x5140)
                    f89 = byte_perm(vw[2][mm], vw[3][mm], 0x7362)
                    av[lane, 2 * mm] = [cvt2(e01 & 0xFFFF), cvt2(e01 >> 16), cvt2(e89 & 0xFFFF),
                                        cvt2(e89 >> 16)]
                    av[lane, 2 * mm + 1] = [cvt2(f01 & 0xFFFF), cvt2(f01 >> 16),
                                            cvt2(f89 & 0xFFFF), cvt2(f89 >> 16)]
            for j in range(8):
                mma16816(acc[:, j], av[:, j], b)
        # the warp's state: lanes' shares of the sum added across g
        total = np.stack([ls[lane & 3::4].sum(axis=0) for lane in range(LANES)])
        o = np.zeros((8, 128))
        for lane in range(LANES):
            g, t = lane_gt(lane)
            for j in range(8):
                o[2 * t, 16 * g + 2 * j] = acc[lane, j, 0]
                o[2 * t + 1, 16 * g + 2 * j] = acc[lane, j, 1]
                o[2 * t, 16 * g + 2 * j + 1] = acc[lane, j, 2]
                o[2 * t + 1, 16 * g + 2 * j + 1] = acc[lane, j, 3]
        heads_m = np.array([m[t, e] for t in range(4) for e in range(2)])  # lanes g = 0
        heads_l = np.array([total[t, e] for t in range(4) for e in range(2)])
        states.append((heads_m, heads_l, o))
    mx = np.max([st[0] for st in states], axis=0)[:group]
    out = np.zeros((group, 128))
    lse = np.full(group, -np.inf)
    for h in range(group):
        if mx[h] == -np.inf:
            continue
        f = [np.exp2(st[0][h] - mx[h]) for st in states]
        lsum = sum(st[1][h] * fi for st, fi in zip(states, f, strict=True))
        out[h] = sum(st[2][h] * fi for st, fi in zip(states, f, strict=True)) / lsum
        lse[h] = mx[h] + np.log2(lsum)
    return out, lse


def reference(q: np.ndarray, k8: np.ndarray, v8: np.ndarray, scale: float):
    k, v = e4m3(k8).astype(np.float64), e4m3(v8).astype(np.float64)
    logits = q @ k.T * scale
    mx = logits.max(axis=1, keepdims=True)
    w = np.exp(logits - mx)
    lse = (np.log(w.sum(axis=1)) + mx[:, 0]) / np.log(2)
    return (w / w.sum(axis=1, keepdims=True)) @ v, lse


def random_bytes(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """e4m3 bytes of a normal's values (no NaN codes)."""
    x = torch.from_numpy(rng.standard_normal(shape).astype(np.float32))
    return x.to(torch.float8_e4m3fn).view(torch.uint8).numpy()


@pytest.mark.parametrize("group, keys, warps", [(4, 16, 1), (4, 37, 2), (8, 70, 4), (1, 5, 1),
                                                (3, 50, 2)])
def test_the_modelled_warps_compute_attention(group: int, keys: int, warps: int) -> None:
    """The fragments as the kernel moves them give softmax(q k^T * scale) v over the split,
    partial last tiles, warps without a tile and padded heads included (up to float16's
    rounding of p)."""
    rng = np.random.default_rng(group * 100 + keys)
    q = f16(rng.standard_normal((group, 128)))
    k8, v8 = random_bytes(rng, (keys, 128)), random_bytes(rng, (keys, 128))
    scale = 128 ** -0.5
    out, lse = model_split(q, k8, v8, scale * np.log2(np.e), warps)
    want, want_lse = reference(q, k8, v8, scale)
    np.testing.assert_allclose(out, want, atol=2e-3, rtol=2e-3)
    np.testing.assert_allclose(lse, want_lse, atol=1e-6, rtol=1e-6)


def test_an_empty_split_gives_zeros_and_no_lse() -> None:
    q = f16(np.ones((4, 128)))
    out, lse = model_split(q, np.zeros((0, 128), np.uint8), np.zeros((0, 128), np.uint8), 1.0, 2)
    assert not out.any() and np.all(lse == -np.inf)


def test_the_permutations_cover_every_dim_once() -> None:
    """K's chunk mapping and V's m-tile mapping are bijections onto the 128 dims."""
    k_dims = sorted(k_base(t, i) + off for t in range(4) for i in range(8) for off in range(4))
    v_dims = sorted(16 * g + 2 * j + r for g in range(8) for j in range(8) for r in range(2))
    assert k_dims == v_dims == list(range(128))


def test_every_variant_compiles_for_sm90() -> None:
    pytest.importorskip("cuda.bindings.nvrtc", reason="cuda-python's NVRTC is not installed")
    from tessera.hal.cuda import native_attention, nvrtc

    for group, warps, stages, mixed, cap, x_f16, use_pdl, heads_first in (
            (4, 4, 3, False, False, False, True, True), (8, 2, 4, True, True, True, False, False),
            (1, 1, 2, False, False, False, False, True), (3, 8, 6, True, False, False, True, True)):
        defs = native_attention.defines(group, warps, stages, mixed, cap, x_f16, use_pdl,
                                        heads_first)
        assert nvrtc.compile_cubin(defs + native_attention.SOURCE, 90)
    for probe in (1, 2, 3, 4):  # the bench's probes (3 and 4: a warp a KV head)
        defs = native_attention.defines(4, 8 if probe >= 3 else 4, 3, False, False, False,
                                        True, True, probe)
        assert nvrtc.compile_cubin(defs + native_attention.SOURCE, 90)


def test_what_it_takes_without_a_gpu() -> None:
    """No GPU (or a CPU tensor): never taken, so the Triton stage 1 runs."""
    from tessera.hal.cuda import native_attention

    q = torch.zeros(2, 32, 128, dtype=torch.bfloat16)
    cache = torch.zeros(64, 8, 128, dtype=torch.float8_e4m3fn)
    table = torch.zeros(2, 16, dtype=torch.int32)
    lens = torch.zeros(2, dtype=torch.int32)
    assert not native_attention.fits(q, cache, cache, table, lens)


def test_the_switches(monkeypatch: pytest.MonkeyPatch) -> None:
    from tessera.hal.cuda import native_attention

    na = native_attention
    monkeypatch.delenv(na.VARIABLE, raising=False)
    na.enabled.cache_clear()
    assert na.enabled() is False
    monkeypatch.setenv(na.VARIABLE, "maybe")
    na.enabled.cache_clear()
    with pytest.raises(ValueError, match=na.VARIABLE):
        na.enabled()
    monkeypatch.setenv(na.VARIABLE, "1")
    na.enabled.cache_clear()
    assert na.enabled() is True
    monkeypatch.setenv(native_attention.VARIABLE, "0")  # read once a process
    assert native_attention.enabled() is True
    native_attention.enabled.cache_clear()
    assert native_attention.parse_tile("2,4") == (2, 4)
    for bad in ("3,3", "4", "4,1", "8,8", "a,b"):
        with pytest.raises(ValueError, match=native_attention.TILE_VARIABLE):
            native_attention.parse_tile(bad)
    native_attention.tile.cache_clear()
    monkeypatch.delenv(native_attention.TILE_VARIABLE, raising=False)
    assert native_attention.tile() == (native_attention.WARPS, native_attention.STAGES)
