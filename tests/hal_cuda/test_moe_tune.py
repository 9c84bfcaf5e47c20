"""moe_tune: the fused MoE's tiles measured once per shape bucket, never inside a graph capture,
the fastest kept; the first candidate is the fixed heuristic the op used before tuning. The
kernels run in Triton's interpreter (the device timer is replaced: the interpreter has none)."""

from __future__ import annotations

from types import ModuleType
from typing import Any

import pytest
import torch

from tessera.hal.reference import reference_op

TOL = {"atol": 1e-5, "rtol": 1e-5}


def _case(tokens: int, seed: int) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, 48, generator=gen)
    w13 = torch.randn(4, 80, 48, generator=gen) / 48 ** 0.5
    w2 = torch.randn(4, 48, 40, generator=gen) / 40 ** 0.5
    weights, ids = torch.softmax(torch.randn(tokens, 4, generator=gen), -1).topk(2, dim=-1)
    return x, w13, w2, weights, ids.to(torch.int32)


def test_first_candidates_are_the_untuned_heuristic() -> None:
    from tessera.hal.cuda import moe_tune

    bf16 = torch.bfloat16
    for tokens in (1, 3, 8, 17, 64):
        assert moe_tune.candidates(tokens, 28672, 4096, bf16)[0] == (16, 32, 64, 4, 3)
        assert moe_tune.candidates(tokens, 20, 4096, bf16)[0] == (16, 32, 64, 4, 3)
        assert moe_tune.candidates(tokens, 8, 16, bf16)[0] == (16, 16, 64, 4, 3)
    for tokens in (65, 256, 8192):
        assert moe_tune.candidates(tokens, 28672, 4096, bf16)[0] == (64, 128, 64, 4, 3)
    # the down GEMM at the gate/up's BLOCK_M: the heuristic's tile, then the others
    down = moe_tune.candidates(3, 4096, 14336, bf16, block_m=16)
    assert down[0] == (16, 32, 64, 4, 3) and {t[0] for t in down} == {16}
    assert {t[0] for t in moe_tune.candidates(100, 4096, 14336, bf16, block_m=128)} == {128}


def test_decode_candidates_move_more_weight_per_iteration() -> None:
    """At decode the GEMMs stream the experts' weights: the candidates hold tiles moving 16-64
    KiB of bf16 weight per program per K iteration (the heuristic: 4 KiB), deeper pipelines,
    8 warps, and all within the shared memory budget."""
    from tessera.hal.cuda import moe_tune

    for tokens in (1, 4, 8, 64):
        cands = moe_tune.candidates(tokens, 28672, 4096, torch.bfloat16)
        assert len(cands) == len(set(cands)) >= 8
        assert max(bn * bk * 2 for _, bn, bk, _, _ in cands) >= 32 * 1024
        assert {w for *_, w, _ in cands} == {4, 8} and max(s for *_, s in cands) >= 5
        assert all(moe_tune.shared_bytes(t, 2) <= moe_tune.SMEM_BYTES for t in cands)
    large = moe_tune.candidates(4096, 28672, 4096, torch.bfloat16)
    assert {t[0] for t in large} >= {64, 128} and {t[1] for t in large} >= {128, 256}


@pytest.fixture()
def tuner(monkeypatch: pytest.MonkeyPatch, kernels: dict[str, ModuleType]) -> dict[str, Any]:
    """A measurable CPU 'device' with a capture switch, a timer that runs the candidate and
    returns the time `times` gives the n-th measurement (default 1 ms), and a log of the
    grouped GEMMs launched."""
    from tessera.hal.cuda import autotune

    moe = kernels["moe"]
    state: dict[str, Any] = {"capturing": False, "timed": [], "times": {}, "launched": []}
    monkeypatch.setattr(autotune, "chosen", {})
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: state["capturing"])
    monkeypatch.setattr(autotune, "measurable",
                        lambda x: not torch.cuda.is_current_stream_capturing())

    def fake_bench(run: Any, config: tuple[int, ...]) -> float:
        assert not state["capturing"], "measured inside a capture"
        state["timed"].append(config)
        run(config)
        return state["times"].get(len(state["timed"]) - 1, 1.0)

    monkeypatch.setattr(autotune, "bench_ms", fake_bench)
    original = moe.grouped_gemm

    def logged(a: Any, b: Any, out: Any, align: Any, top_k: int, **kw: Any) -> None:
        state["launched"].append((align.block_m, kw["block_n"], kw["block_k"],
                                  kw["num_warps"], kw["num_stages"]))
        original(a, b, out, align, top_k, **kw)

    monkeypatch.setattr(moe, "grouped_gemm", logged)
    return state


