"""The scheduler's rules, one at a time, with the in-process fake worker."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from tessera.bus.messages import AbortRequest, DetokInfo, SampledTokens, SamplingParams
from tessera.scheduler_proc.config import SchedulerConfig
from tessera.scheduler_proc.scheduler import Scheduler
from tests.scheduler_proc.sched_fakes import (
    EOS,
    Collected,
    FakeWorker,
    drive,
    make_request,
    reference_output,
)


def make(**kw) -> Scheduler:
    base = dict(num_slots=16 * 200, page_size=16, max_context_len=512, max_running_requests=8,
                chunked_prefill_size=32, eos_token_ids=(EOS,), overlap=False,
                debug_invariants=True)
    base.update(kw)
    return Scheduler(SchedulerConfig(**base))  # type: ignore[arg-type]


def prompt(n: int, start: int = 1) -> np.ndarray:
    return (np.arange(n) % 40 + start).astype(np.int32)


def test_chunked_prefill_runs_the_right_chunks_then_decodes() -> None:
    sched = make()
    worker = FakeWorker(sched)
    assert sched.add_request(make_request("a", prompt(100), max_tokens=3, ignore_eos=True)) is None
    seen = []
    while sched.has_work():
        fb = sched.next_batch()
        assert fb is not None
        seen.append((fb.extend_lens.tolist(), fb.seq_lens.tolist(), fb.sample.tolist(),
                     fb.is_decode))
        sched.on_result(worker.step(fb))
    assert seen == [([32], [32], [0], False), ([32], [64], [0], False),
                    ([32], [96], [0], False), ([4], [100], [1], False),
                    ([1], [101], [1], True), ([1], [102], [1], True)]


def test_decodes_and_a_new_prefill_share_one_batch_under_the_budget() -> None:
    sched = make()
    worker = FakeWorker(sched)
    sched.add_request(make_request("a", prompt(10), max_tokens=20, ignore_eos=True))
    sched.on_result(worker.step(sched.next_batch()))  # a prefilled
    sched.add_request(make_request("b", prompt(50, 3), max_tokens=5, ignore_eos=True))
    sched.add_request(make_request("c", prompt(50, 5), max_tokens=5, ignore_eos=True))
    fb = sched.next_batch()
    # a decodes; b gets the remaining budget of 32 prompt tokens; c waits for budget.
    assert fb.extend_lens.tolist() == [1, 32]
    assert fb.sample.tolist() == [1, 0]
    assert not fb.is_decode
    sched.on_result(worker.step(fb))


def test_prompt_sent_twice_is_served_from_the_cache_with_identical_output() -> None:
    sched = make()
    worker = FakeWorker(sched)
    got = Collected()
    p = prompt(70)
    sched.add_request(make_request("first", p, max_tokens=8, ignore_eos=True))
    drive(sched, worker, got)
    sched.add_request(make_request("second", p, max_tokens=8, ignore_eos=True))
    fb = sched.next_batch()
    assert fb.extend_lens.tolist() == [70 - 64]  # four whole pages reused
    got.add(sched.on_result(worker.step(fb)))
    drive(sched, worker, got)
    assert got.tokens[("second", 0)] == got.tokens[("first", 0)]
    assert got.cached[("second", 0)] == 64 and got.cached[("first", 0)] == 0
    stats = sched.stats()
    assert stats["cache_hit_tokens"] == 64 and stats["cache_query_tokens"] == 140


def test_n_samples_share_the_prompt_pages() -> None:
    sched = make()
    worker = FakeWorker(sched)
    got = Collected()
    req = make_request("n3", prompt(40), max_tokens=30, n=3, seed=5, ignore_eos=True)
    sched.add_request(req)
    first = sched.next_batch()
    assert first.batch_size == 1 and first.extend_lens.tolist() == [32]
    got.add(sched.on_result(worker.step(first)))
    fb = sched.next_batch()
    got.add(sched.on_result(worker.step(fb)))  # index 0 samples: its prompt pages go to the cache
    fb = sched.next_batch()
    # index 0 decodes; indices 1 and 2 compute only the 8 tokens after the 2 shared pages.
    assert fb.extend_lens.tolist() == [1, 8, 8]
    assert fb.seeds.tolist() == [5, 6, 7]
    rows = [s.row for s in sched.requests["n3"].seqs]
    pages = [sched.st.pages[r, :2].tolist() for r in rows]
    assert pages[0] == pages[1] == pages[2]
    assert len({sched.st.pages[r, 2] for r in rows}) == 3  # own pages for the rest
    sched.check_invariant()
    got.add(sched.on_result(worker.step(fb)))
    drive(sched, worker, got)
    for index in range(3):
        want, why = reference_output(req.input_ids, req.sampling, index, 40 + 30)
        assert got.tokens[("n3", index)] == want and got.finish[("n3", index)] == [why]
        assert got.cached[("n3", index)] == (0 if index == 0 else 32)


def test_admission_refuses_what_cannot_run_with_clear_messages() -> None:
    sched = make(num_slots=16 * 11, max_context_len=256, max_queued_requests=2, vocab_size=50)
    err = sched.add_request(make_request("long", prompt(200), max_tokens=100))
    assert err.status == 413 and "200" in err.message and "256" in err.message
    assert err.reply_to == "ipc://nowhere/long"
    err = sched.add_request(make_request("full", prompt(256), max_tokens=None))
    assert err.status == 413 and "context" in err.message and err.param == "prompt"
    err = sched.add_request(make_request("over", prompt(250), max_tokens=7))
    assert err.status == 413 and err.param == "max_tokens" and "257 tokens" in err.message
    err = sched.add_request(make_request("huge", prompt(100), max_tokens=100))
    assert err.status == 503 and "KV cache holds 160" in err.message
    assert sched.add_request(make_request("empty", prompt(0))).status == 400
    bad = make_request("vocab", np.array([1, 99], dtype=np.int32))
    assert sched.add_request(bad).status == 400
    assert sched.add_request(make_request("ok1", prompt(10))) is None
    assert sched.add_request(make_request("ok1", prompt(10))).status == 400  # rid in use
    assert sched.add_request(make_request("ok2", prompt(10))) is None
    err = sched.add_request(make_request("ok3", prompt(10)))
    assert err.status == 503 and "waiting" in err.message
    # max_tokens=None means "until the pool or the context is full": it always fits.
    sched2 = make(num_slots=16 * 11, max_context_len=256)
    assert sched2.add_request(make_request("open", prompt(10), max_tokens=None)) is None
    assert sched2.requests["open"].max_total == 160
    sched2.check_invariant()


def test_priority_policy_runs_higher_priority_first() -> None:
    sched = make(max_running_requests=1, schedule_policy="priority")
    worker = FakeWorker(sched)
    for rid, prio in (("low", 0), ("high", 5), ("mid", 2)):
        req = make_request(rid, prompt(5), max_tokens=2, ignore_eos=True)
        object.__setattr__(req, "priority", prio)
        sched.add_request(req)
    order = []
    while sched.has_work():
        fb = sched.next_batch()
        if fb.extend_lens[0] > 1:
            order.append(sched.running.seq_of_row[int(fb.rows[0])].req.rid)
        sched.on_result(worker.step(fb))
    assert order == ["high", "mid", "low"]


def test_fcfs_runs_in_arrival_order() -> None:
    sched = make(max_running_requests=1)
    worker = FakeWorker(sched)
    for rid in ("a", "b", "c"):
        sched.add_request(make_request(rid, prompt(5), max_tokens=2, ignore_eos=True))
    order = []
    while sched.has_work():
        fb = sched.next_batch()
        if fb.extend_lens[0] > 1:
            order.append(sched.running.seq_of_row[int(fb.rows[0])].req.rid)
        sched.on_result(worker.step(fb))
    assert order == ["a", "b", "c"]


@pytest.mark.parametrize("overlap", [False, True])
def test_abort_frees_everything_at_once(overlap: bool) -> None:
    sched = make(overlap=overlap)
    worker = FakeWorker(sched)
    got = Collected()
    sched.add_request(make_request("run", prompt(60), max_tokens=100, ignore_eos=True))
    sched.add_request(make_request("many", prompt(20, 7), max_tokens=100, n=3,
                                   ignore_eos=True))
    for _ in range(3):
        fb = sched.next_batch()
        got.add(sched.on_result(worker.step(fb)))
    assert sched.abort("run") and sched.abort("many")
    assert not sched.abort("run")  # already gone
    got.add(sched.take_output())
    assert got.finish[("run", 0)] == ["abort"]
    assert [got.finish[("many", i)] for i in range(3)] == [["abort"]] * 3
    assert not sched.running and not sched.requests and len(sched.waiting) == 0
    assert sched.allocator.free_pages + sched.cache.evictable_pages == \
        sched.allocator.total_pages
    # Steps still in flight come back and are ignored.
    while sched.inflight:
        rec = sched.inflight[0]
        got.add(sched.on_result(SampledTokens(step=rec.step, token_ids=np.zeros(
            rec.sampled_rows.shape[0], dtype=np.int32))))
    assert sched.running.row_pool.free_rows == sched.config.max_running_requests
    sched.check_invariant()


def test_min_tokens_blocks_eos_and_stop_ids_until_reached() -> None:
    sched = make()
    worker = FakeWorker(sched)
    sched.add_request(make_request("m", prompt(5), max_tokens=6, min_tokens=3,
                                   stop_token_ids=(7,)))
    blocks = []
    while sched.has_work():
        fb = sched.next_batch()
        blocks.append(fb.block_ids[fb.block_offsets[0]:fb.block_offsets[1]].tolist()
                      if fb.block_offsets.shape[0] else [])
        sched.on_result(worker.step(fb))
    assert blocks[:3] == [[EOS, 7]] * 3
    assert all(b == [] for b in blocks[3:])


def test_stop_token_id_finishes_with_stop_and_reports_it() -> None:
    sched = make()
    worker = FakeWorker(sched)
    got = Collected()
    req = make_request("free", prompt(9), max_tokens=40, ignore_eos=True)
    sched.add_request(req)
    drive(sched, worker, got)
    stop_at = got.tokens[("free", 0)][4]
    req2 = make_request("stops", prompt(9), max_tokens=40, ignore_eos=True,
                        stop_token_ids=(stop_at,))
    sched.add_request(req2)
    tbs = []
    while sched.has_work():
        tbs.append(sched.on_result(worker.step(sched.next_batch())))
    last = tbs[-1]
    assert last.finish == ["stop"] and last.matched_stop == [stop_at]
    first_stop = got.tokens[("free", 0)].index(stop_at)
    assert sum(int(tb.counts.sum()) for tb in tbs) == first_stop + 1


@pytest.mark.parametrize("overlap", [False, True])
def test_penalties_send_the_full_history(overlap: bool) -> None:
    sched = make(overlap=overlap)
    worker = FakeWorker(sched)
    got = Collected()
    sched.add_request(make_request("pen", prompt(6), max_tokens=5, ignore_eos=True,
                                   repetition_penalty=1.3))
    sched.add_request(make_request("plain", prompt(4, 9), max_tokens=5, ignore_eos=True))
    results = []
    while sched.has_work() or sched.inflight:
        while (fb := sched.next_batch()) is not None:
            pen = [i for i in range(fb.batch_size)
                   if sched.running.seq_of_row[int(fb.rows[i])].req.rid == "pen"]
            if pen:
                i = pen[0]
                hist = fb.hist_ids[fb.hist_offsets[i]:fb.hist_offsets[i + 1]].tolist()
                assert fb.hist_prompt_lens[i] == 6
                out_so_far = got.tokens.get(("pen", 0), [])
                assert hist == prompt(6).tolist() + out_so_far
                if fb.is_decode:  # its input is known, never "what you sampled last"
                    assert fb.input_ids[i] >= 0
            results.append(worker.step(fb))
        got.add(sched.on_result(results.pop(0)))
    assert len(got.tokens[("pen", 0)]) == 5


def test_logprobs_pass_through_to_the_token_batch() -> None:
    sched = make()
    sched.add_request(make_request("lp", prompt(5), max_tokens=3, logprobs=2))
    fb = sched.next_batch()
    assert fb.logprobs.tolist() == [2]
    tb = sched.on_result(SampledTokens(
        step=fb.step, token_ids=np.array([11], dtype=np.int32),
        logprobs=np.array([-0.5], dtype=np.float32),
        top_ids=np.array([[11, 12]], dtype=np.int32),
        top_logprobs=np.array([[-0.5, -1.5]], dtype=np.float32)))
    assert tb.token_ids.tolist() == [11] and tb.logprobs.tolist() == [-0.5]
    assert tb.top_ids.tolist() == [[11, 12]]
    assert tb.new_requests == {"lp": DetokInfo(reply_to="ipc://nowhere/lp")}


def test_a_failed_step_fails_its_requests_and_frees_them() -> None:
    sched = make()
    worker = FakeWorker(sched)
    sched.add_request(make_request("x", prompt(20), max_tokens=9, ignore_eos=True))
    sched.on_result(worker.step(sched.next_batch()))
    fb = sched.next_batch()
    assert sched.on_result(SampledTokens(step=fb.step, token_ids=np.zeros(0, np.int32),
                                         error="device lost")) is None
    errors = sched.take_errors()
    assert [(e.rid, e.status) for e in errors] == [("x", 500)]
    assert "device lost" in errors[0].message
    assert not sched.running and not sched.requests
    sched.check_invariant()


def test_worker_timeout_fails_inflight_requests_but_keeps_the_rest() -> None:
    sched = make(overlap=True, max_running_requests=1)
    sched.add_request(make_request("busy", prompt(20), max_tokens=9))
    sched.add_request(make_request("queued", prompt(20, 2), max_tokens=9))
    assert sched.next_batch() is not None
    sched.fail_inflight("the model worker did not answer")
    errors = sched.take_errors()
    assert [(e.rid, e.status) for e in errors] == [("busy", 503)]
    assert list(sched.requests) == ["queued"]
    # The failed step's row stays reserved until the worker is done with that step: a late
    # answer is dropped and gives the row back.
    rows = sched.config.max_running_requests
    assert sched.running.row_pool.free_rows == rows - 1
    assert sched.on_result(SampledTokens(step=0, token_ids=np.zeros(1, np.int32))) is None
    assert sched.running.row_pool.free_rows == rows
    worker = FakeWorker(sched)
    got = Collected()
    drive(sched, worker, got)
    assert got.finish[("queued", 0)] in (["stop"], ["length"])


def test_waiting_requests_expire() -> None:
    sched = make(max_running_requests=1)
    sched.add_request(make_request("a", prompt(5), max_tokens=5))
    sched.add_request(make_request("b", prompt(5), max_tokens=5))
    sched.next_batch()
    now = sched.requests["b"].queued_at
    assert sched.expire_waiting(10.0, now + 5) == 0
    assert sched.expire_waiting(10.0, now + 11) == 1  # "a" runs: it does not expire
    assert [(e.rid, e.status) for e in sched.take_errors()] == [("b", 503)]


def test_retraction_picks_the_youngest_and_it_recomputes() -> None:
    # 12 pages of 4 tokens: two requests of 8 + 20 tokens cannot both finish in memory.
    sched = make(num_slots=4 * 13, page_size=4, max_context_len=64, chunked_prefill_size=64)
    worker = FakeWorker(sched)
    got = Collected()
    old = make_request("old", prompt(8), max_tokens=20, ignore_eos=True)
    young = make_request("young", prompt(8, 20), max_tokens=20, ignore_eos=True)
    sched.add_request(old)
    sched.add_request(young)
    retracted = []

    def watch(_: int) -> None:
        if sched.retracted_total > len(retracted):
            retracted.append([s.req.rid for s in sched.waiting.sequences()])

    drive(sched, worker, got, between=watch)
    assert retracted and all(r == ["young"] for r in retracted)
    for req in (old, young):
        want, _ = reference_output(req.input_ids, req.sampling, 0, 28)
        assert got.tokens[(req.rid, 0)] == want


def test_a_lost_result_fails_only_its_step() -> None:
    sched = make(overlap=True)
    sched.add_request(make_request("a", prompt(5), max_tokens=9, ignore_eos=True))
    first = sched.next_batch()
    sched.add_request(make_request("b", prompt(6, 3), max_tokens=9, ignore_eos=True))
    second = sched.next_batch()  # a decodes (-1), b prefills
    assert first is not None and second is not None and second.batch_size == 2
    # The answer to the first step never comes; the second's does.
    tb = sched.on_result(SampledTokens(step=second.step,
                                       token_ids=np.array([7, 8], dtype=np.int32)))
    assert [(e.rid, e.status) for e in sched.take_errors()] == [("a", 503)]
    assert tb is not None and tb.rids == ["b"] and tb.token_ids.tolist() == [8]
    assert list(sched.requests) == ["b"]
    sched.check_invariant()


@pytest.mark.parametrize("overlap", [False, True])
def test_requests_arriving_together_compute_a_shared_prefix_once(overlap: bool) -> None:
    sched = make(overlap=overlap, chunked_prefill_size=2048)
    worker = FakeWorker(sched)
    got = Collected()
    shared = prompt(64)
    reqs = [make_request(f"s{i}", np.concatenate([shared, [i + 1, i + 2]]), max_tokens=4,
                         ignore_eos=True) for i in range(4)]
    reqs.append(make_request("other", prompt(40, 9), max_tokens=4, ignore_eos=True))
    for req in reqs:
        sched.add_request(req)
    first = sched.next_batch()
    # One of the four computes the shared prefix; the unrelated request is not held back.
    assert first.extend_lens.tolist() == [66, 40]
    computed = int(first.extend_lens.sum())
    results = [worker.step(first)]
    while sched.has_work() or sched.inflight:
        while (fb := sched.next_batch()) is not None:
            computed += int(fb.extend_lens.sum())
            results.append(worker.step(fb))
        got.add(sched.on_result(results.pop(0)))
        sched.check_invariant()
    for i in range(1, 4):
        assert got.cached[(f"s{i}", 0)] == 64
        want, _ = reference_output(reqs[i].input_ids, reqs[i].sampling, 0, 66 + 4)
        assert got.tokens[(f"s{i}", 0)] == want
    # 66 + 40 prompt tokens, 2 for each later request, and the decodes (3 per request).
    assert computed == 66 + 40 + 3 * 2 + 5 * 3


def prefill_left(sched: Scheduler, rid: str) -> int:
    seq = sched.requests[rid].seqs[0]
    """Prompt tokens of `rid` not in KV yet."""
    return max(0, int(sched.st.prompt_len[seq.row] - sched.st.kv_len[seq.row]))


def test_short_requests_are_not_held_behind_a_long_prefill() -> None:
    """A long prompt shares its steps with requests that arrive while it prefills: they are
    admitted at once and finish long before its last chunk."""
    sched = make()  # budget 32 tokens a step
    worker = FakeWorker(sched)
    got = Collected()
    sched.add_request(make_request("long", prompt(400), max_tokens=2, ignore_eos=True))
    got.add(sched.on_result(worker.step(sched.next_batch())))
    for i in range(3):
        sched.add_request(make_request(f"short{i}", prompt(8, 2 + i), max_tokens=3,
                                       ignore_eos=True))
    fb = sched.next_batch()
    assert fb.extend_lens.tolist() == [16, 8, 8]  # half the budget to the long prompt
    got.add(sched.on_result(worker.step(fb)))
    while not all((f"short{i}", 0) in got.finish for i in range(3)):
        got.add(sched.on_result(worker.step(sched.next_batch())))
    assert prefill_left(sched, "long") > 250  # most of the long prompt is still to come
    drive(sched, worker, got)
    for rid, p, n in [("long", prompt(400), 2)] + [(f"short{i}", prompt(8, 2 + i), 3)
                                                   for i in range(3)]:
        want, _ = reference_output(p, SamplingParams(max_tokens=n, ignore_eos=True), 0,
                                   len(p) + n)
        assert got.tokens[(rid, 0)] == want


def timed(worker: FakeWorker, fb, ms_per_token: float) -> SampledTokens:  # noqa: ANN001
    """The fake worker's answer, as if the device took `ms_per_token` per token."""
    return dataclasses.replace(worker.step(fb),
                               forward_ms=ms_per_token * float(fb.extend_lens.sum()))


