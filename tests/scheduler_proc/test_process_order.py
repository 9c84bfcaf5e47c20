"""The scheduler process's turn on a step's result: the next step goes to the worker before the
result's tokens go to the detokenizer (the device waits on the first, nobody on the second),
except tokens that carry a request's first token while the worker has another step to run
(a time to first token waits on them, the device does not); the detokenizer hears every step's
tokens, in step order."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from tessera.bus.codec import decode
from tessera.bus.messages import ForwardBatch, Message, TokenBatch
from tessera.bus.run_paths import RunPaths
from tessera.config import EngineConfig
from tessera.scheduler_proc.config import SchedulerConfig
from tessera.scheduler_proc.process import SchedulerProcess
from tessera.scheduler_proc.scheduler import Scheduler
from tests.scheduler_proc.sched_fakes import EOS, FakeWorker, make_request


class Recorder:
    """An Outbox that appends what it is given to one log shared by every recorder."""

    def __init__(self, name: str, log: list[tuple[str, Message]]) -> None:
        self.name, self.log, self.sent = name, log, 0

    def send(self, msg: Message, timeout_ms: int | None = None) -> None:
        self.log.append((self.name, msg))
        self.sent += 1

    def send_frames(self, frames: list[Any], timeout_ms: int | None = None) -> None:
        self.send(decode([bytes(f) for f in frames]), timeout_ms)

    def close(self) -> None:
        pass


def test_the_next_step_leaves_before_the_last_steps_tokens(tmp_path: Path) -> None:
    proc = SchedulerProcess(RunPaths(run_dir=str(tmp_path)), EngineConfig(model="default"))
    sched = Scheduler(SchedulerConfig(num_slots=16 * 64, page_size=16, max_context_len=256,
                                      max_running_requests=4, chunked_prefill_size=256,
                                      eos_token_ids=(EOS,)))
    log: list[tuple[str, Message]] = []
    proc.sched = sched
    proc.workers = [Recorder("worker", log)]  # type: ignore[list-item]
    proc.detok = Recorder("detokenizer", log)  # type: ignore[assignment]
    worker = FakeWorker(sched)
    for i in range(2):
        assert sched.add_request(make_request(f"r{i}", [3 + i, 4, 5, 6], max_tokens=6,
                                              ignore_eos=True)) is None
    proc.tick()  # the first steps (two in flight)
    answered = first_tokens_ahead = batches_ahead = 0
    for _ in range(50):
        batches = [m for who, m in log if who == "worker"]
        if answered == len(batches):
            break
        start = len(log)
        proc.handle([worker.step(batches[answered])])
        still_running = bool(sched.inflight)  # a step the worker has yet to answer
        proc.tick()
        answered += 1
        turn = log[start:]
        kinds = [(who, type(m).__name__) for who, m in turn]
        assert ("detokenizer", "TokenBatch") in kinds  # this turn's tokens went out
        tokens = next(m for who, m in turn if who == "detokenizer")
        assert isinstance(tokens, TokenBatch)
        if ("worker", "ForwardBatch") in kinds:
            first = kinds.index(("worker", "ForwardBatch")) < kinds.index(
                ("detokenizer", "TokenBatch"))
            if tokens.new_requests and still_running:
                assert not first, "a first token waited for the next step's batch"
                first_tokens_ahead += 1
            else:
                assert first, "the next step waited for this step's tokens"
                batches_ahead += 1
    assert answered > 4 and not sched.inflight and not sched.has_work()
    assert first_tokens_ahead >= 1 and batches_ahead >= 1  # both orders were exercised
    tokens = [m for who, m in log if who == "detokenizer" and isinstance(m, TokenBatch)]
    outs: dict[str, list[int]] = {}
    for tb in tokens:
        ids, offset = np.asarray(tb.token_ids), 0
        for rid, n in zip(tb.rids, np.asarray(tb.counts).tolist(), strict=True):
            outs.setdefault(rid, []).extend(ids[offset:offset + n].tolist())
            offset += n
    assert {rid: len(ids) for rid, ids in outs.items()} == {"r0": 6, "r1": 6}
    steps = [m.step for who, m in log if who == "worker" and isinstance(m, ForwardBatch)]
    assert steps == sorted(steps) and len(steps) == answered


def test_a_first_token_leaves_before_its_prompt_enters_the_prefix_cache() -> None:
    """on_result(early=...) hands a step's output on at once when it carries a first token
    and another step is in flight, before the prompt's pages are filed in the radix cache
    (its matched length is still 0 then), and returns None; a decode step's output is
    returned as before."""
    sched = Scheduler(SchedulerConfig(num_slots=16 * 64, page_size=16, max_context_len=256,
                                      max_running_requests=4, chunked_prefill_size=256,
                                      eos_token_ids=(EOS,)))
    worker = FakeWorker(sched)
    prompt = np.arange(3, 3 + 40, dtype=np.int32)
    assert sched.add_request(make_request("r0", prompt, max_tokens=4, ignore_eos=True)) is None
    first, second = sched.next_batch(), sched.next_batch()  # the prefill, then its decode
    assert first is not None and second is not None
    seen: list[tuple[TokenBatch, int]] = []
    out = sched.on_result(worker.step(first),
                          early=lambda tb: seen.append((tb, sched.kv.matched_tokens(prompt))))
    assert out is None and len(seen) == 1
    tokens, cached_then = seen[0]
    assert tokens.new_requests and list(tokens.rids) == ["r0"] and cached_then == 0
    assert sched.kv.matched_tokens(prompt) == 32  # its two whole pages, filed afterwards
    out = sched.on_result(worker.step(second), early=lambda tb: seen.append((tb, -1)))
    assert out is not None and list(out.rids) == ["r0"] and len(seen) == 1  # not a first token
