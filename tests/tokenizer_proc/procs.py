"""Start engine processes as real children in a private run directory, for integration tests.

The test plays the rest of the engine: it binds the supervisor (to see Ready), a fake scheduler
and a client reply_to as Inboxes, and talks to the children over real ipc sockets.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tessera.bus.channel import Inbox
from tessera.bus.messages import Message, Ready, RequestOutputBatch
from tessera.bus.output_batch import unpack_outputs
from tessera.bus.run_paths import RunPaths
from tessera.config import ServerConfig

REPO = Path(__file__).resolve().parents[2]


def _received(inbox: Inbox, timeout: float) -> list[Message]:
    """Messages drained from `inbox`, each RequestOutputBatch opened into its RequestOutputs
    as the client library does."""
    out: list[Message] = []
    for msg in inbox.drain(timeout):
        out.extend(unpack_outputs(msg) if isinstance(msg, RequestOutputBatch) else [msg])
    return out


def wait_for(inbox: Inbox, kind: type, timeout: float = 10.0,
             predicate=lambda m: True) -> Message:
    """The next message of `kind` (others are kept in `inbox.seen`)."""
    seen = getattr(inbox, "seen", None)
    if seen is None:
        seen = inbox.seen = []  # type: ignore[attr-defined]
    deadline = time.monotonic() + timeout
    while True:
        for i, msg in enumerate(seen):
            if isinstance(msg, kind) and predicate(msg):
                return seen.pop(i)
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"no {kind.__name__} within {timeout} s; got {seen}")
        seen.extend(_received(inbox, min(left, 0.2)))


class Engine:
    """A run directory, the test's own endpoints and the child processes."""

    def __init__(self, run_root: Path, **config: object) -> None:
        self.paths = RunPaths.create(str(run_root / "run"))
        with open(self.paths.config_file, "w") as f:
            self.config = ServerConfig(log_level="warning", **config)
            f.write(self.config.to_json())
        self.supervisor = Inbox(self.paths.supervisor, name="test-supervisor")
        self.scheduler = Inbox(self.paths.scheduler, name="test-scheduler")
        self.client = Inbox(self.paths.client_endpoint(), name="test-client")
        self.procs: list[subprocess.Popen] = []

    def start(self, *children: tuple[str, str, list[str]], timeout: float = 60.0) -> None:
        """Start (module, process name, args) children together; wait for each one's Ready."""
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        started = []
        for module, name, args in children:
            proc = subprocess.Popen(
                [sys.executable, "-m", module, "--run-dir", self.paths.run_dir, *args],
                cwd=REPO, env=env, stderr=subprocess.PIPE, text=True)
            self.procs.append(proc)
            started.append((name, proc))
        for name, proc in started:
            try:
                wait_for(self.supervisor, Ready, timeout, lambda m, name=name: m.process == name)
            except TimeoutError:
                proc.kill()
                raise RuntimeError(f"{name} did not start: {proc.communicate()[1][-3000:]}") \
                    from None

    def alive(self) -> bool:
        return all(p.poll() is None for p in self.procs)

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
            if proc.stderr:
                proc.stderr.close()
        for inbox in (self.supervisor, self.scheduler, self.client):
            inbox.close()
