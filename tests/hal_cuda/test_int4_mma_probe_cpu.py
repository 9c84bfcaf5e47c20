"""The tensor-core int4 GEMV (hal/cuda/native_gemv_mma.py) without a GPU: its interleaved
layout, and a numpy model of the kernel lane by lane (the nibbles made f16 pairs
by their exponent bits, x staged as B fragments a power of two a tile, mma.m16n8k16 by its
fragment layout, each group's scale and offset) against the float reference. Where NVRTC
is installed, every config compiles for sm_90. The kernel itself runs on the GPU through
`gpu_session.sh 91`."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from tessera.hal.cuda import native_gemv_mma
from tessera.hal.quant.weight import pack_int4

sys.path.insert(0, str(Path(__file__).resolve().parent))
import int4_mma_probe as probe  # noqa: E402


def _f16_pairs(words: np.ndarray) -> np.ndarray:
    """uint32 words -> float16 [..., 2] (low half first), as the registers hold them."""
    return words.astype(np.uint32).view(np.float16).reshape(*words.shape, 2)


def _pack_f16(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    return np.stack([lo, hi], -1).astype(np.float16).view(np.uint32)[..., 0]


def _unpack(w: np.ndarray) -> list[np.ndarray]:
    """The kernel's unpack: four f16 pairs a word (r0, r1, r2, r3)."""
    w8 = w >> 8
    out = []
    for word, mask, magic in ((w, 0x000F000F, 0x6408), (w, 0x00F000F0, 0x6480),
                              (w8, 0x000F000F, 0x6408), (w8, 0x00F000F0, 0x6480)):
        v = _f16_pairs((word & mask) | 0x64006400)
        out.append(v - np.float16(np.array([magic], np.uint16).view(np.float16)[0]))
    return out


