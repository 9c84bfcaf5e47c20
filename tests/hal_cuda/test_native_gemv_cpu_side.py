"""The CUDA C GEMV (hal/cuda/native_gemv.py) without a GPU: the arithmetic its int4 path rests
on (a nibble masked in place read as a float32, times x scaled by a power of two), modelled in
numpy over a whole "halves" / "nibbles" row the way the kernel walks it; which weights it
takes; where its configs sit in the tuner's lists; and, where cuda-python's NVRTC is
installed, that every listed config compiles for sm_90. The kernel itself runs in
tests/hal_cuda/test_quant_gpu.py."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tessera.hal.quant import quant_linear_reference, quantize
from tessera.hal.quant.weight import half_tile

# the bit position a byte's low / high nibble is read at (the top byte shifted down by 8)
POS_LO = (0, 8, 16, 16)
POS_HI = (4, 12, 20, 20)


def test_a_masked_nibble_times_scaled_x_is_the_product_exactly() -> None:
    """For every nibble value and bit position p <= 20: the float32 whose bits are q << p,
    times x * 2^(85 - p), is q * x * 2^-64 rounded once (the denormals below bit 23 and the
    smallest normals above it continue each other), for x across float32's range of use."""
    rng = np.random.default_rng(0)
    x = (rng.standard_normal(4096) * np.exp2(rng.integers(-30, 30, 4096))).astype(np.float32)
    for p in (0, 4, 8, 12, 16, 20):
        for q in range(16):
            bits = np.array([q << p], dtype=np.uint32).view(np.float32)[0]
            got = bits * (x * np.float32(2.0 ** (85 - p)))
            want = (np.float32(q) * x) * np.float32(2.0 ** -64)
            assert np.array_equal(got, want), (p, q)
    # bits 24-27 would reach the exponent: the kernel shifts a word's top byte down first
    word = np.array([0xA5 << 24], dtype=np.uint32)
    assert ((word >> 8) & 0xF0000)[0] >> 16 == 0x5 and ((word >> 8) & 0xF00000)[0] >> 20 == 0xA


