"""The cpu plugin's batched attention against the reference, on batches shaped like serving:
many rows of scattered lengths (several length groups), mixed steps where one-token extends
sit between prefill chunks, zero-length padding requests and padding rows."""

from __future__ import annotations

import pytest
import torch

from tessera.hal.conformance_data import make_paged_case, pad_paged_case
from tessera.hal.cpu import attention, batched_attention


def _lengths(seed: int, batch: int, low: int, high: int) -> list[int]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(low, high, (batch,), generator=gen).tolist()


def _extend(case):
    args = (case.q, case.k_cache, case.v_cache, case.req_to_token, case.seq_lens,
            case.extend_lens, case.qo_indptr, case.scale)
    return batched_attention.attention_extend(*args), attention.attention_extend(*args)


def test_length_groups_cover_every_live_row_once_longest_first() -> None:
    lens = [5, 0, 100, 80, 7, 60, 0, 100, 6]
    groups = batched_attention.length_groups(lens)
    flat = [b for g in groups for b in g]
    assert sorted(flat) == [b for b, n in enumerate(lens) if n > 0]
    assert [lens[b] for b in flat] == sorted((n for n in lens if n > 0), reverse=True)
    for group in groups:  # no row pads to more than 1 / GROUP_RATIO of its length
        assert min(lens[b] for b in group) >= batched_attention.GROUP_RATIO * lens[group[0]]
    assert len(groups) == 4  # 100 100 80 | 60 | 7 6 | 5
    assert batched_attention.length_groups([9] * 6) == [list(range(6))]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("hq,hk", [(9, 3), (4, 4), (8, 1)])
def test_decode_matches_reference_over_many_length_groups(dtype, hq, hk) -> None:
    seq_lens = _lengths(1, 40, 1, 90)
    case = make_paged_case(tuple(seq_lens), (1,) * len(seq_lens), hq, hk, 64, dtype, seed=3)
    assert len(batched_attention.length_groups(seq_lens)) > 3
    args = (case.q, case.k_cache, case.v_cache, case.req_to_token, case.seq_lens, case.scale)
    got = batched_attention.attention_decode(*args)
    want = attention.attention_decode(*args)
    assert got.dtype == dtype
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(got.float(), want.float(), atol=tol, rtol=tol)


def test_decode_padding_rows_are_zeros_and_change_nothing() -> None:
    seq_lens = (12, 3, 40)
    case = make_paged_case(seq_lens, (1, 1, 1), 8, 2, 64, torch.float32, seed=4)
    padded = pad_paged_case(case, tokens=2, requests=2, seed=5)
    got = batched_attention.attention_decode(padded.q[:5], padded.k_cache, padded.v_cache,
                                             padded.req_to_token, padded.seq_lens, case.scale)
    want = attention.attention_decode(case.q, case.k_cache, case.v_cache, case.req_to_token,
                                      case.seq_lens, case.scale)
    torch.testing.assert_close(got[:3], want, atol=1e-5, rtol=1e-5)
    assert torch.equal(got[3:], torch.zeros_like(got[3:]))


@pytest.mark.parametrize("hq,hk", [(9, 3), (8, 8)])
def test_mixed_extend_matches_reference(hq, hk) -> None:
    # 20 decodes at scattered lengths around 3 prefill chunks (one with a cached prefix)
    decode_lens = _lengths(6, 20, 1, 70)
    seq_lens = decode_lens[:7] + [33] + decode_lens[7:15] + [50, 9] + decode_lens[15:]
    extend_lens = [1] * 7 + [33] + [1] * 8 + [20, 9] + [1] * 5
    case = make_paged_case(tuple(seq_lens), tuple(extend_lens), hq, hk, 64, torch.float32,
                           seed=7)
    got, want = _extend(case)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    got, want = _extend(pad_paged_case(case, tokens=3, requests=2, seed=8))
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert torch.equal(got[-3:], torch.zeros_like(got[-3:]))


def test_extend_of_only_decodes_and_of_only_prefills() -> None:
    for seq_lens, extend_lens in (((5, 17, 2), (1, 1, 1)), ((5, 17, 2), (5, 4, 2)), ((), ())):
        case = make_paged_case(seq_lens, extend_lens, 8, 2, 64, torch.float32, seed=9)
        got, want = _extend(case)
        assert got.shape == want.shape
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("window,cap", [(6, 0.0), (0, 0.9), (20, 1.3)])
def test_sliding_window_and_soft_cap_match_reference(window: int, cap: float) -> None:
    """Several length groups of decodes, and a mixed step (one-token extends between chunks),
    with windows shorter than most rows."""
    seq_lens = _lengths(5, 24, 1, 70)
    dec = make_paged_case(tuple(seq_lens), (1,) * len(seq_lens), 8, 2, 32, torch.float32,
                          seed=6)
    kw = {"sliding_window": window, "logit_cap": cap}
    args = (dec.q, dec.k_cache, dec.v_cache, dec.req_to_token, dec.seq_lens, dec.scale)
    torch.testing.assert_close(batched_attention.attention_decode(*args, **kw),
                               attention.attention_decode(*args, **kw), atol=1e-5, rtol=1e-5)
    mixed = make_paged_case((40, 9, 33, 1, 50), (12, 1, 33, 1, 1), 8, 2, 32, torch.float32,
                            seed=7)
    margs = (mixed.q, mixed.k_cache, mixed.v_cache, mixed.req_to_token, mixed.seq_lens,
             mixed.extend_lens, mixed.qo_indptr, mixed.scale)
    torch.testing.assert_close(batched_attention.attention_extend(*margs, **kw),
                               attention.attention_extend(*margs, **kw), atol=1e-5, rtol=1e-5)
