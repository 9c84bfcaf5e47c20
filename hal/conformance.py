"""HAL conformance suite: what any plugin must pass, checked against the reference (cpu) ops.

A plugin package runs it against itself in any of these ways:

    pytest -p tessera.hal.conformance --pyargs tessera.hal.conformance --hal-plugin NAME
    TESSERA_HAL=NAME pytest --pyargs tessera.hal.conformance
    python -c "import sys; from tessera.hal.conformance import run_conformance; \
               sys.exit(run_conformance('NAME'))"

or from one of its own test modules, naming the plugin in the module:

    from tessera.hal.conformance import *  # noqa: F403
    HAL_PLUGIN = "NAME"

Every op is compared with the reference computed in float32 on the CPU from the same input
values, over the dtypes the plugin declares, the edge cases the scheduler produces (empty
batch, one token, KV crossing page boundaries, GQA ratios 1/4/8, head dims 64/128). Sampling is
checked for greedy equality, per-seed reproducibility, filtering and the drawn distribution;
graph capture for replay equality where the plugin declares it; events, asynchronous copies,
pinned buffers, the memory policy and profiler ranges (hal/conformance_runtime.py); the
communicator for its single-rank, loopback and two-process semantics.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch

from tessera.hal.conformance_data import (
    DECODE_SEQ_LENS,
    EXTEND_CASES,
    GQA_HEADS,
    HEAD_DIMS,
    PagedCase,
    make_paged_case,
    pad_paged_case,
    sampling_params,
)
from tessera.hal.conformance_fused import (  # noqa: F401  (the suite's fused-op cases)
    test_fused_op_names_resolve,
    test_moe_softmax_topk,
    test_rotary_store_kv,
    test_silu_and_mul_linear,
)
from tessera.hal.conformance_quant import (  # noqa: F401  (the suite's quantized cases)
    test_attention_reads_fp8_kv,
    test_quant_linear,
    test_quant_linear_act_order,
    test_quant_one_token_fused,
    test_quant_one_token_fused_rope,
    test_quant_prepare_keeps_the_values,
    test_quant_rows_fused,
    test_quant_schemes_resolve_or_refuse,
    test_store_kv_fp8,
)
from tessera.hal.conformance_runtime import (  # noqa: F401 - collected from here
    test_an_event_marks_finished_work,
    test_capture_warms_up_then_replays_on_new_inputs,
    test_copies_round_trip_through_the_device,
    test_memory_policy_is_declared,
    test_pinned_buffers_are_host_memory_the_device_can_fill,
    test_profile_ranges_nest_and_repeat,
    test_several_copies_to_the_device_arrive_whole,
)
from tessera.hal.ops import OP_NAMES
from tessera.hal.platform import Capabilities, Platform
from tessera.hal.reference import reference_op
from tessera.hal.rope import cos_sin_cache

# Plugin output vs the float32 reference on the same input values. bfloat16/float16 allow
# about two units in the last place at magnitude 1 (the output is rounded once, maybe twice).
TOLERANCES: dict[torch.dtype, dict[str, float]] = {
    torch.float32: {"atol": 1e-4, "rtol": 1e-4},
    torch.bfloat16: {"atol": 1.6e-2, "rtol": 1.6e-2},
    torch.float16: {"atol": 2e-3, "rtol": 2e-3},
}
DTYPES = ("float32", "bfloat16", "float16")


# --- how the suite finds its plugin ----------------------------------------------------------
def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--hal-plugin", default=None,
                     help="HAL plugin to check (default: TESSERA_HAL, else best available)")


def _plugin_name(config: pytest.Config, module: Any) -> str | None:
    """--hal-plugin, else the test module's HAL_PLUGIN, else None (TESSERA_HAL / best)."""
    return config.getoption("--hal-plugin", default=None) or getattr(module, "HAL_PLUGIN", None)


@pytest.fixture(scope="module")
def hal_plugin_name(request: pytest.FixtureRequest) -> str | None:
    return _plugin_name(request.config, request.module)


