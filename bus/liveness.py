"""Heartbeats of an asyncio process (AsyncBusProcess, bus/process.py): from its event loop,
with fresh stats, and from a thread while a handler holds the loop.

One request can hold the HTTP server's event loop for a second or more (parsing and checking an
8 MiB body of millions of items); a few at once held it past --heartbeat-timeout-s, the loop's
own heartbeat could not run, and the supervisor took the server for hung and restarted it,
failing every stream in flight. As in the engine processes (BusProcess), a thread keeps the
heartbeats going with the stats the loop last sent, until the loop has not come round for
--loop-stall-timeout-s: a loop stuck that long is hung, and the supervisor sees the silence.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable

from tessera.bus.channel import Outbox, SendTimeout
from tessera.bus.messages import Heartbeat

log = logging.getLogger(__name__)


class Liveness:
    def __init__(self, supervisor_endpoint: str, process: str, interval_s: float,
                 loop_stall_timeout_s: float) -> None:
        self.endpoint = supervisor_endpoint
        self.process = process
        self.interval_s = interval_s
        self.loop_stall_timeout_s = loop_stall_timeout_s
        self._stats: dict[str, float] = {}
        self._last_beat = 0.0
        self._loop_seen = time.monotonic()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def beat_from_loop(self, send: Callable[[Heartbeat], None], stats: dict[str, float]) -> None:
        """The loop's heartbeat (through the loop's own socket): fresh stats, and proof that
        the loop came round."""
        now = time.monotonic()
        self._loop_seen = now
        self._stats = stats
        send(self._heartbeat(stats))
        self._last_beat = now

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="heartbeat", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2 * self.interval_s + 1)

    def _heartbeat(self, stats: dict[str, float]) -> Heartbeat:
        return Heartbeat(process=self.process, pid=os.getpid(), time=time.time(), stats=stats)

    def _run(self) -> None:
        box = Outbox(self.endpoint, timeout_ms=100)  # zmq sockets are not shared by threads
        try:
            while not self._stop.wait(self.interval_s):
                now = time.monotonic()
                stall = now - self._loop_seen
                if stall > self.loop_stall_timeout_s:
                    log.error("%s: event loop stalled for %.0f s; heartbeats stop",
                              self.process, stall)
                    continue
                if now - self._last_beat >= 1.5 * self.interval_s:
                    try:
                        box.send(self._heartbeat({**self._stats, "loop_stall_s": stall}))
                    except SendTimeout:
                        pass  # the supervisor is busy or gone: the next beat tries again
        finally:
            box.close()