def _model_row(packed: np.ndarray, tile: int, x: np.ndarray, s: np.ndarray, o: np.ndarray,
               group: int) -> float:
    """native_gemv's int4 arithmetic for one row (float32, in its order within a run):
    packed uint8 [K / 2] in "halves<tile>" tiles (tile 2: "nibbles")."""
    words = packed.view(np.uint32)
    acc = np.float32(0.0)
    for i in range(len(packed) // 16):  # one thread's 16-byte run: 32 columns, one group
        if tile == 2:
            lo = 32 * i + 2 * np.arange(16)
            hi = lo + 1
            g = 32 * i // group
        else:
            base = (16 * i // (tile // 2)) * tile + (16 * i) % (tile // 2)
            lo = base + np.arange(16)
            hi = lo + tile // 2
            g = (16 * i // (tile // 2)) * tile // group
        xl, xh = x[lo], x[hi]
        xsum = np.float32(xl.sum(dtype=np.float32) + xh.sum(dtype=np.float32))
        b = np.arange(16) % 4
        xl = xl * np.exp2(85 - np.array(POS_LO)[b]).astype(np.float32)
        xh = xh * np.exp2(85 - np.array(POS_HI)[b]).astype(np.float32)
        part = np.float32(0.0)
        for j in range(4):
            a = words[4 * i + j]
            t = a >> np.uint32(8)
            masks = [(a, 0xF, xl, 0), (a, 0xF0, xh, 0), (a, 0xF00, xl, 1), (a, 0xF000, xh, 1),
                     (a, 0xF0000, xl, 2), (a, 0xF00000, xh, 2), (t, 0xF0000, xl, 3),
                     (t, 0xF00000, xh, 3)]
            for word, mask, xs, e in masks:
                f = np.array([word & np.uint32(mask)], dtype=np.uint32).view(np.float32)[0]
                part = np.float32(part + f * xs[4 * j + e])
        part = np.float32(part * np.float32(2.0 ** 64))
        acc = np.float32(acc + s[g] * part + o[g] * xsum)
    return float(acc)


@pytest.mark.parametrize("group,prepared", [(128, True), (64, True), (32, True), (128, False),
                                            (None, True)])
def test_the_int4_model_computes_the_definition(group: int | None, prepared: bool) -> None:
    """The kernel's walk over a row (which columns a run's nibbles are, its group, the bit
    positions and scales) computes y = x @ dequantize(w)^T up to float32 rounding."""
    from tessera.hal.cuda.quant_linear import prepare

    n, k = 6, 512
    gen = torch.Generator().manual_seed(3)
    w = quantize(torch.randn((n, k), generator=gen) * k ** -0.5, "int4", group or k)
    if prepared:
        w = prepare(w)
    tile = half_tile(w.packing)
    assert tile is not None
    x = torch.randn(k, generator=gen).float()
    want = quant_linear_reference(x[None], w)[0]
    q = w.qweight.numpy()
    s = w.scales.numpy().astype(np.float32)
    o = w.offsets.numpy().astype(np.float32)  # type: ignore[union-attr]
    got = [_model_row(q[r], tile, x.numpy(), s[r], o[r], w.group_size) for r in range(n)]
    torch.testing.assert_close(torch.tensor(got), want, rtol=1e-4, atol=1e-4)


def test_which_weights_the_kernel_takes() -> None:
    """weight_fits (the tensors) agrees with the layout rule the tuner lists the native
    configs by: fp8 a scale a row, int4 in halves tiles or nibbles of whole runs; not int8,
    not a 16-byte-misaligned view."""
    from tessera.hal.cuda import native_gemv
    from tessera.hal.cuda.quant_linear import prepare

    gen = torch.Generator().manual_seed(4)
    dense = torch.randn((64, 512), generator=gen)
    cases = [quantize(dense, "fp8", None), quantize(dense, "int8", 64)]
    for g in (16, 32, 64, 128, 512):
        cases += [quantize(dense, "int4", g), prepare(quantize(dense, "int4", g))]
    for w in cases:
        rule = native_gemv.layout_fits(w.scheme, w.num_groups == 1, w.group_size, w.packing)
        assert native_gemv.weight_fits(w) == rule, (w.scheme, w.packing, w.group_size)
    assert not native_gemv.weight_fits(quantize(dense, "int8", 64))
    assert not native_gemv.weight_fits(quantize(dense, "int4", 16))  # a run spans two groups
    assert native_gemv.weight_fits(prepare(quantize(dense, "int4", 16))) is False
    x = torch.zeros((1, 513), dtype=torch.bfloat16)
    assert not native_gemv.input_fits(x[:, 1:])  # on the CPU, and misaligned


def test_native_configs_follow_the_triton_tiles() -> None:
    """The CUDA C configs come after every Triton tile in the tuner's lists: where nothing is
    measured (graph capture, the interpreter) the first, a Triton tile, runs."""
    from tessera.hal.cuda import quant_kernels, quant_tune

    for scheme, natives in quant_tune.NATIVE_CANDIDATES.items():
        cands = quant_tune.GEMV_CANDIDATES[scheme]
        mma = quant_tune.MMA_CANDIDATES if scheme == "int4" else []
        if mma:  # the tensor-core configs last (HAL_CUDA_INT4_MMA)
            assert cands[-len(mma):] == mma and len(set(mma)) == len(mma)
            assert all(c[3] == quant_kernels.GEMV_MMA and c[0] % 16 == 0 for c in mma)
            cands = cands[:-len(mma)]
        assert natives and cands[-len(natives):] == natives
        assert not any(c[3] & quant_kernels.GEMV_NATIVE for c in cands[:-len(natives)])
        assert len(set(natives)) == len(natives)
        for rows, unroll, warps, flag in natives:
            assert flag & quant_kernels.GEMV_NATIVE and 1 <= warps * 32 <= 1024
            assert rows >= 1 and unroll >= 1


def test_every_native_config_compiles_for_sm90() -> None:
    pytest.importorskip("cuda.bindings.nvrtc", reason="cuda-python's NVRTC is not installed")
    from tessera.hal.cuda import native_gemv, nvrtc, quant_tune

    for scheme, natives in quant_tune.NATIVE_CANDIDATES.items():
        tiles = (0,) if scheme == "fp8" else (2, 32, 128)
        shifts = (-1,) if scheme == "fp8" else (-1, 7)
        for rows, unroll, warps, _ in natives:
            for tile in tiles:
                for f16, use_pdl, pre, gs in ((False, True, False, shifts[-1]),
                                              (True, False, False, shifts[0]),
                                              (False, True, True, shifts[-1])):
                    defs = native_gemv.defines(scheme, rows, unroll, warps, tile, f16,
                                               use_pdl, pre, gs)
                    assert nvrtc.compile_cubin(defs + native_gemv.SOURCE, 90)
            # the fusions (one_token_fused): norm prologue, residual / SiLU epilogue
            for norm, res, silu in ((True, False, False), (False, True, False),
                                    (True, False, True)):
                if silu and rows % 2:
                    continue
                defs = native_gemv.defines(scheme, rows, unroll, warps, tiles[-1], False,
                                           True, True, shifts[-1], norm, res, silu)
                assert nvrtc.compile_cubin(defs + native_gemv.SOURCE, 90)
            if rows % 2 == 0:  # the rotary / KV store epilogue, heads of 128
                defs = native_gemv.defines(scheme, rows, unroll, warps, tiles[-1], False,
                                           True, True, shifts[-1], True, rope_dim=128)
                assert nvrtc.compile_cubin(defs + native_gemv.SOURCE, 90)



def test_the_fusion_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    """HAL_CUDA_ONE_TOKEN_FUSION: the cuda kernels' `fuses` says yes for fp8 alone under
    auto (the default), for every scheme under all and epilogues (the norm prologue off
    there), no when it is off (0); a value it cannot read is a clear error; a weight with an
    input permutation is never fused."""
    from tessera.hal.cuda import nvrtc, quant_linear
    from tessera.hal.cuda.quant_linear import prepare

    fp8 = prepare(quantize(torch.randn(64, 256), "fp8"))
    int4 = prepare(quantize(torch.randn(64, 256), "int4", 64))
    monkeypatch.setattr(nvrtc, "available", lambda: True)
    try:
        for value, fp8_fused, int4_fused, norm in (
                (None, True, False, True), ("auto", True, False, True),
                ("0", False, False, False), ("off", False, False, False),
                ("1", True, True, True), ("all", True, True, True),
                ("epilogues", True, True, False)):
            quant_linear.fusion_mode.cache_clear()
            if value is None:
                monkeypatch.delenv(quant_linear.FUSION_VARIABLE, raising=False)
            else:
                monkeypatch.setenv(quant_linear.FUSION_VARIABLE, value)
            assert quant_linear.fuses(fp8) is fp8_fused, value
            assert quant_linear.fuses(int4) is int4_fused, value
            if fp8_fused:
                assert quant_linear._norm_prologue(fp8) is norm, value
        quant_linear.fusion_mode.cache_clear()
        monkeypatch.setenv(quant_linear.FUSION_VARIABLE, "all")
        int4.input_perm = torch.arange(256)
        assert not quant_linear.fuses(int4)
        monkeypatch.setenv(quant_linear.FUSION_VARIABLE, "maybe")
        quant_linear.fusion_mode.cache_clear()
        with pytest.raises(ValueError, match=quant_linear.FUSION_VARIABLE):
            quant_linear.fuses(fp8)
    finally:
        quant_linear.fusion_mode.cache_clear()


def test_the_preload_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    """HAL_CUDA_GEMV_PRELOAD: on unless set to 0 (or off / false / no), a clear error for
    anything else."""
    from tessera.hal.cuda import native_gemv

    for value, want in ((None, True), ("0", False), ("1", True), ("on", True), ("no", False)):
        native_gemv.preload_default.cache_clear()
        if value is None:
            monkeypatch.delenv(native_gemv.PRELOAD_VARIABLE, raising=False)
        else:
            monkeypatch.setenv(native_gemv.PRELOAD_VARIABLE, value)
        assert native_gemv.preload_default() is want, value
    native_gemv.preload_default.cache_clear()
    monkeypatch.setenv(native_gemv.PRELOAD_VARIABLE, "sometimes")
    with pytest.raises(ValueError, match="HAL_CUDA_GEMV_PRELOAD"):
        native_gemv.preload_default()
    native_gemv.preload_default.cache_clear()
