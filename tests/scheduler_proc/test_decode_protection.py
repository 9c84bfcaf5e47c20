"""The prefill budget protects running decodes: on a device whose decode step takes 6 ms and
whose prefill tokens cost 0.02 ms each (an H200-like 8B step), a prompt that arrives while
others decode is cut into chunks that keep every step within --max-mixed-step-ratio decode
steps; with nothing decoding it runs whole; a backlog of prompts that the protected chunks
would take more than --prefill-backlog-steps steps to serve gets larger ones, up to
--max-backlog-step-ratio decode steps; the outputs are the same either way."""

from __future__ import annotations

import dataclasses

import numpy as np

from tessera.bus.messages import SampledTokens, SamplingParams
from tessera.scheduler_proc.config import SchedulerConfig
from tessera.scheduler_proc.planner import fill_padding
from tessera.scheduler_proc.scheduler import Scheduler
from tests.scheduler_proc.sched_fakes import (
    EOS,
    Collected,
    FakeWorker,
    drive,
    make_request,
    reference_output,
)

DECODE_MS, PREFILL_MS = 6.0, 0.02


def make(**kw) -> Scheduler:
    # The backlog rule off (its default) unless a test asks for it.
    base = dict(num_slots=16 * 600, page_size=16, max_context_len=4096, max_running_requests=16,
                chunked_prefill_size=2048, eos_token_ids=(EOS,), overlap=False,
                debug_invariants=True, prefill_backlog_steps=0)
    base.update(kw)
    return Scheduler(SchedulerConfig(**base))  # type: ignore[arg-type]


def prompt(n: int, start: int = 1) -> np.ndarray:
    return (np.arange(n) % 40 + start).astype(np.int32)


def timed(worker: FakeWorker, fb) -> SampledTokens:  # noqa: ANN001
    """The fake worker's answer, timed like the device above."""
    extend = fb.extend_lens
    step_ms = DECODE_MS + PREFILL_MS * float(extend[extend > 1].sum())
    return dataclasses.replace(worker.step(fb), forward_ms=step_ms)


def run(sched: Scheduler, worker: FakeWorker, got: Collected, steps: int) -> list[int]:
    """Prefill tokens of each step."""
    sizes = []
    for _ in range(steps):
        fb = sched.next_batch()
        extend = fb.extend_lens
        sizes.append(int(extend[extend > 1].sum()))
        got.add(sched.on_result(timed(worker, fb)))
    return sizes


def streams_decoding(sched: Scheduler, worker: FakeWorker, got: Collected, n: int) -> None:
    for i in range(n):  # n streams decoding, the device's costs learned
        sched.add_request(make_request(f"d{i}", prompt(64, i + 1), max_tokens=300,
                                       ignore_eos=True))
    run(sched, worker, got, 3)
    assert abs(sched.step_cost.decode_ms - DECODE_MS) < 1e-9
    # The streams' own prefill ran before any decode step: its step's fixed cost was charged
    # to its tokens. Prompts next to the decodes teach the marginal cost (a moving average).
    for k in range(6):
        warm = (np.arange(3500) * 7 + k) % 997 + 100  # shares no page with the tests' prompts
        assert sched.add_request(make_request(f"warm{k}", warm.astype(np.int32), max_tokens=1,
                                              ignore_eos=True)) is None
        while f"warm{k}" in sched.requests:
            got.add(sched.on_result(timed(worker, sched.next_batch())))
    assert abs(sched.step_cost.prefill_ms_per_token - PREFILL_MS) < 0.0005


def test_a_prompt_next_to_decodes_is_chunked_to_the_ratio() -> None:
    sched = make(max_mixed_step_ratio=2.5)  # (2.5 - 1) x 6 ms / 0.02 ms = 450 tokens
    worker = FakeWorker(sched)
    got = Collected()
    streams_decoding(sched, worker, got, 4)
    sched.add_request(make_request("long", prompt(2000, 7), max_tokens=2, ignore_eos=True))
    sizes = run(sched, worker, got, 6)
    assert all(abs(s - 450) <= 15 for s in sizes[:4]) and sum(sizes) == 2000, sizes
    assert all(DECODE_MS + PREFILL_MS * s <= 2.5 * DECODE_MS for s in sizes)
    drive(sched, worker, got)
    want, _ = reference_output(prompt(2000, 7), SamplingParams(max_tokens=2, ignore_eos=True),
                               0, 2002)
    assert got.tokens[("long", 0)] == want
    assert all(len(got.tokens[(f"d{i}", 0)]) == 300 for i in range(4))


def test_a_tight_ratio_still_serves_new_prompts_at_the_floor() -> None:
    sched = make(max_mixed_step_ratio=1.5)  # 150 tokens would fit: the floor is 2048 / 8
    worker = FakeWorker(sched)
    got = Collected()
    streams_decoding(sched, worker, got, 4)
    sched.add_request(make_request("long", prompt(2000, 7), max_tokens=2, ignore_eos=True))
    assert run(sched, worker, got, 9) == [256] * 7 + [208, 0]


