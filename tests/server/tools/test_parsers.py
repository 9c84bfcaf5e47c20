"""Each family's tool-call format, parsed whole and streamed in every two-cut split."""

from __future__ import annotations

import json

import pytest

from tessera.formats.chat_template import template_tool_format
from tessera.server.tools.parsers import ParsedCall, make_parser
from tessera.server.tools.stream import ToolCallStream

W = ParsedCall("get_weather", json.dumps({"city": "Paris", "unit": "c"}))
T = ParsedCall("get_time", json.dumps({"tz": "UTC"}))

CASES = [
    ("hermes", 'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": '
               '{"city": "Paris", "unit": "c"}}\n</tool_call>', "Let me check.\n", [W]),
    ("hermes", '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris", "unit": '
               '"c"}}</tool_call>\n<tool_call>{"name": "get_time", "arguments": {"tz": "UTC"}}'
               '</tool_call>', None, [W, T]),
    ("hermes", "No tools needed: 2 < 3.", "No tools needed: 2 < 3.", []),
    ("hermes", "<tool_call>not json</tool_call>", "<tool_call>not json</tool_call>", []),
    # cut at max_tokens after a whole JSON but before the closing tag
    ("hermes", '<tool_call>{"name": "get_time", "arguments": {"tz": "UTC"}}', None, [T]),
    ("llama3_json", '{"name": "get_weather", "parameters": {"city": "Paris", "unit": "c"}}',
     None, [W]),
    ("llama3_json", '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris", '
                    '"unit": "c"}}; {"name": "get_time", "parameters": {"tz": "UTC"}}',
     None, [W, T]),
    ("llama3_json", 'The JSON {"name": "x"} is only quoted here.',
     'The JSON {"name": "x"} is only quoted here.', []),
    ("llama3_json", '{"a": 1}', '{"a": 1}', []),  # JSON, but not a call
    ("mistral", '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris", "unit": '
                '"c"}}, {"name": "get_time", "arguments": {"tz": "UTC"}}]', None, [W, T]),
    ("mistral", 'Sure.[TOOL_CALLS]get_weather[ARGS]{"city": "Paris", "unit": "c"}'
                '[TOOL_CALLS]get_time[ARGS]{"tz": "UTC"}', "Sure.", [W, T]),
    ("mistral", "[TOOL_CALLS] broken", "[TOOL_CALLS] broken", []),
]


@pytest.mark.parametrize("name,text,content,calls", CASES)
def test_parse(name: str, text: str, content: str | None, calls: list[ParsedCall]) -> None:
    assert make_parser(name).parse(text) == (content, calls)


def _stream(name: str, text: str, cuts: list[int]) -> tuple[str, list[ParsedCall]]:
    stream = ToolCallStream(make_parser(name))
    content, calls, last = "", [], 0
    for cut in [*cuts, len(text)]:
        events = stream.feed(text[last:cut])
        content, calls, last = content + events.content, calls + events.calls, cut
    events = stream.finish()
    return content + events.content, calls + events.calls


@pytest.mark.parametrize("name,text,content,calls", CASES)
def test_stream_matches_parse(name: str, text: str, content: str | None,
                              calls: list[ParsedCall]) -> None:
    want = (content or "", calls)
    for a in range(0, len(text) + 1, 2):
        for b in range(a, len(text) + 1, 7):
            assert _stream(name, text, [a, b]) == want, (a, b)
    assert _stream(name, text, list(range(len(text)))) == want


def test_stream_emits_a_call_as_soon_as_it_is_complete() -> None:
    stream = ToolCallStream(make_parser("hermes"))
    first = '<tool_call>{"name": "get_time", "arguments": {"tz": "UTC"}}</tool_call>'
    assert stream.feed("Checking.<tool_") .content == "Checking."
    assert stream.feed(first[len("<tool_"):]).calls == [T]
    assert stream.feed("\n<tool_call>{").calls == []
    assert stream.called


def test_template_picks_the_parser() -> None:
    assert template_tool_format("{{ '[TOOL_CALLS]' }}") == "mistral"
    assert template_tool_format("{% if tools %}<|python_tag|>{% endif %}<|eot_id|>") == \
        "llama3_json"
    assert template_tool_format("<tool_call>") == "hermes"
    assert template_tool_format(None) == "hermes"
    with pytest.raises(ValueError, match="hermes"):
        make_parser("gpt")
