"""What requests ask for beyond plain sampling, on the fake worker: a grammar (the
GrammarInit / GrammarReady exchange, matcher ids in batches, grammar ends), a logit_bias
(its CSR in the batch), one choice stopped alone, a scored prompt, an embedding."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from tessera.bus.messages import GrammarReady, GrammarSpec, SampledTokens
from tests.scheduler_proc.sched_fakes import Collected, FakeWorker, drive, make_request
from tests.scheduler_proc.test_scheduler_behaviour import make, prompt

SCHEMA = GrammarSpec("json_schema", '{"type": "object"}', "response_format")


def test_a_grammar_request_waits_for_its_compile_without_holding_others_back() -> None:
    sched = make()
    worker = FakeWorker(sched)
    sched.add_request(make_request("g", prompt(8), max_tokens=3, ignore_eos=True, n=2,
                                   grammar=SCHEMA))
    sched.add_request(make_request("plain", prompt(8, 5), max_tokens=3, ignore_eos=True))
    (init,) = sched.take_grammar_inits()
    assert (init.count, init.grammar) == (2, SCHEMA) and sched.take_grammar_inits() == []
    fb = sched.next_batch()  # only the plain request runs while the grammar compiles
    assert fb.batch_size == 1 and fb.grammar_ids.shape == (0,)
    collected = Collected()
    collected.add(sched.on_result(worker.step(fb)))
    sched.on_grammar_ready(GrammarReady(first_id=init.first_id))
    ids, freed = set(), set()
    while sched.has_work() or sched.inflight:
        fb = sched.next_batch()
        if fb.grammar_ids.shape[0]:
            ids |= set(fb.grammar_ids[fb.grammar_ids >= 0].tolist())
        freed |= set(fb.grammar_free.tolist())
        collected.add(sched.on_result(worker.step(fb)))
    assert ids == {init.first_id, init.first_id + 1}  # one matcher per sample
    assert collected.finish[("g", 0)] == ["length"] and collected.finish[("g", 1)] == ["length"]
    # a later batch tells the worker to drop each finished matcher
    sched.add_request(make_request("later", prompt(4), max_tokens=1, ignore_eos=True))
    freed |= set(sched.next_batch().grammar_free.tolist())
    assert freed == ids
    sched.check_invariant()


def test_a_grammar_the_worker_refuses_fails_its_request_with_400() -> None:
    sched = make()
    sched.add_request(make_request("g", prompt(8), max_tokens=3, grammar=SCHEMA))
    (init,) = sched.take_grammar_inits()
    sched.on_grammar_ready(GrammarReady(first_id=init.first_id, error="bad schema: x"))
    (error,) = sched.take_errors()
    assert (error.rid, error.status, error.param) == ("g", 400, "response_format")
    assert error.message == "bad schema: x" and error.reply_to == "ipc://nowhere/g"
    assert not sched.has_work() and "g" not in sched.requests


def test_an_abort_while_compiling_frees_the_matchers_made_later() -> None:
    sched = make()
    sched.add_request(make_request("g", prompt(8), max_tokens=3, grammar=SCHEMA))
    (init,) = sched.take_grammar_inits()
    assert sched.abort("g")
    sched.on_grammar_ready(GrammarReady(first_id=init.first_id))
    assert not sched.has_work()
    sched.add_request(make_request("next", prompt(4), max_tokens=1, ignore_eos=True))
    assert init.first_id in sched.next_batch().grammar_free.tolist()


def test_grammar_end_finishes_and_grammar_failure_fails() -> None:
    sched = make()
    for rid in ("done", "broken", "free"):
        sched.add_request(make_request(rid, prompt(6), max_tokens=20, ignore_eos=True,
                                       grammar=SCHEMA))
    for init in sched.take_grammar_inits():
        sched.on_grammar_ready(GrammarReady(first_id=init.first_id))
    worker = FakeWorker(sched)
    fb = sched.next_batch()
    res = worker.step(fb)
    ends = np.array([SampledTokens.GRAMMAR_DONE, SampledTokens.GRAMMAR_FAILED, 0], np.uint8)
    out = sched.on_result(dataclasses.replace(res, grammar_end=ends))
    finish = dict(zip(out.rids, out.finish, strict=True))
    assert finish["done"] == "stop" and finish["free"] is None
    (error,) = sched.take_errors()
    assert error.rid == "broken" and error.status == 500
    assert set(sched.requests) == {"free"}
    sched.check_invariant()


def test_logit_bias_travels_as_csr_for_sampling_rows() -> None:
    sched = make()
    worker = FakeWorker(sched)
    sched.add_request(make_request("a", prompt(8), max_tokens=2, ignore_eos=True,
                                   logit_bias={5: -100.0, 9: 3.0}))
    sched.add_request(make_request("b", prompt(8, 3), max_tokens=2, ignore_eos=True))
    fb = sched.next_batch()
    assert fb.bias_offsets.tolist() == [0, 2, 2]
    assert fb.bias_ids.tolist() == [5, 9] and fb.bias_values.tolist() == [-100.0, 3.0]
    collected = Collected()
    collected.add(sched.on_result(worker.step(fb)))
    drive(sched, worker, collected)
    assert collected.finish[("a", 0)] == ["length"]


def test_logit_bias_outside_the_vocabulary_is_refused() -> None:
    sched = make(vocab_size=50)
    error = sched.add_request(make_request("a", prompt(8), logit_bias={50: 1.0}))
    assert error is not None and error.status == 400 and error.param == "logit_bias"


@pytest.mark.parametrize(("ids", "sampling", "param", "said"), [
    ([1, 50], {}, "input_ids", "token 50, outside the vocabulary [0, 50)"),
    ([1, -1], {}, "input_ids", "holds -1"),
    ([1, 2], {"stop_token_ids": (3, 50)}, "stop_token_ids", "token 50, outside"),
    ([1, 2], {"logit_bias": {49: 1.0, 50: 1.0}}, "logit_bias", "token 50, outside"),
])
def test_every_token_id_a_request_names_is_checked_against_the_models_vocabulary(
        ids: list[int], sampling: dict[str, object], param: str, said: str) -> None:
    """Admission is the one check of ids against the vocabulary (the tokenizer's own may not
    be the model's): a refused request leaves nothing behind, the next one runs."""
    sched = make(vocab_size=50)
    error = sched.add_request(make_request("a", np.array(ids), **sampling))
    assert error is not None and (error.status, error.param) == (400, param)
    assert said in error.message and "a" not in sched.requests
    sched.check_invariant()
    assert sched.add_request(make_request("b", [1, 49], stop_token_ids=(49,),
                                          logit_bias={49: 1.0})) is None


def test_a_negative_id_is_refused_even_where_the_vocabulary_is_unknown() -> None:
    error = make().add_request(make_request("a", [3, -2]))
    assert error is not None and (error.status, error.param) == (400, "input_ids")


def test_aborting_one_sample_leaves_the_others_running() -> None:
    sched = make()
    worker = FakeWorker(sched)
    sched.add_request(make_request("r", prompt(8), max_tokens=6, ignore_eos=True, n=3))
    collected = Collected()
    for _ in range(3):
        collected.add(sched.on_result(worker.step(sched.next_batch())))
    assert sched.abort("r", "stop", index=1)
    drive(sched, worker, collected)
    assert collected.finish[("r", 1)] == ["stop"]
    assert collected.finish[("r", 0)] == ["length"] == collected.finish[("r", 2)]
    assert len(collected.tokens[("r", 0)]) == 6 > len(collected.tokens[("r", 1)])
    assert "r" not in sched.requests
    sched.check_invariant()


def _scoring_worker(sched):  # noqa: ANN001, ANN202
    """The fake worker, answering prompt targets with logprob -target/100 and top-1 == it."""
    base = FakeWorker(sched)

    def step(fb):  # noqa: ANN001, ANN202
        res = base.step(fb)
        targets = fb.prompt_targets[fb.prompt_targets >= 0] if fb.prompt_targets.shape[0] \
            else np.zeros(0, np.int32)
        return dataclasses.replace(
            res, prompt_logprobs=(-targets / 100).astype(np.float32),
            prompt_top_ids=targets[:, None].astype(np.int32),
            prompt_top_logprobs=(-targets[:, None] / 100).astype(np.float32))
    return step


@pytest.mark.parametrize("length,overlap", [(30, False), (25, True), (17, False)])
def test_a_scored_prompt_reports_every_token_once_and_max_tokens_0_ends_after_it(
        length: int, overlap: bool) -> None:
    # 25 and 17 leave a last chunk of one token, which a sampling request would decode
    sched = make(chunked_prefill_size=8, overlap=overlap)
    step = _scoring_worker(sched)
    p = prompt(length)
    # a request with the same prompt first, so that its pages are in the cache
    sched.add_request(make_request("warm", p, max_tokens=1, ignore_eos=True))
    collected = Collected()
    while sched.has_work() or sched.inflight:
        collected.add(sched.on_result(step(sched.next_batch())))
    sched.add_request(make_request("score", p, max_tokens=0, prompt_logprobs=1))
    sched.add_request(make_request("both", p, max_tokens=2, ignore_eos=True,
                                   prompt_logprobs=0))
    reported: dict[str, list[tuple[int, float]]] = {}
    results: list = []
    for _ in range(200):
        if not (sched.has_work() or sched.inflight):
            break
        while (fb := sched.next_batch()) is not None:
            results.append(step(fb))
        tb = sched.on_result(results.pop(0))
        collected.add(tb)
        if tb is not None and tb.prompt_rids:
            start = 0
            for q, rid in enumerate(tb.prompt_rids):
                n = int(tb.prompt_counts[q])
                reported.setdefault(rid, []).extend(zip(
                    tb.prompt_token_ids[start:start + n].tolist(),
                    tb.prompt_logprobs[start:start + n].tolist(), strict=True))
                start += n
    assert not sched.has_work(), "the requests never finished"
    assert sched.retracted_total == 0  # no request was taken for stuck and retracted
    for rid in ("score", "both"):
        ids = [t for t, _ in reported[rid]]
        lps = [lp for _, lp in reported[rid]]
        assert ids == p.tolist()  # every prompt token once, in order, despite the cache
        assert np.isnan(lps[0]) and lps[1:] == pytest.approx([-t / 100 for t in ids[1:]])
    assert collected.finish[("score", 0)] == ["length"]
    assert collected.tokens.get(("score", 0), []) == []  # nothing generated
    assert len(collected.tokens[("both", 0)]) == 2
    sched.check_invariant()


def test_embeddings_pool_over_chunks_and_end_the_request() -> None:
    sched = make(chunked_prefill_size=8, overlap=True)
    base = FakeWorker(sched)
    width = 3

    def step(fb):  # noqa: ANN001, ANN202
        # every row's "hidden state" is (position sum of the chunk, its last position, 1)
        res = base.step(fb)
        rows = []
        start = 0
        for b in range(fb.batch_size):
            n = int(fb.extend_lens[b])
            last = int(fb.seq_lens[b]) - 1
            if fb.embed.shape[0] and fb.embed[b] == 1:
                rows.append([last, last, 1.0])
            elif fb.embed.shape[0] and fb.embed[b] == 2:
                positions = np.arange(last - n + 1, last + 1)
                rows.append([positions.sum(), last, n])
            start += n
        vectors = np.asarray(rows, np.float32).reshape(-1, width)
        return dataclasses.replace(res, embeddings=vectors)

    p = prompt(17)  # a last chunk of one token
    sched.add_request(make_request("last", p, max_tokens=0, embed="last"))
    sched.add_request(make_request("mean", p, max_tokens=0, embed="mean"))
    got: dict[str, np.ndarray] = {}
    collected = Collected()
    results: list = []
    for _ in range(200):
        if not (sched.has_work() or sched.inflight):
            break
        while (fb := sched.next_batch()) is not None:
            results.append(step(fb))
        tb = sched.on_result(results.pop(0))
        collected.add(tb)
        if tb is not None:
            got.update(zip(tb.embedding_rids, tb.embeddings, strict=True))
    assert got["last"].tolist() == [16, 16, 1]  # the prompt's last token, from its last chunk
    # mean: every position 0..16 summed once over the chunks, divided by the prompt length
    mean = got["mean"].tolist()
    assert (mean[0], mean[2]) == pytest.approx((np.arange(17).mean(), 1.0))
    assert sched.retracted_total == 0
    assert collected.finish[("last", 0)] == ["length"] == collected.finish[("mean", 0)]
    assert "last" not in sched.requests and not sched.has_work()
    sched.check_invariant()
