"""The compiled quantized-linear kernels and the fp8 KV cache on a GPU, bf16, at Llama-3-8B
shapes, against their definitions; graph capture and replay of a quantized linear."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from tessera.hal.quant import (
    fp8_w8a8_reference,
    quant_linear_reference,
    quantize,
    quantize_activations_fp8,
)

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")]

SHAPES = [(6144, 4096), (4096, 14336), (1000, 4096)]  # qkv, down, a ragged row count


def _rel(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float((out.float() - ref.float()).norm() / ref.float().norm())


def _setup(scheme: str, group: int | None, n: int, k: int, m: int
           ) -> tuple[object, object, torch.Tensor]:
    from tessera.hal.cuda.quant_linear import prepare

    gen = torch.Generator(device="cuda").manual_seed(n + k + m)
    dense = torch.randn((n, k), device="cuda", generator=gen) * k ** -0.5
    w = prepare(quantize(dense, scheme, group))
    x = torch.randn((m, k), device="cuda", generator=gen).to(torch.bfloat16)
    return w, dense, x


@pytest.mark.parametrize("m", [1, 7, 32, 300])
@pytest.mark.parametrize("scheme,group", [("int4", 128), ("int4", 32), ("int8", 32),
                                          ("int8", 16), ("fp8", None)])
@pytest.mark.parametrize("n,k", SHAPES)
def test_quant_linear_bf16(n: int, k: int, scheme: str, group: int | None, m: int) -> None:
    from tessera.hal.cuda import quant_tune
    from tessera.hal.cuda.quant_linear import apply

    w, _, x = _setup(scheme, group, n, k, m)
    bias = torch.randn(n, device="cuda").to(torch.bfloat16)
    out = apply(x, w, bias)
    assert out.dtype == torch.bfloat16 and out.shape == (m, n)
    if scheme == "fp8" and m > 1 and quant_tune.is_w8a8(quant_tune.fp8_config(w, x, bias)):
        # W8A8 (the tuner's pick): activations in e4m3 too
        assert _rel(out, fp8_w8a8_reference(x, w, bias)) < 1e-2
        assert _rel(out, quant_linear_reference(x.float(), w, bias.float())) < 0.05
    elif scheme != "fp8" and m > 1 and \
            quant_tune.gemm_config(w, x, bias) == quant_tune.DEQUANT_MM:
        # the weight rounded to bf16 once, then cuBLAS
        assert _rel(out, quant_linear_reference(x.float(), w, bias.float())) < 8e-3
    else:  # exact weights, bf16 inputs, float32 sums: bf16 output rounding only
        assert _rel(out, quant_linear_reference(x.float(), w, bias.float())) < 4e-3


def test_fp8_activation_quantization_matches_torch() -> None:
    from tessera.hal.cuda.quant_linear import quantize_rows_fp8

    x = torch.randn((64, 4096), device="cuda") * torch.logspace(-3, 3, 64, device="cuda")[:, None]
    x = x.to(torch.bfloat16)
    q, s = quantize_rows_fp8(x)
    ref_q, ref_s = quantize_activations_fp8(x)
    torch.testing.assert_close(s, ref_s)
    assert torch.equal(q.view(torch.uint8), ref_q.view(torch.uint8))


def test_store_kv_fp8_matches_torch() -> None:
    from tessera.hal.cpu.dense import to_cache
    from tessera.hal.cuda.elementwise import store_kv

    k = (torch.randn((64, 8, 128), device="cuda") * 5).to(torch.bfloat16)
    v = (torch.randn((64, 8, 128), device="cuda")).to(torch.bfloat16)
    kc = torch.zeros((4096, 8, 128), device="cuda", dtype=torch.float8_e4m3fn)
    vc = torch.zeros_like(kc)
    slots = torch.randperm(4096, device="cuda")[:64].int()
    store_kv(kc, vc, k, v, slots, k_scale=0.02, v_scale=0.01)
    assert torch.equal(kc[slots.long()].view(torch.uint8),
                       to_cache(k, torch.float8_e4m3fn, 0.02).view(torch.uint8))
    assert torch.equal(vc[slots.long()].view(torch.uint8),
                       to_cache(v, torch.float8_e4m3fn, 0.01).view(torch.uint8))


@pytest.mark.parametrize("scheme", ["fp8", "int4"])
def test_quantized_linear_replays_in_a_graph(scheme: str) -> None:
    from tessera.hal.cuda.quant_linear import apply

    w, _, x = _setup(scheme, 128 if scheme == "int4" else None, 6144, 4096, 8)
    for m in (1, 8):
        xin = x[:m].clone()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            apply(xin, w, None)  # first use outside capture: the launch config is measured
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = apply(xin, w, None)
        xin.copy_(x[8 - m:])  # new inputs in the captured buffer
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, apply(xin, w, None))


@pytest.mark.parametrize("m", [64, 300])
def test_both_w8a8_paths(m: int) -> None:
    """The tuner picks between qgemm's fp8 dot and torch._scaled_mm: both must be right."""
    from tessera.hal.cuda.quant_linear import fp8_scaled_mm, qgemm

    w, _, x = _setup("fp8", None, 6144, 4096, m)
    ref = fp8_w8a8_reference(x, w)
    assert _rel(qgemm(x, w, None, 64, 128, 128, 4, 3, w8a8=True), ref) < 1e-2
    assert _rel(fp8_scaled_mm(x, w, None), ref) < 1e-2


