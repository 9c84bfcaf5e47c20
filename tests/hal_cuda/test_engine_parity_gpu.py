"""The whole engine on the GPU (tokenizer, scheduler, cuda worker with graphs and pipelined
steps, detokenizer, as real processes) gives transformers' greedy tokens on the same weights:
a batch of mixed-length prompts, two of them sharing a prefix (served from the radix cache),
prefill chunked. fp32, the Llama-3-8B shape cut to 4 layers, random weights."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.slow,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")]

CONFIG = os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks", "configs",
                      "llama3-8b-4layer.json")
NEW_TOKENS = 24


def prompts() -> list[list[int]]:
    rng = np.random.default_rng(0)
    out = [rng.integers(10, 120_000, size=n).tolist() for n in (1, 7, 33, 120, 300, 513, 64)]
    shared = rng.integers(10, 120_000, size=200).tolist()
    out += [shared + [11, 12, 13], shared + [21, 22]]  # one prefix, two suffixes
    return out


def test_engine_greedy_equals_transformers() -> None:
    import transformers

    import tessera
    from tessera.benchmarks.dummy_model import dummy_model_dir
    from tessera.bus.messages import SamplingParams
    from tessera.formats import open_model

    model_dir = dummy_model_dir(os.path.abspath(CONFIG))
    greedy = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)
    batch = prompts()
    with tessera.LLM(model_dir, load_format="dummy", dtype="float32", hal="cuda",
                     max_total_tokens=32768, chunked_prefill_size=256,
                     heartbeat_timeout_s=120) as llm:
        first = llm.generate(batch[:-1], greedy, use_tqdm=False)
        last = llm.generate(batch[-1:], greedy, use_tqdm=False)  # its prefix is cached now
    ours = [r.token_ids for r in first + last]
    assert last[0].cached_tokens >= 192

    files = open_model(model_dir, "dummy", 0)
    files.device = "cuda"  # the same random values as the worker drew
    hf_config = transformers.LlamaConfig(**files.config.to_hf_dict())
    with torch.device("cuda"):
        hf = transformers.LlamaForCausalLM(hf_config).float().eval()
    hf.load_state_dict(dict(files.iter_tensors(torch.float32, progress=False)), strict=False)
    for prompt, got in zip(batch, ours, strict=True):
        ids = torch.tensor([prompt], device="cuda")
        with torch.no_grad():
            want = hf.generate(ids, max_new_tokens=NEW_TOKENS, do_sample=False,
                               attention_mask=torch.ones_like(ids), pad_token_id=0)
        assert got == want[0, len(prompt):].tolist(), f"prompt of {len(prompt)} tokens"
