"""Tools in the prompt: what the chat template is given for a request with `tools` or with
tool-call turns in its history.

A template that renders tools itself gets them as the `tools` variable (as transformers
passes them), with each earlier call's arguments as an object, the form templates expect.
For a template that knows nothing of tools (the default model's), the conversation is
rewritten the way Qwen 2.5's template writes it: the tools are described in the system
message in the Hermes format, earlier calls become `<tool_call>` blocks in the assistant's
text and tool results `<tool_response>` blocks in a user turn, so the model sees every turn
and the server's Hermes parser reads its calls.
"""

from __future__ import annotations

import json
from typing import Any

from tessera.formats.chat_template import template_knows_tools

HERMES_SYSTEM = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
    "{tools}\n</tools>\n\nFor each function call, return a json object with function name "
    "and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{{"name": <function-name>, "arguments": <args-json-object>}}\n</tool_call>')


def _arguments_object(arguments: Any) -> Any:
    if isinstance(arguments, str):
        try:
            return json.loads(arguments)
        except json.JSONDecodeError:
            return arguments  # not JSON: the template shows it as it came
    return arguments


def _calls(message: dict[str, Any]) -> list[dict[str, Any]]:
    calls = message.get("tool_calls")
    return calls if isinstance(calls, list) else []


def template_inputs(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
                    template: str | None) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """(messages, extra template variables) for the chat template `template`."""
    has_tool_turns = any(_calls(m) or m.get("role") == "tool" for m in messages)
    if not tools and not has_tool_turns:
        return messages, {}
    if template_knows_tools(template):
        out = []
        for m in messages:
            if _calls(m):
                m = {**m, "tool_calls": [
                    {**c, "function": {**c["function"],
                                       "arguments": _arguments_object(
                                           c["function"].get("arguments"))}}
                    if isinstance(c, dict) and isinstance(c.get("function"), dict) else c
                    for c in _calls(m)]}
            out.append(m)
        return out, ({"tools": tools} if tools else {})
    return _hermes_messages(messages, tools), {}


def _hermes_messages(messages: list[dict[str, Any]],
                     tools: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for m in messages:
        role = m.get("role")
        if role == "assistant" and _calls(m):
            blocks = [m.get("content") or ""] if m.get("content") else []
            for call in _calls(m):
                fn = call.get("function", {}) if isinstance(call, dict) else {}
                blocks.append("<tool_call>\n" + json.dumps(
                    {"name": fn.get("name"), "arguments": _arguments_object(fn.get("arguments"))},
                    ensure_ascii=False) + "\n</tool_call>")
            out.append({"role": "assistant", "content": "\n".join(blocks)})
        elif role == "tool":
            block = f"<tool_response>\n{m.get('content') or ''}\n</tool_response>"
            if out and out[-1].get("role") == "user" and out[-1].get("_tool_results"):
                out[-1] = {**out[-1], "content": out[-1]["content"] + "\n" + block}
            else:
                out.append({"role": "user", "content": block, "_tool_results": True})
        else:
            out.append({k: v for k, v in m.items() if k not in ("tool_calls", "tool_call_id")})
    out = [{k: v for k, v in m.items() if k != "_tool_results"} for m in out]
    if tools:
        described = HERMES_SYSTEM.format(
            tools="\n".join(json.dumps(t, ensure_ascii=False) for t in tools))
        if out and out[0].get("role") == "system":
            out[0] = {**out[0], "content": f"{out[0].get('content') or ''}\n\n{described}"}
        else:
            out.insert(0, {"role": "system", "content": described})
    return out
