"""The token GEMM (hal/cuda/token_gemm.py) compiled on a GPU: its configurations against the
float64 product, the linear op taking it from its table (eager and in a graph), its measure
mode. The interpreter's tests: test_token_gemm_interpreted.py."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")]


def _token_gemm_case(m: int, n: int, k: int, seed: int) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn((m, k), device="cuda", generator=gen).bfloat16()
    w = (torch.randn((n, k), device="cuda", generator=gen) * k ** -0.5).bfloat16()
    bias = torch.randn(n, device="cuda", generator=gen).bfloat16()
    return x, w, bias


@pytest.mark.parametrize("m,n,k", [(5, 4096, 4096), (80, 6144, 4096), (200, 4096, 14336),
                                   (37, 1000, 200)])
@pytest.mark.parametrize("with_bias", [False, True])
def test_token_gemm_candidates_match_the_product(m: int, n: int, k: int,
                                                 with_bias: bool) -> None:
    """Every configuration the probe would time at this shape (a sample of four of them for
    speed: the first, the last and two between), bf16 against the float64 product: the same
    rounding as cuBLAS's bf16 output, token tiles wider than the batch, two token tiles (200
    tokens in 128s), K splits, an odd shape that no tile divides."""
    from tessera.hal.cuda import token_gemm as tg

    x, w, b = _token_gemm_case(m, n, k, seed=m + n)
    bias = b if with_bias else None
    ref = x.double() @ w.double().T + (b.double() if with_bias else 0.0)
    cands = tg.candidates(m, n, k) or [(16, 64, 64, 4, 3, 1)]
    picks = sorted({0, len(cands) // 3, 2 * len(cands) // 3, len(cands) - 1})
    base = float((F.linear(x, w, bias).double() - ref).abs().max() / ref.abs().max())
    for i in picks:
        out = tg.token_gemm(x, w, bias, cands[i])
        assert out.dtype == torch.bfloat16 and out.shape == (m, n)
        err = float((out.double() - ref).abs().max() / ref.abs().max())
        assert err <= 2 * base + 1e-3, (cands[i], err, base)


def test_linear_takes_the_token_gemm_from_its_table_in_a_graph(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The plugin's linear op, with a table naming a config for 33-64 tokens of this shape,
    runs the token GEMM (eager and inside a captured graph alike: the same output), and
    cuBLAS for a token count the table does not cover."""
    import json

    from tessera.hal.cuda import gemv
    from tessera.hal.cuda import token_gemm as tg

    if torch.cuda.get_device_capability() != tg.CAPABILITY:
        pytest.skip("the token GEMM is used on Hopper only")
    config = [64, 64, 128, 4, 4, 2]
    path = tmp_path / "table.json"
    path.write_text(json.dumps({"picks": {"4096,4096": [[32, None], [64, config]]}}))
    monkeypatch.setenv(tg.TABLE_VARIABLE, str(path))
    monkeypatch.setenv(tg.VARIABLE, "table")
    tg._table.cache_clear()
    tg._mode.cache_clear()
    try:
        x, w, _ = _token_gemm_case(48, 4096, 4096, seed=3)
        assert tg.config_for(x, w, None) == tuple(config)
        eager = gemv.linear(x, w, None)
        assert torch.equal(eager, tg.token_gemm(x, w, None, tuple(config)))
        static_x = x.clone()
        graph = torch.cuda.CUDAGraph()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            gemv.linear(static_x, w, None)
        torch.cuda.current_stream().wait_stream(side)
        with torch.cuda.graph(graph):
            out = gemv.linear(static_x, w, None)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, eager)
        small, _, _ = _token_gemm_case(20, 4096, 4096, seed=4)
        assert tg.config_for(small, w, None) is None  # the table's cuBLAS row
        assert torch.equal(gemv.linear(small, w, None), F.linear(small, w))
    finally:
        tg._table.cache_clear()
        tg._mode.cache_clear()


def test_token_gemm_measure_mode_measures_a_product_once(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """HAL_CUDA_TOKEN_GEMM=measure: a product no table holds is timed against cuBLAS the
    first time it runs outside a capture, the choice kept for the process; inside a capture an
    unmeasured one is cuBLAS. The product is right either way."""
    from tessera.hal.cuda import autotune, gemv
    from tessera.hal.cuda import token_gemm as tg

    if torch.cuda.get_device_capability() != tg.CAPABILITY:
        pytest.skip("the token GEMM is used on Hopper only")
    monkeypatch.setenv(tg.VARIABLE, "measure")
    monkeypatch.delenv(tg.TABLE_VARIABLE, raising=False)
    tg._mode.cache_clear()
    tg._table.cache_clear()
    try:
        x, w, b = _token_gemm_case(24, 2048, 1024, seed=5)
        key = ("token_gemm", 24, 2048, 1024, x.device.index, True)
        autotune.chosen.pop(key, None)
        out = gemv.linear(x, w, b)
        assert key in autotune.chosen
        chosen = autotune.chosen[key]
        assert chosen in (tg.CUBLAS, *tg.candidates(24, 2048, 1024))
        ref = x.double() @ w.double().T + b.double()
        assert float((out.double() - ref).abs().max() / ref.abs().max()) < 1e-2
        gemv.linear(x, w, b)
        assert autotune.chosen[key] == chosen  # measured once
        autotune.chosen.pop(key)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):  # unmeasured inside a capture: cuBLAS, not kept
            assert tg.config_for(x, w, b) is None
        assert key not in autotune.chosen
    finally:
        tg._mode.cache_clear()
