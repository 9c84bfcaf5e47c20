"""Greedy parity with transformers on tiny random models saved as safetensors folders:
Llama 3.1 (rope scaling), Qwen2 (qkv bias, tied embeddings), Qwen3 (q/k norm), Mistral (MQA,
a sliding window shorter than the prompts), Gemma 2 (soft-capping, sliding and global layers),
Gemma 3 (q/k norm, a rope base per layer type), Phi-3 (fused checkpoint tensors, partial
rotary), Granite (multipliers);
Mixture-of-Experts: Mixtral, Qwen2-MoE (gated shared expert), Qwen3-MoE (a dense layer among
MoE ones), dots.llm1 (DeepSeek-V3 grouped sigmoid routing, shared experts).
Also: the tokens do not change with chunked prefill or with a prefix served from the cache."""

from __future__ import annotations

import pytest
import torch

from tests.worker_proc.driver import MiniScheduler
from tests.worker_proc.helpers import (
    hf_greedy,
    hf_last_logits,
    make_runner,
    prompts,
    tiny_hf_model,
)

LENGTHS = [1, 3, 7, 12, 17, 24, 31, 45]
NEW = 32


@pytest.fixture(scope="module", params=["llama31", "qwen2", "qwen3", "mistral", "mixtral",
                                        "qwen2_moe", "qwen3_moe", "dots1", "gemma2", "gemma3",
                                        "phi3", "granite"])
def tiny(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(request.param)
    model = tiny_hf_model(request.param, str(folder))
    batch = prompts(model.config.vocab_size, LENGTHS, seed=len(request.param))
    expected = [hf_greedy(model, p, NEW) for p in batch]
    return str(folder), batch, expected


def test_greedy_tokens_match_transformers(tiny):
    folder, batch, expected = tiny
    sched = MiniScheduler(make_runner(folder))
    got = [r.out for r in sched.generate(batch, NEW)]
    assert got == expected


def test_chunked_prefill_gives_same_tokens(tiny):
    folder, batch, expected = tiny
    sched = MiniScheduler(make_runner(folder), chunk_size=10)
    got = [r.out for r in sched.generate(batch, NEW)]
    assert got == expected


def test_prefix_cache_gives_same_tokens(tiny):
    folder, batch, expected = tiny
    sched = MiniScheduler(make_runner(folder), prefix_cache=True, chunk_size=16)
    first = sched.generate(batch[:4], NEW)
    assert [r.out for r in first] == expected[:4]
    # The same prompts again, plus prompts that extend earlier prompt+output sequences.
    again = sched.generate(batch[4:] + batch[:4], NEW)
    assert sched.cached_tokens > 0
    assert [r.out for r in again] == expected[4:] + expected[:4]


def test_gemma2_oracle_applies_the_attention_soft_cap(tmp_path):
    """The oracle itself: transformers' SDPA attention ignores Gemma 2's soft-cap (and some
    releases choose it by default), so a parity test would compare against a model without
    the cap. The same weights with and without the cap must give different logits."""
    capped = tiny_hf_model("gemma2", str(tmp_path / "capped"))
    uncapped = tiny_hf_model("gemma2", str(tmp_path / "uncapped"), attn_logit_softcapping=None)
    assert torch.equal(capped.model.embed_tokens.weight, uncapped.model.embed_tokens.weight)
    prompt = prompts(capped.config.vocab_size, [12], seed=3)[0]
    diff = (hf_last_logits(capped, prompt) - hf_last_logits(uncapped, prompt)).abs().max()
    assert diff > 1e-2
