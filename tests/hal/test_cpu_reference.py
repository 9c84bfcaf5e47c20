"""The oracle itself: the cpu reference ops against naive formulas computed in float64."""

from __future__ import annotations

import math

import pytest
import torch

from tessera.hal.conformance_data import EXTEND_CASES, make_paged_case, sampling_params
from tessera.hal.cpu import attention, dense
from tessera.hal.cpu.sampling import filtered_probs, sample, stream_seed


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_rms_norm_formula() -> None:
    x, w = torch.randn(3, 32, generator=_gen(0)), torch.randn(32, generator=_gen(1))
    x64 = x.double()
    expected = x64 / torch.sqrt((x64 ** 2).mean(-1, keepdim=True) + 1e-6) * w.double()
    torch.testing.assert_close(dense.rms_norm(x, w, 1e-6), expected.float())
    out, res = dense.fused_add_rms_norm(x, x, w, 1e-6)
    assert torch.equal(res, 2 * x)
    torch.testing.assert_close(out, dense.rms_norm(2 * x, w, 1e-6))


def test_silu_and_mul_and_linear_formulas() -> None:
    x = torch.randn(4, 10, generator=_gen(2))
    gate, up = x[:, :5].double(), x[:, 5:].double()
    torch.testing.assert_close(dense.silu_and_mul(x), (gate / (1 + torch.exp(-gate)) * up).float())
    w, b = torch.randn(3, 10, generator=_gen(3)), torch.randn(3, generator=_gen(4))
    torch.testing.assert_close(dense.linear(x, w, b),
                               (x.double() @ w.double().T + b.double()).float())


