"""The tool fields of a chat request: `tools`, `tool_choice`, `parallel_tool_calls`, and the
legacy `functions` / `function_call`, read into one `ToolRequest`.

    tool_choice "none"       no tools in the prompt, no parsing
    tool_choice "auto"       tools in the prompt; the answer is parsed for calls
    tool_choice "required"   the answer is forced (grammar) to be a JSON array of calls
    {"type": "function", "function": {"name": F}}
                             the answer is forced to be F's arguments (a JSON object)

Forced answers are plain JSON whatever the model family, so they always parse; `forced_schema`
is the JSON schema the grammar engine enforces for them.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from tessera.server.errors import bad_request

_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
MAX_TOOLS = 128


@dataclass(frozen=True)
class ToolRequest:
    tools: list[dict[str, Any]]  # OpenAI tool objects, as the chat template takes them
    choice: str  # "none" | "auto" | "required" | "named"
    named: str | None = None  # the function of a named choice
    parallel: bool = True
    legacy: bool = False  # asked with `functions`: answer with `function_call`

    @property
    def active(self) -> bool:
        return self.choice != "none" and bool(self.tools)

    @property
    def forced(self) -> bool:
        return self.choice in ("required", "named")

    def function(self, name: str) -> dict[str, Any]:
        for tool in self.tools:
            if tool["function"]["name"] == name:
                return tool["function"]  # type: ignore[no-any-return]
        raise KeyError(name)


def _check_function(fn: Any, where: str, param: str) -> dict[str, Any]:
    if not isinstance(fn, dict):
        raise bad_request(f"{where} must be an object with 'name' and 'parameters'", param)
    name = fn.get("name")
    if not isinstance(name, str) or not _NAME.match(name):
        raise bad_request(f"{where}.name must be 1-64 letters, digits, '_' or '-', got "
                          f"{json.dumps(name)[:70]}", param)
    if "description" in fn and fn["description"] is not None and \
            not isinstance(fn["description"], str):
        raise bad_request(f"{where}.description must be a string", param)
    params = fn.get("parameters")
    if params is not None and not isinstance(params, dict):
        raise bad_request(f"{where}.parameters must be a JSON schema object", param)
    if "strict" in fn and fn["strict"] is not None and not isinstance(fn["strict"], bool):
        raise bad_request(f"{where}.strict must be true or false", param)
    unknown = sorted(set(fn) - {"name", "description", "parameters", "strict"})
    if unknown:
        raise bad_request(f"{where} has unknown field(s) {', '.join(unknown)}", param)
    return {k: v for k, v in fn.items() if v is not None}


def _tools(body: dict[str, Any]) -> tuple[list[dict[str, Any]], bool]:
    tools, functions = body.get("tools"), body.get("functions")
    if tools is not None and functions is not None:
        raise bad_request("give 'tools' or the legacy 'functions', not both", "functions")
    if functions is not None:
        if not isinstance(functions, list) or not functions:
            raise bad_request("'functions' must be a non-empty list of function objects",
                              "functions")
        checked = [_check_function(f, f"functions[{i}]", "functions")
                   for i, f in enumerate(functions)]
        return [{"type": "function", "function": f} for f in checked], True
    if tools is None:
        return [], False
    if not isinstance(tools, list) or not tools:
        raise bad_request("'tools' must be a non-empty list of {\"type\": \"function\", "
                          "\"function\": {...}} objects", "tools")
    out: list[dict[str, Any]] = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict) or tool.get("type") != "function":
            raise bad_request(f"tools[{i}] must be {{\"type\": \"function\", \"function\": "
                              f"{{...}}}}; only function tools are supported", "tools")
        unknown = sorted(set(tool) - {"type", "function"})
        if unknown:
            raise bad_request(f"tools[{i}] has unknown field(s) {', '.join(unknown)}", "tools")
        out.append({"type": "function",
                    "function": _check_function(tool.get("function"), f"tools[{i}].function",
                                                "tools")})
    if len(out) > MAX_TOOLS:
        raise bad_request(f"at most {MAX_TOOLS} tools per request, got {len(out)}", "tools")
    names = [t["function"]["name"] for t in out]
    if len(set(names)) != len(names):
        raise bad_request("two tools have the same function name", "tools")
    return out, False


def read_tools(body: dict[str, Any]) -> ToolRequest:
    tools, legacy = _tools(body)
    param = "function_call" if legacy else "tool_choice"
    raw = body.get(param)
    other = body.get("tool_choice" if legacy else "function_call")
    if other is not None:
        raise bad_request("'function_call' goes with 'functions' and 'tool_choice' with "
                          "'tools'", "function_call" if legacy else "tool_choice")
    parallel = body.get("parallel_tool_calls")
    if parallel is not None and not isinstance(parallel, bool):
        raise bad_request("'parallel_tool_calls' must be true or false", "parallel_tool_calls")
    parallel = (not legacy) if parallel is None else parallel
    if raw is None:
        return ToolRequest(tools, "auto" if tools else "none", parallel=parallel, legacy=legacy)
    if not tools and raw != "none":
        raise bad_request(f"'{param}' needs '{'functions' if legacy else 'tools'}'", param)
    if raw in ("none", "auto") or (raw == "required" and not legacy):
        return ToolRequest(tools, raw, parallel=parallel, legacy=legacy)
    name = None
    if legacy and isinstance(raw, dict):
        name = raw.get("name")
    elif isinstance(raw, dict) and raw.get("type") == "function" and \
            isinstance(raw.get("function"), dict):
        name = raw["function"].get("name")
    if not isinstance(name, str):
        allowed = ('"none", "auto" or {"name": ...}' if legacy else
                   '"none", "auto", "required" or {"type": "function", "function": '
                   '{"name": ...}}')
        raise bad_request(f"'{param}' must be {allowed}", param)
    if name not in {t["function"]["name"] for t in tools}:
        raise bad_request(f"'{param}' names the function {name!r}, which is not among the "
                          f"tools", param)
    return ToolRequest(tools, "named", named=name, parallel=parallel, legacy=legacy)


def _parameters(fn: dict[str, Any]) -> dict[str, Any]:
    return fn.get("parameters") or {"type": "object", "properties": {}}


def forced_schema(req: ToolRequest) -> dict[str, Any] | None:
    """The JSON schema a forced answer must follow (None when nothing is forced)."""
    if req.choice == "named":
        assert req.named is not None
        return _parameters(req.function(req.named))
    if req.choice != "required":
        return None
    calls = [{"type": "object",
              "properties": {"name": {"type": "string", "enum": [t["function"]["name"]]},
                             "parameters": _parameters(t["function"])},
              "required": ["name", "parameters"]} for t in req.tools]
    array: dict[str, Any] = {"type": "array", "minItems": 1,
                             "items": calls[0] if len(calls) == 1 else {"anyOf": calls}}
    if not req.parallel:
        array["maxItems"] = 1
    return array


def forced_calls(req: ToolRequest, text: str) -> list[tuple[str, str]]:
    """(name, arguments JSON) of each call in a forced answer; ValueError when the text is
    not what the grammar enforced (a response cut by max_tokens)."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"the forced tool call is not complete JSON ({exc})") from None
    if req.choice == "named":
        assert req.named is not None
        return [(req.named, json.dumps(value, ensure_ascii=False))]
    if not isinstance(value, list):
        raise ValueError("the forced tool calls are not a JSON array")
    return [(c["name"], json.dumps(c["parameters"], ensure_ascii=False)) for c in value
            if isinstance(c, dict) and isinstance(c.get("name"), str) and "parameters" in c]
