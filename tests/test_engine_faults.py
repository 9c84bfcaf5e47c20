"""Faults injected into the real engine (default model, cpu), one engine for every case:

1. hostile HTTP traffic: the API fuzzed from its OpenAPI description (schemathesis), bounded
   in time; no 5xx but 503/504, no process dies, and once idle the KV page invariant holds
   with no page held;
2. an overload burst (BURST requests at once, more than --max-concurrent-requests): each is
   answered, 200 or 429/503 with Retry-After, none is lost;
3. kill -9 of each process kind while requests stream (the restart policy): every request
   ends -- completed, or answered with an explicit error (an SSE error event, an HTTP error
   status, or the connection of a dead server closing); none is left waiting -- and the engine
   serves again without the operator (the worker and the scheduler reload the weights).
Each case prints a JSON line of what it saw (docs/reliability.md quotes them)."""

from __future__ import annotations

import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, settings

from tessera.client import Client, TesseraError
from tessera.server.openapi import openapi_document

pytestmark = pytest.mark.integration

STREAMS = 3
BURST, MAX_CONCURRENT = 200, 32
STALL_S = 90.0  # no request moved this long: those not ended are lost
DEADLINE_S = 600.0  # for the engine to serve again (a weights reload on a busy machine)


@dataclass
class Engine:
    proc: subprocess.Popen[str]
    run_dir: str
    port: int
    log: list[str] = field(default_factory=list)

    def status(self) -> dict:
        with Client(self.run_dir) as client:
            return client.status(timeout=5.0).processes

    def ready(self) -> bool:
        with Client(self.run_dir) as client:
            try:
                return client.status(timeout=2.0).ready
            except TesseraError:
                return False


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def engine() -> Iterator[Engine]:
    root = tempfile.mkdtemp(prefix="tsr-")  # short: ipc paths are limited to 107 bytes
    run_dir = os.path.join(root, "run")
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "tessera.bus.launcher", "--port", str(port), "--run-dir",
         run_dir, "--max-total-tokens", "8192", "--context-length", "512",
         "--max-concurrent-requests", str(MAX_CONCURRENT),
         "--heartbeat-interval-s", "0.2",
         "--heartbeat-timeout-s", "10", "--restart-backoff-s", "0.2",
         "--log-level", "info"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "TESSERA_RUN_ROOT": root})
    eng = Engine(proc, run_dir, port)

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            eng.log.append(line)

    threading.Thread(target=read, daemon=True).start()
    deadline = time.monotonic() + 600
    while not any("tessera is ready" in line for line in eng.log):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail("the engine did not start:\n" + "".join(eng.log[-40:]))
        time.sleep(0.2)
    try:
        yield eng
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
        shutil.rmtree(root, ignore_errors=True)


@dataclass
class Outcome:
    chunks: int = 0
    end: str = ""  # "done", "error: ...", or "" while running (lost, if it stays so)


def stream(port: int, outcome: Outcome, max_tokens: int) -> None:
    body = json.dumps({"messages": [{"role": "user", "content": "Count to one hundred."}],
                       "max_tokens": max_tokens, "ignore_eos": True, "stream": True,
                       "temperature": 0})
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=DEADLINE_S)
        conn.request("POST", "/v1/chat/completions", body=body,
                     headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        if resp.status != 200:
            outcome.end = f"error: HTTP {resp.status}"
            return
        for raw in resp:
            line = raw.strip()
            if line == b"data: [DONE]":
                outcome.end = "done"
                return
            if line.startswith(b"data: "):
                event = json.loads(line[6:])
                if "error" in event:
                    outcome.end = f"error: {event['error']['type']}"
                    return
                outcome.chunks += 1
        outcome.end = "error: the stream ended without [DONE]"
    except (OSError, http.client.HTTPException) as exc:  # the server died: connection reset
        outcome.end = f"error: {type(exc).__name__}"


def one_request(port: int) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("POST", "/v1/chat/completions", headers={"Content-Type": "application/json"},
                     body=json.dumps({"messages": [{"role": "user", "content": "Hi"}],
                                      "max_tokens": 4}))
        return conn.getresponse().status
    except OSError:
        return 0
    finally:
        conn.close()


def watch_ready(engine: Engine, victim: str, old_pid: int, when: list[float]) -> None:
    """Note when the engine is ready again with a new `victim` process."""
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        try:
            with Client(engine.run_dir) as client:
                reply = client.status(timeout=2.0)
            if reply.ready and reply.processes[victim]["pid"] != old_pid:
                when.append(time.monotonic())
                return
        except TesseraError:
            pass
        time.sleep(0.2)


def wait_until_ended_or_stalled(outcomes: list[Outcome]) -> None:
    """Until every request ended, or none moved for STALL_S (a slow machine is not a loss)."""
    last, moved = None, time.monotonic()
    while not all(o.end for o in outcomes):
        now_seen = [(o.chunks, o.end) for o in outcomes]
        if now_seen != last:
            last, moved = now_seen, time.monotonic()
        elif time.monotonic() - moved > STALL_S:
            return
        time.sleep(0.2)


FUZZ_BUDGET_S = 60.0  # the fuzz's wall time in all: later cases only count once it is spent


@pytest.fixture
def api(engine: Engine) -> schemathesis.BaseSchema:
    schema = schemathesis.openapi.from_dict(openapi_document("SmolLM2-135M-Instruct"))
    schema.config.update(base_url=f"http://127.0.0.1:{engine.port}")
    return schema


FUZZ_STARTED: list[float] = []
FUZZ_CALLS: list[int] = []
api_schema = schemathesis.pytest.from_fixture("api")


@api_schema.parametrize()
@settings(max_examples=25, deadline=None, derandomize=True,
          suppress_health_check=list(HealthCheck))
def test_fuzzed_api_traffic_gets_no_server_error(case: schemathesis.Case,
                                                 engine: Engine) -> None:
    if not FUZZ_STARTED:
        FUZZ_STARTED.append(time.monotonic())
    if time.monotonic() - FUZZ_STARTED[0] > FUZZ_BUDGET_S:
        return
    try:
        # A client that gives up disconnects: the server aborts its request.
        response = case.call(timeout=10)
    except requests.exceptions.RequestException:
        return
    FUZZ_CALLS.append(response.status_code)
    assert response.status_code < 500 or response.status_code in (503, 504), \
        (case.as_curl_command(), response.status_code, response.text[:500])


def test_after_the_fuzz_no_process_died_and_no_kv_page_leaked(engine: Engine) -> None:
    processes = engine.status()
    assert all(p["restarts"] == 0 and p["alive"] for p in processes.values()), processes
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        stats = engine.status()["scheduler"]["stats"]
        if stats.get("running") == 0 and stats.get("waiting") == 0:
            break
        time.sleep(0.5)
    assert stats["kv_invariant_ok"] == 1.0 and stats["kv_pages_running"] == 0, stats
    print(json.dumps({"fuzz_requests": len(FUZZ_CALLS),
                      "statuses": {str(c): FUZZ_CALLS.count(c) for c in sorted(set(FUZZ_CALLS))},
                      "kv_invariant_ok": stats["kv_invariant_ok"],
                      "kv_pages_running": stats["kv_pages_running"]}))


def burst_request(port: int, results: list[tuple[int, str]]) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=DEADLINE_S)
    try:
        conn.request("POST", "/v1/completions", headers={"Content-Type": "application/json"},
                     body=json.dumps({"prompt": "Once upon a time", "max_tokens": 8}))
        resp = conn.getresponse()
        resp.read()
        results.append((resp.status, resp.getheader("Retry-After") or ""))
    except OSError as exc:
        results.append((0, type(exc).__name__))
    finally:
        conn.close()


