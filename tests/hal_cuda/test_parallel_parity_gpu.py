"""Tensor and pipeline parallelism on two GPUs, the whole engine (real processes, NCCL, CUDA
graphs, the one-shot all-reduce where it is chosen): greedy tokens at TP=2 and PP=2 equal one
GPU's, fp32, the Llama-3-8B shape cut to 4 layers, random weights; each engine then stops on
SIGTERM with exit code 0, no worker killed, no process left."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.multi_gpu, pytest.mark.slow,
              pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")]

CONFIG = os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks", "configs",
                      "llama3-8b-4layer.json")
NEW_TOKENS = 24


def prompts() -> list[list[int]]:
    rng = np.random.default_rng(0)
    out = [rng.integers(10, 120_000, size=n).tolist() for n in (1, 7, 33, 120, 300, 513, 64)]
    shared = rng.integers(10, 120_000, size=200).tolist()
    return out + [shared + [11, 12, 13], shared + [21, 22]]


def serve_and_stop(model_dir: str, batch: list[list[int]], tp: int, pp: int) -> list[list[int]]:
    import tessera
    from tessera.bus.messages import SamplingParams

    greedy = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)
    llm = tessera.LLM(model_dir, load_format="dummy", dtype="float32", hal="cuda",
                      tp_size=tp, pp_size=pp, max_total_tokens=32768,
                      chunked_prefill_size=256, heartbeat_timeout_s=120)
    try:
        with open(os.path.join(llm.run_dir, "children.pids")) as f:
            children = [int(line) for line in f if line.strip()]
        outs = llm.generate(batch, greedy, use_tqdm=False)
    finally:
        llm.shutdown()
    procs = llm.processes
    assert procs is not None and procs.popen.returncode == 0, procs.log_tail()
    log = procs.log_tail()
    assert "did not stop on SIGTERM" not in log and "ended with" not in log, log
    for pid in children:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    return [o.token_ids for o in outs]


def test_tp2_and_pp2_greedy_equal_one_gpu() -> None:
    from tessera.benchmarks.dummy_model import dummy_model_dir

    model_dir = dummy_model_dir(os.path.abspath(CONFIG))
    batch = prompts()
    want = serve_and_stop(model_dir, batch, 1, 1)
    assert all(len(w) == NEW_TOKENS for w in want)
    for tp, pp in [(2, 1), (1, 2)]:
        got = serve_and_stop(model_dir, batch, tp, pp)
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            assert g == w, f"TP={tp} PP={pp}: prompt {i} ({len(batch[i])} tokens)"
