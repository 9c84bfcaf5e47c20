"""The supervisor: starts the engine's processes in order, watches them, stops them all.

    for each stage (workers, scheduler, detokenizer, tokenizers, server):
        start every process of the stage, wait for each one's Ready
    watch: a child that exits, or falls silent for heartbeat_timeout_s after Ready, is a failure
        with a RestartPolicy: its group is killed and started again after a back-off, stage by
            stage (restarts.py); too many failures in the window -> as without one
        without: SIGTERM to all, SIGKILL after a short grace, exit 1, naming the child and its
            exit code
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
from tessera.bus.restarts import RestartBook, RestartPolicy
from tessera.bus.run_paths import RunPaths
from tessera.bus.startup import ProcessTimes, StartupReport, startup_report
from tessera.codes import DIED_AT_START, FIRST_REQUEST_HANGS, PROCESS_HUNG, coded

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
    group: str = ""  # processes restarted together (restarts.py); "" is the name alone
    # Files a previous run of the stage leaves behind that a new start must not find (the
    # rendezvous file of tensor-parallel ranks): removed before the stage is started again.
    stale_files: tuple[str, ...] = ()

    @property
    def restart_group(self) -> str:
        return self.group or self.name

    @classmethod
    def python_module(cls, name: str, module: str, paths: RunPaths, *args: str, stage: int,
                      ready_timeout_s: float = 120.0, drains: bool = False,
                      group: str = "", stale_files: tuple[str, ...] = ()) -> ProcessSpec:
        argv = (sys.executable, "-m", module, "--run-dir", paths.run_dir, *args)
        return cls(name, argv, stage, ready_timeout_s, drains, group, stale_files)


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
    restarting: bool = False  # killed on purpose, waiting to be started again
    restarts: int = 0
    spawned_wall: float = field(default_factory=time.time)  # for the start-up report
    ready_wall: float | None = None

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


@dataclass
class Restart:
    """A group being restarted: started again stage by stage once `due`."""

    group: str
    members: list[Child]
    due: float
    stages: list[int]
    current: list[Child] = field(default_factory=list)


class Supervisor:
    def __init__(self, paths: RunPaths, specs: Sequence[ProcessSpec], *,
                 heartbeat_timeout_s: float = 5.0, drain_timeout_s: float = 10.0,
                 stop_grace_s: float = 3.0, failure_grace_s: float = 1.0,
                 on_ready: Callable[[list[Child]], None] | None = None,
                 restart: RestartPolicy | None = None,
                 launched_at: float | None = None) -> None:
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
        self.restart_policy = restart
        self.book = RestartBook(restart) if restart is not None else None
        self.children: dict[str, Child] = {}
        self.failure: str | None = None  # why the run ended badly, for the caller
        self._restarts: dict[str, Restart] = {}
        self._stop_signal: int | None = None
        self._all_ready = False
        # Wall-clock start of `tessera serve`, and the start-up report once all are ready.
        self.launched_at = launched_at if launched_at is not None else time.time()
        self.startup: StartupReport | None = None

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
            for child, problem in self._failures(current):
                if child.restarting:
                    continue  # its group is being restarted already (a sibling failed too)
                fatal = self._recover(child, problem)
                if fatal is not None:
                    self.failure = fatal
                    log.error("%s", fatal)
                    log.error("stopping every process after that failure")
                    return 1
            if self._advance_restarts():
                return 1
            if all(c.ready_at is not None for c in current) and not self._restarts:
                if stages:
                    current = self._start_stage(stages.pop(0))
                    if self.failure:
                        log.error("%s", self.failure)
                        return 1
                elif not self._all_ready:
                    self._all_ready = True
                    self.startup = self._startup_report()
                    log.info("all %d processes ready; %s", len(self.children),
                             self.startup.line())
                    if self.on_ready is not None:
                        try:
                            self.on_ready(list(self.children.values()))
                        except Exception:  # a closed stdout must not stop a working engine
                            log.exception("the on-ready callback failed")

    def _start(self, spec: ProcessSpec) -> Child | None:
        log.info("starting %s: %s", spec.name, " ".join(spec.argv[1:]))
        try:
            popen = subprocess.Popen(spec.argv, stdin=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, process_group=0)
        except OSError as exc:
            self.failure = f"could not start {spec.name} ({spec.argv[0]}): {exc}"
            return None
        child = Child(spec, popen, started_at=time.monotonic())
        old = self.children.get(spec.name)
        if old is not None:
            child.restarts = old.restarts + 1
        assert popen.stderr is not None
        child.reader = threading.Thread(target=_forward_stderr,
                                        args=(popen.stderr, child.stderr_tail),
                                        name=f"stderr-{spec.name}", daemon=True)
        child.reader.start()
        self.children[spec.name] = child
        return child

    def _start_stage(self, stage: int) -> list[Child]:
        started: list[Child] = []
        for spec in (s for s in self.specs if s.stage == stage):
            child = self._start(spec)
            if child is None:
                return started
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
            if msg.pid != child.popen.pid:
                return  # the last words of a process since replaced
            child.last_seen = now
            if isinstance(msg, Ready):
                if child.ready_at is None:
                    child.ready_at = now
                    child.ready_wall = time.time()
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
                processes[spec.name] = {"alive": False, "pid": 0, "age_s": -1.0, "stats": {},
                                        "restarts": 0}
                continue
            seen = child.last_seen or child.started_at
            processes[spec.name] = {
                "alive": child.alive and not child.restarting, "pid": child.popen.pid,
                "age_s": round(now - seen, 3), "ready": child.ready_at is not None,
                "stats": child.stats, "restarts": child.restarts, "info": child.info,
            }
        ready = self._all_ready and self._stop_signal is None and not self._restarts and \
            all(p["alive"] and p["ready"] for p in processes.values())
        return StatusReply(nonce=nonce, processes=processes, ready=ready,
                           startup=self.startup.to_dict() if self.startup else {})

    def _startup_report(self) -> StartupReport:
        return startup_report(self.launched_at, [
            ProcessTimes(c.spec.name, c.spec.stage, c.spawned_wall, c.ready_wall or time.time(),
                         c.info) for c in self.children.values()])

    def _failures(self, starting: list[Child]) -> list[tuple[Child, str]]:
        """Children that exited, hung, or are too slow to be ready, each with the reason."""
        now = time.monotonic()
        found: list[tuple[Child, str]] = []
        restarting = [c for r in self._restarts.values() for c in r.current]
        for child in self.children.values():
            if child.restarting:
                continue  # killed on purpose; started again by _advance_restarts
            code = child.popen.poll()
            if code is not None:
                where = "" if child.ready_at is not None else " before it was ready"
                msg = (f"process {child.spec.name} (pid {child.popen.pid}) ended{where}: "
                       f"{describe_exit(code)}"
                       + ("" if child.ready_at is not None else coded(DIED_AT_START)))
                tail = self._tail(child)
                found.append((child, f"{msg}; last lines of its stderr:\n{tail}" if tail
                              else msg))
            elif child.ready_at is not None and \
                    now - child.last_seen > self.heartbeat_timeout_s:
                found.append((child, f"process {child.spec.name} (pid {child.popen.pid}) sent "
                              f"no heartbeat for {now - child.last_seen:.1f} s (limit "
                              f"{self.heartbeat_timeout_s} s): it is hung"
                              + coded(PROCESS_HUNG)))
            elif (child in starting or child in restarting) and child.ready_at is None and \
                    now - child.started_at > child.spec.ready_timeout_s:
                found.append((child, f"process {child.spec.name} (pid {child.popen.pid}) was "
                              f"not ready after {child.spec.ready_timeout_s:.0f} s"
                              + coded(FIRST_REQUEST_HANGS)))
        return found

    # -- restarts ---------------------------------------------------------------------------
    def _recover(self, child: Child, problem: str) -> str | None:
        """Restart the failed child's group after a back-off (None); or why everything must
        stop instead: no restart policy, a crash loop, or a failure during start-up."""
        if self.book is None or self.restart_policy is None:
            return problem
        if not self._all_ready and not any(child in r.current for r in self._restarts.values()):
            return problem  # a start-up failure: restarting would only hide it
        group = child.spec.restart_group
        now = time.monotonic()
        delay = self.book.record(group, now)
        policy = self.restart_policy
        if delay is None:
            return (f"{problem}\ncrash loop: {group} failed {policy.max_restarts + 1} times "
                    f"within {policy.window_s:.0f} s (--restart-max, --restart-window-s); "
                    f"giving up")
        members = [c for c in self.children.values() if c.spec.restart_group == group]
        for member in members:
            member.restarting = True
            member.ready_at = None
            if member.alive:
                self._kill_group(member)
        names = ", ".join(m.spec.name for m in members)
        log.error("%s", problem)
        log.warning("restarting %s in %.1f s (restart %d of at most %d within %.0f s)", names,
                    delay, self.book.recent(group, now), policy.max_restarts, policy.window_s)
        self._restarts[group] = Restart(group, members, now + delay,
                                        sorted({m.spec.stage for m in members}))
        return None

    @staticmethod
    def _kill_group(child: Child) -> None:
        """SIGKILL the child and whatever it started (it leads its own process group)."""
        try:
            os.killpg(child.popen.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            Supervisor._signal(child, signal.SIGKILL)

    def _advance_restarts(self) -> bool:
        """Start restarting groups stage by stage; True if a process could not be started."""
        now = time.monotonic()
        for group, restart in list(self._restarts.items()):
            if now < restart.due or any(m.alive for m in restart.members if m.restarting):
                continue
            if restart.current and not all(c.ready_at is not None for c in restart.current):
                continue
            if not restart.stages:
                del self._restarts[group]
                log.info("%s restarted: every process is ready again", group)
                continue
            stage = restart.stages.pop(0)
            restart.current = []
            in_stage = [m for m in restart.members if m.spec.stage == stage]
            for path in {p for m in in_stage for p in m.spec.stale_files}:
                try:
                    os.unlink(path)
                except FileNotFoundError:
                    pass
            for member in restart.members:
                if member.spec.stage != stage:
                    continue
                member.popen.wait()  # reap it; its pipe readers end with it
                child = self._start(member.spec)
                if child is None:
                    log.error("%s", self.failure)
                    return True
                restart.current.append(child)
            restart.members = [self.children[m.spec.name] if m.spec.stage == stage else m
                               for m in restart.members]
            self._record_pids()
        return False

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
