"""The worker as a real process on the bus: WorkerReady at start, greedy tokens equal to
transformers' through the shared-memory page table, an error answer for a bad batch, and a
clean exit on Shutdown."""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from multiprocessing import shared_memory

import numpy as np
import pytest

from tessera.bus.channel import Inbox, Outbox
from tessera.bus.messages import ForwardBatch, SampledTokens, Shutdown, WorkerReady
from tessera.bus.run_paths import RUN_PREFIX, RunPaths
from tessera.config import EngineConfig
from tests.worker_proc.driver import MiniScheduler
from tests.worker_proc.helpers import hf_greedy, prompts, tiny_hf_model

pytestmark = pytest.mark.integration


@dataclass
class _Plan:
    num_pages: int


class RemoteRunner:
    """What MiniScheduler needs of a runner, served by a worker process over the bus."""

    def __init__(self, config: EngineConfig, ready: WorkerReady, inbox: Inbox,
                 outbox: Outbox) -> None:
        self.config = config
        self.max_context_len = ready.max_context_len
        self.kv_plan = _Plan(ready.num_slots // ready.page_size)
        self.inbox, self.outbox = inbox, outbox

    def step(self, batch: ForwardBatch, req_to_token: np.ndarray) -> SampledTokens:
        self.outbox.send(batch)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            for msg in self.inbox.drain(1.0):
                assert isinstance(msg, SampledTokens) and msg.step == batch.step
                return msg
        raise TimeoutError("no SampledTokens from the worker")


def wait_for(inbox: Inbox, kind: type, proc: subprocess.Popen, timeout: float = 120) -> object:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for msg in inbox.drain(0.5):
            if isinstance(msg, kind):
                return msg
        if proc.poll() is not None:
            raise RuntimeError(f"worker exited with {proc.returncode}")
    raise TimeoutError(f"no {kind.__name__} from the worker")


def test_worker_process_serves_greedy_tokens(tmp_path, run_root):
    model = tiny_hf_model("qwen3", str(tmp_path / "model"))
    # A unique run id: the shared-memory name derives from it and is machine-wide. Under the
    # short run_root: the sockets' ipc:// paths must fit in 107 bytes, which tmp_path (one
    # level deeper under pytest-xdist) can exceed.
    paths = RunPaths.create(tempfile.mkdtemp(prefix=RUN_PREFIX, dir=run_root))
    config = EngineConfig(model=str(tmp_path / "model"), hal="cpu", page_size=4,
                          max_running_requests=16, context_length=128, max_total_tokens=2048,
                          log_level="warning")
    with open(paths.config_file, "w") as f:
        f.write(config.to_json())
    results = Inbox(paths.scheduler_results, name="test-results")
    shm = shared_memory.SharedMemory(name=paths.shm_req_to_token, create=True,
                                     size=16 * 128 * 4)
    proc = subprocess.Popen([sys.executable, "-m", "tessera.worker_proc", "--run-dir",
                             paths.run_dir, "--rank", "0"])
    to_worker = Outbox(paths.worker(0), timeout_ms=5000)
    try:
        ready = wait_for(results, WorkerReady, proc)
        assert isinstance(ready, WorkerReady)
        assert ready.num_slots == 2048 + 4 and ready.max_context_len == 128
        table = np.ndarray((16, 128), dtype=np.int32, buffer=shm.buf)
        sched = MiniScheduler(RemoteRunner(config, ready, results, to_worker),
                              req_to_token=table, through_codec=False)
        batch = prompts(256, [3, 10, 21])
        got = [r.out for r in sched.generate(batch, 8)]
        assert got == [hf_greedy(model, p, 8) for p in batch]
        # A batch naming more input ids than its lengths say is answered with an error.
        bad, _, _ = sched._make_batch([sched.history[0]])
        bad = ForwardBatch(**{**bad.__dict__, "input_ids": np.zeros(5, np.int32)})
        to_worker.send(bad)
        answer = wait_for(results, SampledTokens, proc)
        assert isinstance(answer, SampledTokens) and answer.error and "input ids" in answer.error
        to_worker.send(Shutdown(reason="test"))
        assert proc.wait(timeout=30) == 0
        del table
    finally:
        if proc.poll() is None:
            proc.kill()
        to_worker.close()
        results.close()
        shm.close()
        shm.unlink()
