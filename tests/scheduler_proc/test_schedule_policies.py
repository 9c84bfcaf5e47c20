"""--schedule-policy: lpm (longest cached prefix first) and priority's pre-emption, with the
in-process fake worker (every output checked against what the prompt alone determines)."""

from __future__ import annotations

import numpy as np
import pytest

from tessera.bus.messages import ForwardBatch, SampledTokens, TokenBatch, TokenizedRequest
from tessera.scheduler_proc import policy
from tessera.scheduler_proc.scheduler import Scheduler
from tests.scheduler_proc.sched_fakes import (
    Collected,
    FakeWorker,
    drive,
    make_request,
    reference_output,
)
from tests.scheduler_proc.test_scheduler_behaviour import make, prompt


class Recorder(FakeWorker):
    """The fake worker, noting the order in which requests first appear in a step."""

    def __init__(self, sched: Scheduler) -> None:
        super().__init__(sched)
        self.sched = sched
        self.started: list[str] = []

    def step(self, fb: ForwardBatch) -> SampledTokens:
        for row in fb.rows.tolist():
            rid = self.sched.running.rid_of_row[row]
            if rid not in self.started:
                self.started.append(rid)
        return super().step(fb)


class Finishes(Collected):
    """Collected outputs, plus the order in which requests finished."""

    def __init__(self) -> None:
        super().__init__()
        self.order: list[str] = []

    def add(self, tb: TokenBatch | None) -> None:
        super().add(tb)
        if tb is not None:
            self.order += [rid for rid, f in zip(tb.rids, tb.finish, strict=True) if f is not None]


def request(rid: str, tokens: np.ndarray, max_tokens: int, priority: int = 0) -> TokenizedRequest:
    req = make_request(rid, tokens, max_tokens=max_tokens, ignore_eos=True)
    object.__setattr__(req, "priority", priority)
    return req


def check_outputs(got: Collected, reqs: list[TokenizedRequest]) -> None:
    for req in reqs:
        n = int(req.input_ids.shape[0])
        want, _ = reference_output(req.input_ids, req.sampling, 0, n + req.sampling.max_tokens)
        assert got.tokens[(req.rid, 0)] == want, req.rid


def shared_prefix_run(policy_name: str) -> tuple[list[str], Scheduler]:
    """A 64-token prompt is cached; then an unrelated request and one that extends the cached
    prompt wait together, one running at a time."""
    sched = make(max_running_requests=1, schedule_policy=policy_name, chunked_prefill_size=64)
    worker = Recorder(sched)
    got = Collected()
    system = prompt(64, 3)
    first = request("first", system, 2)
    sched.add_request(first)
    drive(sched, worker, got)
    cold = request("cold", prompt(48, 11)[::-1].copy(), 3)
    warm = request("warm", np.concatenate([system, prompt(16, 7)]), 3)
    sched.add_request(cold)
    sched.add_request(warm)
    drive(sched, worker, got)
    check_outputs(got, [first, cold, warm])
    return worker.started, sched


def test_lpm_admits_the_longest_cached_prefix_first() -> None:
    started, sched = shared_prefix_run("lpm")
    assert started == ["first", "warm", "cold"]
    assert sched.cache_hit_tokens == 64  # warm reused the cached prompt
    started, _ = shared_prefix_run("fcfs")
    assert started == ["first", "cold", "warm"]


def test_lpm_keeps_arrival_order_among_equal_matches_and_for_long_queues(
        monkeypatch: pytest.MonkeyPatch) -> None:
    sched = make(max_running_requests=1, schedule_policy="lpm")
    worker = Recorder(sched)
    got = Collected()
    reqs = [request(f"r{i}", prompt(20, i + 1), 2) for i in range(4)]
    for req in reqs:
        sched.add_request(req)
    drive(sched, worker, got)
    assert worker.started == ["r0", "r1", "r2", "r3"]
    check_outputs(got, reqs)
    # Beyond LPM_MAX_WAITING the queue is not ranked: the shared prefix does not jump ahead.
    monkeypatch.setattr(policy, "LPM_MAX_WAITING", 1)
    started, _ = shared_prefix_run("lpm")
    assert started == ["first", "cold", "warm"]


