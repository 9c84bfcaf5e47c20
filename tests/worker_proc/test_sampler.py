"""The sampler glue on the cpu plugin's `sample` op: filters keep only allowed tokens, seeded
draws are reproducible, penalties follow Hugging Face / OpenAI, logprobs are raw."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from tessera.bus.messages import ForwardBatch
from tessera.hal.registry import load_platform
from tessera.worker_proc.sampler import Sampler


@pytest.fixture(scope="module")
def sampler() -> Sampler:
    return Sampler(load_platform("cpu"), torch.device("cpu"))


def make_batch(n: int, **arrays: Any) -> ForwardBatch:
    base: dict[str, Any] = dict(
        temperature=np.ones(n, np.float32), top_p=np.ones(n, np.float32),
        top_k=np.full(n, -1, np.int32), min_p=np.zeros(n, np.float32),
        repetition_penalty=np.ones(n, np.float32), frequency_penalty=np.zeros(n, np.float32),
        presence_penalty=np.zeros(n, np.float32), seeds=np.full(n, -1, np.int64),
        logprobs=np.full(n, -1, np.int32), output_lens=np.zeros(n, np.int32))
    for key, value in arrays.items():
        base[key] = np.asarray(value, dtype=base[key].dtype if key in base else None)
    return ForwardBatch(step=0, rows=np.arange(n, dtype=np.int32),
                        seq_lens=np.ones(n, np.int32), extend_lens=np.ones(n, np.int32),
                        input_ids=np.zeros(n, np.int32), sample=np.ones(n, np.uint8), **base)


def draw(sampler: Sampler, logits: torch.Tensor, rounds: int, **params: Any) -> np.ndarray:
    """`rounds` independent draws of every row: the rows are repeated, one seed per copy."""
    rows = logits.shape[0]
    big = logits.repeat(rounds, 1)
    n = big.shape[0]
    arrays = {k: np.tile(np.asarray(v), rounds) for k, v in params.items()}
    arrays.setdefault("seeds", np.arange(n))
    out = sampler(big.clone(), make_batch(n, **arrays)).token_ids
    return out.reshape(rounds, rows)


LOGITS = torch.log(torch.tensor([[0.40, 0.25, 0.15, 0.10, 0.06, 0.04]]))


def test_top_k_keeps_only_the_k_best(sampler):
    got = draw(sampler, LOGITS, 2000, top_k=[2])
    assert set(np.unique(got)) == {0, 1}
    # 0.40 / 0.65 of the draws are token 0; 2000 draws: std of the share is about 0.011.
    assert abs((got == 0).mean() - 0.40 / 0.65) < 0.05


def test_top_p_keeps_the_smallest_nucleus(sampler):
    # 0.40 + 0.25 = 0.65 < 0.7, so token 2 (mass before it 0.65) is kept, token 3 is not.
    got = draw(sampler, LOGITS, 2000, top_p=[0.7])
    assert set(np.unique(got)) == {0, 1, 2}


def test_min_p_drops_tokens_below_a_share_of_the_best(sampler):
    # min_p 0.3: keep p >= 0.12, i.e. tokens 0, 1, 2.
    got = draw(sampler, LOGITS, 2000, min_p=[0.3])
    assert set(np.unique(got)) == {0, 1, 2}


def test_unfiltered_draws_follow_the_distribution(sampler):
    got = draw(sampler, LOGITS, 4000)
    freq = np.bincount(got.ravel(), minlength=6) / got.size
    assert np.abs(freq - LOGITS.exp().numpy()[0]).max() < 0.03  # ~4 std of 4000 draws


def test_greedy_rows_take_the_argmax(sampler):
    logits = torch.randn(5, 50)
    out = sampler(logits.clone(), make_batch(5, temperature=np.zeros(5))).token_ids
    assert out.tolist() == logits.argmax(-1).tolist()


def test_seeded_draws_are_reproducible_whatever_the_batch(sampler):
    torch.manual_seed(0)
    logits = torch.randn(4, 100)
    params = dict(seeds=[11, 22, 33, 44], output_lens=[0, 1, 2, 3], temperature=[1.0] * 4)
    first = sampler(logits.clone(), make_batch(4, **params)).token_ids
    again = sampler(logits.clone(), make_batch(4, **params)).token_ids
    assert first.tolist() == again.tolist()
    # Row 2 alone, in a different batch, draws the same token.
    alone = sampler(logits[2:3].clone(), make_batch(1, seeds=[33], output_lens=[2])).token_ids
    assert alone[0] == first[2]
    # Different seeds over many rows do not all agree (the seed matters).
    many = draw(sampler, logits[:1], 50)
    assert len(np.unique(many)) > 1


def test_logprobs_are_raw_log_softmax_with_top_n(sampler):
    torch.manual_seed(1)
    logits = torch.randn(3, 40)
    batch = make_batch(3, temperature=[0.0, 0.0, 0.0], logprobs=[2, -1, 0],
                       repetition_penalty=[1.0, 1.0, 1.0])
    out = sampler(logits.clone(), batch)
    ref = torch.log_softmax(logits, -1)
    assert np.allclose(out.logprobs, ref.gather(1, ref.argmax(-1, keepdim=True))[:, 0].numpy())
    assert out.top_ids.shape == (3, 2)
    assert out.top_ids[0].tolist() == ref[0].topk(2).indices.tolist()
    assert np.allclose(out.top_logprobs[0], ref[0].topk(2).values.numpy())
    assert out.top_ids[2].tolist() == [-1, -1]  # asked for none: padded
    assert np.isneginf(out.top_logprobs[2]).all()


def test_block_ids_are_never_sampled(sampler):
    logits = torch.zeros(2, 10)
    logits[:, 3] = 10.0  # overwhelmingly likely, but blocked on row 0
    batch = make_batch(2, temperature=[0.0, 0.0])
    batch = ForwardBatch(**{**batch.__dict__, "block_offsets": np.array([0, 1, 1], np.int32),
                            "block_ids": np.array([3], np.int32)})
    out = sampler(logits.clone(), batch).token_ids
    assert out[0] != 3 and out[1] == 3


def test_penalties_match_hugging_face_and_openai(sampler):
    from transformers.generation.logits_process import RepetitionPenaltyLogitsProcessor

    from tessera.worker_proc.sampler import apply_penalties

    torch.manual_seed(2)
    logits = torch.randn(2, 30)
    prompt0, out0 = [1, 2, 3], [3, 4, 4]
    prompt1, out1 = [5], [6, 6, 6]
    batch = make_batch(2, repetition_penalty=[1.3, 1.0], frequency_penalty=[0.0, 0.5],
                       presence_penalty=[0.0, 0.25])
    batch = ForwardBatch(**{**batch.__dict__,
                            "hist_offsets": np.array([0, 6, 10], np.int32),
                            "hist_ids": np.array(prompt0 + out0 + prompt1 + out1, np.int32),
                            "hist_prompt_lens": np.array([3, 1], np.int32)})
    got = logits.clone()
    apply_penalties(load_platform("cpu"), got, batch, np.arange(2))
    want0 = RepetitionPenaltyLogitsProcessor(1.3)(torch.tensor([prompt0 + out0]),
                                                  logits[:1].clone())[0]
    assert torch.allclose(got[0], want0)
    want1 = logits[1].clone()
    want1[6] -= 0.5 * 3 + 0.25  # output counts only: the prompt token 5 is not penalized
    assert torch.allclose(got[1], want1)


def test_logit_bias_bans_and_forces_tokens(sampler):
    logits = LOGITS.repeat(3, 1)
    batch = make_batch(
        3, temperature=[0.0, 0.0, 1.0], seeds=[1, 2, 3],
        bias_offsets=np.array([0, 1, 1, 3], np.int32), bias_ids=np.array([0, 1, 5], np.int32),
        bias_values=np.array([-100.0, -100.0, 100.0], np.float32))
    out = sampler(logits.clone(), batch).token_ids
    # row 0: the best token banned -> the second best; row 1: no bias -> the best;
    # row 2 (sampled): token 5 forced by +100 over a -100 on token 1
    assert out.tolist() == [1, 0, 5]
    many = make_batch(400, seeds=np.arange(400), bias_offsets=np.arange(401, dtype=np.int32),
                      bias_ids=np.zeros(400, np.int32), bias_values=np.full(400, -100.0,
                                                                            np.float32))
    assert 0 not in sampler(LOGITS.repeat(400, 1), many).token_ids.tolist()


class SpyOp:
    """The platform's sample op, remembering the dtype of the logits it was given."""

    def __init__(self, op: Any) -> None:
        self.op, self.dtypes = op, []

    def __call__(self, logits: torch.Tensor, params: Any) -> torch.Tensor:
        self.dtypes.append(logits.dtype)
        return self.op(logits, params)


