"""The SSE events made from templates (server/sse.py ChunkEvents) are byte for byte those of
encoding the whole chunk, as the stream wrote them before the templates."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tessera.server.sse import ChunkEvents, event

TEXTS = ["", " hello", "a\"quoted\" \\ back", "line\nbreak\ttab\r\x00\x1f\x7f",
         "é ü 漢字 🙂", "\u2028\u2029", "</script>", "{\"x\": [1]}", "\ud83d\ude42"]
FINISH = [None, "stop", "length", "abort"]
CHUNKS: list[dict[str, Any]] = [
    {"id": "cmpl-abc", "object": "text_completion", "created": 1700000000,
     "model": "SmolLM2-135M-Instruct", "system_fingerprint": None},
    {"id": "cmpl-abc", "object": "text_completion", "created": 1700000000,
     "model": "mödel \"x\"", "system_fingerprint": None, "usage": None},
    {"id": "chatcmpl-abc", "created": 1, "model": "m", "system_fingerprint": None,
     "object": "chat.completion.chunk"},
    {},
    {"choices": "first", "id": "x"},  # a chunk of its own "choices": no template
]


def _reference(chunk: dict[str, Any], choice: dict[str, Any]) -> bytes:
    """What the stream wrote for every chunk before the templates."""
    data = json.dumps({**chunk, "choices": [choice]}, ensure_ascii=False,
                      separators=(",", ":"))
    return b"data: " + data.encode() + b"\n\n"


def _encodable(text: str) -> bool:
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


@pytest.mark.parametrize("chunk", CHUNKS)
def test_completion_text_events_match_the_encoder(chunk: dict[str, Any]) -> None:
    events = ChunkEvents(chunk)
    for index in (0, 1, 17):
        for text in TEXTS:
            for finish in FINISH:
                choice = {"index": index, "text": text, "logprobs": None,
                          "finish_reason": finish}
                if not _encodable(text):
                    with pytest.raises(UnicodeEncodeError):
                        _reference(chunk, choice)
                    with pytest.raises(UnicodeEncodeError):
                        events.text(index, text, finish)
                    continue
                want = _reference(chunk, choice)
                assert events.text(index, text, finish) == want
                assert events.choice(choice) == want
                assert event({**chunk, "choices": [choice]}) == want


DELTAS: list[dict[str, Any]] = [
    *({"content": t} for t in TEXTS if _encodable(t)),
    {"role": "assistant", "content": "", "refusal": None},
    {"reasoning_content": "think"},
    {},
    {"content": None},
    {"content": 5},
    {"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                     "function": {"name": "f", "arguments": "{\"a\": 1}"}}]},
    {"function_call": {"arguments": "{}"}},
]
LOGPROBS: list[Any] = [None, {"content": [{"token": "a", "logprob": -0.5, "bytes": [97],
                                           "top_logprobs": []}], "refusal": None}]


@pytest.mark.parametrize("chunk", CHUNKS)
def test_chat_delta_events_match_the_encoder(chunk: dict[str, Any]) -> None:
    events = ChunkEvents(chunk)
    for index in (0, 3):
        for delta in DELTAS:
            for logprobs in LOGPROBS:
                for finish in FINISH:
                    choice = {"index": index, "delta": delta, "logprobs": logprobs,
                              "finish_reason": finish}
                    assert events.delta(index, delta, logprobs, finish) == \
                        _reference(chunk, choice)
        assert events.delta(index, {"content": "x"}) == _reference(
            chunk, {"index": index, "delta": {"content": "x"}, "logprobs": None,
                    "finish_reason": None})


def test_other_objects_encode_as_json_dumps_did() -> None:
    body = {"error": {"message": "bad \"x\" é", "type": "invalid_request_error",
                      "param": None, "code": None}, "n": [1.5, float("-inf"), True]}
    assert event(body) == b"data: " + json.dumps(
        body, ensure_ascii=False, separators=(",", ":")).encode() + b"\n\n"
