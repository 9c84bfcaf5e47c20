"""benchmarks/fake_worker.py: the stand-in worker's "device" takes the time its cost model
gives each step, and reports that time as the step's own, as the real worker reports what it
measured (the scheduler sizes its prefill chunks from it)."""

from __future__ import annotations

import time

import numpy as np
import pytest

from tessera.benchmarks.fake_worker import FakeWorker
from tessera.benchmarks.sched_sim import CostModel
from tessera.bus.messages import ForwardBatch, SampledTokens
from tessera.bus.run_paths import RunPaths
from tessera.config import EngineConfig


class Outbox:
    def __init__(self) -> None:
        self.sent: list[SampledTokens] = []

    def send(self, msg: SampledTokens) -> None:
        self.sent.append(msg)


def batch(step: int, seq_lens: list[int], extend_lens: list[int]) -> ForwardBatch:
    b = len(seq_lens)
    i32 = np.ones(b, np.int32)
    f32 = np.ones(b, np.float32)
    ext = np.asarray(extend_lens, np.int32)
    return ForwardBatch(step=step, rows=np.arange(b, dtype=np.int32),
                        seq_lens=np.asarray(seq_lens, np.int32), extend_lens=ext,
                        input_ids=np.ones(int(ext.sum()), np.int32),
                        sample=np.ones(b, np.uint8), output_lens=i32, temperature=f32,
                        top_p=f32, top_k=i32, min_p=f32, repetition_penalty=f32,
                        frequency_penalty=f32, presence_penalty=f32,
                        seeds=np.ones(b, np.int64), logprobs=i32)


def worker(**kw: object) -> tuple[FakeWorker, Outbox]:
    w = FakeWorker(RunPaths(run_dir="/nonexistent"), EngineConfig(), **kw)  # type: ignore[arg-type]
    out = Outbox()
    w.results = out  # type: ignore[assignment]
    w.vocab_size = 1000
    return w, out


def drain(w: FakeWorker, out: Outbox, n: int) -> None:
    deadline = time.monotonic() + 5
    while len(out.sent) < n and time.monotonic() < deadline:
        time.sleep(w.wait_timeout())
        w.tick()


@pytest.mark.parametrize("kind", ["tokens", "flat"])
def test_the_cost_model_times_each_step_and_is_reported(kind: str) -> None:
    w, out = worker(cost_model=kind)
    steps = [batch(0, [600] * 4, [1] * 4), batch(1, [600, 600, 300], [1, 1, 300])]
    start = time.monotonic()
    w.handle(steps)  # type: ignore[arg-type]
    drain(w, out, 2)
    cost = CostModel(kind)
    want = [cost.step_ms(np.asarray(b.seq_lens), np.asarray(b.extend_lens)) for b in steps]
    assert [r.step for r in out.sent] == [0, 1]
    assert [r.forward_ms for r in out.sent] == pytest.approx(want)
    # one after the other: the second ends no sooner than both steps' time
    assert time.monotonic() - start >= sum(want) / 1000.0
    assert [len(r.token_ids) for r in out.sent] == [4, 3]


def test_without_a_model_a_step_is_step_ms_and_its_prompt_tokens() -> None:
    w, out = worker(step_ms=2.0, prefill_us_per_token=10.0)
    w.handle([batch(0, [600, 300], [1, 300])])  # type: ignore[list-item]
    drain(w, out, 1)
    assert out.sent[0].forward_ms == pytest.approx(2.0 + 300 * 0.01)


def test_bench_host_replays_its_tier_through_the_simulator() -> None:
    from tessera.benchmarks.bench_host import simulated
    from tessera.benchmarks.datasets import random_requests
    from tessera.benchmarks.sched_sim import run_tier

    reqs = random_requests(16, (32, 64), (8, 16), 1000, seed=3)
    sim = run_tier(4, requests=reqs, cost=CostModel("tokens"))
    assert sim["requests"] == 16 and sim["total_output_tokens"] == sum(r.output_len
                                                                       for r in reqs)
    out = simulated(reqs, 4, "tokens", {"output_tok_per_s": sim["output_tok_per_s"] / 2})
    assert out["sim_output_tok_per_s"] == pytest.approx(sim["output_tok_per_s"])
    assert out["fraction_of_sim"] == pytest.approx(0.5)
    assert out["sim_steps"] == sim["steps"]
