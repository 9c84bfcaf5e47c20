"""SSE streams parsed strictly: chunk shapes, order, usage, [DONE]; 32 concurrent streams;
the native /generate stream."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp

from tessera.client.testing import token_text
from tests.server.harness import ServerUnderTest, parse_sse

CHAT = "/v1/chat/completions"


def check_chat_stream(events: list[Any], n: int, tokens: int, usage: bool) -> list[str]:
    """Assert OpenAI's chunk protocol; return each choice's text."""
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    ids = {c["id"] for c in chunks}
    assert len(ids) == 1 and ids.pop().startswith("chatcmpl-")
    for c in chunks:
        assert c["object"] == "chat.completion.chunk"
        assert {"id", "object", "created", "model", "choices"} <= set(c)
        assert ("usage" in c) == usage
    if usage:
        last = chunks.pop()
        assert last["choices"] == [] and last["usage"]["completion_tokens"] == n * tokens
        assert all(c["usage"] is None for c in chunks)
    texts = []
    for i in range(n):
        mine = [c["choices"][0] for c in chunks if c["choices"][0]["index"] == i]
        assert all(len(c["choices"]) == 1 for c in chunks)
        assert mine[0]["delta"] == {"role": "assistant", "content": "", "refusal": None}
        assert mine[-1]["delta"] == {} and mine[-1]["finish_reason"] in ("stop", "length")
        assert all(m["finish_reason"] is None for m in mine[:-1])
        body = [m["delta"]["content"] for m in mine[1:-1]]
        assert body == [token_text(k, i) for k in range(tokens)], "tokens out of order"
        texts.append("".join(body))
    return texts


def test_chat_stream_is_well_formed(server: ServerUnderTest) -> None:
    status, headers, body = server.request("POST", CHAT, {
        "messages": [{"role": "user", "content": "hi"}], "stream": True, "max_tokens": 5})
    assert status == 200 and headers["content-type"].startswith("text/event-stream")
    check_chat_stream(parse_sse(body), n=1, tokens=5, usage=False)


def test_chat_stream_with_n_and_usage(server: ServerUnderTest) -> None:
    _, _, body = server.request("POST", CHAT, {
        "messages": [{"role": "user", "content": "hi"}], "stream": True, "n": 3,
        "max_tokens": 4, "stream_options": {"include_usage": True}})
    texts = check_chat_stream(parse_sse(body), n=3, tokens=4, usage=True)
    assert texts[2] == "w0.2 w1.2 w2.2 w3.2"


def test_completion_stream_is_well_formed(server: ServerUnderTest) -> None:
    _, _, body = server.request("POST", "/v1/completions", {
        "prompt": "hi", "stream": True, "max_tokens": 3, "logprobs": 0,
        "stream_options": {"include_usage": True}})
    events = parse_sse(body)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    usage = chunks.pop()
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 3
    assert [c["choices"][0]["text"] for c in chunks] == ["w0", " w1", " w2"]
    assert [c["choices"][0]["finish_reason"] for c in chunks] == [None, None, "length"]
    offsets = [c["choices"][0]["logprobs"]["text_offset"] for c in chunks]
    assert offsets == [[0], [2], [5]]  # offsets run on across chunks
    assert all(c["object"] == "text_completion" for c in chunks)


def test_native_generate_plain_and_streamed(server: ServerUnderTest) -> None:
    status, _, body = server.request("POST", "/generate", {
        "text": "hi", "sampling_params": {"max_new_tokens": 3, "temperature": 0},
        "return_logprob": True})
    assert status == 200
    out = json.loads(body)
    assert out["text"] == "w0 w1 w2" and out["output_ids"] == [100, 101, 102]
    meta = out["meta_info"]
    assert meta["finish_reason"] == {"type": "length"} and meta["completion_tokens"] == 3
    assert [row[0] for row in meta["output_token_logprobs"]] == [0.0, -0.25, -0.5]
    _, _, body = server.request("POST", "/generate", {
        "input_ids": [4, 5], "sampling_params": {"max_new_tokens": 3}, "stream": True})
    events = parse_sse(body)
    assert events[-1] == "[DONE]"
    assert [e["text"] for e in events[:-1]] == ["w0", "w0 w1", "w0 w1 w2"]  # cumulative
    assert events[-2]["meta_info"]["finish_reason"] == {"type": "length"}
    assert server.engine.requests[-1].input_ids.tolist() == [4, 5]


def test_32_concurrent_streaming_clients_all_finish_in_order(server: ServerUnderTest) -> None:
    async def one(session: aiohttp.ClientSession, k: int) -> list[str]:
        async with session.post(server.url + CHAT, json={
                "messages": [{"role": "user", "content": f"client {k}"}], "stream": True,
                "max_tokens": 12, "ignore_eos": True,
                "stream_options": {"include_usage": True}}) as resp:
            assert resp.status == 200
            body = await resp.read()
        return check_chat_stream(parse_sse(body), n=1, tokens=12, usage=True)

    async def main() -> list[list[str]]:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as s:
            return await asyncio.gather(*(one(s, k) for k in range(32)))

    results = asyncio.run(main())
    expected = "".join(token_text(k, 0) for k in range(12))
    assert len(results) == 32 and all(r == [expected] for r in results)
