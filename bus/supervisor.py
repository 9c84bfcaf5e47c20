"""The supervisor: starts the engine's processes in order, watches them, stops them all.

    for each stage (workers, scheduler, detokenizer, tokenizers, server):
        start every process of the stage, wait for each one's Ready
    watch: a child that exits, or falls silent for heartbeat_timeout_s after Ready, is a failure
        -> SIGTERM to all, SIGKILL after a short grace, exit 1, naming the child and its exit code
    SIGTERM / SIGINT -> stop the draining processes first (the HTTP server finishes in-flight
        requests), then the rest in reverse start order; exit 0
    answer StatusRequest with a StatusReply (the server's /health and /metrics)

Children run in their own process groups, so a Ctrl-C at the terminal reaches only the
supervisor, which then stops them in order. Their stderr passes through a pipe so that the last
lines of a child that dies can be quoted in the failure message.
"""

from __future__ import annotations

import codecs
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import IO, Any

from tessera.bus.channel import Inbox, OutboxPool, SendTimeout
from tessera.bus.cleanup import CHILDREN_FILE
from tessera.bus.messages import Heartbeat, Message, Ready, StatusReply, StatusRequest
from tessera.bus.run_paths import RunPaths

log = logging.getLogger(__name__)

STDERR_TAIL_LINES = 20
_LOOP_S = 0.05


@dataclass(frozen=True)
class ProcessSpec:
    """One child process. Specs of the same `stage` start together (TP ranks must, to meet in
    their collective set-up); a stage starts when every process of the stages before is Ready."""

    name: str  # the name its Ready / Heartbeat messages carry
    argv: tuple[str, ...]
    stage: int
    ready_timeout_s: float = 120.0
    drains: bool = False  # stopped first on a clean shutdown, given drain_timeout_s

    @classmethod
    def python_module(cls, name: str, module: str, paths: RunPaths, *args: str, stage: int,
                      ready_timeout_s: float = 120.0, drains: bool = False) -> ProcessSpec:
        argv = (sys.executable, "-m", module, "--run-dir", paths.run_dir, *args)
        return cls(name, argv, stage, ready_timeout_s, drains)


@dataclass
class Child:
    spec: ProcessSpec
    popen: subprocess.Popen[bytes]
    started_at: float
    ready_at: float | None = None
    last_seen: float = 0.0
    stats: dict[str, float] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)
    stderr_tail: deque[str] = field(default_factory=lambda: deque(maxlen=STDERR_TAIL_LINES))
    reader: threading.Thread | None = None

    @property
    def alive(self) -> bool:
        return self.popen.poll() is None


def describe_exit(code: int | None) -> str:
    if code is None:
        return "still running"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def _forward_stderr(pipe: IO[bytes], tail: deque[str]) -> None:
    """Copy a child's stderr to ours as it comes (progress bars included), keeping its last
    lines for a failure message."""
    out = sys.stderr.buffer if hasattr(sys.stderr, "buffer") else None
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    pending = ""
    fd = pipe.fileno()
    while chunk := os.read(fd, 65536):
        if out is not None:
            try:
                out.write(chunk)
                out.flush()
            except (OSError, ValueError):
                out = None  # our stderr is gone; keep draining so the child never blocks
        *lines, pending = re.split(r"[\r\n]", pending + decoder.decode(chunk))
        tail.extend(line for line in lines if line.strip())
        pending = pending[-4096:]
    if pending.strip():
        tail.append(pending)
    pipe.close()


