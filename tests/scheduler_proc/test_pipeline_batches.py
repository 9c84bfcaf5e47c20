"""Batches in flight for pipeline stages: the decoding rows are spread over the batches the
workers hold, no row is in two of them, and no batch waits on a token still in flight."""

from __future__ import annotations

import numpy as np

from tessera.scheduler_proc.config import SchedulerConfig
from tessera.scheduler_proc.scheduler import Scheduler
from tests.scheduler_proc.sched_fakes import EOS, Collected, FakeWorker, make_request


def _sched(batches: int) -> Scheduler:
    return Scheduler(SchedulerConfig(num_slots=16 * 200, page_size=16, max_context_len=256,
                                     max_running_requests=16, chunked_prefill_size=512,
                                     eos_token_ids=(EOS,), batches_in_flight=batches))


def test_decoding_rows_are_split_over_the_batches_in_flight() -> None:
    sched = _sched(2)
    worker = FakeWorker(sched, refer_back=False)
    got = Collected()
    for i in range(8):
        assert sched.add_request(make_request(f"r{i}", [5 + i, 6, 7, 8], max_tokens=20,
                                              ignore_eos=True)) is None
    first = sched.next_batch()  # every prompt at once
    assert first is not None and first.batch_size == 8 and sched.next_batch() is None
    got.add(sched.on_result(worker.step(first)))
    sizes = []
    inflight: list = []
    for _ in range(12):
        while (batch := sched.next_batch()) is not None:
            rows = set(batch.rows.tolist())
            for other in inflight:  # no row in two batches in flight
                assert not rows & set(other.rows.tolist())
            assert (batch.input_ids >= 0).all()
            inflight.append(batch)
        assert len(inflight) <= 2
        done = inflight.pop(0)
        sizes.append(done.batch_size)
        got.add(sched.on_result(worker.step(done)))
    assert sizes[:4] == [4, 4, 4, 4]  # two batches of four decodes take turns


def test_one_running_request_decodes_one_batch_at_a_time() -> None:
    sched = _sched(2)
    worker = FakeWorker(sched, refer_back=False)
    assert sched.add_request(make_request("a", [3, 4, 5], max_tokens=4, ignore_eos=True)) is None
    got = Collected()
    steps = 0
    while sched.has_work() or sched.inflight:
        batch = sched.next_batch()
        assert batch is not None and sched.next_batch() is None  # nothing else to run
        got.add(sched.on_result(worker.step(batch)))
        steps += 1
    assert steps == 4 and len(got.tokens[("a", 0)]) == 4
    assert np.all(np.asarray(got.tokens[("a", 0)]) >= 0)


def test_one_batch_more_than_the_stages_spreads_the_rows_over_three() -> None:
    """pp-size 2 keeps three batches in flight by default (tessera/config.py
    pipeline_batches): eight decoding requests go 3, 3, 2, and no row is in two of them."""
    sched = _sched(3)
    worker = FakeWorker(sched, refer_back=False)
    got = Collected()
    for i in range(8):
        assert sched.add_request(make_request(f"r{i}", [5 + i, 6, 7, 8], max_tokens=20,
                                              ignore_eos=True)) is None
    first = sched.next_batch()
    assert first is not None and first.batch_size == 8
    got.add(sched.on_result(worker.step(first)))
    inflight = []
    while (batch := sched.next_batch()) is not None:
        inflight.append(batch)
    assert [b.batch_size for b in inflight] == [3, 3, 2]
    rows = [set(b.rows.tolist()) for b in inflight]
    assert not (rows[0] & rows[1] or rows[0] & rows[2] or rows[1] & rows[2])
    for batch in inflight:
        got.add(sched.on_result(worker.step(batch)))

