"""The scheduler as a real process on real sockets; the test plays the worker (reading the
shared page table the scheduler created), the tokenizer and the detokenizer."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from multiprocessing import resource_tracker, shared_memory
from pathlib import Path

import numpy as np
import pytest

from tessera.bus.channel import Inbox, Outbox
from tessera.bus.messages import (
    AbortRequest,
    ErrorReply,
    ForwardBatch,
    Heartbeat,
    Message,
    Shutdown,
    TokenBatch,
    WorkerReady,
)
from tessera.bus.run_paths import RunPaths
from tessera.config import EngineConfig
from tests.scheduler_proc.sched_fakes import (
    EOS,
    Collected,
    FakeWorker,
    make_request,
    reference_output,
)

pytestmark = pytest.mark.integration

PAGE, ROWS, CTX, SLOTS = 4, 8, 128, 4 * 64


@dataclass
class Harness:
    paths: RunPaths
    proc: subprocess.Popen
    to_sched: Outbox
    to_results: Outbox
    worker_in: Inbox
    detok_in: Inbox
    supervisor_in: Inbox
    worker: FakeWorker | None = None
    shm: shared_memory.SharedMemory | None = None
    got: Collected = field(default_factory=Collected)
    errors: list[ErrorReply] = field(default_factory=list)
    answer: bool = True

    def attach(self) -> None:
        if self.worker is None:
            self.shm = shared_memory.SharedMemory(name=self.paths.shm_req_to_token)
            resource_tracker.unregister(self.shm._name, "shared_memory")  # type: ignore[attr-defined]
            table = np.ndarray((ROWS, CTX), dtype=np.int32, buffer=self.shm.buf)
            self.worker = FakeWorker(req_to_token=table, page_size=PAGE, num_slots=SLOTS)

    def pump(self, until, timeout: float = 20.0) -> None:
        """Serve batches and collect outputs until `until()` is true."""
        deadline = time.monotonic() + timeout
        while not until():
            assert time.monotonic() < deadline, "timed out"
            assert self.proc.poll() is None, f"scheduler exited with {self.proc.returncode}"
            for msg in self.worker_in.drain(0.01):
                assert isinstance(msg, ForwardBatch)
                if self.answer:
                    self.attach()
                    assert self.worker is not None
                    self.to_results.send(self.worker.step(msg))
            for msg in self.detok_in.drain(0.01):
                self._collect(msg)

    def idle_stats(self) -> dict[str, float]:
        """The scheduler's heartbeat stats once nothing runs or waits (heartbeats sent before
        this call, still queued, say nothing of now)."""
        last: dict[str, float] = {}
        since = time.time()

        def idle() -> bool:
            nonlocal last
            beats = [m for m in self.supervisor_in.drain(0.05)
                     if isinstance(m, Heartbeat) and m.time >= since]
            if beats:
                last = beats[-1].stats
            return bool(last) and last["running"] == 0 and last["waiting"] == 0

        self.pump(idle)
        return last

    def _collect(self, msg: Message) -> None:
        if isinstance(msg, TokenBatch):
            self.got.add(msg)
        elif isinstance(msg, ErrorReply):
            self.errors.append(msg)


@pytest.fixture
def harness(run_root: Path, request: pytest.FixtureRequest) -> Iterator[Harness]:
    overrides = getattr(request, "param", {})
    paths = RunPaths.create()
    config = EngineConfig(page_size=PAGE, max_running_requests=ROWS, chunked_prefill_size=16,
                          log_level="warning", send_timeout_ms=2000, debug_invariants=True,
                          **overrides)
    Path(paths.config_file).write_text(config.to_json())
    worker_in = Inbox(paths.worker(0), name="test-worker")
    supervisor_in = Inbox(paths.supervisor, name="test-supervisor")
    detok_in = Inbox(paths.detokenizer, name="test-detok")
    to_results = Outbox(paths.scheduler_results)
    to_results.send(WorkerReady(rank=0, world_size=1, num_slots=SLOTS, page_size=PAGE,
                                max_context_len=CTX, vocab_size=50, eos_token_ids=[EOS]))
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    proc = subprocess.Popen([sys.executable, "-m", "tessera.scheduler_proc", "--run-dir",
                             paths.run_dir], env=env)
    h = Harness(paths, proc, Outbox(paths.scheduler), to_results, worker_in, detok_in,
                supervisor_in)
    try:
        yield h
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(timeout=10)
        if h.shm is not None:
            h.shm.close()
        for box in (h.to_sched, to_results):
            box.close()
        worker_in.close()
        detok_in.close()
        supervisor_in.close()


def test_requests_run_share_the_cache_and_the_process_cleans_up(harness: Harness) -> None:
    h = harness
    prompt = (np.arange(30) % 40 + 1).astype(np.int32)
    first = make_request("first", prompt, max_tokens=6, ignore_eos=True)
    h.to_sched.send(first)
    h.pump(lambda: ("first", 0) in h.got.finish)
    h.to_sched.send(make_request("second", prompt, max_tokens=6, ignore_eos=True))
    h.pump(lambda: ("second", 0) in h.got.finish)
    want, why = reference_output(prompt, first.sampling, 0, 36)
    assert h.got.tokens[("first", 0)] == want and h.got.finish[("first", 0)] == [why]
    assert h.got.tokens[("second", 0)] == want
    assert h.got.cached[("second", 0)] == 28  # seven whole pages of 4 from the cache
    # A request that can never fit is refused at once, with the route to its client.
    h.to_sched.send(make_request("too-long", prompt, max_tokens=200))
    h.pump(lambda: bool(h.errors))
    assert h.errors[0].rid == "too-long" and h.errors[0].status == 413
    assert h.errors[0].reply_to == "ipc://nowhere/too-long"
    # An abort frees a running request and tells the detokenizer.
    h.to_sched.send(make_request("endless", prompt + 1, max_tokens=90, ignore_eos=True))
    h.pump(lambda: len(h.got.tokens.get(("endless", 0), [])) >= 3)
    h.to_sched.send(AbortRequest(rid="endless"))
    h.pump(lambda: ("endless", 0) in h.got.finish)
    assert h.got.finish[("endless", 0)] == ["abort"]
    # The page invariant at the end, as the scheduler reports it in its heartbeat.
    stats = h.idle_stats()
    assert stats["kv_invariant_ok"] == 1.0 and stats["kv_pages_running"] == 0.0
    assert stats["cache_hit_tokens"] >= 28 and stats["aborted_total"] == 1.0, stats
    # Shutdown: exits 0 and unlinks the shared page table.
    h.to_sched.send(Shutdown(reason="test"))
    h.pump(lambda: h.proc.poll() is not None)
    assert h.proc.returncode == 0
    with pytest.raises(FileNotFoundError):
        shared_memory.SharedMemory(name=h.paths.shm_req_to_token)


@pytest.mark.parametrize("harness", [{"step_timeout_s": 1.0}], indirect=True)
def test_a_silent_worker_fails_requests_with_503_and_the_process_lives(harness: Harness) -> None:
    h = harness
    h.answer = False
    h.to_sched.send(make_request("lost", np.arange(1, 9, dtype=np.int32), max_tokens=4))
    h.pump(lambda: bool(h.errors), timeout=30)
    assert h.errors[0].rid == "lost" and h.errors[0].status == 503
    assert "did not answer" in h.errors[0].message
    h.answer = True
    h.to_sched.send(make_request("next", np.arange(1, 9, dtype=np.int32), max_tokens=4,
                                 ignore_eos=True))
    h.pump(lambda: ("next", 0) in h.got.finish)
    assert len(h.got.tokens[("next", 0)]) == 4
    stats = h.idle_stats()
    assert stats["kv_invariant_ok"] == 1.0 and stats["kv_pages_running"] == 0.0
