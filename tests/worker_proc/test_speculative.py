"""Speculative decoding through the real scheduler and the real worker (cpu plugin, fp32) on a
tiny random Llama: with greedy sampling the tokens equal transformers' greedy tokens for both
proposers (prompt lookup; a draft model, the target itself and a 1-layer one), in a batch
whose requests accept different lengths, with a request that stops inside its proposals and
one whose length ends between them; seeded sampling draws the same tokens as without
speculation; logprobs come for every token; the acceptance rule keeps the sampling
distribution (a statistical test with the real sample op)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from tessera.bus.messages import ForwardBatch, SamplingParams
from tessera.hal.registry import load_platform
from tessera.worker_proc.sampler import Sampler
from tessera.worker_proc.verify import accept, plan_verify
from tests.worker_proc.helpers import hf_greedy, make_runner, tiny_hf_model
from tests.worker_proc.spec_engine import generate

NEW = 24


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str, Any]:
    folder = str(tmp_path_factory.mktemp("target"))
    model = tiny_hf_model("llama31", folder)
    small = str(tmp_path_factory.mktemp("draft"))
    tiny_hf_model("llama31", small, num_hidden_layers=1)
    return folder, small, model


def _prompts() -> dict[str, list[int]]:
    rng = np.random.default_rng(0)
    seg = rng.integers(3, 256, size=12).tolist()
    return {"copy": seg * 4, "random": rng.integers(3, 256, size=20).tolist(),
            "short": rng.integers(3, 256, size=5).tolist(),
            "long_copy": (seg[:5] * 9)[:41]}


@pytest.fixture(scope="module")
def expected(tiny: tuple[str, str, Any]) -> dict[str, list[int]]:
    _, _, model = tiny
    return {rid: hf_greedy(model, p, NEW) for rid, p in _prompts().items()}


def _greedy_requests(expected: dict[str, list[int]]) -> dict[str, tuple[list[int],
                                                                       SamplingParams]]:
    prompts = _prompts()
    g = SamplingParams(temperature=0.0, max_tokens=NEW, ignore_eos=True)
    reqs = {rid: (p, g) for rid, p in prompts.items()}
    # ends between proposals: 9 tokens is no multiple of 1 + k
    reqs["length"] = (prompts["copy"], SamplingParams(temperature=0.0, max_tokens=9,
                                                      ignore_eos=True))
    # stops at the first occurrence of a token the model generates late in its output
    stop = expected["copy"][NEW - 6]
    reqs["stop"] = (prompts["copy"], SamplingParams(temperature=0.0, max_tokens=NEW,
                                                    stop_token_ids=(stop,), ignore_eos=True))
    return reqs


def _check_greedy(out: Any, expected: dict[str, list[int]]) -> None:
    for rid in _prompts():
        assert out.tokens[rid] == expected[rid], rid
    assert out.tokens["length"] == expected["copy"][:9]
    stop = expected["copy"][NEW - 6]
    cut = expected["copy"].index(stop) + 1
    assert out.tokens["stop"] == expected["copy"][:cut] and out.finish["stop"] == "stop"


def test_ngram_greedy_equals_transformers(tiny: tuple[str, str, Any],
                                          expected: dict[str, list[int]]) -> None:
    folder, _, _ = tiny
    out = generate(make_runner(folder), _greedy_requests(expected),
                   speculative_algorithm="ngram", speculative_num_draft_tokens=4)
    _check_greedy(out, expected)
    assert out.stats["spec_accepted_tokens_total"] > 0
    # verifies chained on one in flight, and one of them void (the one before it kept fewer
    # proposals): the tokens above are transformers' all the same
    assert out.stats["spec_chained_steps_total"] > 0 and out.stats["spec_void_steps_total"] > 0
    # requests gained different numbers of tokens per step
    per_step = {rid: len(out.tokens[rid]) / out.steps[rid] for rid in _prompts()}
    assert max(per_step.values()) > 1.5 and len(set(per_step.values())) > 1


@pytest.mark.parametrize("draft", ["same", "one_layer"])
def test_draft_model_greedy_equals_transformers(tiny: tuple[str, str, Any],
                                                expected: dict[str, list[int]],
                                                draft: str) -> None:
    folder, small, _ = tiny
    runner = make_runner(folder, speculative_algorithm="draft",
                         speculative_draft_model=folder if draft == "same" else small)
    out = generate(runner, _greedy_requests(expected))
    _check_greedy(out, expected)
    stats = out.stats
    assert stats["spec_verify_steps_total"] > 0
    if draft == "same":  # the target proposing for itself: every proposal is accepted
        assert stats["spec_accepted_tokens_total"] == stats["spec_draft_tokens_total"]


def test_seeded_sampling_draws_the_same_tokens_with_and_without_speculation(
        tiny: tuple[str, str, Any]) -> None:
    folder, _, _ = tiny
    runner = make_runner(folder)
    prompts = _prompts()
    # Sampling close to greedy (the tiny model repeats itself there, so proposals match).
    reqs = {f"{rid}{i}": (p, SamplingParams(temperature=0.5, top_k=3, top_p=0.95,
                                            seed=11 * i + 1, max_tokens=NEW, ignore_eos=True,
                                            logprobs=2))
            for rid, p in prompts.items() for i in range(2)}
    plain = generate(runner, reqs)
    spec = generate(runner, reqs, speculative_algorithm="ngram")
    assert spec.stats["spec_accepted_tokens_total"] > 0
    assert spec.tokens == plain.tokens
    for rid in reqs:  # a logprob for every token, the same as a plain step's
        assert len(spec.logprobs[rid]) == NEW
        np.testing.assert_allclose(spec.logprobs[rid], plain.logprobs[rid], atol=1e-4)


# ------------------------------------------------------------------ the acceptance rule

def _verify_batch(n: int, proposals: list[int], temperature: float, top_p: float
                  ) -> ForwardBatch:
    """n identical requests, each verifying `proposals` after one input token."""
    d = len(proposals)
    one = [7] + proposals
    return ForwardBatch(
        step=0, rows=np.arange(n, dtype=np.int32), seq_lens=np.full(n, 10 + d, np.int32),
        extend_lens=np.full(n, d + 1, np.int32), input_ids=np.tile(one, n).astype(np.int32),
        sample=np.ones(n, np.uint8), output_lens=np.full(n, 3, np.int32),
        temperature=np.full(n, temperature, np.float32), top_p=np.full(n, top_p, np.float32),
        top_k=np.full(n, -1, np.int32), min_p=np.zeros(n, np.float32),
        repetition_penalty=np.ones(n, np.float32), frequency_penalty=np.zeros(n, np.float32),
        presence_penalty=np.zeros(n, np.float32), seeds=np.full(n, -1, np.int64),
        logprobs=np.full(n, -1, np.int32), draft_lens=np.full(n, d, np.int32))


def test_acceptance_keeps_the_sampling_distribution() -> None:
    """The first token kept has the target distribution P0 (filtered by temperature and
    top-p), whatever the proposal; given it equals proposal 1, the second has P1. Chi-square
    tests at a 1e-4 level on 20000 verifications, with a fixed generator (deterministic)."""
    platform = load_platform("cpu")
    sampler = Sampler(platform, torch.device("cpu"))
    vocab, n = 6, 20000
    logits0 = torch.tensor([2.0, 1.5, 1.0, 0.5, 0.0, -3.0])
    logits1 = torch.tensor([0.1, 1.0, 2.0, 0.0, -1.0, 0.5])
    logits2 = torch.tensor([1.0, 0.0, 0.0, 0.0, 0.0, 0.0])
    proposals = [1, 2]  # the second most likely token first, then P1's favourite
    batch = _verify_batch(n, proposals, temperature=0.9, top_p=0.9)
    plan = plan_verify(batch, platform, torch.device("cpu"))
    assert plan is not None
    logits = torch.stack([logits0, logits1, logits2]).repeat(n, 1)
    torch.manual_seed(0)
    draws = sampler.sample(logits.clone(), batch, None, plan.sel, plan.offset_add).tokens
    counts, last = accept(draws, torch.from_numpy(batch.input_ids.astype(np.int64)), plan)
    kept = [proposals[:int(c) - 1] + [int(t)] for c, t in zip(counts, last, strict=True)]

    def filtered(logits: torch.Tensor) -> np.ndarray:
        p = torch.softmax(logits / 0.9, dim=-1).numpy().astype(np.float64)
        order = np.argsort(-p)
        before = np.cumsum(p[order]) - p[order]
        keep = np.zeros(vocab, dtype=bool)
        keep[order[before < 0.9]] = True
        q = np.where(keep, p, 0.0)
        return q / q.sum()

    def chi2(observed: np.ndarray, probs: np.ndarray) -> float:
        """p-value of Pearson's chi-square test of `observed` counts against `probs`."""
        expected = probs * observed.sum()
        used = expected > 0
        assert observed[~used].sum() == 0, "a token the filters remove was kept"
        stat = float((((observed[used] - expected[used]) ** 2) / expected[used]).sum())
        dof = int(used.sum()) - 1
        return float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64),
                                             torch.tensor(stat / 2, dtype=torch.float64)))

    p0, p1 = filtered(logits0), filtered(logits1)
    first = np.bincount([k[0] for k in kept], minlength=vocab)
    assert chi2(first, p0) > 1e-4
    second = np.bincount([k[1] for k in kept if k[0] == proposals[0]], minlength=vocab)
    assert second.sum() > 3000  # P0(proposal 1) of the 20000
    assert chi2(second, p1) > 1e-4
    # a proposal is kept exactly when the draw before it equals it
    assert abs(first[proposals[0]] / n - p0[proposals[0]]) < 0.02
    assert all(len(k) == int(c) for k, c in zip(kept, counts, strict=True))
