"""Every class of bad input gets its status and OpenAI's error JSON, and the server keeps
serving; auth, 429, disconnect → abort."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.server.harness import ServerUnderTest, check_error_body

CHAT = "/v1/chat/completions"
USER = [{"role": "user", "content": "hi"}]


def chat(**fields: Any) -> dict[str, Any]:
    return {"messages": USER, "max_tokens": 2, **fields}


BAD_JSON_CASES = [
    # (path, raw body, status, words the message must contain, param)
    (CHAT, b"{not json", 400, "not valid JSON", None),
    (CHAT, b"[1, 2]", 400, "JSON object", None),
    (CHAT, b"", 400, "empty", None),
]

BAD_FIELD_CASES = [
    # (path, body, status, words, param)
    (CHAT, {"max_tokens": 2}, 400, "'messages' is required", "messages"),
    (CHAT, {"messages": []}, 400, "non-empty", "messages"),
    (CHAT, {"messages": [{"role": "wizard", "content": "x"}]}, 400, "role", "messages"),
    (CHAT, {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, 400,
     "text parts", "messages"),
    (CHAT, chat(temperature="hot"), 400, "'temperature' must be a number", "temperature"),
    (CHAT, chat(temperature=7000), 400, "temperature must be in", "temperature"),
    (CHAT, chat(max_tokens=True), 400, "'max_tokens' must be an integer", "max_tokens"),
    (CHAT, chat(max_tokens=0), 400, "max_tokens must be in", "max_tokens"),
    (CHAT, chat(n=1000), 400, "n must be in", "n"),
    (CHAT, chat(stop=[1, 2]), 400, "'stop' must be a string or a list", "stop"),
    (CHAT, chat(top_logprobs=3), 400, "requires 'logprobs'", "top_logprobs"),
    (CHAT, chat(logprobs=True, top_logprobs=50), 400, "'top_logprobs' must be in [0, 20]",
     "top_logprobs"),
    (CHAT, chat(stream_options={"include_usage": True}), 400, "only allowed when 'stream'",
     "stream_options"),
    (CHAT, chat(tools=[{"type": "browser"}]), 400, "only function tools", "tools"),
    (CHAT, chat(guided_choice=["a"], regex="b"), 400, "give one output constraint",
     "guided_choice"),
    (CHAT, chat(response_format={"type": "yaml"}), 400, "json_object or json_schema",
     "response_format"),
    (CHAT, chat(logit_bias={"x": 1}), 400, "logit_bias keys must be token ids", "logit_bias"),
    (CHAT, chat(logit_bias={"5": 500}), 400, "[-100, 100]", "logit_bias"),
    (CHAT, chat(frobnicate=1), 400, "unknown or unsupported field 'frobnicate'", "frobnicate"),
    (CHAT, chat(store=True), 400, "keeps no completions", "store"),
    ("/v1/completions", {"prompt": "x", "guided_regex": 5}, 400,
     "'guided_regex' must be a non-empty string", "guided_regex"),
    ("/v1/completions", {"prompt": "x", "best_of_n": 2}, 400, "'best_of_n'", "best_of_n"),
    ("/generate", {"text": "x", "sampling_params": {"temprature": 0}}, 400, "'temprature'",
     "temprature"),
    (CHAT, chat(model="gpt-4o"), 404, "does not exist", "model"),
    (CHAT, {"messages": [{"role": "user", "content": "FAIL_413"}]}, 400, "context", None),
    (CHAT, {"messages": [{"role": "user", "content": "FAIL_503"}]}, 503, "queue is full",
     None),
    ("/v1/completions", {"max_tokens": 2}, 400, "'prompt' is required", "prompt"),
    ("/v1/completions", {"prompt": [1.5]}, 400, "'prompt' must be", "prompt"),
    ("/v1/completions", {"prompt": "x", "suffix": "y"}, 400, "suffix", "suffix"),
    ("/generate", {"sampling_params": {}}, 400, "exactly one of 'text'", "text"),
    ("/generate", {"text": "x", "sampling_params": {"max_new_tokens": "many"}}, 400,
     "'max_new_tokens' must be an integer", "max_new_tokens"),
]


@pytest.mark.parametrize("path, raw, status, words, param", BAD_JSON_CASES)
def test_malformed_bodies(server: ServerUnderTest, path: str, raw: bytes, status: int,
                          words: str, param: str | None) -> None:
    got, _, body = server.request("POST", path, raw=raw)
    assert got == status
    err = check_error_body(body, status)
    assert words in err["message"] and err["param"] == param


@pytest.mark.parametrize("path, payload, status, words, param", BAD_FIELD_CASES)
def test_bad_fields(server: ServerUnderTest, path: str, payload: dict[str, Any], status: int,
                    words: str, param: str | None) -> None:
    got, headers, body = server.request("POST", path, payload)
    assert got == status, body
    err = check_error_body(body, status)
    assert words in err["message"], err
    assert err["param"] == param
    if status == 503:
        assert int(headers["retry-after"]) >= 1
    # ... and the server still serves.
    ok, _, _ = server.request("POST", CHAT, chat())
    assert ok == 200


def test_duplicate_native_rid_is_400(server: ServerUnderTest) -> None:
    conn = server.connection()
    conn.request("POST", "/generate", body=json.dumps({"text": "HANG", "rid": "dup",
                                                       "stream": True}),
                 headers={"Content-Type": "application/json"})
    time.sleep(0.3)  # the first request is in flight (it never answers)
    status, _, body = server.request("POST", "/generate", {"text": "x", "rid": "dup"})
    assert status == 400 and check_error_body(body, 400)["param"] == "rid"
    conn.close()


def test_bookkeeping_fields_are_accepted_and_unknown_ones_refused(
        server: ServerUnderTest) -> None:
    status, _, body = server.request("POST", CHAT, chat(user="u1", metadata={"a": "b"},
                                                        service_tier="auto", store=False))
    assert status == 200 and json.loads(body)["choices"][0]["message"]["content"] == "w0 w1"
    status, _, body = server.request("POST", CHAT, chat(frobnicate=3, zzz=1))
    err = check_error_body(body, 400)
    assert status == 400 and err["param"] == "frobnicate" and "'zzz'" in err["message"]
    assert "--lenient-params" in err["message"]


def test_lenient_params_ignore_unknown_fields() -> None:
    lenient = ServerUnderTest(lenient_params=True)
    try:
        status, _, body = lenient.request("POST", CHAT, chat(frobnicate=3))
        assert status == 200 and json.loads(body)["choices"][0]["message"]["content"] == \
            "w0 w1"
        status, _, _ = lenient.request("POST", CHAT, chat(store=True))
        assert status == 400  # a known field with a value it cannot honour is still refused
    finally:
        lenient.stop()


def test_extra_sampling_params_reach_the_engine(server: ServerUnderTest) -> None:
    status, _, _ = server.request("POST", CHAT, chat(
        top_k=5, min_p=0.1, repetition_penalty=1.1, min_tokens=1, ignore_eos=True,
        stop_token_ids=[7], skip_special_tokens=False, stop="END", presence_penalty=0.5,
        frequency_penalty=-0.5, top_p=0.9))
    assert status == 200
    sp = server.engine.requests[-1].sampling
    assert (sp.top_k, sp.min_p, sp.repetition_penalty, sp.min_tokens) == (5, 0.1, 1.1, 1)
    assert (sp.ignore_eos, sp.stop_token_ids, sp.skip_special_tokens) == (True, (7,), False)
    assert (sp.stop, sp.presence_penalty, sp.frequency_penalty, sp.top_p) == \
        (("END",), 0.5, -0.5, 0.9)


def test_unknown_route_and_method(server: ServerUnderTest) -> None:
    status, _, body = server.request("GET", "/v1/nothing")
    assert status == 404 and "no route" in check_error_body(body, 404)["message"]
    status, _, body = server.request("GET", CHAT)
    assert status == 405
    check_error_body(body, 405)


def test_too_large_body_is_413(server: ServerUnderTest) -> None:
    big = json.dumps(chat(padding="x" * (33 << 20))).encode()
    status, _, body = server.request("POST", CHAT, raw=big)
    assert status == 413 and "MiB" in check_error_body(body, 413)["message"]
    assert server.request("POST", CHAT, chat())[0] == 200


def test_client_disconnect_aborts_the_request(server: ServerUnderTest) -> None:
    sock = socket.create_connection((server.host, server.port), timeout=5.0)
    body = json.dumps(chat(stream=True, max_tokens=100_000, ignore_eos=True)).encode()
    sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                 b"Content-Type: application/json\r\nContent-Length: "
                 + str(len(body)).encode() + b"\r\n\r\n" + body)
    received = b""
    while b"chatcmpl-" not in received or b"\n\n" not in received.split(b"chatcmpl-")[1]:
        received += sock.recv(4096)
    rid = received.split(b"chatcmpl-")[1].split(b'"')[0].decode()
    sock.close()
    end = time.monotonic() + 3.0
    while time.monotonic() < end and not any(a.rid == rid for a in server.engine.aborts):
        time.sleep(0.02)
    assert any(a.rid == rid for a in server.engine.aborts)


@pytest.fixture(scope="module")
def keyed_server() -> Iterator[ServerUnderTest]:
    srv = ServerUnderTest(api_key="sekrit", max_concurrent_requests=1)
    yield srv
    srv.stop()


def test_api_key_is_required(keyed_server: ServerUnderTest) -> None:
    status, _, body = keyed_server.request("POST", CHAT, chat())
    assert status == 401
    assert check_error_body(body, 401)["code"] == "invalid_api_key"
    status, _, _ = keyed_server.request("POST", CHAT, chat(),
                                        headers={"Authorization": "Bearer wrong"})
    assert status == 401
    status, _, _ = keyed_server.request("POST", CHAT, chat(),
                                        headers={"Authorization": "Bearer sekrit"})
    assert status == 200
    # Probes stay open: a load balancer has no key.
    assert keyed_server.request("GET", "/health")[0] == 200


def test_concurrency_limit_answers_429(keyed_server: ServerUnderTest) -> None:
    auth = {"Authorization": "Bearer sekrit"}
    conn = keyed_server.connection()
    conn.request("POST", CHAT, body=json.dumps(chat(stream=True, max_tokens=10_000,
                                                    ignore_eos=True)),
                 headers={"Content-Type": "application/json", **auth})
    held = conn.getresponse()
    assert held.status == 200
    held.fp.readline()  # the stream is running: the one slot is taken
    status, headers, body = keyed_server.request("POST", CHAT, chat(), headers=auth)
    assert status == 429 and int(headers["retry-after"]) >= 1
    assert check_error_body(body, 429)["type"] == "rate_limit_error"
    conn.close()
    end = time.monotonic() + 3.0
    while time.monotonic() < end:
        status, _, body = keyed_server.request("POST", CHAT, chat(), headers=auth)
        if status == 200:
            break
        time.sleep(0.05)
    assert status == 200


def test_health_generate_needs_the_key_and_a_free_slot(keyed_server: ServerUnderTest) -> None:
    """It runs a generation: no way around the API key or the concurrency limit."""
    auth = {"Authorization": "Bearer sekrit"}
    status, _, body = keyed_server.request("GET", "/health_generate")
    assert status == 401 and check_error_body(body, 401)["code"] == "invalid_api_key"
    before = len(keyed_server.engine.requests)
    conn = keyed_server.connection()
    conn.request("POST", CHAT, body=json.dumps(chat(stream=True, max_tokens=10_000,
                                                    ignore_eos=True)),
                 headers={"Content-Type": "application/json", **auth})
    held = conn.getresponse()
    assert held.status == 200
    held.fp.readline()  # the one slot is taken
    status, headers, body = keyed_server.request("GET", "/health_generate", headers=auth)
    assert status == 429 and int(headers["retry-after"]) >= 1
    assert len(keyed_server.engine.requests) == before + 1  # no generation was started
    conn.close()
    end = time.monotonic() + 3.0
    while time.monotonic() < end:
        status, _, body = keyed_server.request("GET", "/health_generate", headers=auth)
        if status == 200:
            break
        time.sleep(0.05)
    assert status == 200 and json.loads(body)["status"] == "ok"


def test_stream_failing_before_its_first_output_gets_an_http_status(
        server: ServerUnderTest) -> None:
    """Until the first output the status line is not sent, so the error is a real status
    (a failure after it is an SSE error event: see test_server_lifecycle)."""
    status, headers, body = server.request("POST", CHAT, chat(
        stream=True, messages=[{"role": "user", "content": "FAIL_503"}]))
    assert status == 503 and int(headers["retry-after"]) >= 1
    assert headers["content-type"].startswith("application/json")
    check_error_body(body, 503)


PRIORITY_ROUTES = [
    (CHAT, lambda **kw: chat(**kw)),
    ("/v1/completions", lambda **kw: {"prompt": "hi", "max_tokens": 2, **kw}),
    ("/generate", lambda **kw: {"text": "hi", "sampling_params": {"max_new_tokens": 2}, **kw}),
]


@pytest.mark.parametrize("path,body", PRIORITY_ROUTES, ids=["chat", "completions", "native"])
def test_priority_is_refused_unless_the_server_orders_by_it(server: ServerUnderTest, path: str,
                                                           body: Any) -> None:
    status, _, _ = server.request("POST", path, body(priority=0))  # the default: nothing to do
    assert status == 200
    status, _, raw = server.request("POST", path, body(priority=3))
    err = check_error_body(raw, 400)
    assert status == 400 and err["param"] == "priority" and "--schedule-policy" in err["message"]


def test_priority_reaches_the_engine_under_the_priority_policy() -> None:
    srv = ServerUnderTest(schedule_policy="priority")
    try:
        for (path, body), priority in zip(PRIORITY_ROUTES, (5, -2, 7), strict=True):
            status, _, raw = srv.request("POST", path, body(priority=priority))
            assert status == 200, raw
            assert srv.engine.requests[-1].priority == priority
        for bad in ("high", 1.5, 2**40):
            status, _, raw = srv.request("POST", CHAT, chat(priority=bad))
            assert status == 400 and check_error_body(raw, 400)["param"] == "priority"
    finally:
        srv.stop()
