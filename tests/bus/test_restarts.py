"""The restart policy: a dead or hung process is started again (with its group), the engine is
ready again without the operator, and a crash loop backs off and stops with a clear line."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from tessera.bus.messages import StatusReply
from tessera.bus.restarts import RestartBook, RestartPolicy
from tessera.bus.run_paths import RunPaths
from tests.bus.test_supervisor import Run, leftovers, status

RESTART = {"restart_policy": "on", "restart_backoff_s": 0.2}


def test_backoff_doubles_and_a_crash_loop_gives_up() -> None:
    book = RestartBook(RestartPolicy(max_restarts=3, window_s=10.0, backoff_s=0.5,
                                     max_backoff_s=1.5))
    assert [book.record("core", t) for t in (0.0, 1.0, 2.0)] == [0.5, 1.0, 1.5]
    assert book.record("core", 3.0) is None  # a fourth failure within 10 s
    assert book.record("tokenizer0", 3.0) == 0.5  # groups count apart
    assert book.record("core", 10.5) == 1.5  # the failure at 0.0 left the window
    assert book.total == {"core": 4, "tokenizer0": 1}


def wait_status(paths: RunPaths, predicate, timeout: float = 20.0) -> StatusReply:  # noqa: ANN001
    deadline = time.monotonic() + timeout
    while True:
        reply = status(paths)
        if predicate(reply) or time.monotonic() > deadline:
            return reply
        time.sleep(0.1)


def pids(reply: StatusReply) -> dict[str, int]:
    return {name: info["pid"] for name, info in reply.processes.items()}


def test_a_killed_process_is_restarted_alone_and_the_engine_is_ready_again(
        run_root: Path) -> None:
    run = Run([["a", 0, []], ["victim", 1, []], ["server", 2, []]], **RESTART)
    paths = run.wait_ready()
    before = pids(status(paths))
    os.kill(before["victim"], signal.SIGKILL)
    reply = wait_status(paths, lambda r: r.ready and pids(r)["victim"] != before["victim"])
    assert reply.ready, run.log
    after = pids(reply)
    assert after["a"] == before["a"] and after["server"] == before["server"]
    assert reply.processes["victim"]["restarts"] == 1
    assert "restarting victim in 0.2 s" in run.log and "victim restarted" in run.log
    run.proc.send_signal(signal.SIGTERM)
    assert run.wait_exit(timeout=10) == 0, run.log
    assert leftovers(paths) == []


def test_a_group_restarts_together_in_stage_order(run_root: Path) -> None:
    run = Run([["w0", 0, []], ["w1", 0, []], ["sched", 1, []], ["front", 2, []]],
              groups={"w0": "core", "w1": "core", "sched": "core"}, **RESTART)
    paths = run.wait_ready()
    before = pids(status(paths))
    os.kill(before["sched"], signal.SIGKILL)
    reply = wait_status(paths, lambda r: r.ready and pids(r)["sched"] != before["sched"])
    assert reply.ready, run.log
    after = pids(reply)
    assert after["w0"] != before["w0"] and after["w1"] != before["w1"]  # weights reloaded
    assert after["front"] == before["front"]
    log = run.log.split("restarting", 1)[1]
    assert log.index("starting w0") < log.index("w0 ready") < log.index("starting sched")
    run.proc.send_signal(signal.SIGTERM)
    assert run.wait_exit(timeout=10) == 0, run.log


def test_a_hung_process_is_killed_and_restarted_then_a_crash_loop_stops(run_root: Path) -> None:
    run = Run([["a", 0, []], ["sleeper", 1, ["--hang-after", "0.3"]]], heartbeat_timeout_s=1.0,
              restart_max=2, **RESTART)
    paths = run.wait_ready()
    code = run.wait_exit(timeout=30)
    assert code == 1
    log = run.log
    assert log.count("sent no heartbeat") == 3 and "it is hung" in log
    assert log.count("restarting sleeper") == 2
    assert "crash loop: sleeper failed 3 times within 300 s" in log
    assert leftovers(paths) == []


def test_with_the_policy_off_a_death_still_stops_everything(run_root: Path) -> None:
    run = Run([["a", 0, []], ["victim", 1, []]], restart_policy="off")
    paths = run.wait_ready()
    os.kill(pids(status(paths))["victim"], signal.SIGKILL)
    assert run.wait_exit(timeout=10) == 1
    assert "restarting" not in run.log


@pytest.mark.parametrize("victim", ["a"])
def test_a_start_up_failure_is_not_restarted(run_root: Path, victim: str) -> None:
    run = Run([[victim, 0, ["--exit-before-ready", "3"]]], **RESTART)
    assert run.wait_exit(timeout=30) == 1
    assert "restarting" not in run.log and "exit code 3" in run.log