def _stage_x(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The kernel's staging of x (float32 holding bf16 values): B words [tiles, 64], the
    tiles' sums and 2^-e."""
    tiles = x.reshape(-1, 128)
    xb = np.zeros((len(tiles), 64), np.uint32)
    sums = np.zeros(len(tiles), np.float32)
    inv = np.zeros(len(tiles), np.float32)
    for kt, tile in enumerate(tiles):
        mx = np.abs(tile).max()
        exp = int((np.float32(mx).view(np.uint32) >> 23) & 0xFF) - 127
        e = min(100, max(-100, 14 - exp))
        for lane in range(32):
            v = tile[4 * lane: 4 * lane + 4]
            f = np.float32(2.0 ** (e if lane < 16 else e - 4))
            base = 4 * (lane & 15) + 2 * (lane >> 4)
            xb[kt, base] = _pack_f16(v[0] * f, v[2] * f)
            xb[kt, base + 1] = _pack_f16(v[1] * f, v[3] * f)
        sums[kt] = tile.sum(dtype=np.float32)
        inv[kt] = np.float32(2.0 ** -e)
    return xb, sums, inv


def _mma(a: list[list[np.ndarray]], b: list[list[np.ndarray]]) -> np.ndarray:
    """mma.m16n8k16 (f16 in, float32 out) from 32 lanes' fragments: a[lane] = [a0..a3],
    b[lane] = [b0, b1], each an f16 pair. Returns C [16, 8]."""
    A = np.zeros((16, 16), np.float64)
    B = np.zeros((16, 8), np.float64)
    for lane in range(32):
        g, t = lane >> 2, lane & 3
        for i in range(2):
            A[g, 2 * t + i] = a[lane][0][i]
            A[g + 8, 2 * t + i] = a[lane][1][i]
            A[g, 2 * t + 8 + i] = a[lane][2][i]
            A[g + 8, 2 * t + 8 + i] = a[lane][3][i]
            B[2 * t + i, g] = b[lane][0][i]
            B[2 * t + 8 + i, g] = b[lane][1][i]
    return A @ B


def _model(qi: np.ndarray, s: np.ndarray, o: np.ndarray, x: np.ndarray) -> np.ndarray:
    """The kernel's result (one block a 16-row tile, one warp), rows [N]."""
    n, half = qi.shape
    kt_n = half // 64
    flat = qi.reshape(-1)
    xb, sums, inv = _stage_x(x)
    y = np.zeros(n, np.float64)
    for tile16 in range(n // 16):
        acc = np.zeros((32, 2))
        for kt in range(kt_n):
            c = np.zeros((16, 8))
            words = []
            for h in range(2):  # rows g, then g + 8: row-blocks 2 tile16 and 2 tile16 + 1
                off = ((2 * tile16 + h) * kt_n + kt) * 512
                words.append(flat[off: off + 512].view(np.uint32).reshape(32, 4))
            for m in range(4):
                ra = [_unpack(words[0][lane, m:m + 1]) for lane in range(32)]
                rb = [_unpack(words[1][lane, m:m + 1]) for lane in range(32)]
                bw = [_f16_pairs(xb[kt, 16 * (lane & 3) + 4 * m: 16 * (lane & 3) + 4 * m + 4])
                      for lane in range(32)]
                for first, second, b0 in ((0, 2, 0), (1, 3, 2)):
                    c += _mma([[ra[ln][first][0], rb[ln][first][0], ra[ln][second][0],
                                rb[ln][second][0]] for ln in range(32)],
                              [[bw[ln][b0], bw[ln][b0 + 1]] for ln in range(32)])
            assert np.all(c == c[:, :1]), "every B column is the token's"
            for lane in range(32):
                g = lane >> 2
                for h in range(2):
                    row = 16 * tile16 + 8 * h + g
                    acc[lane, h] += s[row, kt] * inv[kt] * c[8 * h + g, 2 * (lane & 3)] + \
                        (8 * s[row, kt] + o[row, kt]) * sums[kt]
        for lane in range(0, 32, 4):
            y[16 * tile16 + (lane >> 2)] = acc[lane, 0]
            y[16 * tile16 + 8 + (lane >> 2)] = acc[lane, 1]
    return y


def test_interleave_puts_eight_rows_tiles_side_by_side() -> None:
    q = torch.arange(16 * 128, dtype=torch.int32).reshape(16, 128).to(torch.uint8)
    got = native_gemv_mma.interleave(q).reshape(-1)
    for rb8 in range(2):
        for kt in range(2):
            for g in range(8):
                off = ((rb8 * 2 + kt) * 8 + g) * 64
                assert torch.equal(got[off: off + 64], q[8 * rb8 + g, 64 * kt: 64 * kt + 64])


def test_the_copy_is_made_once_a_weight_and_dropped_with_it() -> None:
    """interleaved(w) keeps one copy by the identity of w's qweight (a tensor's == is
    elementwise, so a plain weak dictionary could not look one up), shared by a replaced
    weight over the same tensor, gone with the tensor; which weights and x it takes."""
    import dataclasses
    import gc

    from tessera.hal.quant import quantize

    w = quantize(torch.randn(32, 256), "int4", 128)
    w = dataclasses.replace(w, qweight=pack_int4(torch.randint(0, 16, (32, 256)), 128),
                            packing="halves128")
    assert native_gemv_mma.weight_fits(w) and native_gemv_mma.weight_fits(w, 32)
    assert not native_gemv_mma.weight_fits(w, 64)  # 32 rows are not whole blocks of 64
    qi = native_gemv_mma.interleaved(w)
    assert qi is not None and torch.equal(qi, native_gemv_mma.interleave(w.qweight))
    assert native_gemv_mma.interleaved(w) is qi
    assert native_gemv_mma.interleaved(dataclasses.replace(w, scales=w.scales.clone())) is qi
    before = len(native_gemv_mma._COPIES)
    del w
    gc.collect()
    assert len(native_gemv_mma._COPIES) == before - 1
    for scheme, group in (("int4", 64), ("int4", 256), ("fp8", 256)):
        other = quantize(torch.randn(32, 256), scheme, group)
        assert not native_gemv_mma.weight_fits(other), (scheme, group)
    assert not native_gemv_mma.input_fits(torch.randn(1, 256).to(torch.bfloat16))  # no GPU


@pytest.mark.parametrize("scale", [1.0, 3e-4, 2e3])
def test_the_model_of_the_kernel_is_the_definition(scale: float) -> None:
    """Random nibbles, group scales and offsets (groups of 128, "halves128"), bf16 x with
    tiles of very different magnitudes: the lane-by-lane model equals x @ dequantize(w)^T
    to float32 rounding."""
    rng = np.random.default_rng(int(scale * 1000))
    n, k = 32, 384
    q = torch.from_numpy(rng.integers(0, 16, (n, k), dtype=np.uint8))
    packed = pack_int4(q, 128).numpy()
    s = rng.uniform(0.001, 0.02, (n, k // 128)).astype(np.float32)
    o = (-s * rng.uniform(0, 15, (n, k // 128))).astype(np.float32)
    x = rng.standard_normal(k).astype(np.float32) * scale
    x[128:256] *= 1e-3  # a tile far below the others: its own power of two
    x = torch.from_numpy(x).to(torch.bfloat16).float().numpy()
    w = q.numpy().astype(np.float64) * np.repeat(s, 128, 1) + np.repeat(o, 128, 1)
    want = w @ x.astype(np.float64)
    got = _model(native_gemv_mma.interleave(torch.from_numpy(packed)).numpy(), s, o, x)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6 * np.abs(want).max())


def test_every_config_compiles_for_sm90(tmp_path: Path) -> None:
    from tessera.hal.cuda import nvrtc

    if not nvrtc.can_compile():
        pytest.skip("cuda-python's NVRTC is not installed")
    assert probe.main([str(tmp_path / "dry.json"), "--cpu"]) == 0
    assert "sm_90" in (tmp_path / "dry.json").read_text()


def test_every_tuner_config_compiles_for_sm90() -> None:
    """quant_tune's MMA_CANDIDATES at both 8B row widths, bf16 and fp16 x, with and without
    PDL: no local memory (a spill would be a loop's loads through memory)."""
    from compile_for_sm90 import OPCODE, disassemble

    from tessera.hal.cuda import nvrtc, quant_tune

    if not nvrtc.can_compile():
        pytest.skip("cuda-python's NVRTC is not installed")
    for rows, unroll, warps, _ in quant_tune.MMA_CANDIDATES:
        for k, f16, use_pdl in ((4096, False, True), (14336, True, False)):
            cubin = nvrtc.compile_cubin(native_gemv_mma.defines(rows, unroll, warps, k, f16,
                                                                use_pdl) +
                                        native_gemv_mma.SOURCE, 90)
            sass, _ = disassemble(cubin)
            ops = {m.group(1).split(".")[0] for m in OPCODE.finditer(sass)}
            assert "HMMA" in ops and not ops & {"STL", "LDL"}, (rows, unroll, warps, k)