class Supervisor:
    def __init__(self, paths: RunPaths, specs: Sequence[ProcessSpec], *,
                 heartbeat_timeout_s: float = 5.0, drain_timeout_s: float = 10.0,
                 stop_grace_s: float = 3.0, failure_grace_s: float = 1.0,
                 on_ready: Callable[[list[Child]], None] | None = None) -> None:
        names = [s.name for s in specs]
        if len(set(names)) != len(names):
            raise ValueError(f"process names must be unique, got {names}")
        self.paths = paths
        self.specs = sorted(specs, key=lambda s: s.stage)  # stable: keeps order within a stage
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self.drain_timeout_s = drain_timeout_s
        self.stop_grace_s = stop_grace_s
        self.failure_grace_s = failure_grace_s
        self.on_ready = on_ready
        self.children: dict[str, Child] = {}
        self.failure: str | None = None  # why the run ended badly, for the caller
        self._stop_signal: int | None = None
        self._all_ready = False

    # -- signals --------------------------------------------------------------------------
    def request_stop(self, signum: int = signal.SIGTERM, frame: Any = None) -> None:
        if self._stop_signal is None:
            self._stop_signal = signum
        else:
            # A second Ctrl-C: the user will not wait for a drain.
            log.warning("second signal: killing every process now")
            self._kill_all(signal.SIGKILL)

    # -- running ----------------------------------------------------------------------------
    def run(self) -> int:
        """Start, watch and stop every process; the exit code for `tessera serve`."""
        in_main = threading.current_thread() is threading.main_thread()
        previous = {}
        if in_main:
            # SIGHUP too: a closed terminal should stop the engine in order, not orphan it.
            for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
                previous[sig] = signal.signal(sig, self.request_stop)
        inbox = Inbox(self.paths.supervisor, name="supervisor")
        replies = OutboxPool(timeout_ms=100)
        graceful = False

        def keep_answering() -> None:
            # While the server drains, its /health still asks us for the status.
            for msg in inbox.drain(0.0):
                self._handle(msg, replies)

        try:
            code = self._watch(inbox, replies)
            graceful = code == 0
            return code
        finally:
            self.stop_all(graceful=graceful, pump=keep_answering)
            inbox.close()
            replies.close()
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _watch(self, inbox: Inbox, replies: OutboxPool) -> int:
        stages = sorted({s.stage for s in self.specs})
        current: list[Child] = []
        while True:
            if self._stop_signal is not None:
                log.info("received %s: stopping every process",
                         signal.Signals(self._stop_signal).name)
                return 0
            for msg in inbox.drain(_LOOP_S):
                self._handle(msg, replies)
            problem = self._check(current)
            if problem is not None:
                self.failure = problem
                log.error("%s", problem)
                log.error("stopping every process after that failure")
                return 1
            if all(c.ready_at is not None for c in current):
                if stages:
                    current = self._start_stage(stages.pop(0))
                    if self.failure:
                        log.error("%s", self.failure)
                        return 1
                elif not self._all_ready:
                    self._all_ready = True
                    log.info("all %d processes ready", len(self.children))
                    if self.on_ready is not None:
                        try:
                            self.on_ready(list(self.children.values()))
                        except Exception:  # a closed stdout must not stop a working engine
                            log.exception("the on-ready callback failed")

    def _start_stage(self, stage: int) -> list[Child]:
        started: list[Child] = []
        for spec in (s for s in self.specs if s.stage == stage):
            log.info("starting %s: %s", spec.name, " ".join(spec.argv[1:]))
            try:
                popen = subprocess.Popen(spec.argv, stdin=subprocess.DEVNULL,
                                         stderr=subprocess.PIPE, process_group=0)
            except OSError as exc:
                self.failure = f"could not start {spec.name} ({spec.argv[0]}): {exc}"
                return started
            child = Child(spec, popen, started_at=time.monotonic())
            assert popen.stderr is not None
            child.reader = threading.Thread(target=_forward_stderr,
                                            args=(popen.stderr, child.stderr_tail),
                                            name=f"stderr-{spec.name}", daemon=True)
            child.reader.start()
            self.children[spec.name] = child
            started.append(child)
        self._record_pids()
        return started

    def _record_pids(self) -> None:
        """Let a later start find (and kill) children that outlive a SIGKILLed supervisor."""
        path = os.path.join(self.paths.run_dir, CHILDREN_FILE)
        try:
            with open(path, "w") as f:
                f.writelines(f"{c.popen.pid}\n" for c in self.children.values())
        except OSError as exc:
            log.warning("could not record child pids in %s: %s", path, exc)

    def _handle(self, msg: Message, replies: OutboxPool) -> None:
        now = time.monotonic()
        if isinstance(msg, Ready | Heartbeat):
            child = self.children.get(msg.process)
            if child is None:
                log.warning("%s from unknown process %r (pid %d) ignored",
                            msg.TYPE, msg.process, msg.pid)
                return
            child.last_seen = now
            if isinstance(msg, Ready):
                if child.ready_at is None:
                    child.ready_at = now
                    child.info = dict(msg.info)
                    log.info("%s ready after %.1f s", msg.process, now - child.started_at)
            else:
                child.stats = dict(msg.stats)
        elif isinstance(msg, StatusRequest):
            try:
                replies.send(msg.reply_to, self.status(msg.nonce))
            except SendTimeout:
                replies.forget(msg.reply_to)
                log.debug("status requester at %s is gone", msg.reply_to)
        else:
            log.warning("supervisor ignores %s", msg.TYPE)

    def status(self, nonce: int = 0) -> StatusReply:
        now = time.monotonic()
        processes: dict[str, dict[str, Any]] = {}
        for spec in self.specs:
            child = self.children.get(spec.name)
            if child is None:
                processes[spec.name] = {"alive": False, "pid": 0, "age_s": -1.0, "stats": {}}
                continue
            seen = child.last_seen or child.started_at
            processes[spec.name] = {
                "alive": child.alive, "pid": child.popen.pid, "age_s": round(now - seen, 3),
                "ready": child.ready_at is not None, "stats": child.stats,
                "info": child.info,
            }
        ready = self._all_ready and self._stop_signal is None and \
            all(p["alive"] for p in processes.values())
        return StatusReply(nonce=nonce, processes=processes, ready=ready)

    def _check(self, starting: list[Child]) -> str | None:
        """What went wrong, if anything: a child exited, hung, or is too slow to be ready."""
        now = time.monotonic()
        for child in self.children.values():
            code = child.popen.poll()
            if code is not None:
                where = "" if child.ready_at is not None else " before it was ready"
                msg = (f"process {child.spec.name} (pid {child.popen.pid}) ended{where}: "
                       f"{describe_exit(code)}")
                tail = self._tail(child)
                return f"{msg}; last lines of its stderr:\n{tail}" if tail else msg
            if child.ready_at is not None and \
                    now - child.last_seen > self.heartbeat_timeout_s:
                return (f"process {child.spec.name} (pid {child.popen.pid}) sent no heartbeat "
                        f"for {now - child.last_seen:.1f} s (limit {self.heartbeat_timeout_s} "
                        "s): it is hung")
        for child in starting:
            if child.ready_at is None and now - child.started_at > child.spec.ready_timeout_s:
                return (f"process {child.spec.name} (pid {child.popen.pid}) was not ready "
                        f"after {child.spec.ready_timeout_s:.0f} s")
        return None

    @staticmethod
    def _tail(child: Child) -> str:
        if child.reader is not None:
            child.reader.join(timeout=0.5)  # the pipe closes when the child is gone
        return "\n".join("    " + line for line in child.stderr_tail)

    # -- stopping ---------------------------------------------------------------------------
    def _kill_all(self, sig: int) -> None:
        for child in reversed(list(self.children.values())):
            self._signal(child, sig)

    @staticmethod
    def _signal(child: Child, sig: int) -> None:
        if child.alive:
            try:
                child.popen.send_signal(sig)
            except ProcessLookupError:
                pass

    def _wait(self, children: list[Child], timeout: float,
              pump: Callable[[], None] | None = None) -> list[Child]:
        """Wait up to `timeout` for children to exit; return those still alive."""
        deadline = time.monotonic() + timeout
        alive = [c for c in children if c.alive]
        while alive and time.monotonic() < deadline:
            time.sleep(0.02)
            if pump is not None:
                pump()
            alive = [c for c in alive if c.alive]
        return alive

    def stop_all(self, graceful: bool, pump: Callable[[], None] | None = None) -> None:
        """Stop every child: SIGTERM, wait, SIGKILL. Graceful: drainers first, in full."""
        order = list(reversed(self.children.values()))
        if graceful:
            drainers = [c for c in order if c.spec.drains and c.alive]
            for child in drainers:
                log.info("stopping %s (draining up to %.0f s)", child.spec.name,
                         self.drain_timeout_s)
                self._signal(child, signal.SIGTERM)
            self._wait(drainers, self.drain_timeout_s + self.stop_grace_s, pump)
        for child in order:
            self._signal(child, signal.SIGTERM)
        stragglers = self._wait(order, self.stop_grace_s if graceful else self.failure_grace_s)
        for child in stragglers:
            log.warning("%s (pid %d) did not stop on SIGTERM: killing it", child.spec.name,
                        child.popen.pid)
            self._signal(child, signal.SIGKILL)
        for child in order:
            try:
                child.popen.wait(timeout=2.0)
            except subprocess.TimeoutExpired:
                log.error("%s (pid %d) survived SIGKILL", child.spec.name, child.popen.pid)
            if child.reader is not None:
                child.reader.join(timeout=0.5)
            if graceful and child.popen.returncode not in (0, None, -signal.SIGTERM):
                log.warning("%s ended with %s", child.spec.name,
                            describe_exit(child.popen.returncode))
