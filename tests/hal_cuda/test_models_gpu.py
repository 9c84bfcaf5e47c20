"""Every model family on the cuda plugin gives transformers' greedy tokens (fp32, tiny random
checkpoints written by the test, as tests/worker_proc/test_parity_tiny.py does on the cpu
plugin): the Triton fused-MoE kernel (Mixtral, Qwen2/3-MoE, dots.llm1's grouped routing and
shared experts), sliding-window and soft-capped attention (Mistral, Gemma 2/3, Phi-3), with
decode and prefill graphs, chunked prefill and prefix reuse."""

from __future__ import annotations

import pytest
import torch

from tests.worker_proc.driver import MiniScheduler
from tests.worker_proc.helpers import hf_greedy, make_runner, prompts, tiny_hf_model

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")]

LENGTHS = [1, 3, 7, 12, 17, 24, 31, 45]
NEW = 32


@pytest.mark.parametrize("kind", ["mistral", "mixtral", "qwen2_moe", "qwen3_moe", "dots1",
                                  "gemma2", "gemma3", "phi3", "granite"])
def test_greedy_tokens_match_transformers_on_cuda(tmp_path, kind):
    model = tiny_hf_model(kind, str(tmp_path / kind))
    batch = prompts(model.config.vocab_size, LENGTHS, seed=len(kind))
    expected = [hf_greedy(model, p, NEW) for p in batch]
    runner = make_runner(str(tmp_path / kind), hal="cuda")
    assert runner.graphs is not None  # decode steps replay captured graphs
    got = [r.out for r in MiniScheduler(runner, chunk_size=10).generate(batch, NEW)]
    assert got == expected
    cached = MiniScheduler(runner, prefix_cache=True, chunk_size=16)
    cached.generate(batch[:4], NEW)
    again = cached.generate(batch[4:] + batch[:4], NEW)
    assert cached.cached_tokens > 0
    assert [r.out for r in again] == expected[4:] + expected[:4]