def test_prefill_chunks_shrink_to_the_step_time_target_even_alone() -> None:
    """On a slow device (10 ms a token, so 32 tokens take 320 ms) and a 100 ms target, every
    prefill step takes 10 tokens... at least one page (16). Alone too: a request that arrives
    during a step waits for it, so no step may hold it for long."""
    sched = make(step_target_ms=100.0)
    worker = FakeWorker(sched)
    sched.add_request(make_request("alone", prompt(96), max_tokens=40, ignore_eos=True))
    sizes = []
    while not sizes or prefill_left(sched, "alone"):
        fb = sched.next_batch()
        sizes.append(fb.extend_lens.tolist())
        sched.on_result(timed(worker, fb, 10.0))
    assert sizes == [[32]] + [[16]] * 4  # the first step measures the device
    assert sched.ms_per_token == pytest.approx(10.0)
    assert sched.add_request(make_request("next", prompt(96, 3), max_tokens=2,
                                          ignore_eos=True)) is None
    sizes = []
    for _ in range(6):
        fb = sched.next_batch()
        sizes.append(fb.extend_lens.tolist())
        sched.on_result(timed(worker, fb, 10.0))
    # "alone" decodes one token a step; "next" prefills a page a step, not 32 tokens.
    assert sizes == [[1, 16]] * 6
    assert prefill_left(sched, "next") == 0
    assert sched.stats()["step_token_budget"] == 16