@pytest.mark.parametrize("m", [1, 16, 32, 64, 128, 256])
@pytest.mark.parametrize("scheme", ["fp8", "int4"])
def test_every_tuner_candidate(scheme: str, m: int) -> None:
    """The tuner may pick any candidate for a shape and batch: each must compute the
    definition (the GEMV_DOT one-token tiles, the int4 "halves" tiles with the exponent-bit
    nibbles, fp8 W8A16 and W8A8 tiles, cuBLASLt)."""
    from tessera.hal.cuda import quant_tune

    w, _, x = _setup(scheme, 128 if scheme == "int4" else None, 6144, 4096, m)
    bias = torch.randn(6144, device="cuda").to(torch.bfloat16)
    exact = quant_linear_reference(x.float(), w, bias.float())
    bucket = quant_tune.batch_bucket(m)
    if m == 1:
        runs = {c: (lambda c=c: quant_tune.one_token(x, w, bias, c))
                for c in quant_tune.gemv_candidates(w)}
    elif scheme == "fp8":
        runs = {c: (lambda c=c: quant_tune.run_fp8(x, w, bias, c))
                for c in quant_tune.W8A8_CANDIDATES[bucket]
                if quant_tune.a8f_fits(c, w.in_features)}
    else:
        runs = {c: (lambda c=c: quant_tune.run_gemm(x, w, bias, c))
                for c in quant_tune.INT4_GEMM_CANDIDATES[bucket]}
    assert scheme == "fp8" or w.packing == "halves128"
    for cfg, run in runs.items():
        out = run()
        if scheme == "fp8" and m > 1 and quant_tune.is_w8a8(cfg):
            assert _rel(out, fp8_w8a8_reference(x, w, bias)) < 1e-2, cfg
        elif cfg == quant_tune.DEQUANT_MM:  # the weight rounded to bf16 once
            assert _rel(out, exact) < 8e-3, cfg
        else:
            assert _rel(out, exact) < 4e-3, cfg


def test_tuner_measure_times_the_device_not_the_host() -> None:
    """autotune.bench_ms hides the host's launch work behind a device-side spin: a call that
    spends 40 us on the host before launching a few-microsecond kernel measures as the
    kernel, so candidates are ranked by what they cost inside a CUDA graph."""
    import time

    from tessera.hal.cuda import autotune

    x = torch.zeros(1024, device="cuda")

    def run(_: tuple[int, ...]) -> torch.Tensor:
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < 40e-6:
            pass
        return x.add_(1.0)

    assert autotune.bench_ms(run, (0,)) < 0.02