def test_rotary_is_a_rotation_of_pairs() -> None:
    # rotate-half pairs dim i with dim i + D/2 and turns the pair by position * inv_freq[i]
    d = 8
    freqs = torch.tensor([1.0, 0.5, 0.25, 0.125])
    angles = torch.arange(4.0)[:, None] * freqs
    table = torch.cat((angles.cos(), angles.sin()), dim=-1)
    q = torch.randn(2, 1, d, generator=_gen(5))
    positions = torch.tensor([3, 1])
    q_out, _ = dense.rotary_embedding(positions, q, q, table)
    for t, p in enumerate(positions.tolist()):
        for i in range(d // 2):
            a = p * freqs[i].item()
            x1, x2 = q[t, 0, i].item(), q[t, 0, i + d // 2].item()
            assert q_out[t, 0, i].item() == pytest.approx(x1 * math.cos(a) - x2 * math.sin(a),
                                                          abs=1e-5)
            assert q_out[t, 0, i + d // 2].item() == pytest.approx(
                x2 * math.cos(a) + x1 * math.sin(a), abs=1e-5)


def _naive_attention(case, b: int, i: int, window: int = 0,  # type: ignore[no-untyped-def]
                     cap: float = 0.0) -> torch.Tensor:
    """Output [Hq, D] of query i of request b: a dense softmax over the visible keys (the
    last `window` of them with a window), scores soft-capped at `cap`."""
    seq_len, ext_len = int(case.seq_lens[b]), int(case.extend_lens[b])
    visible = seq_len - ext_len + i + 1
    first = max(0, visible - window) if window > 0 else 0
    slots = case.req_to_token[b, first:visible].long()
    q = case.q[int(case.qo_indptr[b]) + i].double()
    k, v = case.k_cache[slots].double(), case.v_cache[slots].double()
    group = q.shape[0] // k.shape[1]
    out = torch.empty_like(q)
    for h in range(q.shape[0]):
        scores = (k[:, h // group] @ q[h]) * case.scale
        if cap > 0:
            scores = cap * torch.tanh(scores / cap)
        weights = torch.exp(scores - scores.max())
        out[h] = (weights / weights.sum()) @ v[:, h // group]
    return out


@pytest.mark.parametrize("name", sorted(EXTEND_CASES))
@pytest.mark.parametrize("hq,hk", [(4, 4), (4, 1)])
def test_attention_extend_against_dense_softmax(name: str, hq: int, hk: int) -> None:
    seq_lens, extend_lens = EXTEND_CASES[name]
    case = make_paged_case(seq_lens, extend_lens, hq, hk, 16, torch.float32, seed=6)
    out = attention.attention_extend(case.q, case.k_cache, case.v_cache, case.req_to_token,
                                     case.seq_lens, case.extend_lens, case.qo_indptr, case.scale)
    assert out.shape == case.q.shape
    for b, ext_len in enumerate(extend_lens):
        for i in range(ext_len):
            torch.testing.assert_close(out[int(case.qo_indptr[b]) + i].double(),
                                       _naive_attention(case, b, i), atol=1e-5, rtol=1e-5)


def test_attention_decode_against_dense_softmax() -> None:
    case = make_paged_case((1, 4, 5, 17), (1, 1, 1, 1), 8, 2, 16, torch.float32, seed=7)
    out = attention.attention_decode(case.q, case.k_cache, case.v_cache, case.req_to_token,
                                     case.seq_lens, case.scale)
    for b in range(4):
        torch.testing.assert_close(out[b].double(), _naive_attention(case, b, 0), atol=1e-5,
                                   rtol=1e-5)


@pytest.mark.parametrize("window,cap", [(3, 0.0), (0, 0.5), (6, 0.8), (100, 0.0)])
def test_sliding_window_and_soft_capping(window: int, cap: float) -> None:
    """Scores of order 1 (scale 1, cap < 1 bites), windows shorter and longer than the rows."""
    seq_lens, extend_lens = (9, 17, 4, 12), (9, 5, 1, 12)
    case = make_paged_case(seq_lens, extend_lens, 4, 2, 16, torch.float32, seed=9)
    case.scale = 0.25
    out = attention.attention_extend(case.q, case.k_cache, case.v_cache, case.req_to_token,
                                     case.seq_lens, case.extend_lens, case.qo_indptr, case.scale,
                                     sliding_window=window, logit_cap=cap)
    for b, ext_len in enumerate(extend_lens):
        for i in range(ext_len):
            torch.testing.assert_close(out[int(case.qo_indptr[b]) + i].double(),
                                       _naive_attention(case, b, i, window, cap), atol=1e-5,
                                       rtol=1e-5)
    dec = make_paged_case(seq_lens, (1,) * 4, 4, 2, 16, torch.float32, seed=10)
    out = attention.attention_decode(dec.q, dec.k_cache, dec.v_cache, dec.req_to_token,
                                     dec.seq_lens, dec.scale, sliding_window=window,
                                     logit_cap=cap)
    for b in range(4):
        torch.testing.assert_close(out[b].double(), _naive_attention(dec, b, 0, window, cap),
                                   atol=1e-5, rtol=1e-5)


def test_attention_decode_padding_row_is_zero() -> None:
    case = make_paged_case((3, 1), (1, 1), 2, 2, 8, torch.float32, seed=8)
    case.seq_lens[1] = 0
    out = attention.attention_decode(case.q, case.k_cache, case.v_cache, case.req_to_token,
                                     case.seq_lens, case.scale)
    assert torch.equal(out[1], torch.zeros_like(out[1]))
    assert torch.isfinite(out).all()


def test_store_kv_in_place() -> None:
    cache = torch.zeros(6, 1, 2)
    dense.store_kv(cache, cache.clone(), torch.ones(2, 1, 2), torch.ones(2, 1, 2),
                   torch.tensor([1, 4], dtype=torch.int32))
    assert cache[:, 0, 0].tolist() == [0, 1, 0, 0, 1, 0]


def test_filtered_probs_exact() -> None:
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    params = sampling_params(1, top_k=3)
    kept = filtered_probs(probs.log(), params)
    torch.testing.assert_close(kept / kept.sum(), torch.tensor([[0.5, 0.3, 0.15, 0.0]]) / 0.95)
    params = sampling_params(1, top_p=0.8)  # mass before token 2 is exactly 0.8: dropped
    kept = filtered_probs(probs.log(), params)
    assert (kept[0, :2] > 0).all() and (kept[0, 2:] == 0).all()
    params = sampling_params(1, top_p=0.0)  # degenerate: the best token always survives
    assert (filtered_probs(probs.log(), params)[0] > 0).tolist() == [True, False, False, False]


def test_stream_seed_separates_neighbours() -> None:
    seeds = {stream_seed(s, o) for s in range(20) for o in range(20)}
    assert len(seeds) == 400
    assert all(0 <= s < 2 ** 63 for s in seeds)


def test_unseeded_rows_follow_the_global_generator() -> None:
    logits = torch.zeros(3, 1000)
    torch.manual_seed(123)
    first = sample(logits, sampling_params(3))
    torch.manual_seed(123)
    assert torch.equal(sample(logits, sampling_params(3)), first)


def test_filtered_probs_without_filters_is_the_softmax() -> None:
    logits = torch.randn(2, 30, generator=_gen(9))
    params = sampling_params(2, temperature=torch.tensor([1.0, 0.5]))
    expected = torch.stack([logits[0].softmax(-1), (logits[1] / 0.5).softmax(-1)])
    torch.testing.assert_close(filtered_probs(logits, params), expected)


def test_top_p_window_widens_for_flat_distributions() -> None:
    # Nearly flat over 5000 tokens: the nucleus of 0.5 is ~2500 tokens, far beyond the first
    # topk window, and the result must equal the definition computed with a full sort.
    logits = torch.randn(3, 5000, generator=_gen(10)) * 0.01
    params = sampling_params(3, top_p=torch.tensor([0.5, 0.95, 1.0]),
                             top_k=torch.tensor([0, 3000, 0]))
    got = filtered_probs(logits, params)
    probs = logits.softmax(-1)
    for row, (p, k) in enumerate([(0.5, 5000), (0.95, 3000), (1.0, 5000)]):
        values, order = probs[row].sort(descending=True)
        values = values * (torch.arange(5000) < k)
        values = values / values.sum()
        before = values.cumsum(0) - values
        keep = (before < p) & (values > 0) if p < 1 else values > 0
        expected = torch.zeros(5000, dtype=torch.bool)
        expected[order[keep]] = True
        assert torch.equal(got[row] > 0, expected), row
