"""The default model (SmolLM2-135M-Instruct, Q4_1 GGUF dequantized to fp32) gives exactly the
tokens transformers gives on the same weights: 8 prompts of different lengths, batched, 32 new
tokens each, greedy."""

from __future__ import annotations

import pytest
import torch

from tessera.formats import open_model
from tests.worker_proc.driver import MiniScheduler
from tests.worker_proc.helpers import hf_greedy, make_runner, prompts

LENGTHS = [1, 4, 9, 16, 23, 37, 52, 80]
NEW = 32


@pytest.fixture(scope="module")
def smollm2():
    import transformers as tf

    files = open_model("default")
    hf_cfg = tf.LlamaConfig(**files.config.to_hf_dict())
    model = tf.LlamaForCausalLM(hf_cfg).eval()
    state = dict(files.iter_tensors(torch.float32, progress=False))
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected
    assert set(missing) <= {"lm_head.weight"}  # tied to the embedding
    model.tie_weights()
    assert torch.equal(model.lm_head.weight, state["model.embed_tokens.weight"])
    batch = prompts(files.config.vocab_size, LENGTHS, seed=7)
    expected = [hf_greedy(model, p, NEW) for p in batch]
    return files, batch, expected


def test_default_model_greedy_matches_transformers(smollm2):
    files, batch, expected = smollm2
    runner = make_runner("default", context_length=512, max_total_tokens=4096, page_size=16)
    got = [r.out for r in MiniScheduler(runner).generate(batch, NEW)]
    assert got == expected


def test_default_model_tokens_unchanged_by_prefix_cache_and_chunked_prefill(smollm2):
    files, batch, expected = smollm2
    runner = make_runner("default", context_length=512, max_total_tokens=4096, page_size=16)
    sched = MiniScheduler(runner, prefix_cache=True, chunk_size=40)
    first = sched.generate(batch[4:], NEW)  # the long prompts, in chunks of 40 tokens
    assert [r.out for r in first] == expected[4:]
    # Shared prefixes: the long prompts again, now served from the cache up to a page edge.
    again = sched.generate(batch[4:], NEW)
    assert sched.cached_tokens >= sum((len(p) - 1) // 16 * 16 for p in batch[4:])
    assert [r.out for r in again] == expected[4:]
