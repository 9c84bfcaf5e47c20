"""Long randomized schedules against the fake worker: arrivals, aborts, shared prefixes, n > 1,
memory pressure that forces retraction. After every step the page invariant holds; at the end
every sample finished exactly once with exactly the tokens a direct computation gives."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tessera.scheduler_proc.config import SchedulerConfig
from tessera.scheduler_proc.scheduler import Scheduler
from tests.scheduler_proc.sched_fakes import (
    EOS,
    VOCAB,
    Collected,
    FakeWorker,
    Model,
    drive,
    make_request,
    next_token,
    reference_output,
)


def random_request(rng: np.random.Generator, rid: str, bases: list[np.ndarray], ctx: int):
    base = bases[int(rng.integers(len(bases)))]
    cut = int(rng.integers(0, base.shape[0] + 1))
    tail = rng.integers(1, VOCAB, size=int(rng.integers(1, 20)))
    prompt = np.concatenate([base[:cut], tail]).astype(np.int32)
    max_tokens = None if rng.random() < 0.1 else int(rng.integers(1, 48))
    if max_tokens is not None:
        max_tokens = min(max_tokens, ctx - prompt.shape[0])
    sampling: dict = {"max_tokens": max_tokens, "n": int(rng.integers(1, 4)),
                      "seed": int(rng.integers(0, 1000)) if rng.random() < 0.5 else None}
    if rng.random() < 0.2:
        sampling["min_tokens"] = min(int(rng.integers(1, 10)), max_tokens or 10)
    if rng.random() < 0.2:
        sampling["stop_token_ids"] = (int(rng.integers(1, VOCAB)),)
    if rng.random() < 0.15:
        sampling["ignore_eos"] = True
    return make_request(rid, prompt, **sampling)


def run_schedule(seed: int, overlap: bool, num_pages: int, n_requests: int = 60,
                 disable_cache: bool = False, model: Model = next_token,
                 worker_class: type[FakeWorker] = FakeWorker, priorities: int = 0,
                 **config: object) -> Scheduler:
    """Random arrivals, aborts and cache flushes until every request is done; every output is
    checked against `model` computed directly. `priorities` > 0: each request gets a random
    priority below it. `config`: more SchedulerConfig fields."""
    rng = np.random.default_rng(seed)
    ps, ctx = 4, 128
    cfg = SchedulerConfig(num_slots=ps * (num_pages + 1), page_size=ps, max_context_len=ctx,
                          max_running_requests=8, chunked_prefill_size=24,
                          eos_token_ids=(EOS,), overlap=overlap,
                          disable_radix_cache=disable_cache, debug_invariants=True,
                          **config)  # type: ignore[arg-type]
    sched = Scheduler(cfg)
    worker = worker_class(sched, model=model, refer_back=not config.get("batches_in_flight"))
    got = Collected()
    bases = [rng.integers(1, VOCAB, size=int(rng.integers(8, 60))).astype(np.int32)
             for _ in range(3)]
    sent: dict = {}
    aborted: set[str] = set()
    def arrive(rid: str) -> None:
        req = random_request(rng, rid, bases, ctx)
        if priorities:
            object.__setattr__(req, "priority", int(rng.integers(0, priorities)))
        assert sched.add_request(req) is None
        sent[req.rid] = req

    for i in range(8):
        arrive(f"r{i}")

    def between(step: int) -> None:
        if len(sent) < n_requests and rng.random() < 0.4:
            arrive(f"r{len(sent)}")
        if rng.random() < 0.04:
            rid = f"r{int(rng.integers(len(sent)))}"
            if sched.abort(rid):
                aborted.add(rid)
        if rng.random() < 0.01:
            sched.flush_cache()

    drive(sched, worker, got, between=between)
    while len(sent) < n_requests:  # the schedule ended early: run the rest too
        between(0)
        drive(sched, worker, got, between=between)

    for rid, req in sent.items():
        for index in range(req.sampling.n):
            key = (rid, index)
            finishes = got.finish.get(key, [])
            assert len(finishes) == 1, f"{key} finished {finishes}"
            max_total = sched.limits.max_total(req.input_ids.shape[0], req.sampling.max_tokens)
            want, why = reference_output(req.input_ids, req.sampling, index, max_total,
                                         model=model)
            tokens = got.tokens.get(key, [])
            if finishes[0] == "abort":
                assert rid in aborted
                assert tokens == want[:len(tokens)], f"{key}: wrong tokens before the abort"
            else:
                assert (tokens, finishes[0]) == (want, why), f"{key}: wrong output"
        assert got.announced.get(rid) == 1
    assert not sched.requests and not sched.running and len(sched.waiting) == 0
    assert sched.allocator.free_pages + sched.cache.evictable_pages == \
        sched.allocator.total_pages
    sched.check_invariant()
    return sched


@pytest.mark.parametrize("overlap", [False, True])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_schedule_with_memory_pressure(seed: int, overlap: bool) -> None:
    sched = run_schedule(seed, overlap, num_pages=48)
    assert sched.retracted_total > 0, "the pool was meant to be too small for everyone"
    assert sched.cache_hit_tokens > 0


@pytest.mark.parametrize("overlap", [False, True])
@pytest.mark.parametrize("policy", ["priority", "lpm"])
def test_random_schedule_under_each_policy(policy: str, overlap: bool) -> None:
    """Arrivals of mixed priorities pre-empt running requests (priority), or jump the queue
    by cached prefix (lpm), under memory pressure: every output is still exact."""
    sched = run_schedule(11, overlap, num_pages=48, priorities=3, schedule_policy=policy)
    assert sched.retracted_total > 0 and sched.cache_hit_tokens > 0


@pytest.mark.parametrize("overlap", [False, True])
def test_random_schedule_roomy_pool_never_retracts(overlap: bool) -> None:
    sched = run_schedule(7, overlap, num_pages=2000, n_requests=30)
    assert sched.retracted_total == 0


@pytest.mark.parametrize("batches", [2, 3])
def test_random_schedule_with_pipeline_batches_in_flight(batches: int) -> None:
    """Pipeline stages: several independent batches in flight, none referring to a token
    still in flight (the fake worker refuses a -1 input), every output still exact."""
    sched = run_schedule(5, True, num_pages=48, batches_in_flight=batches)
    assert sched.retracted_total > 0


def test_random_schedule_without_radix_cache() -> None:
    sched = run_schedule(3, True, num_pages=48, disable_cache=True)
    assert sched.cache_hit_tokens == 0 and sched.cache.total_pages == 0


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(page_size=st.sampled_from([1, 2, 4, 16]), chunk=st.sampled_from([0, 1, 7, 64]),
       extra_pages=st.integers(0, 40), rows=st.integers(1, 6), overlap=st.booleans(),
       policy=st.sampled_from(["fcfs", "priority", "lpm"]), disable_cache=st.booleans(),
       step_sizes=st.sampled_from([(), (8, 16, 64), (4, 32), (3,)]), fill=st.booleans(),
       backlog=st.sampled_from([0, 2]), order=st.sampled_from(["longest-first", "arrival"]),
       costs=st.booleans(), seed=st.integers(0, 2**16))
def test_any_configuration_finishes_every_request_correctly(
        page_size: int, chunk: int, extra_pages: int, rows: int, overlap: bool, policy: str,
        disable_cache: bool, step_sizes: tuple[int, ...], fill: bool, backlog: int,
        order: str, costs: bool, seed: int) -> None:
    """Tiny pools (down to one request's worth), any chunk size, page size, row count; steps
    filled into the worker's padded sizes or not, the backlog rule on or off, either decode
    order. With `costs` the step costs are known (a decode step 10 ms, a prompt token 1 ms;
    the fake worker reports none, so they stay), and the protected budget binds: the only
    way the backlog rule and the filling change a plan."""
    rng = np.random.default_rng(seed)
    ctx = 64
    largest = 40  # prompt + max_tokens of the largest request below
    num_pages = -(-largest // page_size) + extra_pages
    cfg = SchedulerConfig(num_slots=page_size * (num_pages + 1), page_size=page_size,
                          max_context_len=ctx, max_running_requests=rows,
                          chunked_prefill_size=chunk, eos_token_ids=(EOS,), overlap=overlap,
                          disable_radix_cache=disable_cache,
                          schedule_policy=policy, step_token_sizes=step_sizes,
                          fill_padded_steps=fill, prefill_backlog_steps=backlog,
                          decode_order=order, debug_invariants=True)
    sched = Scheduler(cfg)
    if costs:  # as if measured: decode steps of 1-8 streams, then one with 64 prompt tokens
        for streams in range(1, 9):
            sched.step_cost.observe(streams, 0, 10.0)
        sched.step_cost.observe(1, 64, 10.0 + 64 * 1.0)
        assert sched.step_cost.prefill_ms_per_token == 1.0
    worker = FakeWorker(sched)
    got = Collected()
    base = rng.integers(1, VOCAB, size=20).astype(np.int32)
    sent = []
    for i in range(int(rng.integers(1, 8))):
        prompt = np.concatenate([base[:int(rng.integers(0, 21))],
                                 rng.integers(1, VOCAB, size=int(rng.integers(1, 6)))])
        req = make_request(f"q{i}", prompt.astype(np.int32),
                           max_tokens=int(rng.integers(1, largest - prompt.shape[0] + 1)),
                           n=int(rng.integers(1, 3)), seed=i)
        object.__setattr__(req, "priority", int(rng.integers(0, 3)))
        assert sched.add_request(req) is None
        sent.append(req)
    drive(sched, worker, got)
    for req in sent:
        max_total = req.input_ids.shape[0] + req.sampling.max_tokens
        for index in range(req.sampling.n):
            want, why = reference_output(req.input_ids, req.sampling, index, max_total)
            assert got.tokens[(req.rid, index)] == want
            assert got.finish[(req.rid, index)] == [why]
    assert sched.allocator.free_pages + sched.cache.evictable_pages == \
        sched.allocator.total_pages