def test_lpm_ranks_by_the_cache_as_it_is_now() -> None:
    queue = policy.WaitingQueue(by_priority=False, by_prefix=True)
    sched = make(schedule_policy="lpm")
    seqs = []
    for i, n in enumerate((8, 40, 24)):
        sched.add_request(request(f"s{i}", prompt(n + 1, 5), 1))
        seqs.append(sched.requests[f"s{i}"].seqs[0])
        queue.push(seqs[-1])
    matched = {id(s.tokens): m for s, m in zip(seqs, (8, 40, 24), strict=True)}
    queue.rank(lambda tokens: matched[id(tokens)], 0)
    assert [queue.pop() for _ in range(3)] == [seqs[1], seqs[2], seqs[0]]
    for s in seqs:
        queue.push(s)  # arrivals: ranked again even at the same cache version
    queue.rank(lambda tokens: matched[id(tokens)], 0)
    assert queue.peek() is seqs[1]
    matched[id(seqs[0].tokens)] = 64
    queue.rank(lambda tokens: matched[id(tokens)], 0)
    assert queue.peek() is seqs[1]  # same cache version, no arrival: the ranking stands
    queue.rank(lambda tokens: matched[id(tokens)], 1)  # the cache changed: it follows
    assert queue.peek() is seqs[0] and len(queue) == 3


@pytest.mark.parametrize("overlap", [False, True])
@pytest.mark.parametrize("high_priority", [5, 0])
def test_priority_preempts_lower_priority_when_rows_run_out(overlap: bool,
                                                            high_priority: int) -> None:
    sched = make(max_running_requests=1, schedule_policy="priority", overlap=overlap)
    worker = Recorder(sched)
    got = Finishes()
    low = request("low", prompt(20), 30)
    high = request("high", prompt(12, 9), 4, priority=high_priority)
    sched.add_request(low)

    def arrive(steps: int) -> None:
        if steps == 3:
            sched.add_request(high)

    drive(sched, worker, got, between=arrive)
    check_outputs(got, [low, high])
    if high_priority:
        assert got.order == ["high", "low"] and sched.retracted_total == 1
    else:  # an equal priority waits its turn: no pre-emption
        assert got.order == ["low", "high"] and sched.retracted_total == 0


@pytest.mark.parametrize("overlap", [False, True])
@pytest.mark.parametrize("policy_name", ["priority", "fcfs"])
def test_priority_preempts_lower_priority_when_memory_runs_out(overlap: bool,
                                                               policy_name: str) -> None:
    # 12 usable pages of 16 tokens; "low" fills them all (176 prompt + 16 output tokens), so
    # "high" finds no memory at all while low runs.
    sched = make(num_slots=16 * 13, schedule_policy=policy_name, overlap=overlap,
                 chunked_prefill_size=64)
    worker = Recorder(sched)
    got = Finishes()
    low = request("low", prompt(176), 16)
    high = request("high", prompt(40, 9), 4, priority=5)
    sched.add_request(low)
    assert sched.allocator.total_pages == 12

    def arrive(steps: int) -> None:
        if steps == 4:  # low is decoding and holds every page
            assert sched.kv.available() <= 1
            sched.add_request(high)

    drive(sched, worker, got, between=arrive)
    check_outputs(got, [low, high])
    if policy_name == "priority":
        assert got.order == ["high", "low"] and sched.retracted_total == 1
    else:
        assert got.order == ["low", "high"] and sched.retracted_total == 0


def test_priority_never_preempts_for_an_equal_or_lower_priority() -> None:
    sched = make(schedule_policy="priority")
    for rid, prio in (("a", 3), ("b", 1), ("c", 3)):
        sched.add_request(request(rid, prompt(5), 2, priority=prio))
    a, b, c = (sched.requests[r].seqs[0] for r in "abc")
    assert policy.preemption_victim(c, [a]) is None  # equal
    assert policy.preemption_victim(b, [a]) is None  # lower
    assert policy.preemption_victim(a, [b, c]) is b  # the lower one only
    assert policy.preemption_victim(a, []) is None