@pytest.fixture(scope="module")
def hal_platform(hal_plugin_name: str | None) -> Platform:
    from tessera.hal.registry import load_platform

    return load_platform(hal_plugin_name)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Parametrize `dtype` over the dtypes the plugin declares (all known ones if the plugin
    cannot be loaded here; the `hal_platform` fixture then reports why)."""
    # With `-p tessera.hal.conformance` this hook runs twice (as plugin and as module) on the
    # same metafunc; parametrize once.
    if "dtype" not in metafunc.fixturenames or getattr(metafunc, "_tessera_dtypes", False):
        return
    metafunc._tessera_dtypes = True  # type: ignore[attr-defined]
    from tessera.hal.registry import select_plugin_class

    try:
        declared = select_plugin_class(_plugin_name(metafunc.config, metafunc.module)
                                       ).capabilities.dtypes
    except Exception:
        declared = DTYPES
    names = [d for d in DTYPES if d in declared]
    metafunc.parametrize("dtype", [getattr(torch, d) for d in names], ids=names)


def run_conformance(plugin: str, *pytest_args: str) -> int:
    """Run this suite against `plugin` in-process; returns pytest's exit code."""
    # This module is already imported (by the caller), too late for pytest to rewrite its
    # asserts; say nothing about it.
    return int(pytest.main(["-p", "tessera.hal.conformance", "--pyargs",
                            "tessera.hal.conformance", "--hal-plugin", plugin,
                            "-W", "ignore::pytest.PytestAssertRewriteWarning", *pytest_args]))


# --- helpers -----------------------------------------------------------------------------------
def _rand(shape: tuple[int, ...], dtype: torch.dtype, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=gen).to(dtype)


def _ref(name: str, *args: Any) -> Any:
    """The reference op on float32 CPU copies of the inputs (exact values of low-precision
    inputs, accurate math)."""
    def up(a: Any) -> Any:
        if isinstance(a, torch.Tensor):
            return a.cpu().float() if a.is_floating_point() else a.cpu()
        return a
    return reference_op(name)(*[up(a) for a in args])


def _close(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype) -> None:
    assert actual.dtype == dtype, f"output dtype {actual.dtype}, expected {dtype}"
    tol = TOLERANCES[dtype]
    torch.testing.assert_close(actual.cpu().float(), expected.cpu().float(), atol=tol["atol"],
                               rtol=tol["rtol"])


def _on(platform: Platform, *tensors: torch.Tensor) -> list[torch.Tensor]:
    return [t.to(platform.device()) for t in tensors]


# --- the contract ------------------------------------------------------------------------------
def test_platform_declares_contract(hal_platform: Platform) -> None:
    caps = hal_platform.capabilities
    assert hal_platform.name
    assert isinstance(caps, Capabilities)
    with pytest.raises(AttributeError):
        caps.graph_capture = not caps.graph_capture  # type: ignore[misc]
    assert caps.default_dtype in caps.dtypes
    # what --overlap-steps 0 (auto) takes: a value the engine accepts
    assert type(caps.overlap_steps) is int and 2 <= caps.overlap_steps <= 4
    assert type(hal_platform).is_available()
    free, total = hal_platform.mem_get_info()
    assert 0 < free <= total
    assert isinstance(hal_platform.device(), torch.device)
    hal_platform.synchronize()


@pytest.mark.parametrize("op", OP_NAMES)
def test_every_op_resolves(hal_platform: Platform, op: str) -> None:
    assert callable(hal_platform.op(op))


def test_missing_op_error_names_op_and_plugin(hal_platform: Platform) -> None:
    with pytest.raises(NotImplementedError) as info:
        hal_platform.op("no_such_op")
    assert "no_such_op" in str(info.value) and hal_platform.name in str(info.value)


# --- dense ops ---------------------------------------------------------------------------------
@pytest.mark.parametrize("tokens", [0, 1, 7])
def test_embedding(hal_platform: Platform, dtype: torch.dtype, tokens: int) -> None:
    weight = _rand((50, 64), dtype, 1)
    ids = torch.randint(0, 50, (tokens,), generator=torch.Generator().manual_seed(2))
    out = hal_platform.op("embedding")(*_on(hal_platform, ids, weight))
    assert out.shape == (tokens, 64)
    assert torch.equal(out.cpu(), weight[ids])


@pytest.mark.parametrize("tokens,hidden", [(0, 64), (1, 64), (5, 576)])
def test_rms_norm(hal_platform: Platform, dtype: torch.dtype, tokens: int, hidden: int) -> None:
    x, weight = _rand((tokens, hidden), dtype, 3) * 3, _rand((hidden,), dtype, 4)
    out = hal_platform.op("rms_norm")(*_on(hal_platform, x, weight), 1e-6)
    _close(out, _ref("rms_norm", x, weight, 1e-6), dtype)


@pytest.mark.parametrize("tokens", [0, 1, 5])
def test_fused_add_rms_norm(hal_platform: Platform, dtype: torch.dtype, tokens: int) -> None:
    x, res, weight = _rand((tokens, 128), dtype, 5), _rand((tokens, 128), dtype, 6), \
        _rand((128,), dtype, 7)
    out, res_out = hal_platform.op("fused_add_rms_norm")(*_on(hal_platform, x, res, weight), 1e-5)
    # The reference adds in float32; a plugin rounds the sum to dtype first, as it must to
    # return it, so compare the norm against the rounded sum.
    expected_res = (x.float() + res.float()).to(dtype)
    _close(res_out, expected_res, dtype)
    _close(out, _ref("rms_norm", expected_res, weight, 1e-5), dtype)