def test_on_a_device_slower_than_the_step_target_waiting_requests_still_get_in() -> None:
    """A step's fixed cost (1 s) alone exceeds --step-target-ms (500 ms), and no decode step
    has measured it yet, so it reads as prefill work. The chunks must not shrink step after
    step down to a page (which went wholly to the long prompt): the requests that arrive are
    admitted and finish while most of the long prompt is still to come."""
    sched = make(chunked_prefill_size=512, step_target_ms=500.0, max_context_len=4096,
                 num_slots=16 * 400)
    worker = FakeWorker(sched)
    got = Collected()

    def slow(fb) -> SampledTokens:  # noqa: ANN001
        return dataclasses.replace(worker.step(fb),
                                   forward_ms=1000.0 + 5.0 * float(fb.extend_lens.sum()))

    assert sched.add_request(make_request("long", prompt(3000), max_tokens=2,
                                          ignore_eos=True)) is None
    for _ in range(4):
        got.add(sched.on_result(slow(sched.next_batch())))
    for i in range(3):
        sched.add_request(make_request(f"short{i}", prompt(24, 2 + i), max_tokens=3,
                                       ignore_eos=True))
    steps = 0
    while not all((f"short{i}", 0) in got.finish for i in range(3)) and steps < 40:
        got.add(sched.on_result(slow(sched.next_batch())))
        steps += 1
    assert all((f"short{i}", 0) in got.finish for i in range(3)), sched.stats()
    assert prefill_left(sched, "long") > 1500
    assert sched.stats()["step_token_budget"] >= 64  # an eighth of the chunk size at least
    drive(sched, worker, got)
    for rid, p, n in [("long", prompt(3000), 2)] + [(f"short{i}", prompt(24, 2 + i), 3)
                                                    for i in range(3)]:
        want, _ = reference_output(p, SamplingParams(max_tokens=n, ignore_eos=True), 0,
                                   len(p) + n)
        assert got.tokens[(rid, 0)] == want


