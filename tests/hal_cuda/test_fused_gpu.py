"""The cuda plugin's fused ops, compiled, at Llama-3-8B shapes in bf16: against the plugin's
own unfused kernels run one after the other, and inside a captured graph."""

from __future__ import annotations

import pytest
import torch

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")]

HQ, HK, D, HIDDEN = 32, 8, 128, 4096


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-12))


@pytest.mark.parametrize("fp8", [False, True])
@pytest.mark.parametrize("tokens", [1, 7])
def test_rotary_store_kv_equals_rotary_then_store(tokens: int, fp8: bool) -> None:
    from tessera.hal.cuda import elementwise
    from tessera.hal.rope import cos_sin_cache

    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(tokens)
    table = cos_sin_cache(D, 8192, 500000.0, None, dev, torch.bfloat16)
    qkv = torch.randn((tokens, (HQ + 2 * HK) * D), device=dev, generator=gen,
                      dtype=torch.bfloat16)
    q = qkv[:, :HQ * D].view(tokens, HQ, D)
    k = qkv[:, HQ * D:(HQ + HK) * D].view(tokens, HK, D)
    v = qkv[:, (HQ + HK) * D:].view(tokens, HK, D)
    positions = torch.randint(0, 8192, (tokens,), device=dev, generator=gen)
    slots = torch.randperm(256, device=dev, generator=gen)[:tokens].to(torch.int32)
    cache_dtype = torch.float8_e4m3fn if fp8 else torch.bfloat16
    scales = {"k_scale": 0.05, "v_scale": 0.02} if fp8 else {}
    fused_k = torch.zeros((256, HK, D), device=dev, dtype=cache_dtype)
    fused_v, plain_k, plain_v = (torch.zeros_like(fused_k) for _ in range(3))
    q_out = elementwise.rotary_store_kv(positions, q, k, v, table, fused_k, fused_v, slots,
                                        **scales)
    q_rot, k_rot = elementwise.rotary_embedding(positions, q, k, table)
    elementwise.store_kv(plain_k, plain_v, k_rot, v, slots, **scales)
    torch.cuda.synchronize()
    # the same fp32 expressions rounded at the same points: equal but for a contraction
    # the compiler may make differently in two kernels (one bf16 / e4m3 step)
    assert _rel(q_out, q_rot) < 1e-3
    assert _rel(fused_k, plain_k) < 1e-2
    # v is stored as store_kv stores it (compared as bytes: fp8 has no equality kernel)
    assert torch.equal(fused_v.view(torch.uint8), plain_v.view(torch.uint8))


def test_fused_decode_layer_replays_as_eager_computes() -> None:
    """rotary_store_kv, decode attention and the o projection (the tuned GEMV) captured at
    batch 1 (B1's graph) replay to what eager computes on new inputs."""
    from tessera.hal.cuda import CudaPlatform
    from tessera.hal.rope import cos_sin_cache

    platform = CudaPlatform()
    rotary_store_kv = platform.fused_op("rotary_store_kv")
    assert rotary_store_kv is not None
    linear = platform.op("linear")
    dev, width = torch.device("cuda"), 512
    kv = platform.create_kv_arena(1, width, HK, D, torch.bfloat16)
    kv.storage.normal_()
    table = cos_sin_cache(D, 4096, 500000.0, None, dev, torch.bfloat16)
    qkv = torch.zeros((1, (HQ + 2 * HK) * D), device=dev, dtype=torch.bfloat16)
    w_o = (torch.randn((HIDDEN, HQ * D), device=dev) / 64).to(torch.bfloat16)
    positions = torch.zeros(1, dtype=torch.int64, device=dev)
    slots = torch.zeros(1, dtype=torch.int64, device=dev)
    rtt = torch.arange(width, device=dev, dtype=torch.int32)[None, :]
    seq_lens = torch.ones(1, dtype=torch.int32, device=dev)

    def step() -> torch.Tensor:
        q = qkv[:, :HQ * D].view(1, HQ, D)
        k = qkv[:, HQ * D:(HQ + HK) * D].view(1, HK, D)
        v = qkv[:, (HQ + HK) * D:].view(1, HK, D)
        q = rotary_store_kv(positions, q, k, v, table, kv.k[0], kv.v[0], slots)
        o = platform.op("attention_decode")(q, kv.k[0], kv.v[0], rtt, seq_lens, D ** -0.5)
        return linear(o.reshape(1, HQ * D), w_o, None)  # type: ignore[no-any-return]

    runner = platform.create_graph_runner()
    assert runner is not None
    out = runner.capture(1, step)
    gen = torch.Generator(device=dev).manual_seed(1)
    for length in (1, 77, 512):
        qkv.normal_(generator=gen)
        positions.fill_(length - 1)
        slots.fill_(length - 1)
        seq_lens.fill_(length)
        runner.replay(1)
        torch.cuda.synchronize()
        replayed = out.clone()
        assert torch.equal(replayed, step()), f"length {length}: replay differs from eager"
    runner.reset()