# The CUDA C GEMV (native_gemv.py): every layout it takes, every config the tuner lists,
# against the definition and the Triton GEMV; under PDL in a graph between kernels that read
# and write what it reads and writes; an input it cannot take goes to the Triton GEMV.
NATIVE_LAYOUTS = [("fp8", None, True), ("int4", 128, True), ("int4", 64, True),
                  ("int4", 32, True), ("int4", "row", True), ("int4", 128, False),
                  ("int4", "row", False)]  # (scheme, group, prepared: halves tiles, else nibbles)


def _native_or_skip() -> object:
    from tessera.hal.cuda import native_gemv, nvrtc

    if not nvrtc.available():
        pytest.skip("the native GEMV needs cuda-python (cuda.bindings) on this machine")
    return native_gemv


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("n,k", [(1000, 4096), (4096, 14336), (37, 512)])
@pytest.mark.parametrize("scheme,group,prepared", NATIVE_LAYOUTS)
def test_native_gemv_every_layout_and_config(scheme: str, group: object, prepared: bool,
                                             n: int, k: int, dtype: torch.dtype) -> None:
    from tessera.hal.cuda import quant_tune
    from tessera.hal.cuda.quant_linear import prepare

    native = _native_or_skip()
    gen = torch.Generator(device="cuda").manual_seed(n + k)
    dense = torch.randn((n, k), device="cuda", generator=gen) * k ** -0.5
    w = quantize(dense, scheme, k if group == "row" else group)  # type: ignore[arg-type]
    if prepared:
        w = prepare(w)
    else:
        assert w.packing == "nibbles"
    assert native.weight_fits(w), (w.scheme, w.packing, w.group_size)
    x = (torch.randn((1, k), device="cuda", generator=gen) * 3).to(dtype)
    bias = torch.randn(n, device="cuda", generator=gen).to(dtype)
    exact = quant_linear_reference(x.float(), w, bias.float())
    triton_out = quant_tune.one_token(x, w, bias, quant_tune.GEMV_CANDIDATES[scheme][0]) \
        if prepared else None
    configs = quant_tune.NATIVE_CANDIDATES[scheme]
    assert native.fits(w, x)
    for cfg in configs:
        rows, unroll, warps, _ = cfg
        for b in (bias, None):
            out = native.qgemv(x, w, b, rows, unroll, warps)
            assert out.dtype == dtype and out.shape == (1, n)
            want = exact if b is not None else quant_linear_reference(x.float(), w)
            assert _rel(out, want) < 4e-3, (cfg, b is None)
        if triton_out is not None:
            assert _rel(native.qgemv(x, w, bias, rows, unroll, warps), triton_out) < 4e-3, cfg


def _check_pdl_graph(chain: Callable[[torch.Tensor], torch.Tensor], x0: torch.Tensor) -> None:
    """chain(x) launched with PDL forced on equals its plain launches, eagerly and captured
    in a graph replayed over fresh inputs, bit for bit."""
    from tessera.hal.cuda import pdl

    with pdl.forced(False):
        want = chain(x0)
    with pdl.forced(True):
        assert torch.equal(chain(x0), want)
        static = x0.clone()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            chain(static)  # warm (compiles the PDL variant)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = chain(static)
        for seed in range(3):
            fresh = torch.randn(tuple(x0.shape), device="cuda",
                                generator=torch.Generator(device="cuda").manual_seed(seed))
            static.copy_(fresh.to(x0.dtype))
            graph.replay()
            with pdl.forced(False):
                assert torch.equal(out, chain(static)), seed