def test_a_resent_copy_of_a_running_request_is_ignored() -> None:
    sched = make()
    worker = FakeWorker(sched)
    got = Collected()
    req = make_request("r", prompt(20), max_tokens=4, ignore_eos=True)
    assert sched.add_request(req) is None
    got.add(sched.on_result(worker.step(sched.next_batch())))
    assert sched.add_request(dataclasses.replace(req, resent=True)) is None  # ignored
    again = sched.add_request(req)  # the same rid, not marked: a client's mistake
    assert again is not None and again.status == 400 and again.param == "rid"
    drive(sched, worker, got)
    want, _ = reference_output(prompt(20), req.sampling, 0, 24)
    assert got.tokens[("r", 0)] == want  # ran once


def test_an_abort_for_a_lost_route_fails_the_request_to_its_client() -> None:
    sched = make()
    worker = FakeWorker(sched)
    sched.add_request(make_request("r", prompt(20), max_tokens=40, ignore_eos=True))
    sched.on_result(worker.step(sched.next_batch()))
    assert sched.abort("r", AbortRequest.LOST_ROUTE)
    errors = sched.take_errors()
    assert [(e.rid, e.status, e.reply_to) for e in errors] == [("r", 503, "ipc://nowhere/r")]
    assert "detokenizer restarted" in errors[0].message
    assert not sched.has_work()
    sched.check_invariant()


