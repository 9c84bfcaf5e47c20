"""The HTTP API fuzzed from its own OpenAPI description (schemathesis): whatever the body,
the answer is never a 5xx other than 503/504, and the server lives on. Against the fake
engine, so that a few hundred cases take seconds; the real engine's turn (with the page
invariant checked afterwards) is in tests/test_engine_faults.py."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
import schemathesis
from hypothesis import HealthCheck, settings

from tessera.server.openapi import openapi_document
from tests.server.harness import ServerUnderTest


@pytest.fixture(scope="module")
def fuzzed_server() -> Iterator[ServerUnderTest]:
    # a small context: a request with ignore_eos and no max_tokens (the fuzz sends some) runs
    # until it is full, as on the real engine, in about a second
    srv = ServerUnderTest(token_delay_s=0.0005, request_timeout_s=5.0, context_len=2048)
    yield srv
    srv.stop()


@pytest.fixture
def api(fuzzed_server: ServerUnderTest) -> schemathesis.BaseSchema:
    schema = schemathesis.openapi.from_dict(openapi_document("SmolLM2-135M-Instruct"))
    schema.config.update(base_url=fuzzed_server.url)
    return schema


schema = schemathesis.pytest.from_fixture("api")
CALLS: list[int] = []


@schema.parametrize()
@settings(max_examples=60, deadline=None, derandomize=True,
          suppress_health_check=list(HealthCheck))
def test_no_request_gets_a_server_error(case: schemathesis.Case,
                                       fuzzed_server: ServerUnderTest) -> None:
    response = case.call(timeout=30)
    CALLS.append(response.status_code)
    assert response.status_code < 500 or response.status_code in (503, 504), \
        (case.as_curl_command(), response.status_code, response.text[:500])
    assert fuzzed_server.proc.poll() is None, fuzzed_server.log()[-3000:]


def test_the_fuzz_ran_and_the_server_still_serves(fuzzed_server: ServerUnderTest) -> None:
    assert len(CALLS) >= 100, CALLS  # every operation was exercised, most of them often
    status, _, _ = fuzzed_server.request("POST", "/v1/chat/completions", {
        "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
    assert status == 200
    print({"fuzz_requests": len(CALLS),
           "statuses": {str(c): CALLS.count(c) for c in sorted(set(CALLS))}})


def test_ignore_eos_without_max_tokens_ends_at_the_context(fuzzed_server: ServerUnderTest
                                                           ) -> None:
    """The case a random fuzz found hanging the fake engine (it generated forever): without
    max_tokens a request with ignore_eos ends where prompt and output fill the context."""
    status, _, body = fuzzed_server.request("POST", "/v1/chat/completions", {
        "messages": [{"role": "user", "content": "hi"}], "ignore_eos": True})
    assert status == 200, body
    reply = json.loads(body)
    usage = reply["usage"]
    assert reply["choices"][0]["finish_reason"] == "length"
    assert usage["prompt_tokens"] + usage["completion_tokens"] == 2048, usage