@pytest.mark.parametrize("preload", [False, True])
@pytest.mark.parametrize("scheme", ["fp8", "int4"])
def test_native_gemv_under_pdl_in_a_graph(scheme: str, preload: bool) -> None:
    """norm -> GEMV -> norm -> GEMV, each launched with PDL where the mode is on, captured
    and replayed: the GEMV waits for the norm that writes its x, and the norm after it for
    its output (the chain's result equals the plain launches' one exactly)."""
    from tessera.hal.cuda import norm
    from tessera.hal.cuda.quant_linear import prepare

    native = _native_or_skip()
    k = 4096
    gen = torch.Generator(device="cuda").manual_seed(7)
    ws = [prepare(quantize(torch.randn((k, k), device="cuda", generator=gen) * k ** -0.5,
                           scheme, None)) for _ in range(2)]
    nw = torch.rand(k, device="cuda", generator=gen).to(torch.bfloat16) + 0.5
    x0 = torch.randn((1, k), device="cuda", generator=gen).to(torch.bfloat16)

    def chain(x: torch.Tensor) -> torch.Tensor:
        for w in ws:
            x = native.qgemv(norm.rms_norm(x, nw, 1e-6), w, None, 4, 1, 8, preload=preload)
        return x

    _check_pdl_graph(chain, x0)


def test_native_config_falls_back_for_an_unaligned_input() -> None:
    """A native config chosen for a shape, then an x the kernel cannot load 16 bytes at a
    time (a view 2 bytes into its buffer): the Triton GEMV computes it."""
    from tessera.hal.cuda import quant_tune

    native = _native_or_skip()
    w, _, _ = _setup("int4", 128, 1000, 4096, 1)
    buf = torch.randn((1, 4097), device="cuda").to(torch.bfloat16)
    x = buf[:, 1:]
    assert not native.input_fits(x)
    cfg = quant_tune.NATIVE_CANDIDATES["int4"][0]
    out = quant_tune.one_token(x, w, None, cfg)
    assert _rel(out, quant_linear_reference(x.float(), w)) < 4e-3


# int4's tensor-core GEMV (native_gemv_mma.py, HAL_CUDA_INT4_MMA): every config the tuner
# lists, against the definition, with x's tiles at very different magnitudes (each staged at
# its own power of two); under PDL in a graph; a weight it does not take.
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("n,k", [(4096, 14336), (6144, 4096), (48, 384)])
def test_int4_mma_gemv_every_config(n: int, k: int, dtype: torch.dtype) -> None:
    from tessera.hal.cuda import native_gemv_mma, quant_tune
    from tessera.hal.cuda.quant_linear import prepare

    native = _native_or_skip()
    gen = torch.Generator(device="cuda").manual_seed(n + k)
    w = prepare(quantize(torch.randn((n, k), device="cuda", generator=gen) * k ** -0.5,
                         "int4", 128))
    assert native_gemv_mma.weight_fits(w), (w.packing, w.group_size)
    x = (torch.randn((1, k), device="cuda", generator=gen) * 3)
    x[:, :128] *= 300.0
    x[:, 128:256] *= 1e-3
    x = x.to(dtype)
    bias = torch.randn(n, device="cuda", generator=gen).to(dtype)
    exact = quant_linear_reference(x.float(), w, bias.float())
    plain = quant_linear_reference(x.float(), w)
    for rows, unroll, warps, _ in quant_tune.MMA_CANDIDATES:
        if n % rows:
            with pytest.raises(native.NotTaken):
                native_gemv_mma.qgemv(x, w, bias, rows, unroll, warps)
            continue
        for b, want in ((bias, exact), (None, plain)):
            out = native_gemv_mma.qgemv(x, w, b, rows, unroll, warps)
            assert out.dtype == dtype and out.shape == (1, n)
            assert _rel(out, want) < 4e-3, (rows, unroll, warps, b is None)
    row_w = prepare(quantize(torch.randn((n, k), device="cuda") * 0.02, "int4", k))
    assert not native_gemv_mma.weight_fits(row_w)  # one scale a row: the CUDA-core GEMV's
    with pytest.raises(native.NotTaken):
        native_gemv_mma.qgemv(x, row_w, None, 16, 1, 4)


