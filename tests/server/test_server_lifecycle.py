"""Start-up (warm-up before Ready), probes, metrics, a dead engine during a stream, and
SIGTERM draining."""

from __future__ import annotations

import http.client
import json
import signal
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tessera.bus.messages import GenerateRequest, Heartbeat, Ready
from tests.server.harness import ServerUnderTest, parse_sse

CHAT = "/v1/chat/completions"


def open_stream(server: ServerUnderTest, **fields: Any) -> http.client.HTTPResponse:
    conn = server.connection()
    body = {"messages": [{"role": "user", "content": "hi"}], "stream": True, **fields}
    conn.request("POST", CHAT, body=json.dumps(body),
                 headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    assert resp.status == 200
    return resp


def events(resp: http.client.HTTPResponse) -> Iterator[Any]:
    """Events as they arrive (each `data: ...` line must be followed by a blank line)."""
    while True:
        line = resp.readline()
        if not line:
            return
        assert line.startswith(b"data: "), line
        assert resp.readline() == b"\n"
        payload = line[len(b"data: "):].rstrip(b"\n")
        yield "[DONE]" if payload == b"[DONE]" else json.loads(payload)


def test_warm_up_runs_before_ready_and_heartbeats_flow(server: ServerUnderTest) -> None:
    control = list(server.engine.control)
    ready_at = next(i for i, m in enumerate(control) if isinstance(m, Ready))
    assert control[ready_at].info["model"] == "SmolLM2-135M-Instruct"
    warmup = server.engine.requests[0]
    assert isinstance(warmup, GenerateRequest) and warmup.sampling.max_tokens == 1
    time.sleep(0.3)
    beats = [m for m in server.engine.control if isinstance(m, Heartbeat)]
    assert beats and all(b.process == "server" for b in beats)
    assert beats[-1].stats["ready"] == 1.0


def test_health_probes(server: ServerUnderTest) -> None:
    status, _, body = server.request("GET", "/health")
    assert status == 200 and json.loads(body)["status"] == "ok"
    before = len(server.engine.requests)
    status, _, body = server.request("GET", "/health_generate")
    assert status == 200 and json.loads(body)["completion_tokens"] == 1
    assert len(server.engine.requests) == before + 1  # a real generation went through


def test_metrics_show_server_and_engine_numbers(server: ServerUnderTest) -> None:
    server.engine.processes["scheduler"]["stats"]["free_pages"] = 123.0
    time.sleep(0.6)  # the status the server caches is at most 0.5 s old
    server.request("POST", CHAT, {"messages": [{"role": "user", "content": "a b"}],
                                  "max_tokens": 3})
    server.request("POST", CHAT, {"messages": []})
    status, headers, body = server.request("GET", "/metrics")
    assert status == 200 and headers["content-type"].startswith("text/plain")
    text = body.decode()
    samples = {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
               for line in text.splitlines() if line and not line.startswith("#")}
    assert samples['tessera:http_requests_total{route="/v1/chat/completions",status="200"}'] >= 1
    assert samples['tessera:http_requests_total{route="/v1/chat/completions",status="400"}'] >= 1
    assert samples["tessera:generation_tokens_total"] >= 3
    assert samples["tessera:time_to_first_token_seconds_count"] >= 1
    assert samples["tessera:e2e_request_latency_seconds_count"] >= 1
    assert samples['tessera:scheduler_free_pages{process="scheduler"}'] == 123.0
    assert 'tessera:worker_running{process="worker0"}' in samples
    assert samples['tessera:process_alive{process="worker0"}'] == 1.0


def test_openapi_document_names_every_route(server: ServerUnderTest) -> None:
    status, _, body = server.request("GET", "/openapi.json")
    doc = json.loads(body)
    assert status == 200 and doc["openapi"].startswith("3.")
    assert {"/v1/chat/completions", "/v1/completions", "/v1/models", "/generate", "/health",
            "/health_generate", "/metrics", "/openapi.json"} <= set(doc["paths"])


@pytest.fixture
def fresh_server(request: pytest.FixtureRequest) -> Iterator[ServerUnderTest]:
    params = getattr(request, "param", {})
    srv = ServerUnderTest(token_delay_s=0.01, **params)
    yield srv
    srv.stop()


def test_dead_engine_process_gives_an_error_event_within_2s(
        fresh_server: ServerUnderTest) -> None:
    resp = open_stream(fresh_server, max_tokens=100_000, ignore_eos=True)
    stream = events(resp)
    for _ in range(3):
        next(stream)
    killed = time.monotonic()
    fresh_server.engine.kill("worker0")
    rest = list(stream)
    elapsed = time.monotonic() - killed
    assert elapsed < 2.0
    error = rest[-1]
    assert "[DONE]" not in rest
    assert error["error"]["type"] == "engine_dead" and "worker0" in error["error"]["message"]
    status, headers, _ = fresh_server.request("GET", "/health")
    assert status == 503
    metrics = fresh_server.request("GET", "/metrics")[2].decode()
    assert 'tessera:http_errors_total{status="503",type="engine_dead"} 1.0' in metrics
    status, headers, body = fresh_server.request("POST", CHAT, {
        "messages": [{"role": "user", "content": "x"}]})
    assert status == 503 and int(headers["retry-after"]) >= 1


def test_sigterm_drains_in_flight_streams_then_exits_0(fresh_server: ServerUnderTest) -> None:
    resp = open_stream(fresh_server, max_tokens=40, ignore_eos=True)
    stream = events(resp)
    first = next(stream)
    fresh_server.signal(signal.SIGTERM)
    time.sleep(0.2)
    # While it drains the server still answers: "stopping", and 503 to new work.
    status, headers, body = fresh_server.request("GET", "/health")
    assert status == 503 and json.loads(body)["status"] == "stopping"
    status, headers, body = fresh_server.request("POST", CHAT, {
        "messages": [{"role": "user", "content": "x"}], "max_tokens": 2})
    assert status == 503 and int(headers["retry-after"]) >= 1
    assert "shutting down" in json.loads(body)["error"]["message"]
    rest = list(stream)
    assert rest[-1] == "[DONE]"
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in [first, *rest[:-1]])
    assert text.split() == [f"w{k}" for k in range(40)]
    assert fresh_server.proc.wait(10) == 0


@pytest.mark.parametrize("fresh_server", [{"drain_timeout_s": 0.5}], indirect=True)
def test_drain_deadline_ends_streams_with_an_error_event(fresh_server: ServerUnderTest) -> None:
    resp = open_stream(fresh_server, max_tokens=100_000, ignore_eos=True)
    stream = events(resp)
    next(stream)
    fresh_server.signal(signal.SIGTERM)
    started = time.monotonic()
    rest = list(stream)
    assert rest[-1]["error"]["type"] == "service_unavailable"
    assert "shut down" in rest[-1]["error"]["message"]
    assert time.monotonic() - started < 3.0
    assert fresh_server.proc.wait(10) == 0


@pytest.mark.parametrize("fresh_server", [{"disable_warmup": True}], indirect=True)
def test_disable_warmup_skips_the_warm_up_request(fresh_server: ServerUnderTest) -> None:
    assert fresh_server.engine.requests == []
    body = parse_sse(fresh_server.request("POST", CHAT, {
        "messages": [{"role": "user", "content": "x"}], "stream": True, "max_tokens": 1})[2])
    assert body[-1] == "[DONE]"