def test_an_overload_burst_is_answered_and_nothing_is_lost(engine: Engine) -> None:
    results: list[tuple[int, str]] = []
    threads = [threading.Thread(target=burst_request, args=(engine.port, results), daemon=True)
               for _ in range(BURST)]
    started = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join(DEADLINE_S)
    statuses = sorted({status for status, _ in results})
    summary = {"burst": BURST, "answered": len(results),
               "statuses": {str(s): sum(r[0] == s for r in results) for s in statuses},
               "seconds": round(time.monotonic() - started, 1)}
    print(json.dumps(summary))
    assert len(results) == BURST, summary  # none lost
    assert set(statuses) <= {200, 429, 503}, summary
    assert all(int(retry) >= 1 for status, retry in results if status in (429, 503))
    assert sum(status == 200 for status, _ in results) >= MAX_CONCURRENT
    assert all(p["restarts"] == 0 for p in engine.status().values())


@pytest.mark.parametrize("victim", ["tokenizer0", "detokenizer", "server", "scheduler",
                                    "worker0"])
def test_kill_9_during_a_stream_loses_no_request_and_the_engine_serves_again(
        engine: Engine, victim: str) -> None:
    before = engine.status()
    outcomes = [Outcome() for _ in range(STREAMS)]
    threads = [threading.Thread(target=stream, args=(engine.port, o, 48), daemon=True)
               for o in outcomes]
    for t in threads:
        t.start()
    deadline = time.monotonic() + DEADLINE_S
    while not all(o.chunks >= 2 or o.end for o in outcomes) and time.monotonic() < deadline:
        time.sleep(0.05)
    late = [Outcome() for _ in range(2)]  # sent as the victim dies: maybe not answered yet
    late_threads = [threading.Thread(target=stream, args=(engine.port, o, 8), daemon=True)
                    for o in late]
    for t in late_threads:
        t.start()
    os.kill(before[victim]["pid"], signal.SIGKILL)
    killed_at = time.monotonic()
    ready_again: list[float] = []
    watcher = threading.Thread(target=watch_ready, daemon=True,
                               args=(engine, victim, before[victim]["pid"], ready_again))
    watcher.start()
    everyone = outcomes + late
    wait_until_ended_or_stalled(everyone)
    lost = [o for o in everyone if not o.end]
    summary = {"victim": victim, "requests": len(everyone),
               "done": sum(o.end == "done" for o in everyone),
               "errors": sorted(o.end for o in everyone if o.end.startswith("error")),
               "lost": len(lost)}
    assert not lost, f"{summary}\n" + "".join(engine.log[-80:])
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline and not engine.ready():
        time.sleep(0.5)
    after = engine.status()
    assert after[victim]["pid"] != before[victim]["pid"] and after[victim]["restarts"] >= 1
    status = 0
    while time.monotonic() < deadline and (status := one_request(engine.port)) != 200:
        time.sleep(0.5)
    assert status == 200, "".join(engine.log[-60:])
    assert engine.proc.poll() is None  # the supervisor never gave up
    watcher.join(DEADLINE_S)
    summary["ready_again_after_s"] = round(ready_again[0] - killed_at, 1) if ready_again \
        else None
    print(json.dumps(summary))