def test_with_room_in_the_ratio_the_chunk_is_what_fits() -> None:
    sched = make(max_mixed_step_ratio=4.0)  # 3 x 6 ms / 0.02 ms = 900 tokens
    worker = FakeWorker(sched)
    got = Collected()
    streams_decoding(sched, worker, got, 1)
    sched.add_request(make_request("long", prompt(3000, 5), max_tokens=1, ignore_eos=True))
    sizes = run(sched, worker, got, 4)
    assert all(abs(s - 900) <= 30 for s in sizes[:3]) and sum(sizes) == 3000, sizes


def test_with_nothing_decoding_a_prompt_runs_in_full_chunks() -> None:
    sched = make(max_mixed_step_ratio=1.5)
    worker = FakeWorker(sched)
    got = Collected()
    sched.add_request(make_request("warm", prompt(64), max_tokens=1, ignore_eos=True))
    run(sched, worker, got, 1)  # the device measured: fast, far below --step-target-ms
    assert "warm" not in sched.requests
    sched.add_request(make_request("long", prompt(3000, 9), max_tokens=1, ignore_eos=True))
    assert run(sched, worker, got, 2) == [2048, 3000 - 2048]


def test_a_burst_that_outnumbers_the_streams_gets_half_chunks_until_they_are_even() -> None:
    """Protecting few streams would hold many prompts back: while more requests await their
    first token than decode, steps take half the chunk whatever the ratio; once the streams
    are as many, their steps are protected again. The outputs are the same."""
    sched = make(max_mixed_step_ratio=1.5, max_running_requests=16)
    worker = FakeWorker(sched)
    got = Collected()
    streams_decoding(sched, worker, got, 2)
    for i in range(12):  # 12 prompts of 600 tokens arrive beside 2 streams
        sched.add_request(make_request(f"p{i}", prompt(600, 11 + i), max_tokens=40,
                                       ignore_eos=True))
    sizes, decoding = [], []
    for _ in range(4):
        fb = sched.next_batch()
        extend = fb.extend_lens
        sizes.append(int(extend[extend > 1].sum()))
        decoding.append(int((extend == 1).sum()))
        got.add(sched.on_result(timed(worker, fb)))
    # 2 streams, 12 awaiting: half the chunk (a prompt and part of the next), whatever the
    # ratio; 3 streams, 11 awaiting: half again; 5 streams, 9 awaiting: half again; then 7
    # streams, 7 awaiting: protected, cut to the floor (the ratio leaves 150 tokens; the
    # floor is 2048 / 8)
    assert sizes == [1024, 1024, 1024, 256], (sizes, decoding)
    assert decoding == [2, 3, 5, 7], (sizes, decoding)
    drive(sched, worker, got)
    for i in range(12):
        want, _ = reference_output(prompt(600, 11 + i),
                                   SamplingParams(max_tokens=40, ignore_eos=True), 0, 640)
        assert got.tokens[(f"p{i}", 0)] == want


def backlog_beside_streams(sched: Scheduler, n_prompts: int, length: int = 600
                           ) -> tuple[FakeWorker, Collected, list[int]]:
    """8 streams decoding, then `n_prompts` prompts arriving at once (no more than the
    streams: the decodes stay protected); the prefill tokens of each step until all are in."""
    worker = FakeWorker(sched)
    got = Collected()
    streams_decoding(sched, worker, got, 8)
    for i in range(n_prompts):
        sched.add_request(make_request(f"p{i}", prompt(length, 21 + i), max_tokens=8,
                                       ignore_eos=True))
    sizes: list[int] = []
    while sum(sizes) < n_prompts * length:
        sizes.extend(run(sched, worker, got, 1))
    return worker, got, sizes


def finish_backlog(sched: Scheduler, worker: FakeWorker, got: Collected, n_prompts: int) -> None:
    """Run backlog_beside_streams' requests to their end: each prompt's tokens are the
    reference's, and every stream got all of its own."""
    drive(sched, worker, got)
    for i in range(n_prompts):
        want, _ = reference_output(prompt(600, 21 + i),
                                   SamplingParams(max_tokens=8, ignore_eos=True), 0, 608)
        assert got.tokens[(f"p{i}", 0)] == want
    assert all(len(got.tokens[(f"d{i}", 0)]) == 300 for i in range(8))


