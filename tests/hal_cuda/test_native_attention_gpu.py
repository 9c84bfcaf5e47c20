"""The CUDA C decode attention over an fp8 cache (hal/cuda/native_attention.py) on the GPU:
against the fp32 reference over the values the cache holds and against the Triton stage 1,
at query groups of 1, 4 and 8 heads, bf16 and fp16 q, one split and many, sliding windows and
soft caps, mixed batches, NaN bytes in the slots no request reads, inside a CUDA graph; and
that it is the kernel that ran (never a silent fall back to Triton)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from tessera.hal.reference import reference_op

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")]

D = 128


@pytest.fixture
def native(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """The native stage 1 switched on; the list counts its launches."""
    from tessera.hal.cuda import native_attention

    if not native_attention.nvrtc.available() or \
            torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("needs cuda-python and sm_89 or later")
    monkeypatch.setenv(native_attention.VARIABLE, "1")
    native_attention.enabled.cache_clear()
    calls: list[int] = []
    real = native_attention.launch_stage1

    def counted(*args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(native_attention, "launch_stage1", counted)
    yield calls
    monkeypatch.delenv(native_attention.VARIABLE)
    native_attention.enabled.cache_clear()


def _case(seq_lens: list[int], hq: int, hk: int, dtype: torch.dtype, seed: int,
          extend_lens: list[int] | None = None) -> dict[str, torch.Tensor]:
    """test_kernels_gpu's paged case over an e4m3 cache (normals and subnormals); every slot
    no request reads (page 0, the pages' tails) holds NaN bytes."""
    from test_kernels_gpu import _paged

    c = _paged(seq_lens, extend_lens or [1] * len(seq_lens), dtype, seed, hq=hq, hk=hk)
    unread = torch.ones(c["k_cache"].shape[0], dtype=torch.bool, device="cuda")
    for b, s in enumerate(seq_lens):
        unread[c["req_to_token"][b, :s].long()] = False
    for name in ("k_cache", "v_cache"):
        c[name] = (c[name].float() * 8).to(torch.float8_e4m3fn)
        c[name].view(torch.uint8)[unread] = 0x7F  # e4m3's NaN
    return c


def _reference(c: dict[str, torch.Tensor], scale: float, window: int = 0,
               cap: float = 0.0) -> torch.Tensor:
    f = {k: (v.float() if v.is_floating_point() else v) for k, v in c.items()}
    for name in ("k_cache", "v_cache"):
        f[name] = torch.nan_to_num(f[name], nan=0.0) * 0.125
    return reference_op("attention_extend")(f["q"], f["k_cache"], f["v_cache"],
                                            f["req_to_token"], f["seq_lens"], f["extend_lens"],
                                            f["qo_indptr"], scale, sliding_window=window,
                                            logit_cap=cap)


def _rel(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float((out.float() - ref).norm() / ref.norm())


def _decode(c: dict[str, torch.Tensor], **kw) -> torch.Tensor:  # type: ignore[no-untyped-def]
    from tessera.hal.cuda.decode_attention import attention_decode

    return attention_decode(c["q"], c["k_cache"], c["v_cache"], c["req_to_token"],
                            c["seq_lens"], D ** -0.5, k_scale=0.125, v_scale=0.125, **kw)


LENGTHS = [[1], [4096], [17, 600, 2049, 3, 1024, 77, 4000, 256], [16, 32, 15, 33, 64, 1],
           [37 * (i % 9) + 1 for i in range(64)], [100 + 7 * i for i in range(256)]]


@pytest.mark.parametrize("heads", [(32, 8), (8, 8), (64, 8)])
@pytest.mark.parametrize("seq_lens", LENGTHS)
def test_native_decode_equals_the_reference_and_triton(native: list[int], seq_lens: list[int],
                                                       heads: tuple[int, int],
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    from tessera.hal.cuda import native_attention

    c = _case(seq_lens, *heads, torch.bfloat16, seed=len(seq_lens))
    out = _decode(c)
    assert native, "the native stage 1 did not run"
    assert torch.isfinite(out).all()
    assert _rel(out, _reference(c, D ** -0.5)) < 1e-2
    monkeypatch.setenv(native_attention.VARIABLE, "0")
    native_attention.enabled.cache_clear()
    triton_out = _decode(c)
    assert _rel(out, triton_out.float()) < 5e-3


@pytest.mark.parametrize("splits", [1, 3, 32])
@pytest.mark.parametrize("tile", ["1,2", "2,4", "8,3", "4,8"])
def test_every_split_count_and_tile(native: list[int], splits: int, tile: str,
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Blocks of 1-8 warps, rings of 2-8 stages (over 48 KB of shared memory at 4 x 8)."""
    from tessera.hal.cuda import native_attention

    monkeypatch.setenv(native_attention.TILE_VARIABLE, tile)
    native_attention.tile.cache_clear()
    try:
        c = _case([5, 300, 1000, 47, 2048], 32, 8, torch.float16, seed=splits)
        out = _decode(c, splits=splits)
    finally:
        monkeypatch.delenv(native_attention.TILE_VARIABLE)
        native_attention.tile.cache_clear()
    assert native and out.dtype == torch.float16
    assert _rel(out, _reference(c, D ** -0.5)) < 1e-2


@pytest.mark.parametrize("window, cap", [(100, 0.0), (0, 30.0), (700, 50.0)])
def test_windows_and_soft_caps(native: list[int], window: int, cap: float) -> None:
    c = _case([17, 600, 2049, 3, 1024], 32, 8, torch.bfloat16, seed=window)
    c["q"] = c["q"] * 4  # scores large enough for the cap to bite
    out = _decode(c, sliding_window=window, logit_cap=cap)
    assert native
    assert _rel(out, _reference(c, D ** -0.5, window, cap)) < 1e-2


def test_a_mixed_batch_takes_the_one_token_rows(native: list[int]) -> None:
    """attention_extend: the one-token extends by the native stage 1, the others by the
    extend kernel, every row right."""
    from tessera.hal.cuda.extend_attention import attention_extend

    c = _case([300, 40, 1000, 7, 513], 32, 8, torch.bfloat16, seed=5,
              extend_lens=[1, 40, 1, 3, 1])
    out = attention_extend(c["q"], c["k_cache"], c["v_cache"], c["req_to_token"],
                           c["seq_lens"], c["extend_lens"], c["qo_indptr"], D ** -0.5,
                           k_scale=0.125, v_scale=0.125)
    assert native
    assert _rel(out, _reference(c, D ** -0.5)) < 1e-2


def test_a_captured_graph_replays_what_eager_computes(native: list[int]) -> None:
    c = _case([900, 33, 2000, 1, 640, 128], 32, 8, torch.bfloat16, seed=9)
    eager = _decode(c)
    graph = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        _decode(c)
    torch.cuda.current_stream().wait_stream(side)
    with torch.cuda.graph(graph):
        captured = _decode(c)
    c["seq_lens"][0] = 700  # the lengths are read on the device at replay
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured, _decode(c))
    assert not torch.equal(captured, eager)
    assert _rel(captured, _reference(c, D ** -0.5)) < 1e-2


def test_what_it_does_not_take_runs_the_triton_kernel(native: list[int]) -> None:
    """Heads of 64, 16-head groups, an fp32 q, a bf16 cache: not the native kernel's, and
    still right."""
    from tessera.hal.cuda.decode_attention import attention_decode

    c = _case([300, 17], 32, 2, torch.bfloat16, seed=1)  # a group of 16
    assert _rel(_decode(c), _reference(c, D ** -0.5)) < 1e-2
    c = _case([300, 17], 32, 8, torch.float32, seed=2)
    assert _rel(_decode(c), _reference(c, D ** -0.5)) < 1e-2
    q = torch.randn(2, 8, 64, device="cuda", dtype=torch.bfloat16)
    kc = torch.randn(64, 2, 64, device="cuda").to(torch.float8_e4m3fn)
    rtt = torch.arange(64, dtype=torch.int32, device="cuda").view(2, 32)
    lens = torch.tensor([32, 9], dtype=torch.int32, device="cuda")
    out = attention_decode(q, kc, kc, rtt, lens, 0.125)
    assert torch.isfinite(out).all()
    assert not native


@pytest.mark.parametrize("splits", [None, 3])
@pytest.mark.parametrize("seq_lens", LENGTHS)
def test_probe4_a_block_over_a_requests_heads_equals_the_reference(
        native: list[int], seq_lens: list[int], splits: int | None,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The bench's probe 4 (native_attention.defines: a block over a request's KV heads, a
    warp a head, each writing its own): the same attention, one split or several merged by
    stage 2 (an empty split's lse -inf)."""
    from tessera.hal.cuda import native_attention

    real = native_attention.launch_stage1
    monkeypatch.setattr(native_attention, "launch_stage1",
                        lambda *a, **kw: real(*a, **{**kw, "probe": 4}))
    c = _case(seq_lens, 32, 8, torch.bfloat16, seed=len(seq_lens))
    out = _decode(c, splits=splits)
    assert native, "the native stage 1 did not run"
    assert torch.isfinite(out).all()
    assert _rel(out, _reference(c, D ** -0.5)) < 1e-2
