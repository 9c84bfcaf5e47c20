"""Tensor parallelism on the cpu plugin: two gloo ranks serve a tiny model and give
transformers' logits and greedy tokens; unseeded sampling agrees across ranks (rank 0's
tokens are adopted). Mistral's single KV head checks KV-head replication; Mixture-of-Experts
models run with experts sharded (tensor parallel) or split between the ranks (--ep-size)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from tests.worker_proc.helpers import hf_greedy, hf_last_logits, prompts, tiny_hf_model

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("kind,ep_size", [("llama31", 1), ("mistral", 1), ("qwen2", 1),
                                          ("phi3", 1), ("mixtral", 1), ("qwen3_moe", 2),
                                          ("dots1", 1)])
def test_two_ranks_match_transformers(tmp_path, kind, ep_size):
    """Each rank fuses its own share of q/k/v (its query heads, then its KV heads; Qwen2's
    biases likewise) and of gate/up; Phi-3's checkpoint stores them pre-fused, cut back per
    part before the split. MoE models: ep_size 1 splits every expert's intermediate dimension
    across the ranks, ep_size 2 gives each rank whole experts (half of them)."""
    model = tiny_hf_model(kind, str(tmp_path / "model"))
    batch = prompts(256, [5, 17, 30])
    init = f"file://{tmp_path / 'rendezvous'}"
    procs = [subprocess.Popen([sys.executable, "-m", "tests.worker_proc.tp_rank",
                               str(tmp_path / "model"), str(rank), "2", init,
                               str(tmp_path / f"rank{rank}.json"), json.dumps(batch),
                               str(ep_size)])
             for rank in range(2)]
    for p in procs:
        assert p.wait(timeout=300) == 0
    out = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    for i, p in enumerate(batch):
        want = hf_last_logits(model, p)
        assert torch.allclose(torch.tensor(out[0]["logits"][i]), want, atol=1e-4)
    assert out[0]["greedy"] == [hf_greedy(model, p, 12) for p in batch]
    assert out[1]["greedy"] == out[0]["greedy"]
    assert out[1]["sampled"] == out[0]["sampled"]
