"""The op table as torch.library custom ops: same results, valid schemas and fake kernels."""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from tessera.hal.conformance_data import make_paged_case, sampling_params
from tessera.hal.cpu import CpuPlatform
from tessera.hal.torch_library import library_ops


@pytest.fixture(scope="module")
def platform() -> CpuPlatform:
    return CpuPlatform()


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_registered_under_the_plugin_namespace(platform: CpuPlatform) -> None:
    ops = library_ops(platform)
    assert library_ops(platform) is ops  # once per process
    x, w = torch.randn(3, 16, generator=_gen(0)), torch.randn(16, generator=_gen(1))
    assert torch.equal(torch.ops.tessera_cpu.rms_norm(x, w, 1e-6),
                       platform.op("rms_norm")(x, w, 1e-6))


def test_results_equal_the_table(platform: CpuPlatform) -> None:
    ops = library_ops(platform)
    case = make_paged_case((5, 9), (2, 9), 4, 2, 16, torch.float32, seed=2)
    args = (case.q, case.k_cache, case.v_cache, case.req_to_token, case.seq_lens,
            case.extend_lens, case.qo_indptr, case.scale)
    assert torch.equal(ops["attention_extend"](*args), platform.op("attention_extend")(*args))
    x = torch.randn(4, 32, generator=_gen(3))
    assert torch.equal(ops["silu_and_mul"](x), platform.op("silu_and_mul")(x))
    w = torch.randn(8, 32, generator=_gen(4))
    assert torch.equal(ops["linear"](x, w, None), platform.op("linear")(x, w, None))
    logits = torch.randn(3, 50, generator=_gen(5))
    params = sampling_params(3, seeds=torch.tensor([1, 2, 3]))
    assert torch.equal(ops["sample"](logits, params), platform.op("sample")(logits, params))
    masked, expected = logits.clone(), logits.clone()
    mask = torch.tensor([[0b101], [-1]], dtype=torch.int32)
    ops["apply_token_mask"](masked, mask, torch.tensor([2, 0]))
    platform.op("apply_token_mask")(expected, mask, torch.tensor([2, 0]))
    assert torch.equal(masked, expected) and torch.isinf(masked[2]).sum() == 48
    k_cache = torch.zeros(8, 2, 4)
    ops["store_kv"](k_cache, k_cache.clone(), torch.ones(1, 2, 4), torch.ones(1, 2, 4),
                    torch.tensor([5]))
    assert k_cache[5].eq(1).all() and k_cache.sum() == 8


def test_moe_and_gelu_ops(platform: CpuPlatform) -> None:
    ops = library_ops(platform)
    x = torch.randn(5, 16, generator=_gen(9))
    w13, w2 = torch.randn(4, 24, 16, generator=_gen(10)), torch.randn(4, 16, 12, generator=_gen(11))
    weights, ids = torch.softmax(torch.randn(5, 4, generator=_gen(12)), -1).topk(2, dim=-1)
    for activation in ("silu", "gelu_tanh"):
        assert torch.equal(ops["fused_moe"](x, w13, w2, weights, ids, activation),
                           platform.op("fused_moe")(x, w13, w2, weights, ids,
                                                    activation=activation))
    assert torch.equal(ops["gelu_tanh_and_mul"](x), platform.op("gelu_tanh_and_mul")(x))
    torch.library.opcheck(torch.ops.tessera_cpu.fused_moe.default, (x, w13, w2, weights, ids))


def test_opcheck(platform: CpuPlatform) -> None:
    library_ops(platform)
    x, w = torch.randn(3, 16, generator=_gen(6)), torch.randn(16, generator=_gen(7))
    torch.library.opcheck(torch.ops.tessera_cpu.rms_norm.default, (x, w, 1e-6))
    torch.library.opcheck(torch.ops.tessera_cpu.linear.default,
                          (x, torch.randn(5, 16, generator=_gen(8)), None))
    torch.library.opcheck(torch.ops.tessera_cpu.store_kv.default,
                          (torch.zeros(8, 1, 16), torch.zeros(8, 1, 16), x[:2, None],
                           x[:2, None], torch.tensor([1, 6])))


def test_fake_kernels_give_contract_shapes(platform: CpuPlatform) -> None:
    library_ops(platform)
    with FakeTensorMode():
        x, w = torch.empty(7, 64), torch.empty(96, 64)
        assert torch.ops.tessera_cpu.linear(x, w, None).shape == (7, 96)
        assert torch.ops.tessera_cpu.silu_and_mul(torch.empty(7, 96)).shape == (7, 48)
        ids = torch.empty(7, dtype=torch.int64)
        assert torch.ops.tessera_cpu.embedding(ids, torch.empty(100, 64)).shape == (7, 64)
        q = torch.empty(3, 8, 64)
        out = torch.ops.tessera_cpu.attention_decode(q, torch.empty(40, 2, 64),
                                                      torch.empty(40, 2, 64),
                                                      torch.empty(3, 16, dtype=torch.int32),
                                                      torch.empty(3, dtype=torch.int32), 0.125)
        assert out.shape == (3, 8, 64)
        tokens = torch.ops.tessera_cpu.sample(torch.empty(3, 100), *[torch.empty(3)] * 6, False)
        assert tokens.shape == (3,) and tokens.dtype == torch.int64