@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("hq,hk", GQA_HEADS)
@pytest.mark.parametrize("tokens", [0, 1, 9])
def test_rotary_embedding(hal_platform: Platform, dtype: torch.dtype, head_dim: int, hq: int,
                          hk: int, tokens: int) -> None:
    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 1024}
    table = cos_sin_cache(head_dim, 4096, 500000.0, scaling, "cpu", dtype)
    positions = torch.randint(0, 4096, (tokens,), generator=torch.Generator().manual_seed(8))
    q, k = _rand((tokens, hq, head_dim), dtype, 9), _rand((tokens, hk, head_dim), dtype, 10)
    q_out, k_out = hal_platform.op("rotary_embedding")(*_on(hal_platform, positions, q, k, table))
    q_ref, k_ref = _ref("rotary_embedding", positions, q, k, table)
    _close(q_out, q_ref, dtype)
    _close(k_out, k_ref, dtype)


@pytest.mark.parametrize("tokens,inner", [(0, 64), (1, 64), (6, 1536)])
def test_silu_and_mul(hal_platform: Platform, dtype: torch.dtype, tokens: int,
                      inner: int) -> None:
    x = _rand((tokens, 2 * inner), dtype, 11) * 2
    out = hal_platform.op("silu_and_mul")(*_on(hal_platform, x))
    assert out.shape == (tokens, inner)
    _close(out, _ref("silu_and_mul", x), dtype)


@pytest.mark.parametrize("tokens,inner", [(0, 64), (1, 64), (6, 1536)])
def test_gelu_tanh_and_mul(hal_platform: Platform, dtype: torch.dtype, tokens: int,
                           inner: int) -> None:
    x = _rand((tokens, 2 * inner), dtype, 41) * 3  # reaches the flat tails of tanh
    out = hal_platform.op("gelu_tanh_and_mul")(*_on(hal_platform, x))
    assert out.shape == (tokens, inner)
    _close(out, _ref("gelu_tanh_and_mul", x), dtype)


# tokens, experts, top_k, hidden, inner: decode-sized and prefill-sized batches, an expert
# count that leaves some experts without tokens, sizes that are not powers of two
MOE_CASES = {"one_token": (1, 8, 2, 64, 32), "decode": (5, 8, 2, 96, 80),
             "prefill": (70, 6, 3, 64, 48), "empty": (0, 4, 2, 64, 32)}


@pytest.mark.parametrize("activation", ["silu", "gelu_tanh"])
@pytest.mark.parametrize("case", sorted(MOE_CASES))
def test_fused_moe(hal_platform: Platform, dtype: torch.dtype, case: str,
                   activation: str) -> None:
    tokens, experts, top_k, hidden, inner = MOE_CASES[case]
    x = _rand((tokens, hidden), dtype, 42)
    # Weights scaled so that every stage has unit-order values (the tolerances then mean the
    # same thing at every size).
    w13 = (_rand((experts, 2 * inner, hidden), dtype, 43).float() / math.sqrt(hidden)).to(dtype)
    w2 = (_rand((experts, hidden, inner), dtype, 44).float() / math.sqrt(inner)).to(dtype)
    scores = torch.softmax(_rand((tokens, experts), torch.float32, 45), dim=-1)
    weights, ids = scores.topk(top_k, dim=-1)
    ids = ids.to(torch.int32)
    if tokens > 1:
        ids[0, 0] = -1  # experts held by other ranks add nothing
        ids[1, top_k - 1] = experts + 3
    out = hal_platform.op("fused_moe")(*_on(hal_platform, x, w13, w2, weights, ids),
                                       activation=activation)
    assert out.shape == x.shape
    _close(out, _ref("fused_moe", x, w13, w2, weights, ids, activation), dtype)


@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("tokens", [0, 1, 13])
def test_linear(hal_platform: Platform, dtype: torch.dtype, tokens: int, with_bias: bool) -> None:
    # Unit-variance outputs (weights scaled by 1/sqrt(in)) so the tolerances mean the same
    # thing for every size.
    x = _rand((tokens, 192), dtype, 12)
    weight = (_rand((80, 192), dtype, 13).float() / math.sqrt(192)).to(dtype)
    bias = _rand((80,), dtype, 14) if with_bias else None
    args = _on(hal_platform, x, weight) + ([bias.to(hal_platform.device())] if bias is not None
                                           else [None])
    out = hal_platform.op("linear")(*args)
    _close(out, _ref("linear", x, weight, bias), dtype)


