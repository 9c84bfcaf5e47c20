"""Conformance of quantized linears (part of hal/conformance.py's suite; run through it).

For every scheme the plugin runs (natively or through its declared reference fallback), the
`linear_kernel(scheme)` output is compared with the scheme's definition,
x @ dequantize(w)^T (+ bias), computed in float32 on the CPU from the same quantized weight and
the same input values. Outputs have unit variance (weights scaled by 1/sqrt(in)), so the
tolerances mean the same at every size. Stated tolerances:

    int8, int4  the dense tolerances of the dtype (hal/conformance.py TOLERANCES): the weight
                values are exact integers times float32 scales; only summation order and the
                output's rounding differ
    fp8         relative L2 error <= 0.05 and max error <= 0.25: an fp8 tensor-core GEMM
                quantizes the activations to e4m3 per token (W8A8, 3 mantissa bits; the
                emulation in hal/quant/reference.py measures about 0.027 and 0.11 here)

A scheme the plugin does not declare must raise MissingSchemeError naming it and the plugin.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from tessera.hal.errors import MissingSchemeError
from tessera.hal.platform import Platform
from tessera.hal.quant import (
    SCHEMES,
    QuantizedWeight,
    one_token_fused_reference,
    quant_linear_reference,
    quantize,
    rows_fused_reference,
)

FP8_REL_L2 = 0.05
FP8_MAX_ABS = 0.25
# (scheme, group size): the group sizes the checkpoint formats produce (Q6_K 16, GGUF 32,
# AWQ/GPTQ 128; fp8 is per output row).
QUANT_CASES = (("fp8", None), ("int8", 16), ("int8", 128), ("int4", 32), ("int4", 128))


def _dense_tolerance(dtype: torch.dtype) -> dict[str, float]:
    from tessera.hal.conformance import TOLERANCES

    return TOLERANCES[dtype]


def _quant_close(scheme: str, actual: torch.Tensor, expected: torch.Tensor,
                 dtype: torch.dtype) -> None:
    assert actual.dtype == dtype, f"output dtype {actual.dtype}, expected {dtype}"
    assert actual.shape == expected.shape, f"shape {tuple(actual.shape)}, expected " \
        f"{tuple(expected.shape)}"
    got, want = actual.cpu().float(), expected.cpu().float()
    if scheme != "fp8":
        tol = _dense_tolerance(dtype)
        torch.testing.assert_close(got, want, atol=tol["atol"], rtol=tol["rtol"])
        return
    if want.numel() == 0:
        return
    rel = float((got - want).norm() / want.norm().clamp_min(1e-12))
    worst = float((got - want).abs().max())
    assert rel <= FP8_REL_L2 and worst <= FP8_MAX_ABS, \
        f"fp8 linear off its definition: relative L2 {rel:.4f} (<= {FP8_REL_L2}), max " \
        f"{worst:.4f} (<= {FP8_MAX_ABS})"


def _weight(scheme: str, group: int | None, out_f: int, in_f: int, seed: int
            ) -> QuantizedWeight:
    gen = torch.Generator().manual_seed(seed)
    dense = torch.randn((out_f, in_f), generator=gen) / math.sqrt(in_f)
    return quantize(dense, scheme, group)


def _runs(platform: Platform, scheme: str) -> bool:
    source = getattr(platform, "scheme_source", None)
    if source is not None:
        return bool(source(scheme) != "missing")
    return scheme in platform.capabilities.quant_schemes


def test_quant_schemes_resolve_or_refuse(hal_platform: Platform) -> None:
    declared = hal_platform.capabilities.quant_schemes
    assert set(declared) <= set(SCHEMES), f"unknown schemes declared: {declared}"
    for scheme in SCHEMES:
        if _runs(hal_platform, scheme):
            kernel = hal_platform.linear_kernel(scheme)
            assert kernel.scheme == scheme and callable(kernel)
        else:
            with pytest.raises(MissingSchemeError) as info:
                hal_platform.linear_kernel(scheme)
            assert scheme in str(info.value) and hal_platform.name in str(info.value)


@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("tokens", [0, 1, 5, 40])
@pytest.mark.parametrize("scheme,group", QUANT_CASES, ids=[f"{s}-g{g}" for s, g in QUANT_CASES])
def test_quant_linear(hal_platform: Platform, dtype: torch.dtype, scheme: str,
                      group: int | None, tokens: int, with_bias: bool) -> None:
    if not _runs(hal_platform, scheme):
        pytest.skip(f"{hal_platform.name} does not run {scheme} (checked to refuse it above)")
    # 272 outputs: not a multiple of the usual tiles; 256 inputs: two groups of 128
    w = _weight(scheme, group, 272, 256, seed=30)
    gen = torch.Generator().manual_seed(31)
    x = torch.randn((tokens, 256), generator=gen).to(dtype)
    bias = torch.randn((272,), generator=gen).to(dtype) if with_bias else None
    kernel = hal_platform.linear_kernel(scheme)
    dev = hal_platform.device()
    prepared = kernel.prepare(w.to(dev))
    out = kernel(x.to(dev), prepared, None if bias is None else bias.to(dev))
    _quant_close(scheme, out, quant_linear_reference(x.float(), w, bias), dtype)


def _fusing_kernel(platform: Platform, scheme: str, fusion: str) -> Any:
    """The platform's kernel for scheme, skipping the test where the plugin does not run
    the scheme or offers no `fusion` (one_token_fused, rows_fused) for it."""
    if not _runs(platform, scheme):
        pytest.skip(f"{platform.name} does not run {scheme}")
    kernel = platform.linear_kernel(scheme)
    if getattr(kernel, fusion) is None:
        pytest.skip(f"{platform.name} has no {fusion} for {scheme}")
    return kernel


# (norm, residual, silu): the fusions QuantLinearKernel.one_token_fused takes
ONE_TOKEN_FUSIONS = ((True, False, False), (False, True, False), (True, False, True),
                     (False, False, True))


@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("norm,residual,silu", ONE_TOKEN_FUSIONS,
                         ids=["norm", "residual", "norm-silu", "silu"])
@pytest.mark.parametrize("scheme,group", QUANT_CASES, ids=[f"{s}-g{g}" for s, g in QUANT_CASES])
def test_quant_one_token_fused(hal_platform: Platform, dtype: torch.dtype, scheme: str,
                               group: int | None, norm: bool, residual: bool, silu: bool,
                               with_bias: bool) -> None:
    """one_token_fused against its definition, the composition, in float32 from the same
    values (the plugin's composition rounds the normed x and the gate/up outputs to dtype
    on the way: within the dtype's tolerance)."""
    kernel = _fusing_kernel(hal_platform, scheme, "one_token_fused")
    w = _weight(scheme, group, 272, 256, seed=36)
    gen = torch.Generator().manual_seed(37)
    x = (torch.randn((1, 256), generator=gen) * 3).to(dtype)
    gain = (torch.rand((256,), generator=gen) + 0.5).to(dtype)
    res = torch.randn((1, 272), generator=gen).to(dtype)
    bias = torch.randn((272,), generator=gen).to(dtype) if with_bias else None
    dev = hal_platform.device()
    prepared = kernel.prepare(w.to(dev))
    kw: dict[str, Any] = {"silu": silu}
    if norm:
        kw["norm"] = (gain.to(dev), 1e-5)
    if residual:
        kw["residual"] = res.to(dev)
    out = kernel.one_token_fused(x.to(dev), prepared, None if bias is None else bias.to(dev),
                                 **kw)
    want_kw: dict[str, Any] = {"silu": silu}
    if norm:
        want_kw["norm"] = (gain.float(), 1e-5)
    if residual:
        want_kw["residual"] = res.float()
    want = one_token_fused_reference(x.float(), w, None if bias is None else bias.float(),
                                     **want_kw)
    assert out.shape == (1, 136 if silu else 272)
    _quant_close(scheme, out, want.to(dtype), dtype)
    with pytest.raises(ValueError):
        kernel.one_token_fused(x.to(dev), prepared, None, residual=res.to(dev), silu=True)


@pytest.mark.parametrize("tokens", [2, 40])
@pytest.mark.parametrize("fusion", ["norm", "norm+residual", "silu"])
@pytest.mark.parametrize("scheme,group", QUANT_CASES, ids=[f"{s}-g{g}" for s, g in QUANT_CASES])
def test_quant_rows_fused(hal_platform: Platform, dtype: torch.dtype, scheme: str,
                          group: int | None, fusion: str, tokens: int) -> None:
    """rows_fused against its definition, the composition, in float32 from the same values
    (the plugin rounds the normed x or the SiLU's output to dtype on the way: within the
    dtype's tolerance); the new residual exactly the plugin's fused_add_rms_norm's."""
    kernel = _fusing_kernel(hal_platform, scheme, "rows_fused")
    w = _weight(scheme, group, 272, 256, seed=50)
    gen = torch.Generator().manual_seed(51)
    silu = fusion == "silu"
    # the SiLU's input at unit scale: its products reach the magnitudes fp8's absolute bound
    # (FP8_MAX_ABS) is stated for; the norm's output is at unit scale whatever x's
    x = (torch.randn((tokens, 512 if silu else 256), generator=gen) * (1 if silu else 3)
         ).to(dtype)
    gain = (torch.rand((256,), generator=gen) + 0.5).to(dtype)
    res = torch.randn((tokens, 256), generator=gen).to(dtype) if "residual" in fusion else None
    bias = torch.randn((272,), generator=gen).to(dtype)
    dev = hal_platform.device()
    prepared = kernel.prepare(w.to(dev))
    kw: dict[str, Any] = {"silu": True} if silu else {
        "norm": (gain.to(dev), 1e-5), "residual": None if res is None else res.to(dev)}
    out, res_out = kernel.rows_fused(x.to(dev), prepared, bias.to(dev), **kw)
    want_kw: dict[str, Any] = {"silu": True} if silu else {
        "norm": (gain.float(), 1e-5), "residual": None if res is None else res.float()}
    want, _ = rows_fused_reference(x.float(), w, bias.float(), **want_kw)
    assert out.shape == (tokens, 272)
    _quant_close(scheme, out, want.to(dtype), dtype)
    assert (res_out is None) == (res is None)
    if res is not None and res_out is not None:
        _, plugin_res = hal_platform.op("fused_add_rms_norm")(x.to(dev), res.to(dev),
                                                              gain.to(dev), 1e-5)
        assert torch.equal(res_out.cpu(), plugin_res.cpu())
    with pytest.raises(ValueError):
        kernel.rows_fused(x.to(dev), prepared, None, norm=(gain.to(dev), 1e-5), silu=True)


@pytest.mark.parametrize("norm", [False, True])
@pytest.mark.parametrize("scheme,group", QUANT_CASES, ids=[f"{s}-g{g}" for s, g in QUANT_CASES])
def test_quant_one_token_fused_rope(hal_platform: Platform, dtype: torch.dtype, scheme: str,
                                    group: int | None, norm: bool) -> None:
    """one_token_fused with rope: the rotated q out, the rotated k and v in the cache slot,
    nothing else of the cache touched, against the composition in float32."""
    from tessera.hal.platform import RotaryStore
    from tessera.hal.rope import cos_sin_cache

    kernel = _fusing_kernel(hal_platform, scheme, "one_token_fused")
    hq, hk, d, slots = 4, 2, 64, 24
    w = _weight(scheme, group, (hq + 2 * hk) * d, 256, seed=38)
    gen = torch.Generator().manual_seed(39)
    x = (torch.randn((1, 256), generator=gen) * 3).to(dtype)
    gain = (torch.rand((256,), generator=gen) + 0.5).to(dtype)
    table = cos_sin_cache(d, 64, 10000.0, None, "cpu", dtype)
    pos, slot = torch.tensor([37]), torch.tensor([13])
    dev = hal_platform.device()
    caches = [torch.randn((slots, hk, d), generator=gen).to(dtype) for _ in range(2)]
    got_k, got_v = (c.to(dev) for c in caches)
    rope = RotaryStore(pos.to(dev), table.to(dev), got_k, got_v, slot.to(dev), hq, hk, d)
    prepared = kernel.prepare(w.to(dev))
    out = kernel.one_token_fused(x.to(dev), prepared, None,
                                 norm=(gain.to(dev), 1e-5) if norm else None, rope=rope)
    want_k, want_v = (c.float() for c in caches)
    want = one_token_fused_reference(
        x.float(), w, None, norm=(gain.float(), 1e-5) if norm else None,
        rope=RotaryStore(pos, table.float(), want_k, want_v, slot, hq, hk, d))
    assert out.shape == (1, hq * d)
    _quant_close(scheme, out, want.to(dtype), dtype)
    _quant_close(scheme, got_k[13].reshape(1, -1), want_k[13].reshape(1, -1).to(dtype), dtype)
    _quant_close(scheme, got_v[13].reshape(1, -1), want_v[13].reshape(1, -1).to(dtype), dtype)
    others = [i for i in range(slots) if i != 13]
    assert torch.equal(got_k[others].cpu(), caches[0][others])
    assert torch.equal(got_v[others].cpu(), caches[1][others])


def test_quant_prepare_keeps_the_values(hal_platform: Platform) -> None:
    for scheme, group in QUANT_CASES:
        if not _runs(hal_platform, scheme):
            continue
        w = _weight(scheme, group, 48, 256, seed=32)
        prepared = hal_platform.linear_kernel(scheme).prepare(w.to(hal_platform.device()))
        assert torch.equal(prepared.dequantize().cpu(), w.dequantize()), scheme


def test_quant_linear_act_order(hal_platform: Platform, dtype: torch.dtype) -> None:
    """GPTQ act-order: the input columns are permuted before the product."""
    if not _runs(hal_platform, "int4"):
        pytest.skip(f"{hal_platform.name} does not run int4")
    w = _weight("int4", 64, 96, 256, seed=33)
    w.input_perm = torch.randperm(256, generator=torch.Generator().manual_seed(34))
    x = torch.randn((3, 256), generator=torch.Generator().manual_seed(35)).to(dtype)
    kernel = hal_platform.linear_kernel("int4")
    out = kernel(x.to(hal_platform.device()), kernel.prepare(w.to(hal_platform.device())))
    _quant_close("int4", out, quant_linear_reference(x.float(), w), dtype)


# --- fp8 KV cache ------------------------------------------------------------------------------
FP8_KV_SCALES = (0.05, 0.02)  # (k_scale, v_scale): values of ~1 land mid-range of e4m3
FP8_E4M3_SUBNORMAL_STEP = 2.0 ** -9  # the spacing of e4m3's subnormals (and of 0 to them)


def assert_fp8_within_one_step(got: torch.Tensor, want: torch.Tensor) -> None:
    """got and want (e4m3 values as float) at most one e4m3 step apart: a kernel that
    rounds a tie, or an input one ulp away, the other way. A step is 2^-3 of the value's
    binade (<= 2^-3 |want|) among normal numbers and 2^-9 among subnormals, where a relative
    bound alone would demand equality (an H200 run rounded a 2^-9 to 0 that way)."""
    bound = torch.maximum(want.abs() * 2 ** -3, torch.full_like(want, FP8_E4M3_SUBNORMAL_STEP))
    diff = (got - want).abs()
    assert bool((diff <= bound).all()), \
        f"fp8 values more than one e4m3 step apart: max {float((diff - bound).max()):+.3g} " \
        f"past the bound, at want={float(want.flatten()[int((diff - bound).argmax())]):.4g}"


def _fp8_kv(platform: Platform) -> bool:
    return "fp8_e4m3" in platform.capabilities.kv_cache_dtypes


def _fp8_case(seq_lens: tuple[int, ...], extend_lens: tuple[int, ...], dtype: torch.dtype,
              seed: int) -> tuple[Any, torch.Tensor, torch.Tensor]:
    """A paged case whose caches are fp8 (k / k_scale), and the float caches they stand for."""
    from tessera.hal.conformance_data import make_paged_case
    from tessera.hal.cpu.dense import to_cache

    case = make_paged_case(seq_lens, extend_lens, 8, 2, 64, dtype, seed=seed)
    ks, vs = FP8_KV_SCALES
    k8 = to_cache(case.k_cache, torch.float8_e4m3fn, ks)
    v8 = to_cache(case.v_cache, torch.float8_e4m3fn, vs)
    k_float, v_float = k8.float() * ks, v8.float() * vs
    case.k_cache, case.v_cache = k8, v8
    return case, k_float, v_float


def test_store_kv_fp8(hal_platform: Platform, dtype: torch.dtype) -> None:
    if not _fp8_kv(hal_platform):
        pytest.skip(f"{hal_platform.name} declares no fp8 KV cache")
    from tessera.hal.cpu.dense import to_cache

    dev = hal_platform.device()
    ks, vs = FP8_KV_SCALES
    gen = torch.Generator().manual_seed(40)
    k = (torch.randn((5, 2, 64), generator=gen) * 3).to(dtype)
    v = (torch.randn((5, 2, 64), generator=gen) * 3).to(dtype)
    k[0, 0, 0] = 1e4  # far past 448 * k_scale: saturates instead of becoming NaN
    kc = torch.zeros((32, 2, 64), dtype=torch.float8_e4m3fn, device=dev)
    vc = torch.zeros_like(kc)
    slots = torch.tensor([3, 4, 8, 31, 0], dtype=torch.int32)
    hal_platform.op("store_kv")(kc, vc, k.to(dev), v.to(dev), slots.to(dev), k_scale=ks,
                                v_scale=vs)
    for cache, x, scale in ((kc, k, ks), (vc, v, vs)):
        got = cache.cpu().float()[slots.long()]
        want = to_cache(x, torch.float8_e4m3fn, scale).float()
        assert_fp8_within_one_step(got, want)
        assert bool(torch.isfinite(got).all())
        untouched = torch.ones(32, dtype=torch.bool)
        untouched[slots.long()] = False
        assert int(cache.cpu().float()[untouched].count_nonzero()) == 0


@pytest.mark.parametrize("mode", ["decode", "extend"])
def test_attention_reads_fp8_kv(hal_platform: Platform, dtype: torch.dtype, mode: str) -> None:
    if not _fp8_kv(hal_platform):
        pytest.skip(f"{hal_platform.name} declares no fp8 KV cache")
    from tessera.hal.conformance import _close, _ref

    if mode == "decode":
        case, k_float, v_float = _fp8_case((1, 4, 5, 17), (1, 1, 1, 1), dtype, seed=41)
    else:
        case, k_float, v_float = _fp8_case((8, 13, 12), (3, 1, 4), dtype, seed=42)
    ks, vs = FP8_KV_SCALES
    dev = case.to(hal_platform.device())
    if mode == "decode":
        out = hal_platform.op("attention_decode")(
            dev.q, dev.k_cache, dev.v_cache, dev.req_to_token, dev.seq_lens, case.scale,
            k_scale=ks, v_scale=vs)
    else:
        out = hal_platform.op("attention_extend")(
            dev.q, dev.k_cache, dev.v_cache, dev.req_to_token, dev.seq_lens, dev.extend_lens,
            dev.qo_indptr, case.scale, k_scale=ks, v_scale=vs)
    expected = _ref("attention_extend", case.q, k_float, v_float, case.req_to_token,
                    case.seq_lens, case.extend_lens, case.qo_indptr, case.scale)
    _close(out, expected, dtype)
