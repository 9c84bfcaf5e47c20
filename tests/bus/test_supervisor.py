"""The supervisor with real processes: start order, failure, hang, SIGTERM, clean-up, status."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import zmq

from tessera.bus.channel import Inbox, Outbox
from tessera.bus.cleanup import pid_alive
from tessera.bus.messages import StatusReply, StatusRequest
from tessera.bus.run_paths import RunPaths

pytestmark = [pytest.mark.integration, pytest.mark.skipif(
    not os.path.isdir("/dev/shm"), reason="checks /dev/shm for leaked segments")]

HERE = Path(__file__).parent


class Run:
    """A supervisor process over dummy children, with its output collected as it comes.
    Every Run is stopped after its test, passed or failed (tests/bus/conftest.py)."""

    started: list[Run] = []

    def __init__(self, procs: list[list], **plan: float) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(HERE / "supervise_dummies.py"),
             json.dumps({"procs": procs, **plan})],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        Run.started.append(self)
        self.out: list[str] = []
        self.err: list[str] = []
        self.run_dir: str | None = None
        self._ready = threading.Event()
        self._readers = [threading.Thread(target=self._read, args=(s, b), daemon=True)
                         for s, b in ((self.proc.stdout, self.out), (self.proc.stderr, self.err))]
        for t in self._readers:
            t.start()

    def _read(self, stream, lines: list[str]) -> None:
        for line in stream:
            lines.append(line)
            if line.startswith("READY "):
                self.run_dir = line.split(" ", 1)[1].strip()
                self._ready.set()

    def wait_ready(self, timeout: float = 30.0) -> RunPaths:
        if not self._ready.wait(timeout):
            self.proc.kill()
            pytest.fail("supervisor never reported ready:\n" + "".join(self.err[-30:]))
        assert self.run_dir is not None
        return RunPaths(run_dir=self.run_dir)

    def wait_exit(self, timeout: float) -> int:
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            pytest.fail(f"supervisor still running after {timeout} s:\n" + "".join(self.err))
        for t in self._readers:
            t.join(timeout=2)
        return code

    @property
    def log(self) -> str:
        return "".join(self.err)


def status(paths: RunPaths, timeout: float = 5.0) -> StatusReply:
    inbox = Inbox(paths.client_endpoint(), name="test-status")
    out = Outbox(paths.supervisor)
    try:
        out.send(StatusRequest(reply_to=inbox.endpoint, nonce=7))
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for msg in inbox.drain(0.1):
                if isinstance(msg, StatusReply) and msg.nonce == 7:
                    return msg
        raise AssertionError("no StatusReply from the supervisor")
    finally:
        out.close()
        inbox.close()


def leftovers(paths: RunPaths) -> list[str]:
    shm = [n for n in os.listdir("/dev/shm") if n.startswith(paths.shm_name(""))]
    return shm + ([paths.run_dir] if os.path.exists(paths.run_dir) else [])


def assert_all_dead(pids: list[int], within: float = 0.5) -> None:
    deadline = time.monotonic() + within
    while any(pid_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not [p for p in pids if pid_alive(p)], "children outlived the supervisor"


def test_sigterm_stops_all_cleanly_and_leaves_nothing(run_root: Path) -> None:
    run = Run([["a", 0, ["--shm"]], ["b", 1, ["--leak-shm"]], ["server", 2, []]])
    paths = run.wait_ready()
    reply = status(paths)
    pids = [p["pid"] for p in reply.processes.values()]
    assert reply.ready and set(reply.processes) == {"a", "b", "server"}
    assert all(p["alive"] for p in reply.processes.values())
    assert sorted(n for n in os.listdir("/dev/shm") if n.startswith(paths.shm_name(""))) == \
        [paths.shm_name("a"), paths.shm_name("b")]
    run.proc.send_signal(signal.SIGTERM)
    assert run.wait_exit(timeout=10) == 0, run.log
    assert_all_dead(pids)
    # b "forgot" its segment; the supervisor removes it with the run directory and sockets.
    assert leftovers(paths) == []


@pytest.mark.parametrize("stop_signal", [signal.SIGINT, signal.SIGHUP])
def test_stages_start_in_order(run_root: Path, stop_signal: int) -> None:
    run = Run([["first", 0, []], ["second", 1, []], ["third", 1, []]])
    run.wait_ready()
    run.proc.send_signal(stop_signal)
    assert run.wait_exit(timeout=10) == 0, run.log
    log = run.log
    assert log.index("first ready") < log.index("starting second") < log.index("second ready")
    assert log.index("starting third") < log.index("second ready")  # same stage: together


def test_kill_9_of_a_child_stops_all_without_waiting_for_a_heartbeat(run_root: Path) -> None:
    run = Run([["a", 0, ["--shm"]], ["victim", 1, ["--shm"]], ["server", 2, []]])
    paths = run.wait_ready()
    pids = {name: p["pid"] for name, p in status(paths).processes.items()}
    killed_at = time.monotonic()
    os.kill(pids["victim"], signal.SIGKILL)
    code = run.wait_exit(timeout=9)
    elapsed = time.monotonic() - killed_at
    assert code != 0
    # The death itself is seen (about a second on an idle machine), not a heartbeat missing
    # for the dummies' 10 s timeout; the bound is loose for a busy machine.
    assert elapsed < 9.0, f"took {elapsed:.2f} s to stop after a child died"
    assert_all_dead(list(pids.values()))
    assert "process victim" in run.log and "killed by SIGKILL" in run.log
    assert leftovers(paths) == []  # the victim's segment included


def test_child_exiting_before_ready_is_named_with_code_and_stderr(run_root: Path) -> None:
    run = Run([["a", 0, []], ["broken", 1, ["--exit-before-ready", "3"]], ["never", 2, []]])
    code = run.wait_exit(timeout=30)
    assert code != 0
    log = run.log
    assert "process broken" in log and "before it was ready" in log and "exit code 3" in log
    assert "pretend the model file is missing" in log.split("exit code 3", 1)[1]
    assert "starting never" not in log
    assert list(run_root.iterdir()) == []


def test_hung_child_counts_as_dead(run_root: Path) -> None:
    run = Run([["a", 0, []], ["sleeper", 0, ["--hang-after", "0.3"]]], heartbeat_timeout_s=1.0)
    paths = run.wait_ready()
    code = run.wait_exit(timeout=10)
    assert code != 0
    assert "process sleeper" in run.log and "hung" in run.log
    assert leftovers(paths) == []


def test_malformed_messages_are_dropped_and_the_process_lives_on(run_root: Path) -> None:
    run = Run([["target", 0, []]])
    paths = run.wait_ready()
    sock = zmq.Context.instance().socket(zmq.PUSH)
    sock.setsockopt(zmq.LINGER, 1000)
    sock.connect(f"ipc://{paths.run_dir}/target.sock")
    garbage = [[b"\xc1 not msgpack"], [b"\x80"], [b"\x84\xa1t\xa4Nope\xa1v\x01\xa1f\x80\xa1a\x90"]]
    for frames in garbage:
        sock.send_multipart(frames)
    sock.close()
    deadline = time.monotonic() + 5
    stats: dict = {}
    while time.monotonic() < deadline:
        stats = status(paths).processes["target"]["stats"]
        if stats.get("dropped_messages") == len(garbage):
            break
        time.sleep(0.1)
    assert stats.get("dropped_messages") == len(garbage)
    assert status(paths).processes["target"]["alive"]
    assert "dropped a malformed message" in run.log
    run.proc.send_signal(signal.SIGTERM)
    assert run.wait_exit(timeout=10) == 0


def test_stale_run_of_a_crashed_supervisor_is_removed_before_start(run_root: Path) -> None:
    # Names of this test process's own: the shared-memory segment lives in /dev/shm, which
    # another test run on the machine shares.
    stale = RunPaths.create(str(run_root / f"tessera-run-crashed{os.getpid()}"))
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    Path(stale.pid_file).write_text(f"{dead.pid}\n")
    Path(stale.run_dir, "scheduler.sock").touch()
    segment = Path("/dev/shm", stale.shm_name("req_to_token"))
    segment.write_bytes(b"\0" * 64)
    live = RunPaths.create(str(run_root / f"tessera-run-alive{os.getpid()}"))
    Path(live.pid_file).write_text(f"{os.getpid()}\n")
    try:
        run = Run([["a", 0, []]])
        run.wait_ready()
        run.proc.send_signal(signal.SIGTERM)
        assert run.wait_exit(timeout=10) == 0
        assert not os.path.exists(stale.run_dir) and not segment.exists()
        assert os.path.exists(live.pid_file)  # a live run is left alone
        assert "removed stale run" in run.log
    finally:
        segment.unlink(missing_ok=True)


def test_server_drains_first_while_status_is_still_answered(run_root: Path) -> None:
    run = Run([["engine", 0, []], ["server", 1, ["--slow-stop", "1.5"]]])
    paths = run.wait_ready()
    run.proc.send_signal(signal.SIGTERM)
    time.sleep(0.5)  # the server is in its 1.5 s teardown ("draining")
    reply = status(paths)
    assert not reply.ready  # stopping: /health must say so
    assert reply.processes["engine"]["alive"]  # stopped only after the server is done
    assert run.wait_exit(timeout=10) == 0, run.log
    assert run.log.index("stopping server") < run.log.index("engine: received signal")
    assert leftovers(paths) == []


def test_children_stop_when_the_supervisor_is_killed_and_the_next_start_cleans_up(
        run_root: Path) -> None:
    run = Run([["a", 0, ["--leak-shm"]], ["b", 0, []]])
    paths = run.wait_ready()
    pids = [p["pid"] for p in status(paths).processes.values()]
    run.proc.kill()
    run.wait_exit(timeout=5)
    assert_all_dead(pids, within=5.0)  # orphans notice their parent is gone
    assert paths.shm_name("a") in leftovers(paths)  # a crash leaves the run behind...
    again = Run([["c", 0, []]])
    again.wait_ready()
    assert leftovers(paths) == []  # ...until the next start removes it
    assert f"removed stale run {paths.run_dir}" in again.log
    again.proc.send_signal(signal.SIGTERM)
    assert again.wait_exit(timeout=10) == 0


def test_a_second_signal_kills_at_once_instead_of_waiting_for_the_drain(run_root: Path) -> None:
    run = Run([["engine", 0, []], ["server", 1, ["--slow-stop", "30"]]], drain_timeout_s=30)
    paths = run.wait_ready()
    pids = [p["pid"] for p in status(paths).processes.values()]
    run.proc.send_signal(signal.SIGINT)
    time.sleep(0.5)
    second = time.monotonic()
    run.proc.send_signal(signal.SIGINT)
    run.wait_exit(timeout=15)
    assert time.monotonic() - second < 15.0  # not the 30 s drain (loose: a busy machine)
    assert "second signal" in run.log
    assert_all_dead(pids)
    assert leftovers(paths) == []