def test_store_kv_writes_only_its_slots(hal_platform: Platform, dtype: torch.dtype) -> None:
    k_cache, v_cache = _rand((32, 2, 64), dtype, 15), _rand((32, 2, 64), dtype, 16)
    k, v = _rand((5, 2, 64), dtype, 17), _rand((5, 2, 64), dtype, 18)
    slots = torch.tensor([3, 4, 8, 31, 0], dtype=torch.int32)  # crosses pages of 4
    kc, vc = _on(hal_platform, k_cache, v_cache)
    hal_platform.op("store_kv")(kc, vc, *_on(hal_platform, k, v, slots))
    expected_k, expected_v = k_cache.clone(), v_cache.clone()
    expected_k[slots.long()], expected_v[slots.long()] = k, v
    assert torch.equal(kc.cpu(), expected_k) and torch.equal(vc.cpu(), expected_v)
    empty = torch.empty((0, 2, 64), dtype=dtype)
    hal_platform.op("store_kv")(kc, vc, *_on(hal_platform, empty, empty,
                                             torch.empty(0, dtype=torch.int32)))
    assert torch.equal(kc.cpu(), expected_k)


# --- attention ---------------------------------------------------------------------------------
def _case_on(platform: Platform, case: PagedCase) -> PagedCase:
    return case.to(platform.device())


@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("hq,hk", GQA_HEADS)
@pytest.mark.parametrize("case", sorted(EXTEND_CASES))
def test_attention_extend(hal_platform: Platform, dtype: torch.dtype, head_dim: int, hq: int,
                          hk: int, case: str) -> None:
    seq_lens, extend_lens = EXTEND_CASES[case]
    data = make_paged_case(seq_lens, extend_lens, hq, hk, head_dim, dtype, seed=19)
    dev = _case_on(hal_platform, data)
    out = hal_platform.op("attention_extend")(dev.q, dev.k_cache, dev.v_cache, dev.req_to_token,
                                              dev.seq_lens, dev.extend_lens, dev.qo_indptr,
                                              data.scale)
    assert out.shape == data.q.shape
    expected = _ref("attention_extend", data.q, data.k_cache, data.v_cache, data.req_to_token,
                    data.seq_lens, data.extend_lens, data.qo_indptr, data.scale)
    _close(out, expected, dtype)
    # The worker passes the longest extend, known on the host: same answer.
    hinted = hal_platform.op("attention_extend")(
        dev.q, dev.k_cache, dev.v_cache, dev.req_to_token, dev.seq_lens, dev.extend_lens,
        dev.qo_indptr, data.scale, max_extend_len=max(extend_lens, default=0))
    _close(hinted, expected, dtype)


@pytest.mark.parametrize("hq,hk", GQA_HEADS)
@pytest.mark.parametrize("case", ["empty_batch", "prefill", "mixed"])
def test_attention_extend_padded(hal_platform: Platform, dtype: torch.dtype, hq: int, hk: int,
                                 case: str) -> None:
    """A step captured at a padded size: padding requests and rows change no real row, and
    the padding rows come out as zeros."""
    seq_lens, extend_lens = EXTEND_CASES[case]
    data = make_paged_case(seq_lens, extend_lens, hq, hk, 64, dtype, seed=22)
    padded = _case_on(hal_platform, pad_paged_case(data, tokens=5, requests=2, seed=23))
    out = hal_platform.op("attention_extend")(
        padded.q, padded.k_cache, padded.v_cache, padded.req_to_token, padded.seq_lens,
        padded.extend_lens, padded.qo_indptr, data.scale,
        max_extend_len=padded.q.shape[0])  # what a captured step passes: an upper bound
    t = data.q.shape[0]
    assert out.shape == padded.q.shape
    expected = _ref("attention_extend", data.q, data.k_cache, data.v_cache, data.req_to_token,
                    data.seq_lens, data.extend_lens, data.qo_indptr, data.scale)
    _close(out[:t], expected, dtype)
    assert torch.equal(out[t:].cpu(), torch.zeros_like(out[t:].cpu()))


# sliding window, soft-capping cap, score scale (None: head_dim^-1/2): windows inside one KV
# block and across several, caps that bite at the scores' scale (inputs of unit variance,
# head dim 64, scale 1/8), and a scale the model sets (Gemma 2's query_pre_attn_scalar) with
# scores far past the cap, where tanh saturates
WINDOW_CAP_CASES: dict[str, tuple[int, float, float | None]] = {
    "window5": (5, 0.0, None), "window70": (70, 0.0, None), "cap": (0, 1.5, None),
    "window_cap": (33, 2.0, None), "window_cap_scale1": (10, 2.0, 1.0)}
