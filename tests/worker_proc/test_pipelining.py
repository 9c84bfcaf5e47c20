"""The worker process queues step n+1 before it waits for step n (on an asynchronous
device), yet answers every step once, in step order, and never sits on a finished step."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tessera.bus.messages import ForwardBatch, SampledTokens
from tessera.bus.run_paths import RunPaths
from tessera.config import EngineConfig
from tessera.worker_proc.process import WorkerProcess


@dataclass
class FakePending:
    """A step on a fake asynchronous device: still running at the first look, finished when
    the worker keeps waiting for it (the worker polls `ready()` rather than blocking in the
    device); `done` finishes it at once."""

    step: int
    done: bool = False
    polls: int = 0

    def ready(self) -> bool:
        self.polls += 1
        return self.done or self.polls > 1


class QuietPlatform:
    """A plugin that compiled `compiled` (nothing by default) since the last look."""

    def __init__(self, compiled: list[str] | None = None) -> None:
        self.compiled = list(compiled or [])

    def allocator_counters(self) -> dict[str, int]:
        return {}

    def recent_compiles(self) -> list[str]:
        out, self.compiled = self.compiled, []
        return out


@dataclass
class FakeRunner:
    asynchronous: bool = True
    log: list[str] = field(default_factory=list)
    launched: list[FakePending] = field(default_factory=list)
    fail_launch: set[int] = field(default_factory=set)
    grammars_compiling: bool = False
    answers: bool = True  # the runner of the last pipeline stage answers the scheduler
    platform: Any = field(default_factory=QuietPlatform)

    def launch(self, batch: ForwardBatch, table: np.ndarray) -> FakePending:
        if batch.step in self.fail_launch:
            raise RuntimeError("bad batch")
        self.log.append(f"launch {batch.step}")
        pending = FakePending(batch.step)
        self.launched.append(pending)
        return pending

    def finish(self, pending: FakePending) -> SampledTokens:
        self.log.append(f"finish {pending.step}")
        return SampledTokens(step=pending.step, token_ids=np.array([pending.step], np.int32))


class FakeOutbox:
    def __init__(self) -> None:
        self.sent: list[SampledTokens] = []

    def send(self, msg: SampledTokens) -> None:
        self.sent.append(msg)


def batch(step: int) -> ForwardBatch:
    one_i = np.ones(1, np.int32)
    one_f = np.ones(1, np.float32)
    return ForwardBatch(step=step, rows=one_i, seq_lens=one_i, extend_lens=one_i,
                        input_ids=one_i, sample=np.ones(1, np.uint8), output_lens=one_i,
                        temperature=one_f, top_p=one_f, top_k=one_i, min_p=one_f,
                        repetition_penalty=one_f, frequency_penalty=one_f,
                        presence_penalty=one_f, seeds=np.ones(1, np.int64), logprobs=one_i)


def worker(runner: FakeRunner) -> tuple[WorkerProcess, FakeOutbox]:
    proc = WorkerProcess(RunPaths(run_dir="/nonexistent"), EngineConfig(), rank=0)
    proc.runner, proc.table = runner, type("T", (), {"array": np.zeros((1, 1), np.int32)})()
    out = FakeOutbox()
    proc.results = out  # type: ignore[assignment]
    return proc, out


def test_next_step_is_queued_before_the_previous_is_waited_for() -> None:
    runner = FakeRunner()
    proc, out = worker(runner)
    proc.handle([batch(1)])
    assert runner.log == ["launch 1"] and out.sent == []  # still running on the device
    assert proc.wait_timeout() < 0.001  # polls while a step is in flight
    proc.handle([batch(2), batch(3)])
    assert runner.log == ["launch 1", "launch 2", "finish 1", "launch 3", "finish 2"]
    assert [m.step for m in out.sent] == [1, 2]
    proc.tick()  # step 3 not done yet: nothing sent
    assert [m.step for m in out.sent] == [1, 2]
    runner.launched[-1].done = True
    proc.tick()  # done: answered at once, without waiting for another batch
    assert [m.step for m in out.sent] == [1, 2, 3]
    assert proc.pending is None and proc.wait_timeout() == proc.loop_timeout_s


def test_a_failed_launch_answers_after_the_step_before_it() -> None:
    runner = FakeRunner(fail_launch={2})
    proc, out = worker(runner)
    proc.handle([batch(1), batch(2), batch(3)])
    runner.launched[-1].done = True
    proc.tick()
    assert [m.step for m in out.sent] == [1, 2, 3]
    assert out.sent[1].error and "bad batch" in out.sent[1].error
    assert out.sent[0].error is None and out.sent[2].error is None
    assert proc.failed_steps == 1 and proc.steps == 3


def test_on_a_synchronous_device_each_step_is_answered_at_once() -> None:
    runner = FakeRunner(asynchronous=False)
    proc, out = worker(runner)
    proc.handle([batch(1), batch(2)])
    assert runner.log == ["launch 1", "finish 1", "launch 2", "finish 2"]
    assert [m.step for m in out.sent] == [1, 2] and proc.pending is None


def test_forward_ms_is_each_steps_own_time_not_the_queue_behind_it(monkeypatch) -> None:
    """Step 2 is launched at t=1 while step 1 runs until t=10; step 2 then ends at t=13:
    its own time is 3 ms (from step 1's end), not the 12 ms since its launch."""
    # launch 1 (its start and end), launch 2 (start and end), end 1, end 2
    clock = iter([0.000, 0.000, 0.001, 0.001, 0.010, 0.013]).__next__
    monkeypatch.setattr("tessera.worker_proc.process.time.perf_counter", clock)
    runner = FakeRunner()
    proc, out = worker(runner)
    proc.handle([batch(1)])
    proc.handle([batch(2)])  # launches 2, then finishes 1 (at t=10)
    runner.launched[-1].done = True
    proc.tick()  # finishes 2 (t=13)
    assert [round(m.forward_ms, 6) for m in out.sent] == [10.0, 3.0]


def test_a_slow_launch_is_counted_and_said_with_the_allocators_events(monkeypatch,
                                                                      caplog) -> None:
    """A launch that takes far longer than host work can (a kernel compiled, the allocator
    reclaimed memory mid-serving) is counted in the stats and logged with what the device
    allocator did since the last report; ordinary launches are not."""
    import logging

    from tessera.worker_proc import process

    class Platform:
        counters = {"alloc_retries": 2, "device_allocs": 10}
        compiled = ["decode_kernel[num_warps=4](n: i32)"]

        def allocator_counters(self) -> dict[str, int]:
            return dict(self.counters)

        def recent_compiles(self) -> list[str]:
            out, self.compiled = self.compiled, []
            return out

    runner = FakeRunner()
    runner.platform = Platform()  # type: ignore[attr-defined]
    proc, _ = worker(runner)
    with caplog.at_level(logging.WARNING, logger=process.log.name):
        runner.platform.compiled = []  # type: ignore[attr-defined]
        proc._note_launch(batch(0), 12.0)
        runner.platform.compiled = ["decode_kernel[num_warps=4](n: i32)"]  # type: ignore
        proc._note_launch(batch(1), 600.0)
        runner.platform.counters = {"alloc_retries": 5, "device_allocs": 10}  # type: ignore
        proc._note_launch(batch(2), 900.0)
    assert proc.slow_launches == 2
    assert proc.launch_ms_max == 900.0
    slow = [r.getMessage() for r in caplog.records if "to launch" in r.getMessage()]
    assert len(slow) == 2
    assert "step 1 took 600 ms" in slow[0] and "'alloc_retries': 2" in slow[0]
    assert "kernels compiled since the last report: decode_kernel[num_warps=4]" in slow[0]
    assert "kernels compiled" not in slow[1]  # none since
    assert "step 2 took 900 ms" in slow[1] and "'alloc_retries': 3" in slow[1]
    assert "'device_allocs': 0" in slow[1]
    # a synchronous plugin (the cpu one) computes the step in its launch: not a slow launch
    sync = FakeRunner(asynchronous=False)
    sync.platform = Platform()  # type: ignore[attr-defined]
    sync_proc, _ = worker(sync)
    monkeypatch.setattr(process.time, "perf_counter", iter([0.0, 5.0, 5.0, 5.0, 5.0]).__next__)
    sync_proc._launch(batch(3))
    assert sync_proc.slow_launches == 0 and sync_proc.launch_ms_max == 0.0


def test_a_compile_while_serving_is_named_even_when_the_launch_is_not_slow(caplog) -> None:
    """A kernel compiled inside a launch under the slow threshold (a benchmark's counters say
    one compiled mid-run) is named at info level with its step; a launch that compiled
    nothing says nothing, and what was named is not named again."""
    import logging

    from tessera.worker_proc import process

    runner = FakeRunner(platform=QuietPlatform(["_extend_kernel[BLOCK_M=64](n: i32)"]))
    proc, _ = worker(runner)
    with caplog.at_level(logging.INFO, logger=process.log.name):
        proc._note_launch(batch(4), 90.0)
        proc._note_launch(batch(5), 2.0)
    said = [r.getMessage() for r in caplog.records if "compiled while serving" in r.getMessage()]
    assert len(said) == 1
    assert "step 4 compiled while serving (launch 90 ms" in said[0]
    assert "_extend_kernel[BLOCK_M=64]" in said[0]
    assert proc.slow_launches == 0