def test_int4_mma_gemv_under_pdl_in_a_graph() -> None:
    """norm -> GEMV -> norm -> GEMV through the tensor-core GEMV, captured and replayed under
    PDL: the same result as the plain launches, bit for bit, for fresh inputs."""
    from tessera.hal.cuda import native_gemv_mma, norm
    from tessera.hal.cuda.quant_linear import prepare

    _native_or_skip()
    k = 4096
    gen = torch.Generator(device="cuda").manual_seed(11)
    ws = [prepare(quantize(torch.randn((k, k), device="cuda", generator=gen) * k ** -0.5,
                           "int4", 128)) for _ in range(2)]
    nw = torch.rand(k, device="cuda", generator=gen).to(torch.bfloat16) + 0.5
    x0 = torch.randn((1, k), device="cuda", generator=gen).to(torch.bfloat16)

    def chain(x: torch.Tensor) -> torch.Tensor:
        for w in ws:
            x = native_gemv_mma.qgemv(norm.rms_norm(x, nw, 1e-6), w, None, 32, 1, 4)
        return x

    _check_pdl_graph(chain, x0)


# The native GEMV's fusions (QuantLinearKernel.one_token_fused): an RMSNorm of x as its
# prologue, a residual add or the gated SiLU as its epilogue, every layout and config.
FUSIONS = [("norm", True, False, False), ("residual", False, True, False),
           ("norm-silu", True, False, True), ("silu", False, False, True)]