# (seq_lens, extend_lens): rows longer than the windows, prefixes, decode rows mixed in
WINDOW_BATCHES = {"prefill": ((40, 150), (40, 150)), "cached_prefix": ((90, 13, 140), (20, 1, 7)),
                  "mixed": ((1, 120, 4, 75), (1, 6, 1, 1))}


@pytest.mark.parametrize("hq,hk", [(8, 2)])
@pytest.mark.parametrize("case", sorted(WINDOW_BATCHES))
@pytest.mark.parametrize("variant", sorted(WINDOW_CAP_CASES))
def test_attention_sliding_window_and_soft_cap(hal_platform: Platform, dtype: torch.dtype,
                                               hq: int, hk: int, case: str,
                                               variant: str) -> None:
    window, cap, scale = WINDOW_CAP_CASES[variant]
    seq_lens, extend_lens = WINDOW_BATCHES[case]
    data = make_paged_case(seq_lens, extend_lens, hq, hk, 64, dtype, seed=46)
    if scale is not None:
        data = replace(data, scale=scale)
    dev = _case_on(hal_platform, data)
    kw = {"sliding_window": window, "logit_cap": cap}
    out = hal_platform.op("attention_extend")(dev.q, dev.k_cache, dev.v_cache, dev.req_to_token,
                                              dev.seq_lens, dev.extend_lens, dev.qo_indptr,
                                              data.scale, **kw)
    _close(out, reference_op("attention_extend")(
        data.q.float(), data.k_cache.float(), data.v_cache.float(), data.req_to_token,
        data.seq_lens, data.extend_lens, data.qo_indptr, data.scale, **kw), dtype)
    dec = make_paged_case(seq_lens, (1,) * len(seq_lens), hq, hk, 64, dtype, seed=47)
    dec = replace(dec, scale=data.scale)
    ddev = _case_on(hal_platform, dec)
    out = hal_platform.op("attention_decode")(ddev.q, ddev.k_cache, ddev.v_cache,
                                              ddev.req_to_token, ddev.seq_lens, dec.scale, **kw)
    _close(out, reference_op("attention_decode")(
        dec.q.float(), dec.k_cache.float(), dec.v_cache.float(), dec.req_to_token,
        dec.seq_lens, dec.scale, **kw), dtype)


@pytest.mark.parametrize("variant", ["window_cap", "window_cap_scale1"])
def test_attention_decode_window_cap_as_captured(hal_platform: Platform, dtype: torch.dtype,
                                                 variant: str) -> None:
    """Decode with a sliding window and a soft-cap as a captured decode step runs it: rows
    shorter than, at, just past and far past the window, then padding rows (one token at
    position 0 in slot 0, seq_len 1). The real rows are the reference's, the padding rows
    finite."""
    window, cap, scale = WINDOW_CAP_CASES[variant]
    seq_lens = (1, window - 1, window, window + 1, 2 * window + 5, 130)
    real = make_paged_case(seq_lens, (1,) * len(seq_lens), 8, 2, 64, dtype, seed=48)
    if scale is not None:
        real = replace(real, scale=scale)
    pad = 3
    gen = torch.Generator().manual_seed(49)
    q = torch.cat([real.q, torch.randn((pad, *real.q.shape[1:]), generator=gen).to(dtype)])
    req_to_token = torch.cat([real.req_to_token,
                              torch.zeros((pad, real.req_to_token.shape[1]), dtype=torch.int32)])
    lens = torch.cat([real.seq_lens, torch.ones(pad, dtype=torch.int32)])
    kw = {"sliding_window": window, "logit_cap": cap}
    q_d, kc, vc, rtt, lens_d = _on(hal_platform, q, real.k_cache, real.v_cache, req_to_token,
                                   lens)
    out = hal_platform.op("attention_decode")(q_d, kc, vc, rtt, lens_d, real.scale, **kw)
    assert out.shape == q.shape
    b = len(seq_lens)
    _close(out[:b], reference_op("attention_decode")(
        real.q.float(), real.k_cache.float(), real.v_cache.float(), real.req_to_token,
        real.seq_lens, real.scale, **kw), dtype)
    assert bool(torch.isfinite(out[b:].cpu().float()).all())


