"""The cuda plugin's fused kernels on the CPU (Triton's interpreter, fp32), against the
reference compositions that define them (hal/ops.py FUSED_OP_NAMES)."""

from __future__ import annotations

from types import ModuleType

import pytest
import torch

from tessera.hal.reference import reference_op
from tessera.hal.rope import cos_sin_cache

TOL = {"atol": 1e-5, "rtol": 1e-5}
PAGE = 4
SLOTS = 10 * PAGE


def _qkv_views(tokens: int, hq: int, hk: int, dim: int, seed: int
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q, k, v as views into one fused QKV output with spare columns (rows not contiguous)."""
    width = (hq + 2 * hk) * dim
    qkv = torch.randn((tokens, width + 8), generator=torch.Generator().manual_seed(seed))
    return (qkv[:, :hq * dim].view(tokens, hq, dim),
            qkv[:, hq * dim:(hq + hk) * dim].view(tokens, hk, dim),
            qkv[:, (hq + hk) * dim:width].view(tokens, hk, dim))


# head dims 64 and 128 (Llama's), 24 (half 12: masked lanes); GQA ratios 1, 4, 8 and 3;
# 32 query heads over 8 KV heads is Llama-3-8B's layout
@pytest.mark.parametrize("hq,hk,dim", [(4, 4, 64), (8, 2, 128), (8, 1, 64), (3, 1, 24),
                                       (32, 8, 128)])
@pytest.mark.parametrize("tokens", [1, 6])
def test_rotary_store_kv_matches_rotary_then_store(kernels: dict[str, ModuleType], hq: int,
                                                   hk: int, dim: int, tokens: int) -> None:
    table = cos_sin_cache(dim, 512, 10000.0, None, "cpu", torch.float32)
    positions = torch.tensor([0, 3, 4, 511, 130, 7][:tokens])
    q, k, v = _qkv_views(tokens, hq, hk, dim, seed=tokens + dim)
    inputs = (q.clone(), k.clone(), v.clone())
    # slots on both sides of page boundaries, the padding slot 0 among them
    slots = torch.tensor([7, 8, 0, 39, 3, 4][:tokens], dtype=torch.int32)
    gen = torch.Generator().manual_seed(5)
    k_cache = torch.randn((SLOTS, hk, dim), generator=gen)
    v_cache = torch.randn((SLOTS, hk, dim), generator=gen)
    want_k, want_v = k_cache.clone(), v_cache.clone()
    want_q = reference_op("rotary_store_kv")(positions, q, k, v, table, want_k, want_v, slots)

    q_out = kernels["elementwise"].rotary_store_kv(positions, q, k, v, table, k_cache, v_cache,
                                                   slots)
    torch.testing.assert_close(q_out, want_q, **TOL)
    torch.testing.assert_close(k_cache, want_k, **TOL)
    torch.testing.assert_close(v_cache, want_v, **TOL)
    untouched = torch.ones(SLOTS, dtype=torch.bool)
    untouched[slots.long()] = False
    assert torch.equal(k_cache[untouched], want_k[untouched])
    assert torch.equal(v_cache[untouched], want_v[untouched])
    assert torch.equal(v_cache[slots.long()], v)  # v is stored as it is
    # the inputs are left as they were (q, k, v are views of the projection's output)
    for before, after in zip(inputs, (q, k, v), strict=True):
        assert torch.equal(before, after)


def test_rotary_store_kv_matches_the_unfused_kernels(kernels: dict[str, ModuleType]) -> None:
    """The fused kernel against the plugin's own two kernels run one after the other."""
    table = cos_sin_cache(64, 64, 10000.0, None, "cpu", torch.float32)
    positions = torch.tensor([9, 10, 63])
    q, k, v = _qkv_views(3, 8, 2, 64, seed=11)
    slots = torch.tensor([11, 12, 1], dtype=torch.int32)
    fused_k, fused_v = torch.zeros((16, 2, 64)), torch.zeros((16, 2, 64))
    q_out = kernels["elementwise"].rotary_store_kv(positions, q, k, v, table, fused_k, fused_v,
                                                   slots)
    plain_k, plain_v = torch.zeros((16, 2, 64)), torch.zeros((16, 2, 64))
    q_rot, k_rot = kernels["elementwise"].rotary_embedding(positions, q, k, table)
    kernels["elementwise"].store_kv(plain_k, plain_v, k_rot, v, slots)
    assert torch.equal(q_out, q_rot)
    assert torch.equal(fused_k, plain_k) and torch.equal(fused_v, plain_v)


def test_rotary_store_kv_of_no_tokens_writes_nothing(kernels: dict[str, ModuleType]) -> None:
    table = cos_sin_cache(64, 16, 10000.0, None, "cpu", torch.float32)
    k_cache = torch.randn((8, 2, 64))
    before = k_cache.clone()
    empty = torch.empty((0, 2, 64))
    q_out = kernels["elementwise"].rotary_store_kv(
        torch.empty(0, dtype=torch.int64), torch.empty((0, 4, 64)), empty, empty, table,
        k_cache, k_cache.clone(), torch.empty(0, dtype=torch.int32))
    assert q_out.shape == (0, 4, 64) and torch.equal(k_cache, before)


def test_rotary_store_kv_refuses_mismatched_heads(kernels: dict[str, ModuleType]) -> None:
    table = cos_sin_cache(64, 16, 10000.0, None, "cpu", torch.float32)
    q, k, v = _qkv_views(2, 4, 2, 64, seed=3)
    with pytest.raises(ValueError, match="rotary_store_kv"):
        kernels["elementwise"].rotary_store_kv(torch.tensor([0, 1]), q, k, v, table,
                                               torch.zeros((8, 4, 64)), torch.zeros((8, 4, 64)),
                                               torch.tensor([1, 2], dtype=torch.int32))


@pytest.mark.parametrize("experts,top_k", [(8, 2), (60, 4), (256, 8), (3, 3)])
@pytest.mark.parametrize("renormalize", [True, False])
def test_moe_softmax_topk_matches_softmax_then_topk(kernels: dict[str, ModuleType],
                                                    experts: int, top_k: int,
                                                    renormalize: bool) -> None:
    """The router kernel (one program per token) against softmax, topk and the
    renormalization; a view with a row stride, and logits from -8 to +8."""
    gen = torch.Generator().manual_seed(experts + top_k)
    wide = torch.randn((5, experts + 3), generator=gen) * 4
    logits = wide[:, :experts]  # rows not contiguous
    weights, ids = kernels["moe"].moe_softmax_topk(logits, top_k, renormalize)
    want_w, want_ids = reference_op("moe_softmax_topk")(logits, top_k, renormalize)
    assert torch.equal(ids, want_ids)
    torch.testing.assert_close(weights, want_w, **TOL)
    with pytest.raises(ValueError, match="top_k"):
        kernels["moe"].moe_softmax_topk(logits, experts + 1, renormalize)
