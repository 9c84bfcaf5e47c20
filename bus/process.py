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

`AsyncBusProcess` is the same life cycle for a process built on asyncio (the HTTP server):
setup (raced with a stop request) -> Ready -> serve until stopped -> teardown, heartbeats from
a task, the same orphan check. `Lifeline` is what both owe the supervisor.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import threading
import time
from typing import Any

from tessera.bus import gc_pauses, trace
from tessera.bus.breaker import CircuitBreaker
from tessera.bus.channel import DEFAULT_HWM, Inbox, Outbox, SendTimeout
from tessera.bus.liveness import Liveness
from tessera.bus.logs import setup_logging
from tessera.bus.messages import Heartbeat, Message, Ready, Shutdown
from tessera.bus.run_paths import RunPaths
from tessera.bus.stats import BREAKER_VALUE, labeled
from tessera.config import EngineConfig, ServerConfig

log = logging.getLogger(__name__)


def load_config(paths: RunPaths) -> ServerConfig:
    with open(paths.config_file) as f:
        return ServerConfig.from_json(f.read())


class Lifeline:
    """What an engine process owes the supervisor: Ready once, heartbeats, and noticing that
    the supervisor is gone. Sends never wait longer than `timeout_ms`: a supervisor that does
    not read costs a debug line, never a stuck process."""

    def __init__(self, name: str, paths: RunPaths, timeout_ms: int = 100,
                 hwm: int = DEFAULT_HWM) -> None:
        self.name = name
        self.timeout_ms = timeout_ms
        self.box = Outbox(paths.supervisor, timeout_ms=timeout_ms, hwm=hwm)
        self.parent_pid = os.getppid()

    @property
    def supervisor_alive(self) -> bool:
        return os.getppid() == self.parent_pid

    def orphaned(self) -> bool:
        """The supervisor died without stopping us (kill -9): an orphan serves no one."""
        if self.supervisor_alive:
            return False
        log.error("%s: supervisor (pid %d) is gone; stopping", self.name, self.parent_pid)
        return True

    def send(self, msg: Message) -> None:
        try:
            self.box.send(msg, timeout_ms=self.timeout_ms)
        except SendTimeout:
            log.debug("%s: supervisor not reachable", self.name)

    def ready(self, info: dict[str, Any]) -> None:
        self.send(Ready(process=self.name, pid=os.getpid(), info=info))

    def beat(self, stats: dict[str, float]) -> None:
        self.send(Heartbeat(process=self.name, pid=os.getpid(), time=time.time(), stats=stats))

    def close(self) -> None:
        self.box.close()


class BusProcess:
    name = "process"

    def __init__(self, paths: RunPaths, config: EngineConfig) -> None:
        self.paths = paths
        self.config = config
        self.stopping = False
        self.inbox: Inbox | None = None
        self._supervisor: Lifeline | None = None
        self._last_beat = 0.0
        self._stats: dict[str, float] = {}
        self._loop_seen = time.monotonic()
        self._beating = threading.Event()
        self.max_loop_stall_s = config.loop_stall_timeout_s
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

    @property
    def supervisor_alive(self) -> bool:
        """False once the supervisor died without stopping this process (crash, kill -9)."""
        return self._supervisor is None or self._supervisor.supervisor_alive

    def notify_supervisor(self, msg: Message) -> None:
        if self._supervisor is not None:
            self._supervisor.send(msg)

    def _heartbeat(self, lifeline: Lifeline, stats: dict[str, float]) -> None:
        self._last_beat = time.monotonic()
        lifeline.beat(stats)

    def _loop_came_round(self) -> None:
        """Called from the loop each iteration: note it, and send a heartbeat with fresh
        stats when one is due."""
        now = time.monotonic()
        self._loop_seen = now
        assert self._supervisor is not None
        if self._supervisor.orphaned():
            self.stopping = True
        if now - self._last_beat < self.config.heartbeat_interval_s:
            return
        stats = {"dropped_messages": float(self.inbox.dropped if self.inbox else 0),
                 "cpu_s": time.process_time()}  # the process's CPU so far (per-step figures)
        stats.update(self.stats())
        stats.update(gc_pauses.stats())
        self._stats = stats
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
        box = Lifeline(self.name, self.paths)
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
        self._supervisor = Lifeline(self.name, self.paths)
        gc_pauses.install()
        try:
            self.setup()
            if self.config.gc_freeze:
                gc_pauses.freeze()
            self._supervisor.ready(self.ready_info())
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


class StartupError(RuntimeError):
    """The process cannot become ready; AsyncBusProcess.run logs it and exits 1."""


class AsyncBusProcess:
    """The life cycle of BusProcess for a process built on asyncio: `setup()` (raced with a
    stop request: a stop during a long warm-up exits 0 at once) -> Ready -> `serve()` until
    `stop` is set -> `teardown()`. Heartbeats come from a task every heartbeat_interval_s
    with `stats()`, and from a thread while a handler holds the loop (`bus/liveness.py`);
    SIGTERM / SIGINT and a vanished supervisor set `stop`."""

    name = "process"

    def __init__(self, paths: RunPaths, config: EngineConfig) -> None:
        self.paths = paths
        self.config = config
        self.stop = asyncio.Event()
        # Never wait on the supervisor's socket from the event loop.
        self.lifeline = Lifeline(self.name, paths, timeout_ms=0, hwm=64)
        self.liveness = Liveness(paths.supervisor, self.name, config.heartbeat_interval_s,
                                 config.loop_stall_timeout_s)

    # -- to override ------------------------------------------------------------------------
    async def setup(self) -> None:
        """Bind and warm up; raise StartupError when the process cannot serve."""

    async def serve(self) -> None:
        """Serve until `stop` is set (and finish what stopping needs, such as a drain)."""
        await self.stop.wait()

    async def teardown(self) -> None:
        """Release what setup made; runs however run() ends."""

    def stats(self) -> dict[str, float]:
        return {}

    def ready_info(self) -> dict[str, Any]:
        return {}

    # -- machinery --------------------------------------------------------------------------
    async def _heartbeats(self) -> None:
        while True:
            if not self.stop.is_set() and self.lifeline.orphaned():
                self.stop.set()
            self.liveness.beat_from_loop(self.lifeline.send,
                                         {**self.stats(), **gc_pauses.stats()})
            await asyncio.sleep(self.config.heartbeat_interval_s)

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stop.set)
        gc_pauses.install()
        beat = asyncio.create_task(self._heartbeats())
        self.liveness.start()
        try:
            setup = asyncio.create_task(self.setup())
            stopping = asyncio.create_task(self.stop.wait())
            await asyncio.wait({setup, stopping}, return_when=asyncio.FIRST_COMPLETED)
            stopping.cancel()
            if not setup.done():
                setup.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await setup
                return 0
            try:
                setup.result()
            except StartupError as exc:
                log.error("%s: %s", self.name, exc)
                return 1
            if self.config.gc_freeze:
                gc_pauses.freeze()
            self.lifeline.ready(self.ready_info())
            log.info("%s ready", self.name)
            await self.serve()
            return 0
        finally:
            beat.cancel()
            self.liveness.stop()
            try:
                await self.teardown()
            finally:
                self.lifeline.close()


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
    trace.start(config.trace_messages_dir, proc.name)
    return proc.run()