@pytest.mark.parametrize("order", ["longest-first", "arrival"])
@pytest.mark.parametrize("overlap", [False, True])
def test_decodes_run_longest_context_first_and_keep_their_tokens(overlap: bool,
                                                                 order: str) -> None:
    """A step's decode rows come longest context first (the decode attention kernels hand
    out their programs in the batch's order), whatever order the requests arrived in, or in
    their arrival order under --decode-order arrival; every request gets exactly its own
    tokens either way."""
    sched = make(overlap=overlap, chunked_prefill_size=512, decode_order=order)
    worker = FakeWorker(sched)
    got = Collected()
    lens = {"short": 9, "long": 80, "mid": 33, "tiny": 3}
    for i, (rid, n) in enumerate(lens.items()):
        sched.add_request(make_request(rid, prompt(n, 1 + i), max_tokens=6, ignore_eos=True))
    decode_orders = []
    results = []
    while sched.has_work() or sched.inflight:
        while (fb := sched.next_batch()) is not None:
            dec = [i for i in range(fb.batch_size) if fb.extend_lens[i] == 1]
            if len(dec) > 1 and order == "longest-first":
                ctx = [int(fb.seq_lens[i]) for i in dec]
                assert ctx == sorted(ctx, reverse=True), f"decodes not longest first: {ctx}"
            if len(dec) > 1:
                decode_orders.append([sched.running.seq_of_row[int(fb.rows[i])].req.rid
                                      for i in dec])
            results.append(worker.step(fb))
        got.add(sched.on_result(results.pop(0)))
        got.add(sched.take_output())
        sched.check_invariant()
    got.add(sched.take_output())
    first = ["long", "mid", "short", "tiny"] if order == "longest-first" else list(lens)
    assert decode_orders and decode_orders[0] == first
    for i, (rid, n) in enumerate(lens.items()):
        want, _ = reference_output(prompt(n, 1 + i), SamplingParams(max_tokens=6,
                                   ignore_eos=True), 0, n + 6)
        assert got.tokens[(rid, 0)] == want, rid
