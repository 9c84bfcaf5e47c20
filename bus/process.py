"""The base of every engine process's main loop.

    setup()            bind inboxes, load what the process needs (may take long: before Ready)
    send Ready         to the supervisor
    loop until stopped:
        msgs = inbox.drain(timeout)   one swap of the double buffer
        handle(msgs)                  the whole batch
        tick()                        periodic work (scheduling step, timeouts)
    teardown()

Heartbeats (with fresh stats) go out every heartbeat_interval_s from the loop. While the loop
is busy in one long step (a big prefill on a slow CPU) a thread of its own keeps them going
with the stats last sent, so a long step does not read as death; that thread stops once the
loop has not come round for `loop_stall_timeout_s`: a loop stuck that long is hung, and the
supervisor sees the silence.

SIGTERM / SIGINT set a flag; the loop finishes its iteration, runs teardown and exits 0.
Subclasses set `name` and implement `setup` and `handle`.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import threading
import time
from typing import Any

from tessera.bus.breaker import CircuitBreaker
from tessera.bus.channel import Inbox, Outbox, SendTimeout
from tessera.bus.logs import setup_logging
from tessera.bus.messages import Heartbeat, Message, Ready, Shutdown
from tessera.bus.run_paths import RunPaths
from tessera.bus.stats import BREAKER_VALUE, labeled
from tessera.config import EngineConfig, ServerConfig

log = logging.getLogger(__name__)


def load_config(paths: RunPaths) -> ServerConfig:
    with open(paths.config_file) as f:
        return ServerConfig.from_json(f.read())


class BusProcess:
    name = "process"

    def __init__(self, paths: RunPaths, config: EngineConfig) -> None:
        self.paths = paths
        self.config = config
        self.stopping = False
        self.inbox: Inbox | None = None
        self._supervisor: Outbox | None = None
        self._last_beat = 0.0
        self._stats: dict[str, float] = {}
        self._loop_seen = time.monotonic()
        self._beating = threading.Event()
        self.max_loop_stall_s = config.loop_stall_timeout_s
        self._parent_pid = os.getppid()
        self.loop_timeout_s = 0.05
        # Reported per channel in every heartbeat: inboxes' queue depth, breakers' state.
        self.extra_inboxes: list[Inbox] = []
        self.breakers: list[CircuitBreaker] = []

    # -- to override ------------------------------------------------------------------------
    def setup(self) -> None:
        """Bind sockets and load; called before Ready. Must set self.inbox."""

    def handle(self, msgs: list[Message]) -> None:
        """Handle one drained batch of messages."""

    def tick(self) -> None:
        """Periodic work after each batch (also runs when nothing arrived)."""

    def stats(self) -> dict[str, float]:
        """Numbers reported in each heartbeat (and so in /metrics)."""
        return {}

    def ready_info(self) -> dict[str, Any]:
        return {}

    def teardown(self) -> None:
        """Release sockets, shared memory, devices."""

    def wait_timeout(self) -> float:
        """How long the loop may block waiting for messages this iteration."""
        return self.loop_timeout_s

    # -- machinery --------------------------------------------------------------------------
    def _on_signal(self, signum: int, frame: Any) -> None:
        log.info("%s: received signal %d, stopping", self.name, signum)
        self.stopping = True
        if self.inbox is not None:
            self.inbox.buffer.wake()

    def notify_supervisor(self, msg: Message) -> None:
        if self._supervisor is None:
            return
        try:
            self._supervisor.send(msg, timeout_ms=100)
        except SendTimeout:
            log.debug("%s: supervisor not reachable", self.name)

    def _heartbeat(self, box: Outbox, stats: dict[str, float]) -> None:
        self._last_beat = time.monotonic()
        try:
            box.send(Heartbeat(process=self.name, pid=os.getpid(), time=time.time(),
                               stats=stats), timeout_ms=100)
        except SendTimeout:
            log.debug("%s: supervisor not reachable", self.name)

    def _loop_came_round(self) -> None:
        """Called from the loop each iteration: note it, and send a heartbeat with fresh
        stats when one is due."""
        now = time.monotonic()
        self._loop_seen = now
        if os.getppid() != self._parent_pid:
            # The supervisor died without stopping us (kill -9): an orphan serves no one.
            log.error("%s: supervisor (pid %d) is gone; stopping", self.name, self._parent_pid)
            self.stopping = True
        if now - self._last_beat < self.config.heartbeat_interval_s:
            return
        stats = {"dropped_messages": float(self.inbox.dropped if self.inbox else 0),
                 "cpu_s": time.process_time()}  # the process's CPU so far (per-step figures)
        stats.update(self.stats())
        self._stats = stats
        assert self._supervisor is not None
        self._heartbeat(self._supervisor, stats)

    def channel_stats(self) -> dict[str, float]:
        """Messages waiting in each inbox (received, not yet taken by the loop) and the state
        of each circuit breaker (0 closed, 0.5 half-open, 1 open)."""
        out: dict[str, float] = {}
        seen: set[int] = set()
        for box in [self.inbox, *self.extra_inboxes]:
            if box is None or id(box.buffer) in seen:
                continue
            seen.add(id(box.buffer))
            out[labeled("queue_depth", channel=box.name)] = float(len(box.buffer))
        for breaker in self.breakers:
            out[labeled("breaker_state", channel=breaker.name)] = BREAKER_VALUE[breaker.state]
        return out

    def _beat(self) -> None:
        """Heartbeats for a loop busy in one long step (its own socket: zmq sockets are not
        shared between threads), with the stats the loop last sent."""
        box = Outbox(self.paths.supervisor, timeout_ms=100)
        interval = self.config.heartbeat_interval_s
        try:
            while not self._beating.wait(interval):
                now = time.monotonic()
                stall = now - self._loop_seen
                if stall > self.max_loop_stall_s:
                    log.error("%s: main loop stalled for %.0f s; heartbeats stop", self.name,
                              stall)
                    continue
                if now - self._last_beat >= 1.5 * interval:
                    self._heartbeat(box, dict(self._stats, loop_stall_s=stall))
        finally:
            box.close()

    def run(self) -> int:
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)
        self._supervisor = Outbox(self.paths.supervisor, timeout_ms=100)
        try:
            self.setup()
            self.notify_supervisor(Ready(process=self.name, pid=os.getpid(),
                                         info=self.ready_info()))
            log.info("%s ready", self.name)
            self._loop_came_round()
            threading.Thread(target=self._beat, name="heartbeat", daemon=True).start()
            while not self.stopping:
                msgs = self.inbox.drain(self.wait_timeout()) if self.inbox else []
                if any(isinstance(m, Shutdown) for m in msgs):
                    self.stopping = True
                if msgs:
                    self.handle([m for m in msgs if not isinstance(m, Shutdown)])
                self.tick()
                self._loop_came_round()
        finally:
            self._beating.set()
            try:
                self.teardown()
            finally:
                if self.inbox is not None:
                    self.inbox.close()
                self._supervisor.close()
        return 0


def process_main(cls: type[BusProcess], argv: list[str] | None = None,
                 extra_args: dict[str, Any] | None = None) -> int:
    """Common entry point: `python -m tessera.<proc> --run-dir DIR [--rank R]`."""
    parser = argparse.ArgumentParser(prog=f"tessera.{cls.name}")
    parser.add_argument("--run-dir", required=True)
    for flag, kwargs in (extra_args or {}).items():
        parser.add_argument(flag, **kwargs)
    args = parser.parse_args(argv)
    paths = RunPaths(run_dir=os.path.abspath(args.run_dir))
    config = load_config(paths)
    kwargs = {k: v for k, v in vars(args).items() if k != "run_dir"}
    proc = cls(paths, config, **kwargs)  # type: ignore[call-arg]
    setup_logging(config.log_level, proc.name, config.log_format)  # worker1, tokenizer0, ...
    return proc.run()