@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("hq,hk", GQA_HEADS)
@pytest.mark.parametrize("seq_lens", DECODE_SEQ_LENS, ids=lambda s: f"lens{len(s)}")
def test_attention_decode(hal_platform: Platform, dtype: torch.dtype, head_dim: int, hq: int,
                          hk: int, seq_lens: tuple[int, ...]) -> None:
    data = make_paged_case(seq_lens, (1,) * len(seq_lens), hq, hk, head_dim, dtype, seed=20)
    dev = _case_on(hal_platform, data)
    out = hal_platform.op("attention_decode")(dev.q, dev.k_cache, dev.v_cache, dev.req_to_token,
                                              dev.seq_lens, data.scale)
    assert out.shape == data.q.shape
    expected = _ref("attention_extend", data.q, data.k_cache, data.v_cache, data.req_to_token,
                    data.seq_lens, data.extend_lens, data.qo_indptr, data.scale)
    _close(out, expected, dtype)


# --- sampling ----------------------------------------------------------------------------------
def _sample(platform: Platform, logits: torch.Tensor, **params: Any) -> torch.Tensor:
    dev = platform.device()
    tokens = platform.op("sample")(logits.to(dev), sampling_params(len(logits), dev, **params))
    assert tokens.dtype == torch.int64 and tokens.shape == (len(logits),)
    return tokens.cpu()


def test_sample_greedy_matches_argmax(hal_platform: Platform) -> None:
    logits = _rand((6, 300), torch.float32, 21)
    logits[2, 7] = logits[2, 200] = logits[2].max() + 1  # a tie: lowest index wins
    expected = logits.argmax(dim=-1)
    assert expected[2] == 7
    assert torch.equal(_sample(hal_platform, logits, temperature=0.0), expected)
    # top_k == 1 is greedy too, whatever the temperature
    assert torch.equal(_sample(hal_platform, logits, temperature=1.0, top_k=1), expected)
    assert _sample(hal_platform, logits[:0], temperature=0.0).shape == (0,)


@pytest.mark.parametrize("logit_dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_sample_greedy_over_the_model_dtype(hal_platform: Platform,
                                            logit_dtype: torch.dtype) -> None:
    """A decode graph's logits unconverted (all rows greedy): the tokens of their float32
    copy, over a vocabulary wider than one program's share, ties included (rounded to 16 bits
    many values tie; row 1 ties across the far ends of the row, row 3 is one value)."""
    logits = (_rand((5, 49157), torch.float32, 26) * 4).to(logit_dtype)
    logits[1, 10] = logits[1, 40000] = logits[1].max() + 1
    logits[3] = logits[3, 5]  # one value everywhere: index 0
    wide = logits.float()
    expected = wide.argmax(dim=-1)
    assert expected[1] == 10 and expected[3] == 0
    assert torch.equal(_sample(hal_platform, logits, temperature=0.0), expected)
    assert torch.equal(_sample(hal_platform, wide, temperature=0.0), expected)


def test_sample_seeded_rows_ignore_batch_composition(hal_platform: Platform) -> None:
    logits = _rand((1, 1000), torch.float32, 22) * 0.1  # nearly flat: every draw matters
    for seed in range(12):
        alone = _sample(hal_platform, logits, temperature=1.0, seeds=seed, offsets=5)
        batch = logits.repeat(5, 1) + _rand((5, 1000), torch.float32, 23 + seed) * \
            torch.tensor([1.0, 1.0, 1.0, 0.0, 1.0])[:, None]
        seeds = torch.tensor([-1, 7, seed + 100, seed, -1])
        mixed = _sample(hal_platform, batch, temperature=1.0, seeds=seeds, offsets=5,
                        top_p=torch.tensor([0.9, 1.0, 0.5, 1.0, 1.0]))
        assert mixed[3] == alone[0], f"seed {seed}: {mixed[3]} in a batch, {alone[0]} alone"
    # offsets move the stream on: a seeded request does not repeat one token forever
    draws = {int(_sample(hal_platform, logits, temperature=1.0, seeds=3, offsets=o)[0])
             for o in range(20)}
    assert len(draws) > 1


@pytest.mark.parametrize("filters,allowed", [
    ({"top_k": 2}, {0, 1}),
    ({"top_p": 0.6}, {0, 1}),  # mass before token 2 is 0.8 >= 0.6
    ({"min_p": 0.5}, {0, 1}),  # threshold 0.25
    ({"top_k": 3, "top_p": 0.99, "min_p": 0.35}, {0, 1}),  # min-p drops token 2
])
def test_sample_filters(hal_platform: Platform, filters: dict[str, Any],
                        allowed: set[int]) -> None:
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    logits = probs.log().repeat(400, 1)
    tokens = _sample(hal_platform, logits, temperature=1.0, seeds=torch.arange(400), **filters)
    assert set(tokens.tolist()) == allowed


