"""A small BusProcess the supervisor tests start as a real child process.

    python dummy_proc.py --run-dir DIR --name NAME [--exit-before-ready CODE]
        [--hang-after S] [--shm] [--leak-shm] [--slow-stop S]

It binds an inbox at ipc://DIR/NAME.sock, reports Ready and heartbeats like every engine
process, and misbehaves on request so the supervisor's reactions can be observed.
"""

from __future__ import annotations

import os
import sys
import time
from multiprocessing import resource_tracker, shared_memory
from typing import Any

from tessera.bus.channel import Inbox
from tessera.bus.messages import Message
from tessera.bus.process import BusProcess, process_main
from tessera.bus.run_paths import RunPaths
from tessera.config import EngineConfig


class DummyProcess(BusProcess):
    def __init__(self, paths: RunPaths, config: EngineConfig, name: str,
                 exit_before_ready: int | None, hang_after: float | None, shm: bool,
                 leak_shm: bool, slow_stop: float) -> None:
        super().__init__(paths, config)
        self.name = name
        self.exit_before_ready = exit_before_ready
        self.hang_after = hang_after
        self.slow_stop = slow_stop
        self.want_shm = shm or leak_shm
        self.leak_shm = leak_shm
        self.segment: shared_memory.SharedMemory | None = None
        self.handled = 0
        self.started = 0.0

    def setup(self) -> None:
        if self.exit_before_ready is not None:
            print(f"{self.name}: cannot start: pretend the model file is missing",
                  file=sys.stderr, flush=True)
            sys.exit(self.exit_before_ready)
        self.inbox = Inbox(f"ipc://{self.paths.run_dir}/{self.name}.sock", name=self.name)
        if self.want_shm:
            self.segment = shared_memory.SharedMemory(
                name=self.paths.shm_name(self.name), create=True, size=4096)
            # The segment's fate is the process's business (and the supervisor's after a
            # crash), not the resource tracker's, which would otherwise unlink it at our death.
            resource_tracker.unregister(self.segment._name, "shared_memory")  # type: ignore[attr-defined]
        self.started = time.monotonic()

    def handle(self, msgs: list[Message]) -> None:
        self.handled += len(msgs)

    def tick(self) -> None:
        if self.hang_after is not None and time.monotonic() - self.started > self.hang_after:
            time.sleep(3600)  # a hung main loop: no more heartbeats

    def stats(self) -> dict[str, float]:
        return {"handled": float(self.handled)}

    def ready_info(self) -> dict[str, Any]:
        return {"model": "dummy-model"}

    def teardown(self) -> None:
        time.sleep(self.slow_stop)
        if self.segment is not None:
            self.segment.close()
            if not self.leak_shm:
                # Unlinked by path: SharedMemory.unlink() would also tell the resource tracker,
                # which no longer knows the name and would print a traceback.
                os.unlink(f"/dev/shm/{self.segment.name}")


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(__file__))
    sys.exit(process_main(DummyProcess, extra_args={
        "--name": {"required": True},
        "--exit-before-ready": {"type": int, "default": None},
        "--hang-after": {"type": float, "default": None},
        "--shm": {"action": "store_true"},
        "--leak-shm": {"action": "store_true"},
        "--slow-stop": {"type": float, "default": 0.0},
    }))