def test_a_backlog_of_prompts_gets_larger_chunks_up_to_the_backlog_ratio() -> None:
    """6 prompts of 600 tokens beside 8 streams: the ratio's chunk (the floor, 256) would take
    14 steps; with --prefill-backlog-steps 4 a step takes what serves the backlog in 4, up to
    --max-backlog-step-ratio 2.5 decode steps (1.5 x 6 ms / 0.02 ms = 450 tokens), until
    what is left fits 4 protected steps."""
    sched = make(max_mixed_step_ratio=1.5, prefill_backlog_steps=4, max_backlog_step_ratio=2.5,
                 max_running_requests=32)
    worker, got, sizes = backlog_beside_streams(sched, 6)
    left = 3600
    for size in sizes:
        wanted = -(-left // 4)
        if left <= 4 * 256:  # what is left fits 4 protected steps
            assert size == min(256, left), sizes
        elif wanted < 435:  # below the ratio's cap: the backlog over 4 steps
            assert size == wanted, sizes
        else:
            assert abs(size - 450) <= 15, sizes
        left -= size
    assert sizes[:5] == [450] * 5 and sizes[5] == 338, sizes  # 1350 tokens left: 338 a step
    assert all(DECODE_MS + PREFILL_MS * s <= 2.5 * DECODE_MS + 0.5 for s in sizes), sizes
    finish_backlog(sched, worker, got, 6)


def test_a_backlog_within_the_steps_keeps_the_protected_chunk() -> None:
    """One prompt of 600 tokens: three protected steps serve it, within 4: unchanged. And
    with the rule off (--prefill-backlog-steps 0, the default) six prompts keep the protected
    chunk."""
    sched = make(max_mixed_step_ratio=1.5, prefill_backlog_steps=4, max_running_requests=32)
    assert backlog_beside_streams(sched, 1)[2] == [256, 256, 88]
    sched = make(max_mixed_step_ratio=1.5, prefill_backlog_steps=0, max_running_requests=32)
    sizes = backlog_beside_streams(sched, 6)[2]
    assert sizes == [256] * 14 + [16], sizes


def test_the_backlog_ratio_never_shrinks_the_protected_chunk() -> None:
    """--max-backlog-step-ratio below --max-mixed-step-ratio: the backlog's steps are the
    ratio's (3 x 6 ms / 0.02 ms = 900 tokens), never smaller."""
    sched = make(max_mixed_step_ratio=4.0, prefill_backlog_steps=2, max_backlog_step_ratio=2.0,
                 max_running_requests=32)
    sizes = backlog_beside_streams(sched, 6)[2]
    assert all(abs(s - 900) <= 30 for s in sizes[:3]), sizes


def test_fill_padding_grows_a_budget_to_its_steps_padded_size() -> None:
    sizes = (32, 64, 96, 128, 192, 256, 320)
    assert fill_padding(88, 205, sizes, 2048) == 232  # 293 tokens run as 320
    assert fill_padding(88, 232, sizes, 2048) == 232  # exactly a size: as it is
    assert fill_padding(10, 50, sizes, 2048) == 54  # 60 run as 64
    assert fill_padding(10, 50, sizes, 52) == 52  # at most the chunk size
    assert fill_padding(10, 50, sizes, 40) == 50  # which never shrinks it
    assert fill_padding(100, 300, sizes, 2048) == 300  # beyond every size: eager, unpadded
    assert fill_padding(88, 205, (), 2048) == 205  # no sizes told: every count its own


def test_a_step_that_would_run_padded_prefills_in_the_padding() -> None:
    """A worker whose prefill steps run padded to 128, 320 or 512 tokens (its captured
    graphs): the protected chunk beside the streams (256, the floor) grows to what the padded
    size holds beside them, so each step runs 320 tokens of work instead of 256 of work and
    64 of padding; with --no-fill-padded-steps the budget stays as measured. The
    tokens are the same."""
    sizes = (128, 320, 512)
    sched = make(max_mixed_step_ratio=1.5, max_running_requests=32, step_token_sizes=sizes,
                 fill_padded_steps=True)
    worker = FakeWorker(sched)
    got = Collected()
    streams_decoding(sched, worker, got, 8)
    for i in range(6):
        sched.add_request(make_request(f"p{i}", prompt(600, 21 + i), max_tokens=8,
                                       ignore_eos=True))
    steps: list[tuple[int, int]] = []  # (decodes, prefill tokens)
    while sum(p for _, p in steps) < 3600:
        fb = sched.next_batch()
        extend = fb.extend_lens
        steps.append((int((extend == 1).sum()), int(extend[extend > 1].sum())))
        got.add(sched.on_result(timed(worker, fb)))
    *full, last = steps
    assert all(d + p == 320 and p > 256 for d, p in full), steps
    assert last[1] <= 320 - last[0]
    assert len(steps) == 12, steps  # where 256-token chunks took 15
    finish_backlog(sched, worker, got, 6)
    off = make(max_mixed_step_ratio=1.5, max_running_requests=32, step_token_sizes=sizes,
               fill_padded_steps=False)
    assert backlog_beside_streams(off, 6)[2] == [256] * 14 + [16]