@pytest.mark.parametrize("temperature", [1.0, 0.5])
def test_sample_distribution(hal_platform: Platform, temperature: float) -> None:
    probs = torch.tensor([0.5, 0.25, 0.15, 0.1])
    n = 4000
    tokens = _sample(hal_platform, probs.log().repeat(n, 1), temperature=temperature,
                     seeds=torch.arange(n))
    target = probs ** (1 / temperature)
    target = target / target.sum()
    freq = torch.bincount(tokens, minlength=4).float() / n
    sigma = (target * (1 - target) / n).sqrt()
    # five standard deviations: a correct sampler fails this about once in 10^6 runs
    assert ((freq - target).abs() <= 5 * sigma).all(), (freq, target)


def _bitmask_of(allowed: torch.Tensor) -> torch.Tensor:
    """int32 [G, ceil(V/32)] words packing a bool [G, V] allow-matrix (bit v % 32 of word
    v // 32), written without the op under test."""
    groups, vocab = allowed.shape
    words = (vocab + 31) // 32
    padded = torch.zeros((groups, words * 32), dtype=torch.int64)
    padded[:, :vocab] = allowed.long()
    weights = torch.tensor([1 << b for b in range(32)], dtype=torch.int64)
    packed = (padded.view(groups, words, 32) * weights).sum(dim=-1)
    return torch.where(packed >= 1 << 31, packed - (1 << 32), packed).to(torch.int32)


@pytest.mark.parametrize("vocab", [37, 64, 1000, 4133])
def test_apply_token_mask(hal_platform: Platform, vocab: int) -> None:
    logits = _rand((5, vocab), torch.float32, 31)
    gen = torch.Generator().manual_seed(32)
    allowed = torch.rand((3, vocab), generator=gen) < 0.3
    allowed[0] = False
    allowed[0, vocab - 1] = True  # the last token alone, and bit 31 of some words
    allowed[1, :] = True
    rows = torch.tensor([4, 0, 2])
    expected = logits.clone()
    for g, row in enumerate(rows.tolist()):
        expected[row][~allowed[g]] = float("-inf")
    (dev_logits,) = _on(hal_platform, logits)
    mask, dev_rows = _on(hal_platform, _bitmask_of(allowed), rows.to(torch.int32))
    hal_platform.op("apply_token_mask")(dev_logits, mask, dev_rows)
    assert torch.equal(dev_logits.cpu(), expected)  # untouched rows and logits stay exact
    # a mask narrower than the vocabulary forbids the tokens past its end
    narrow = _bitmask_of(torch.ones((1, 32), dtype=torch.bool))
    (dev_logits,) = _on(hal_platform, logits)
    hal_platform.op("apply_token_mask")(dev_logits, *_on(hal_platform, narrow,
                                                         torch.tensor([1])))
    assert torch.isinf(dev_logits[1, 32:]).all() and torch.equal(dev_logits[1, :32].cpu(),
                                                                   logits[1, :32])
    hal_platform.op("apply_token_mask")(dev_logits, mask[:0], dev_rows[:0])  # nothing to do


# --- memory and graphs -------------------------------------------------------------------------
def test_kv_arena_is_one_allocation(hal_platform: Platform, dtype: torch.dtype) -> None:
    arena = hal_platform.create_kv_arena(3, 16, 2, 64, dtype)
    assert arena.storage.device.type == hal_platform.device().type
    assert arena.storage.dtype == dtype and len(arena.k) == len(arena.v) == 3
    for view in arena.k + arena.v:
        assert view.shape == (16, 2, 64)
        assert view.untyped_storage().data_ptr() == arena.storage.untyped_storage().data_ptr()
    k = _rand((2, 2, 64), dtype, 24).to(hal_platform.device())
    hal_platform.op("store_kv")(arena.k[1], arena.v[1], k, k,
                                torch.tensor([4, 5], device=hal_platform.device()))
    assert torch.equal(arena.storage[1, 0, 4:6].cpu(), k.cpu())
    assert int(arena.storage[0].count_nonzero()) == 0