def test_tuner_measures_once_outside_captures_and_keeps_the_fastest(
        kernels: dict[str, ModuleType], tuner: dict[str, Any]) -> None:
    from tessera.hal.cuda import autotune, moe_tune

    moe = kernels["moe"]
    f32 = torch.float32
    gate_up = moe_tune.candidates(17, 80, 48, f32)
    fast1 = next(t for t in gate_up if t[0] == 32)  # another alignment than the heuristic's
    down = moe_tune.candidates(17, 48, 40, f32, block_m=32)
    fast2 = down[-1]
    tuner["times"] = {gate_up.index(fast1): 0.5, len(gate_up) + len(down) - 1: 0.25, 0: 0.75}

    case = _case(17, seed=1)
    out = moe.fused_moe(*case)  # measured: every candidate of both GEMMs, once
    torch.testing.assert_close(out, reference_op("fused_moe")(*case), **TOL)
    assert tuner["timed"] == gate_up + down
    # each measured candidate, then the op's own launch with the fastest
    assert tuner["launched"] == gate_up + [fast1] + down + [fast2]
    tuner["timed"].clear()
    case = _case(40, seed=2)  # the same bucket (9-64 tokens): kept, not measured again
    tuner["launched"].clear()
    out = moe.fused_moe(*case)
    torch.testing.assert_close(out, reference_op("fused_moe")(*case), **TOL)
    assert tuner["timed"] == [] and tuner["launched"] == [fast1, fast2]

    # one token, first seen inside a capture: the heuristic, unmeasured and not kept
    tuner["capturing"], tuner["launched"] = True, []
    case = _case(1, seed=3)
    out = moe.fused_moe(*case)
    torch.testing.assert_close(out, reference_op("fused_moe")(*case), **TOL)
    assert tuner["timed"] == [] and tuner["launched"] == [(16, 32, 64, 4, 3), (16, 32, 64, 4, 3)]
    assert len(autotune.chosen) == 2
    tuner["capturing"] = False  # outside the capture it is measured
    gate_up = moe_tune.candidates(1, 80, 48, f32)
    down = moe_tune.candidates(1, 48, 40, f32, block_m=16)
    tuner["timed"], tuner["times"] = [], {1: 0.5, len(gate_up) + len(down) - 1: 0.25}
    moe.fused_moe(*case)
    assert tuner["timed"] == gate_up + down and len(autotune.chosen) == 4
    tuner["timed"] = []
    tuner["capturing"], tuner["launched"] = True, []  # a capture now takes what was measured
    out = moe.fused_moe(*case)
    torch.testing.assert_close(out, reference_op("fused_moe")(*case), **TOL)
    assert tuner["launched"] == [gate_up[1], down[-1]] and tuner["timed"] == []


def test_a_candidate_the_device_refuses_is_skipped(kernels: dict[str, ModuleType],
                                                   tuner: dict[str, Any],
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    from tessera.hal.cuda import autotune, moe_tune

    moe = kernels["moe"]
    gate_up = moe_tune.candidates(3, 80, 48, torch.float32)
    refused = gate_up[1]
    fake = autotune.bench_ms

    def refusing(run: Any, config: tuple[int, ...]) -> float:
        if config == refused:
            raise RuntimeError("out of resources: shared memory")
        return fake(run, config)

    monkeypatch.setattr(autotune, "bench_ms", refusing)
    tuner["times"] = {1: 0.5}  # the second measured: gate_up[2]
    case = _case(3, seed=4)
    out = moe.fused_moe(*case)
    torch.testing.assert_close(out, reference_op("fused_moe")(*case), **TOL)
    assert refused not in tuner["timed"]
    assert [v for k, v in autotune.chosen.items() if k[0] == "moe_gate_up"] == [gate_up[2]]
