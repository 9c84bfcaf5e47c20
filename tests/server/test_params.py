"""parse_json_body: what it refuses, and that a body without surrogate escapes skips the walk
over its strings (seconds of the event loop for a body of millions of items)."""

from __future__ import annotations

import json

import pytest

from tessera.server import params
from tessera.server.errors import ApiError


def test_lone_surrogates_are_found_at_any_depth_and_in_any_encoding() -> None:
    for raw in [b'{"messages": [{"role": "user", "content": "a\\ud800"}]}',
                b'{"messages": [{"content": [{"text": "\\uDC00"}]}]}',
                json.dumps({"stop": ["x", "\ud800"]}).encode("utf-16", "surrogatepass")]:
        with pytest.raises(ApiError) as err:
            params.parse_json_body(raw)
        assert err.value.status == 400 and "surrogate" in err.value.message
    pair = params.parse_json_body(b'{"prompt": "\\ud83d\\ude00"}')  # a valid pair: an emoji
    assert pair == {"prompt": "\U0001F600"}


def test_a_body_without_surrogate_escapes_is_not_walked(monkeypatch) -> None:  # noqa: ANN001
    walked: list[object] = []
    monkeypatch.setattr(params, "field_with_invalid_text",
                        lambda body: walked.append(body))
    big = json.dumps({"input_ids": [1] * 100_000, "prompt": "caf\u00e9 \u4e16\u754c"}).encode()
    assert params.parse_json_body(big)["input_ids"][0] == 1
    assert params.parse_json_body(json.dumps({"prompt": "\u00e9"}).encode())  # \u00e9: no
    assert walked == []
    params.parse_json_body(b'{"prompt": "\\ud83d\\ude00"}')  # an escape: walked
    params.parse_json_body(json.dumps({"prompt": "x"}).encode("utf-16"))  # not UTF-8: walked
    assert len(walked) == 2
