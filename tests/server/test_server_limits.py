"""Hostile bodies: every one gets a 4xx naming the field, at once, and the server keeps
serving. Every HTTP limit is below the bus's, so what the server accepts reaches the engine."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from tessera.bus.codec import MAX_HEADER_BYTES
from tessera.server.formatting import MAX_BODY_BYTES
from tests.server.harness import ServerUnderTest, check_error_body

CHAT = "/v1/chat/completions"
LONE = "\ud800"  # json.dumps writes it as the escape "\ud800"


def chat(**fields: Any) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, **fields}


RAW_CASES = [  # named: pytest puts the id in the environment of the processes it starts
    # (path, raw body, words in the message)
    pytest.param(CHAT, b"[" * 100_000 + b"]" * 100_000, "nested too deeply", id="deep"),
    pytest.param(CHAT, b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": '
                 + b"7" * 5000 + b"}", "not valid JSON", id="long-int"),
    pytest.param("/v1/completions", b'{"prompt": "x", "n": ' + b"1" * 5000 + b"}",
                 "not valid JSON", id="long-int-n"),
]


@pytest.mark.parametrize("path, raw, words", RAW_CASES)
def test_bodies_that_break_json_parsing_are_400(server: ServerUnderTest, path: str, raw: bytes,
                                                words: str) -> None:
    status, _, body = server.request("POST", path, raw=raw)
    assert status == 400, body
    assert words in check_error_body(body, 400)["message"]
    assert server.request("POST", CHAT, chat())[0] == 200


FIELD_CASES = [
    # (path, body, param)
    (CHAT, {"messages": [{"role": "user", "content": LONE}]}, "messages"),
    (CHAT, {"messages": [{"role": "user", "content": "hi", "name": "a" + LONE}]}, "messages"),
    (CHAT, {"messages": [{"role": "user", "content": [{"type": "text", "text": LONE}]}]},
     "messages"),
    (CHAT, chat(stop=["ok", LONE]), "stop"),
    ("/v1/completions", {"prompt": LONE}, "prompt"),
    ("/v1/completions", {"prompt": ["fine", "x" + LONE]}, "prompt"),
    ("/generate", {"text": "x", "rid": LONE}, "rid"),
    ("/generate", {"text": "x", "sampling_params": {"stop": LONE}}, "sampling_params"),
    (CHAT, chat(stop_token_ids=[2**70]), "stop_token_ids"),
    (CHAT, chat(stop_token_ids=[2**31]), "stop_token_ids"),
    ("/generate", {"text": "x", "sampling_params": {"stop_token_ids": [2**64]}},
     "stop_token_ids"),
    (CHAT, chat(seed=2**64), "seed"),
    (CHAT, chat(logit_bias={str(2**70): 1}), "logit_bias"),
    ("/v1/completions", {"prompt": "x", "logit_bias": {str(2**31): -100}}, "logit_bias"),
    ("/generate", {"text": "x", "sampling_params": {"logit_bias": {str(2**64): 1}}},
     "logit_bias"),
    (CHAT, chat(max_tokens=2**70), "max_tokens"),
    (CHAT, chat(n=2**70), "n"),
    (CHAT, chat(top_k=2**70), "top_k"),
    (CHAT, chat(min_tokens=2**70), "min_tokens"),
    (CHAT, chat(logprobs=True, top_logprobs=2**70), "top_logprobs"),
    ("/v1/completions", {"prompt": "x", "logprobs": 2**70}, "logprobs"),
    ("/generate", {"text": "x", "sampling_params": {"max_new_tokens": 2**70}}, "max_new_tokens"),
    (CHAT, chat(stop=["x" * 2000]), "stop"),
    ("/generate", {"text": "x", "rid": "r" * 300}, "rid"),
]


@pytest.mark.parametrize("path, payload, param", FIELD_CASES)
def test_values_the_bus_cannot_carry_are_400_naming_the_field(
        server: ServerUnderTest, path: str, payload: dict[str, Any], param: str) -> None:
    t0 = time.monotonic()
    status, _, body = server.request("POST", path, payload)
    assert status == 400, body
    assert check_error_body(body, 400)["param"] == param
    assert time.monotonic() - t0 < 5.0  # answered, not left to the request timeout
    assert server.request("POST", CHAT, chat())[0] == 200


@pytest.mark.parametrize("path, payload", [
    (CHAT, chat(stop=["s" * (1536 << 10)] * 16)),  # 24 MiB of stop strings
    ("/generate", {"text": "x", "rid": "r" * (17 << 20)}),
    ("/v1/completions", {"prompt": "hello world " * 699_050}),
])
def test_bodies_over_the_http_limit_are_413_at_once(server: ServerUnderTest, path: str,
                                                    payload: dict[str, Any]) -> None:
    status, _, body = server.request("POST", path, payload)
    assert status == 413, body
    assert "MiB" in check_error_body(body, 413)["message"]
    assert server.request("POST", CHAT, chat())[0] == 200


def test_the_http_limit_is_below_the_bus_limit(server: ServerUnderTest) -> None:
    """The largest body the server takes, as chat messages (the form that expands most on the
    way: one GenerateRequest header), reaches the engine and is answered."""
    assert MAX_BODY_BYTES < MAX_HEADER_BYTES
    one = {"role": "user", "content": "é" * 300}
    size = len(json.dumps(one, ensure_ascii=False).encode()) + 2
    messages = [one] * ((MAX_BODY_BYTES - 1000) // size)
    raw = json.dumps({"messages": messages, "max_tokens": 2}, ensure_ascii=False).encode()
    assert MAX_BODY_BYTES - 2000 < len(raw) <= MAX_BODY_BYTES
    status, _, body = server.request("POST", CHAT, raw=raw)
    assert status == 200, body[:300]
    assert len(server.engine.requests[-1].messages) == len(messages)