@pytest.mark.parametrize("fusion,norm_on,res_on,silu", FUSIONS, ids=[f[0] for f in FUSIONS])
@pytest.mark.parametrize("n,k", [(2048, 4096), (4096, 1024), (74, 512)])
@pytest.mark.parametrize("scheme,group,prepared", NATIVE_LAYOUTS)
def test_native_gemv_fusions(scheme: str, group: object, prepared: bool, n: int, k: int,
                             fusion: str, norm_on: bool, res_on: bool, silu: bool) -> None:
    from tessera.hal.cuda import elementwise, norm, quant_tune
    from tessera.hal.cuda.quant_linear import prepare
    from tessera.hal.quant import one_token_fused_reference

    native = _native_or_skip()
    gen = torch.Generator(device="cuda").manual_seed(n + k + len(fusion))
    dense = torch.randn((n, k), device="cuda", generator=gen) * k ** -0.5
    w = quantize(dense, scheme, k if group == "row" else group)  # type: ignore[arg-type]
    if prepared:
        w = prepare(w)
    x = (torch.randn((1, k), device="cuda", generator=gen) * 3).to(torch.bfloat16)
    gain = (torch.rand(k, device="cuda", generator=gen) + 0.5).to(torch.bfloat16)
    res = torch.randn((1, n), device="cuda", generator=gen).to(torch.bfloat16)
    bias = torch.randn(n, device="cuda", generator=gen).to(torch.bfloat16)
    nrm = (gain, 1e-5) if norm_on else None
    resid = res if res_on else None
    want = one_token_fused_reference(x.float(), w, bias.float(),
                                     norm=None if nrm is None else (gain.float(), 1e-5),
                                     residual=None if resid is None else res.float(),
                                     silu=silu)
    for cfg in quant_tune.NATIVE_CANDIDATES[scheme]:
        rows, unroll, warps, _ = cfg
        if silu and rows % 2:
            with pytest.raises(native.NotTaken):
                native.qgemv(x, w, bias, rows, unroll, warps, norm=nrm, silu=True)
            continue
        out = native.qgemv(x, w, bias, rows, unroll, warps, norm=nrm, residual=resid,
                           silu=silu)
        assert out.shape == (1, n // 2 if silu else n) and out.dtype == torch.bfloat16
        assert _rel(out, want) < 6e-3, cfg
        if not norm_on:  # the epilogue rounds as the composition of the plain ops does
            plain = native.qgemv(x, w, bias, rows, unroll, warps)
            composed = elementwise.silu_and_mul(plain) if silu else plain + res
            if silu:
                assert _rel(out, composed) < 2e-3, cfg
            else:
                assert torch.equal(out, composed), cfg
        else:
            composed = native.qgemv(norm.rms_norm(x, gain, 1e-5), w, bias, rows, unroll,
                                    warps)
            if silu:
                composed = elementwise.silu_and_mul(composed)
            assert _rel(out, composed) < 6e-3, cfg
    # the plugin's entry point: tuned, and the same values
    fused = quant_tune.one_token_fused(x, w, bias, nrm, resid, silu)
    assert _rel(fused, want) < 6e-3


@pytest.mark.parametrize("norm_on", [False, True])
@pytest.mark.parametrize("scheme,group,prepared", [("fp8", None, True), ("int4", 128, True),
                                                   ("int4", "row", False)])
def test_native_gemv_rotary_epilogue(scheme: str, group: object, prepared: bool,
                                     norm_on: bool) -> None:
    """The ROPE epilogue at Llama-3-8B's qkv (32 / 8 heads of 128), every config that pairs
    its rows: the rotated q out, k and v in the cache slot (nothing else written), as the
    plain GEMV followed by rotary_store_kv."""
    from tessera.hal.cuda import elementwise, norm, quant_tune
    from tessera.hal.cuda.quant_linear import prepare
    from tessera.hal.platform import RotaryStore
    from tessera.hal.rope import cos_sin_cache

    native = _native_or_skip()
    hq, hk, d, k = 32, 8, 128, 4096
    gen = torch.Generator(device="cuda").manual_seed(5)
    dense = torch.randn(((hq + 2 * hk) * d, k), device="cuda", generator=gen) * k ** -0.5
    w = quantize(dense, scheme, k if group == "row" else group)  # type: ignore[arg-type]
    if prepared:
        w = prepare(w)
    x = (torch.randn((1, k), device="cuda", generator=gen) * 3).to(torch.bfloat16)
    gain = (torch.rand(k, device="cuda", generator=gen) + 0.5).to(torch.bfloat16)
    table = cos_sin_cache(d, 4096, 500000.0, None, "cuda", torch.bfloat16)
    pos = torch.tensor([3001], device="cuda")
    slot = torch.tensor([77], device="cuda")
    nrm = (gain, 1e-5) if norm_on else None
    ran = 0
    for cfg in quant_tune.NATIVE_CANDIDATES[scheme]:
        rows, unroll, warps, _ = cfg
        kc = torch.zeros((128, hk, d), device="cuda", dtype=torch.bfloat16)
        vc = torch.zeros_like(kc)
        rope = RotaryStore(pos, table, kc, vc, slot, hq, hk, d)
        if rows % 2 or (d // 2) % (rows // 2):
            with pytest.raises(native.NotTaken):
                native.qgemv(x, w, None, rows, unroll, warps, norm=nrm, rope=rope)
            continue
        q = native.qgemv(x, w, None, rows, unroll, warps, norm=nrm, rope=rope)
        ran += 1
        h = norm.rms_norm(x, gain, 1e-5) if norm_on else x
        y = native.qgemv(h, w, None, rows, unroll, warps)
        qs, ks, vs = y.split([hq * d, hk * d, hk * d], dim=-1)
        kc2, vc2 = torch.zeros_like(kc), torch.zeros_like(vc)
        q2 = elementwise.rotary_store_kv(pos, qs.view(1, hq, d), ks.view(1, hk, d),
                                         vs.view(1, hk, d), table, kc2, vc2, slot)
        tol = 6e-3 if norm_on else 1e-3  # the normed x rounded by the composition only
        assert q.shape == (1, hq * d) and _rel(q, q2.view(1, -1)) < tol, cfg
        assert _rel(kc[77], kc2[77]) < tol and _rel(vc[77], vc2[77]) < tol, cfg
        if not norm_on:
            assert torch.equal(vc[77], vc2[77]), cfg  # v: the rounded product itself
        others = torch.ones(128, dtype=torch.bool)
        others[77] = False
        assert not kc[others].any() and not vc[others].any(), cfg
    assert ran


def test_one_token_fused_composes_what_the_kernel_does_not_take() -> None:
    """An x the native GEMV cannot load (a view 2 bytes into its buffer): the plugin's
    one_token_fused composes its ops instead, with the same values."""
    from tessera.hal.cuda.quant_linear import one_token_fused
    from tessera.hal.quant import one_token_fused_reference

    native = _native_or_skip()
    w, _, _ = _setup("fp8", None, 512, 1024, 1)
    buf = torch.randn((1, 1025), device="cuda").to(torch.bfloat16)
    x = buf[:, 1:]
    assert not native.input_fits(x)
    gain = torch.ones(1024, device="cuda", dtype=torch.bfloat16)
    out = one_token_fused(x, w, None, norm=(gain, 1e-6), silu=True)
    want = one_token_fused_reference(x.float(), w, None, norm=(gain.float(), 1e-6), silu=True)
    assert out.shape == (1, 256) and _rel(out, want) < 6e-3


@pytest.mark.parametrize("scheme", ["fp8", "int4"])
def test_fused_layer_chain_under_pdl_in_a_graph(scheme: str) -> None:
    """A decoder layer's fused products in a row (qkv with the norm and the rotary / KV store,
    o with the residual, gate/up with the norm and SiLU, down with the residual; an add
    reading the stored v between), each launched with PDL where
    the mode is on, captured and replayed: every kernel waits for what it reads, including
    the residual written two launches before (the result equals the plain launches' one
    exactly)."""
    from tessera.hal.cuda.quant_linear import prepare
    from tessera.hal.platform import RotaryStore
    from tessera.hal.rope import cos_sin_cache

    native = _native_or_skip()
    h, inter = 4096, 14336
    gen = torch.Generator(device="cuda").manual_seed(11)

    def weight(n: int, k: int) -> object:
        return prepare(quantize(torch.randn((n, k), device="cuda", generator=gen) * k ** -0.5,
                                scheme, None if scheme == "fp8" else 128))

    qkv, o, gate_up, down = weight(6144, h), weight(h, 4096), weight(2 * inter, h), \
        weight(h, inter)
    g1, g2 = [(torch.rand(h, device="cuda", generator=gen) + 0.5).to(torch.bfloat16)
              for _ in range(2)]
    x0 = torch.randn((1, h), device="cuda", generator=gen).to(torch.bfloat16)

    table = cos_sin_cache(128, 4096, 500000.0, None, "cuda", torch.bfloat16)
    kc = torch.zeros((64, 8, 128), device="cuda", dtype=torch.bfloat16)
    vc = torch.zeros_like(kc)
    rope = RotaryStore(torch.tensor([100], device="cuda"), table, kc, vc,
                       torch.tensor([5], device="cuda"), 32, 8, 128)

    def layer(x: torch.Tensor) -> torch.Tensor:
        for _ in range(2):
            a = native.qgemv(x, qkv, None, 4, 1, 8, norm=(g1, 1e-5), rope=rope)
            a = a + vc[5].view(1, -1).repeat(1, 4)  # reads the v the epilogue stored
            x = native.qgemv(a, o, None, 4, 1, 8, residual=x)
            act = native.qgemv(x, gate_up, None, 4, 1, 8, norm=(g2, 1e-5), silu=True)
            x = native.qgemv(act, down, None, 4, 1, 8, residual=x)
        return x

    _check_pdl_graph(layer, x0)


@pytest.mark.parametrize("m", [2, 64, 256])
@pytest.mark.parametrize("fusion", ["norm", "norm+residual", "silu"])
def test_rows_fused_fp8_is_its_composition(m: int, fusion: str) -> None:
    """rows_fused over an fp8 weight at Llama-3-8B's widths (4096 in, gate/up's 14336 for the
    SiLU): wherever the tuner's pick is W8A8 the norm's or the SiLU's kernel quantizes the
    activations. The compiled kernels may sum a row's squares in another order than the
    norm's own kernel (their layouts differ), so a normed element may round to the next
    bf16 and its e4m3 value move a step (call 59: 256 rows at 4096, some outputs apart): the
    quantized activations agree but for a few elements, one e4m3 step each, and the output
    is the composition's within 1e-3 relative; the new residual is fused_add_rms_norm's bit
    for bit. (The interpreter's test holds them equal.)"""
    from tessera.hal.cuda import quant_tune
    from tessera.hal.cuda.elementwise import silu_and_mul
    from tessera.hal.cuda.norm import fused_add_rms_norm, rms_norm
    from tessera.hal.cuda.quant_linear import apply, prepare, rows_fused

    gen = torch.Generator(device="cuda").manual_seed(60)
    k = 14336 if fusion == "silu" else 4096
    w = prepare(quantize(torch.randn((1024, k), device="cuda", generator=gen) / k ** 0.5,
                         "fp8").to(torch.device("cuda")))
    x = torch.randn((m, 2 * k if fusion == "silu" else k), device="cuda",
                    generator=gen).to(torch.bfloat16)
    gain = (torch.rand(4096, device="cuda", generator=gen) + 0.5).to(torch.bfloat16)
    res = torch.randn((m, 4096), device="cuda", generator=gen).to(torch.bfloat16) \
        if fusion == "norm+residual" else None
    if fusion == "silu":
        got, got_res = rows_fused(x, w, None, silu=True)
        want, want_res = apply(silu_and_mul(x), w, None), None
    elif res is None:
        got, got_res = rows_fused(x, w, None, norm=(gain, 1e-5))
        want, want_res = apply(rms_norm(x, gain, 1e-5), w, None), None
    else:
        got, got_res = rows_fused(x, w, None, norm=(gain, 1e-5), residual=res)
        h, want_res = fused_add_rms_norm(x, res, gain, 1e-5)
        want = apply(h, w, None)
    rel = float((got.float() - want.float()).norm() / want.float().norm())
    assert rel < 1e-3, rel
    assert (got_res is None) == (want_res is None)
    if want_res is not None:
        assert torch.equal(got_res, want_res)
    # the activations themselves
    from tessera.hal.cuda.elementwise import silu_and_mul_quant_fp8
    from tessera.hal.cuda.norm import rms_norm_quant_fp8
    from tessera.hal.cuda.quant_linear import quantize_rows_fp8

    if fusion == "silu":
        q, scales = silu_and_mul_quant_fp8(x)
        want_q, want_scales = quantize_rows_fp8(silu_and_mul(x))
    else:
        q, scales, _ = rms_norm_quant_fp8(x, gain, 1e-5, res)
        want_q, want_scales = quantize_rows_fp8(rms_norm(x, gain, 1e-5) if res is None
                                                else fused_add_rms_norm(x, res, gain, 1e-5)[0])
    a, b = q.float() * scales, want_q.float() * want_scales  # the values they stand for
    apart = a != b
    assert float(apart.float().mean()) < 1e-3
    assert bool(((a - b).abs() <= b.abs() * 2 ** -3 + 2 ** -9 * want_scales)[apart].all())
    config = quant_tune.fp8_config(w, x[:, :k], None)
    print(f"rows_fused m={m} {fusion}: config {config}, W8A8 {quant_tune.is_w8a8(config)}, "
          f"output {rel:.2e} apart, {int(apart.sum())} activations apart")
