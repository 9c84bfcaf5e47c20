"""The token GEMM (hal/cuda/token_gemm.py) on the CPU through Triton's interpreter, fp32,
tiny shapes, against x @ w^T (+ bias); its configuration rules and tables."""

from __future__ import annotations

from types import ModuleType

import pytest
import torch

TOL = {"atol": 1e-4, "rtol": 1e-4}


def _operands(m: int, n: int, k: int, seed: int) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn((m, k), generator=g), torch.randn((n, k), generator=g) / k ** 0.5,
            torch.randn((n,), generator=g))


# (m, n, k, config): token tiles wider than the batch, weight rows that do not fill their
# last tile, K that does not fill its last tile or its splits, splits of 2 and 4, two token
# tiles over one weight tile
CASES = [
    (2, 64, 64, (16, 64, 64, 4, 2, 1)),
    (5, 80, 96, (16, 64, 64, 4, 2, 1)),
    (17, 128, 256, (32, 64, 64, 4, 3, 2)),
    (9, 64, 448, (16, 64, 64, 4, 2, 4)),
    (33, 96, 128, (16, 32, 32, 4, 2, 2)),
    (40, 64, 192, (32, 64, 64, 8, 2, 1)),
]


@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("m,n,k,config", CASES,
                         ids=[f"m{c[0]}-n{c[1]}-k{c[2]}-s{c[3][5]}" for c in CASES])
def test_token_gemm_is_the_product(kernels: dict[str, ModuleType], m: int, n: int, k: int,
                                   config: tuple[int, ...], with_bias: bool) -> None:
    tg = kernels["token_gemm"]
    x, w, b = _operands(m, n, k, seed=m + n + k)
    bias = b if with_bias else None
    got = tg.token_gemm(x, w, bias, config)
    want = x @ w.T + (b if with_bias else 0.0)
    assert got.shape == (m, n) and got.dtype == x.dtype
    torch.testing.assert_close(got, want, **TOL)


def test_a_strided_batch_is_read_by_its_rows(kernels: dict[str, ModuleType]) -> None:
    """x may be a view whose rows are further apart than K (a slice of a wider buffer)."""
    tg = kernels["token_gemm"]
    wide, w, _ = _operands(6, 64, 160, seed=3)
    x = wide[:, :128]
    got = tg.token_gemm(x, w[:, :128].contiguous(), None, (16, 64, 64, 4, 2, 2))
    torch.testing.assert_close(got, x @ w[:, :128].T, **TOL)


def test_refuses_what_it_cannot_read(kernels: dict[str, ModuleType]) -> None:
    tg = kernels["token_gemm"]
    x, w, _ = _operands(4, 64, 64, seed=1)
    with pytest.raises(ValueError, match="row-major"):
        tg.token_gemm(x, w.T.contiguous().T, None, (16, 64, 64, 4, 2, 1))
    with pytest.raises(ValueError, match="row-major"):
        tg.token_gemm(x, w[:, :32], None, (16, 64, 32, 4, 2, 1))
    with pytest.raises(ValueError, match="does not fit"):
        tg.token_gemm(x, w, None, (16, 64, 48, 4, 2, 1))


def test_fits_rules(kernels: dict[str, ModuleType]) -> None:
    tg = kernels["token_gemm"]
    assert tg.fits(4096, (64, 64, 128, 4, 4, 4))
    assert not tg.fits(4096, (48, 64, 128, 4, 4, 1))  # not a power of two
    assert not tg.fits(4096, (8, 64, 128, 4, 4, 1))  # under the dot's 16
    assert not tg.fits(4096, (64, 64, 128, 2, 4, 1))  # warps
    assert not tg.fits(4096, (128, 128, 256, 4, 3, 1))  # 384 KB of stages
    assert not tg.fits(128, (64, 64, 64, 4, 3, 4))  # more splits than K tiles
    assert not tg.fits(320, (64, 64, 64, 4, 3, 4))  # 5 tiles in runs of 2: 4th empty
    assert not tg.fits(384, (64, 64, 64, 4, 3, 4))  # 6 tiles in runs of 2: the same
    assert tg.fits(448, (64, 64, 64, 4, 3, 4))  # 7 tiles: 2, 2, 2, 1