def test_graph_capture_replays(hal_platform: Platform) -> None:
    runner = hal_platform.create_graph_runner()
    if not hal_platform.capabilities.graph_capture:
        assert runner is None, "a plugin without capture must return no graph runner"
        return
    assert runner is not None
    dtype = getattr(torch, hal_platform.capabilities.default_dtype)
    data = make_paged_case((5, 9, 16), (1, 1, 1), 8, 2, 64, dtype, seed=25)
    dev = _case_on(hal_platform, data)
    decode = hal_platform.op("attention_decode")
    out = torch.empty_like(dev.q)
    out.copy_(decode(dev.q, dev.k_cache, dev.v_cache, dev.req_to_token, dev.seq_lens,
                     data.scale))  # warm-up outside capture
    hal_platform.synchronize()
    runner.begin_capture(3)
    out.copy_(decode(dev.q, dev.k_cache, dev.v_cache, dev.req_to_token, dev.seq_lens,
                     data.scale))
    runner.end_capture(3)
    for step in range(2):  # new inputs in the same buffers, as the worker does
        dev.q.copy_(_rand(tuple(dev.q.shape), dtype, 26 + step).to(dev.q.device))
        dev.seq_lens.copy_(torch.tensor([6 + step, 10 + step, 16], dtype=dev.seq_lens.dtype))
        runner.replay(3)
        hal_platform.synchronize()
        eager = decode(dev.q, dev.k_cache, dev.v_cache, dev.req_to_token, dev.seq_lens,
                       data.scale)
        _close(out, eager, dtype)
    runner.reset()


# --- communicator ------------------------------------------------------------------------------
def test_communicator_single_rank(hal_platform: Platform) -> None:
    comm = hal_platform.create_communicator(0, 1, "")
    x = torch.arange(6.0, device=hal_platform.device()).reshape(2, 3)
    assert torch.equal(comm.all_reduce(x.clone()).cpu(), x.cpu())
    assert torch.equal(comm.all_gather(x, dim=1).cpu(), x.cpu())
    assert torch.equal(comm.reduce_scatter(x).cpu(), x.cpu())
    comm.barrier()
    comm.destroy()


def test_communicator_loopback(hal_platform: Platform) -> None:
    comm = hal_platform.create_communicator(1, 4, "", loopback=True)
    assert (comm.rank, comm.world_size) == (1, 4)
    x = torch.arange(8.0, device=hal_platform.device()).reshape(4, 2)
    assert torch.equal(comm.all_reduce(x.clone()).cpu(), x.cpu())
    assert torch.equal(comm.all_gather(x, dim=1).cpu(), torch.cat([x.cpu()] * 4, dim=1))
    assert torch.equal(comm.reduce_scatter(x).cpu(), x.cpu()[1:2])
    comm.send(x, 3)
    buf = torch.zeros_like(x)
    assert torch.equal(comm.recv(buf, 3).cpu(), x.cpu())
    comm.barrier()
    comm.destroy()


def _multi_process_capable(platform: Platform) -> bool:
    return "gloo" in platform.capabilities.communicator_backends or platform.device_count() >= 2


def test_communicator_two_processes(hal_platform: Platform, tmp_path: Path) -> None:
    if not _multi_process_capable(hal_platform):
        pytest.skip(f"{hal_platform.name}: two ranks need two devices or a host backend")
    init = f"file://{tmp_path / 'store'}"
    code = "import sys; from tessera.hal.conformance_comm import main; sys.exit(main(sys.argv[1:]))"
    procs = [subprocess.Popen([sys.executable, "-c", code, hal_platform.name, str(rank), "2",
                               init, str(tmp_path / f"rank{rank}.json")],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              env=os.environ.copy())
             for rank in range(2)]
    logs = []
    for proc in procs:
        try:
            logs.append(proc.communicate(timeout=120)[0])
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            pytest.fail("communicator processes did not finish in 120 s")
    for rank, proc in enumerate(procs):
        assert proc.returncode == 0, f"rank {rank} failed:\n{logs[rank]}"
    results = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in range(2)]
    for rank, got in enumerate(results):
        assert got["all_reduce"] == [[3.0, 3.0, 3.0], [3.0, 3.0, 3.0]]
        assert got["all_gather_dim0"] == [[0.0, 1.0], [10.0, 11.0]]
        assert got["all_gather_dim1"] == [[0.0, 1.0, 10.0, 11.0]]
        # sum of both ranks' [0..3] + 10*rank is [10, 12, 14, 16]; rank r keeps half r
        assert got["reduce_scatter"] == [[10.0, 12.0], [14.0, 16.0]][rank]
        # rank 0 sends [1, 2, 3] to rank 1, which sends back what it got plus one
        assert got["recv"] == [[2.0, 3.0, 4.0], [1.0, 2.0, 3.0]][rank]
        assert got["split_alone"] == [rank + 1.0, rank + 1.0]
        assert got["split_rank"] == [float(rank), 2.0]
        assert got["split_all_reduce"] == [3.0, 3.0]
        assert got["split_recv"] == [[7.0, 8.0], [0.0, 0.0]][rank]  # rank 1 sent to 0
        # rank 0's two queued sends completed; rank 1 got them in order
        assert got["irecv"] == [[1.0], [5.0, 6.0, 6.0, 7.0]][rank]
