"""Reading tools / tool_choice / functions, and the schemas that force calls."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import pytest

from tessera.server.errors import ApiError
from tessera.server.tools.request import forced_calls, forced_schema, read_tools

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}
TIME = {"type": "function", "function": {"name": "get_time"}}


def _refused(body: dict[str, Any], param: str) -> str:
    with pytest.raises(ApiError) as info:
        read_tools(body)
    assert info.value.status == 400 and info.value.param == param
    return info.value.message


def test_defaults() -> None:
    assert read_tools({}).choice == "none" and not read_tools({}).active
    req = read_tools({"tools": [WEATHER]})
    assert req.choice == "auto" and req.active and req.parallel and not req.forced


def test_choices() -> None:
    assert read_tools({"tools": [WEATHER], "tool_choice": "required"}).forced
    named = read_tools({"tools": [WEATHER, TIME], "parallel_tool_calls": False,
                        "tool_choice": {"type": "function", "function": {"name": "get_time"}}})
    assert (named.choice, named.named, named.parallel) == ("named", "get_time", False)
    assert not read_tools({"tools": [WEATHER], "tool_choice": "none"}).active


def test_legacy_functions_map_to_tools() -> None:
    req = read_tools({"functions": [WEATHER["function"]],
                      "function_call": {"name": "get_weather"}})
    assert req.legacy and req.choice == "named" and req.tools == [WEATHER]
    assert read_tools({"functions": [WEATHER["function"]]}).choice == "auto"
    assert not read_tools({"functions": [WEATHER["function"]]}).parallel


@pytest.mark.parametrize("body,param,words", [
    ({"tools": "x"}, "tools", "non-empty list"),
    ({"tools": [{"type": "code_interpreter"}]}, "tools", "only function tools"),
    ({"tools": [{"type": "function", "function": {"name": "bad name!"}}]}, "tools", "letters"),
    ({"tools": [WEATHER, WEATHER]}, "tools", "same function name"),
    ({"tools": [WEATHER], "tool_choice": "sometimes"}, "tool_choice", "required"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
     "tool_choice", "not among"),
    ({"tool_choice": "required"}, "tool_choice", "needs 'tools'"),
    ({"tools": [WEATHER], "functions": [TIME["function"]]}, "functions", "not both"),
    ({"functions": [TIME["function"]], "function_call": "required"}, "function_call",
     "\"auto\""),
    ({"tools": [WEATHER], "parallel_tool_calls": "yes"}, "parallel_tool_calls", "true or"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": []}}]}, "tools",
     "JSON schema"),
])
def test_refusals_name_the_field(body: dict[str, Any], param: str, words: str) -> None:
    assert words in _refused(body, param)


def test_forced_schemas_accept_what_forced_calls_reads() -> None:
    named = read_tools({"tools": [WEATHER],
                        "tool_choice": {"type": "function", "function": {"name": "get_weather"}}})
    schema = forced_schema(named)
    assert schema == WEATHER["function"]["parameters"]
    assert forced_calls(named, '{"city": "Oslo"}') == [("get_weather", '{"city": "Oslo"}')]

    required = read_tools({"tools": [WEATHER, TIME], "tool_choice": "required"})
    schema = forced_schema(required)
    answer = [{"name": "get_weather", "parameters": {"city": "Oslo"}},
              {"name": "get_time", "parameters": {}}]
    jsonschema.validate(answer, schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate([{"name": "rm_rf", "parameters": {}}], schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate([], schema)
    assert forced_calls(required, json.dumps(answer)) == [
        ("get_weather", '{"city": "Oslo"}'), ("get_time", "{}")]
    single = forced_schema(read_tools({"tools": [WEATHER], "tool_choice": "required",
                                       "parallel_tool_calls": False}))
    assert single is not None and single["maxItems"] == 1
    assert forced_schema(read_tools({"tools": [WEATHER]})) is None
    with pytest.raises(ValueError, match="complete JSON"):
        forced_calls(required, '[{"name": "get_ti')