@pytest.mark.parametrize("case", ["greedy", "sampled", "logprobs", "penalty", "block", "bias"])
def test_a_decode_graphs_bf16_logits_are_converted_only_where_needed(case: str) -> None:
    """A greedy step reads the LM head's bf16 logits as they are (their float32 copy would be
    130 MB a step at 256 rows of a 128k vocabulary); filters, draws, logprobs and edits get
    float32, and every case picks the tokens it would over the float32 logits."""
    sampler = Sampler(load_platform("cpu"), torch.device("cpu"))
    spy = sampler.sample_op = SpyOp(sampler.sample_op)
    torch.manual_seed(3)
    logits = (torch.randn(4, 50) * 3).to(torch.bfloat16)
    arrays: dict[str, Any] = {"temperature": np.zeros(4)}
    extra: dict[str, Any] = {}
    if case == "sampled":
        arrays = {"temperature": [0.0, 0.7, 0.0, 1.0], "seeds": [1, 2, 3, 4]}
    elif case == "logprobs":
        arrays["logprobs"] = [-1, 1, -1, -1]
    elif case == "penalty":
        arrays["presence_penalty"] = [0.0, 0.5, 0.0, 0.0]
        extra = {"hist_offsets": np.array([0, 0, 1, 1, 1], np.int32),
                 "hist_ids": np.array([int(logits[1].float().argmax())], np.int32),
                 "hist_prompt_lens": np.zeros(4, np.int32)}
    elif case == "block":
        extra = {"block_offsets": np.array([0, 1, 1, 1, 1], np.int32),
                 "block_ids": np.array([int(logits[0].float().argmax())], np.int32)}
    elif case == "bias":
        extra = {"bias_offsets": np.array([0, 0, 0, 1, 1], np.int32),
                 "bias_ids": np.array([7], np.int32),
                 "bias_values": np.array([100.0], np.float32)}
    batch = make_batch(4, **arrays)
    batch = ForwardBatch(**{**batch.__dict__, **extra})
    got = sampler(logits.clone(), batch)
    assert spy.dtypes == [torch.bfloat16 if case == "greedy" else torch.float32]
    want = Sampler(load_platform("cpu"), torch.device("cpu"))(logits.float(), batch)
    assert got.token_ids.tolist() == want.token_ids.tolist()
    if case == "logprobs":
        assert np.allclose(got.logprobs, want.logprobs)