@pytest.mark.parametrize("m", [2, 16, 24, 64, 80, 128, 160, 256])
def test_candidates_fit_every_llama_projection(kernels: dict[str, ModuleType],
                                               m: int) -> None:
    tg = kernels["token_gemm"]
    for n, k in ((6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336), (128256, 4096)):
        cands = tg.candidates(m, n, k)
        assert cands, (m, n, k)
        assert all(tg.fits(k, c) for c in cands)
        assert all(c[0] >= min(16, m) for c in cands)
        programs = {c: -(-m // c[0]) * -(-n // c[1]) * c[5] for c in cands}
        # a weight with few rows is split until it reaches the chip's multiprocessors
        assert max(programs.values()) >= 100, (m, n, k)
        if m > 128:
            assert any(c[0] == 256 for c in cands) and any(c[0] == 128 for c in cands)


def test_table_rows_pick_the_first_count_at_or_above(kernels: dict[str, ModuleType]) -> None:
    tg = kernels["token_gemm"]
    table = tg.parse_table({"4096,4096": [[64, [64, 64, 128, 4, 6, 4]], [16, None],
                                          [128, [128, 64, 128, 4, 4, 4]]]})
    assert [r[0] for r in table[(4096, 4096)]] == [16, 64, 128]  # sorted by token count
    assert tg.lookup(table, 8, 4096, 4096) == (True, None)  # held: cuBLAS
    assert tg.lookup(table, 17, 4096, 4096) == (True, (64, 64, 128, 4, 6, 4))
    assert tg.lookup(table, 64, 4096, 4096) == (True, (64, 64, 128, 4, 6, 4))
    assert tg.lookup(table, 100, 4096, 4096) == (True, (128, 64, 128, 4, 4, 4))
    assert tg.lookup(table, 129, 4096, 4096) == (False, None)  # past the last row
    assert tg.lookup(table, 64, 4096, 14336) == (False, None)  # another shape
    # a config that cannot run this product (here: more splits than K tiles) is cuBLAS
    small_k = tg.parse_table({"4096,256": [[64, [64, 64, 128, 4, 6, 4]]]})
    assert tg.lookup(small_k, 32, 4096, 256) == (True, None)


@pytest.mark.parametrize("data,match", [
    ([1, 2], "is an object"),
    ({"4096": [[16, None]]}, "4096"),
    ({"4096,4096": [[16, [1, 2, 3]]]}, "is not"),
    ({"4096,4096": [["x", None]]}, "4096,4096"),
])
def test_a_bad_table_is_a_clear_error(kernels: dict[str, ModuleType], data: object,
                                      match: str) -> None:
    with pytest.raises(ValueError, match=match):
        kernels["token_gemm"].parse_table(data)


def test_the_table_variable_replaces_tuned(kernels: dict[str, ModuleType], tmp_path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """HAL_CUDA_TOKEN_GEMM_TABLE: a probe's output (its `picks`) is the process's table."""
    import json

    tg = kernels["token_gemm"]
    path = tmp_path / "probe.json"
    path.write_text(json.dumps({"cases": {}, "picks": {"64,32": [[16, [16, 32, 32, 4, 2, 1]]]}}))
    monkeypatch.setenv(tg.TABLE_VARIABLE, str(path))
    tg._table.cache_clear()
    try:
        assert tg._table() == {(64, 32): ((16, (16, 32, 32, 4, 2, 1)),)}
        x, w, _ = _operands(4, 64, 32, seed=2)
        tg._mode.cache_clear()
        monkeypatch.setenv(tg.VARIABLE, "table")
        assert tg.config_for(x, w, None) == (16, 32, 32, 4, 2, 1)
        monkeypatch.setenv(tg.VARIABLE, "off")
        tg._mode.cache_clear()
        assert tg.config_for(x, w, None) is None
    finally:
        tg._table.cache_clear()
        tg._mode.cache_clear()
    monkeypatch.delenv(tg.TABLE_VARIABLE)
    assert tg._table("NVIDIA Unknown") == {}


def test_tuned_tables_are_the_cards_own(kernels: dict[str, ModuleType],
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """TUNED is keyed by a word of the device's name: one card's picks never run on another;
    every row of it is a config that fits its product, token counts ascending."""
    tg = kernels["token_gemm"]
    monkeypatch.setitem(tg.TUNED, "H300", {(64, 32): ((16, (16, 32, 32, 4, 2, 1)),)})
    tg._table.cache_clear()
    try:
        assert tg._table("NVIDIA H300 SXM") == {(64, 32): ((16, (16, 32, 32, 4, 2, 1)),)}
        assert tg._table("NVIDIA H3000") == {}  # a word, not a substring
    finally:
        tg._table.cache_clear()
    for table in tg.TUNED.values():
        for (n, k), rows in table.items():
            assert [r[0] for r in rows] == sorted(r[0] for r in rows)
            for tokens, config in rows:
                assert config is None or tg.fits(k, config), (n, k, tokens, config)


@pytest.mark.parametrize("value,mode", [(None, "table"), ("", "table"), ("1", "table"),
                                        ("measure", "measure"), ("0", "off"), ("OFF", "off")])
def test_mode_setting(kernels: dict[str, ModuleType], value: str | None, mode: str) -> None:
    assert kernels["token_gemm"].setting(value) == mode


def test_a_bad_mode_names_the_variable(kernels: dict[str, ModuleType]) -> None:
    with pytest.raises(ValueError, match="HAL_CUDA_TOKEN_GEMM"):
        kernels["token_gemm"].setting("fast")


def test_the_linear_op_leaves_cpu_tensors_to_torch(kernels: dict[str, ModuleType]) -> None:
    """applies() holds the kernel to bf16 on a Hopper device: anything else is F.linear."""
    tg = kernels["token_gemm"]
    x, w, b = _operands(8, 64, 32, seed=4)
    assert not tg.applies(x, w)
    assert not tg.applies(x.bfloat16(), w.bfloat16())  # not on a GPU
    torch.testing.assert_close(kernels["gemv"].linear(x, w, b), x @ w.T + b, **TOL)
