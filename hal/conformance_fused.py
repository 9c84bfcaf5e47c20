"""Conformance of fused ops (part of hal/conformance.py's suite; run through it).

A fused op is defined as the composition of the unfused ops (hal/ops.py), so each case runs
the reference composition on the CPU in the same dtype (the same roundings between the
steps) and compares. A plugin that does not register a fused op skips its cases: the worker
composes the unfused ops there, which the rest of the suite checks.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from tessera.hal.conformance_data import GQA_HEADS, HEAD_DIMS, PAGE_SIZE
from tessera.hal.conformance_quant import FP8_KV_SCALES, assert_fp8_within_one_step
from tessera.hal.ops import FUSED_OP_NAMES
from tessera.hal.platform import Platform
from tessera.hal.reference import reference_op
from tessera.hal.rope import cos_sin_cache

_TOLERANCES = {torch.float32: 1e-4, torch.bfloat16: 1.6e-2, torch.float16: 2e-3}
_SLOTS = 12 * PAGE_SIZE


def _fused(platform: Platform, name: str) -> Callable[..., Any]:
    fn = platform.fused_op(name)
    if fn is None:
        pytest.skip(f"{platform.name} does not fuse {name}; the worker composes the ops")
    return fn


def test_fused_op_names_resolve(hal_platform: Platform) -> None:
    for name in FUSED_OP_NAMES:
        fn = hal_platform.fused_op(name)
        assert fn is None or callable(fn)
    with pytest.raises(KeyError, match="no_such_fusion"):
        hal_platform.fused_op("no_such_fusion")


@pytest.mark.parametrize("cache", ["model_dtype", "fp8_e4m3"])
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("hq,hk", GQA_HEADS)
@pytest.mark.parametrize("tokens", [0, 1, 9])
def test_rotary_store_kv(hal_platform: Platform, dtype: torch.dtype, head_dim: int, hq: int,
                         hk: int, tokens: int, cache: str) -> None:
    fused = _fused(hal_platform, "rotary_store_kv")
    fp8 = cache == "fp8_e4m3"
    if fp8 and cache not in hal_platform.capabilities.kv_cache_dtypes:
        pytest.skip(f"{hal_platform.name} declares no fp8 KV cache")
    gen = torch.Generator().manual_seed(60 + tokens)
    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 1024}
    table = cos_sin_cache(head_dim, 4096, 500000.0, scaling, "cpu", dtype)
    positions = torch.randint(0, 4096, (tokens,), generator=gen)
    # q, k and v as views into one fused QKV row with spare columns: rows are not contiguous
    width = (hq + 2 * hk) * head_dim
    qkv = (torch.randn((tokens, width + 16), generator=gen) * 2).to(dtype)
    q = qkv[:, :hq * head_dim].view(tokens, hq, head_dim)
    k = qkv[:, hq * head_dim:(hq + hk) * head_dim].view(tokens, hk, head_dim)
    v = qkv[:, (hq + hk) * head_dim:width].view(tokens, hk, head_dim)
    # Distinct slots scattered over the pages, the padding slot 0 among them (the last): two
    # tokens on one slot would race, and which write lands is not defined.
    slots = (torch.randperm(_SLOTS - 1, generator=gen)[:tokens] + 1).to(torch.int32)
    if tokens > 1:
        slots[-1] = 0
    cache_dtype = torch.float8_e4m3fn if fp8 else dtype
    k_cache = torch.randn((_SLOTS, hk, head_dim), generator=gen).to(cache_dtype)
    v_cache = torch.randn((_SLOTS, hk, head_dim), generator=gen).to(cache_dtype)
    scales = {"k_scale": FP8_KV_SCALES[0], "v_scale": FP8_KV_SCALES[1]} if fp8 else {}

    dev = hal_platform.device()
    kc, vc = k_cache.to(dev), v_cache.to(dev)
    q_out = fused(positions.to(dev), q.to(dev), k.to(dev), v.to(dev), table.to(dev), kc, vc,
                  slots.to(dev), **scales)
    want_kc, want_vc = k_cache.clone(), v_cache.clone()
    want_q = reference_op("rotary_store_kv")(positions, q, k, v, table, want_kc, want_vc, slots,
                                             **scales)

    tol = _TOLERANCES[dtype]
    assert q_out.shape == (tokens, hq, head_dim) and q_out.dtype == dtype
    torch.testing.assert_close(q_out.cpu().float(), want_q.float(), atol=tol, rtol=tol)
    untouched = torch.ones(_SLOTS, dtype=torch.bool)
    untouched[slots.long()] = False
    for got, want in ((kc.cpu(), want_kc), (vc.cpu(), want_vc)):
        assert got.dtype == cache_dtype
        assert torch.equal(got[untouched].float(), want[untouched].float()), \
            "rotary_store_kv wrote outside its slots"
        got, want = got.float()[~untouched], want.float()[~untouched]
        if fp8:  # the kernel's k is rotated in fp32, the reference's rounded to dtype first
            assert_fp8_within_one_step(got, want)
        else:
            torch.testing.assert_close(got, want, atol=tol, rtol=tol)


@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("tokens,inner,out", [(0, 64, 32), (1, 80, 48), (1, 1536, 256),
                                              (5, 96, 40)])
def test_silu_and_mul_linear(hal_platform: Platform, dtype: torch.dtype, tokens: int, inner: int,
                             out: int, with_bias: bool) -> None:
    fused = _fused(hal_platform, "silu_and_mul_linear")
    gen = torch.Generator().manual_seed(70 + inner)
    x = (torch.randn((tokens, 2 * inner), generator=gen) * 2).to(dtype)
    # unit-order outputs: the tolerances mean the same at every width
    weight = (torch.randn((out, inner), generator=gen) / inner ** 0.5).to(dtype)
    bias = torch.randn((out,), generator=gen).to(dtype) if with_bias else None
    dev = hal_platform.device()
    got = fused(x.to(dev), weight.to(dev), None if bias is None else bias.to(dev))
    want = reference_op("silu_and_mul_linear")(x, weight, bias)
    tol = _TOLERANCES[dtype]
    assert got.shape == (tokens, out) and got.dtype == dtype
    torch.testing.assert_close(got.cpu().float(), want.float(), atol=tol, rtol=tol)


@pytest.mark.parametrize("renormalize", [True, False])
@pytest.mark.parametrize("experts,top_k", [(8, 2), (8, 1), (60, 4), (128, 8), (256, 8)])
@pytest.mark.parametrize("tokens", [0, 1, 37])
def test_moe_softmax_topk(hal_platform: Platform, dtype: torch.dtype, tokens: int,
                          experts: int, top_k: int, renormalize: bool) -> None:
    fused = _fused(hal_platform, "moe_softmax_topk")
    gen = torch.Generator().manual_seed(70 + tokens + experts)
    # distinct logits, exact in every dtype (multiples of 1/16 within +-8): no ties, so the
    # chosen experts and their order are determined
    logits = torch.stack([(torch.randperm(experts, generator=gen) - experts // 2) / 16.0
                          for _ in range(tokens)]) if tokens else torch.zeros((0, experts))
    logits = logits.to(dtype)
    weights, ids = fused(logits.to(hal_platform.device()), top_k, renormalize)
    want_w, want_ids = reference_op("moe_softmax_topk")(logits, top_k, renormalize)
    assert weights.dtype == torch.float32 and ids.dtype == torch.int32
    assert tuple(weights.shape) == tuple(ids.shape) == (tokens, top_k)
    assert torch.equal(ids.cpu(), want_ids)
    torch.testing.assert_close(weights.cpu(), want_w, rtol=1e-5, atol=1e-6)
