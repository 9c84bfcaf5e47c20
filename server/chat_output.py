"""One chat choice's answer as OpenAI shapes it: text split into `reasoning_content` and
`content`, and tool calls read out of it, as stream deltas or as one message.

    stream = ChoiceOutput(plan)               # per choice
    deltas = stream.feed(text_delta)          # [{"content": ...}, {"tool_calls": [...]}, ...]
    deltas, finish = stream.finish("stop")    # the last deltas and the finish_reason to send
    message, finish = whole_message(plan, text, "stop")   # the non-streaming answer

Tool calls by tool_choice: "auto" parses the family's format as text streams in (each call is
sent once complete); a named function's forced answer *is* its arguments, streamed as
argument deltas; "required" buffers the forced JSON array and sends its calls at the end.
The non-streaming message is built by the same code, from one delta holding the whole text,
so both forms always agree.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from tessera.server.reasoning import ReasoningParser, ReasoningStream
from tessera.server.tools.parsers import ParsedCall, ToolParser
from tessera.server.tools.request import ToolRequest, forced_calls
from tessera.server.tools.stream import ToolCallStream


@dataclass(frozen=True)
class OutputPlan:
    tools: ToolRequest
    parser: ToolParser | None  # reads tool calls under tool_choice "auto"
    reasoning: ReasoningParser | None


def call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


class ChoiceOutput:
    def __init__(self, plan: OutputPlan) -> None:
        self.plan = plan
        tools = plan.tools
        self.reasoning: ReasoningStream | None = plan.reasoning.stream() if plan.reasoning \
            else None
        self.auto: ToolCallStream | None = None
        if tools.active and tools.choice == "auto" and plan.parser is not None:
            self.auto = ToolCallStream(plan.parser)
        self.calls = 0
        self.named_id: str | None = None
        self.buffer = ""  # tool_choice "required": the forced JSON array

    # -- deltas -------------------------------------------------------------------------------
    def feed(self, text: str) -> list[dict[str, Any]]:
        if self.reasoning is None:
            return self._content(text, final=False)
        piece = self.reasoning.feed(text)
        out = [{"reasoning_content": piece.reasoning}] if piece.reasoning else []
        return out + self._content(piece.content, final=False)

    def finish(self, finish_reason: str | None) -> tuple[list[dict[str, Any]], str | None]:
        out: list[dict[str, Any]] = []
        if self.reasoning is not None:
            piece = self.reasoning.finish()
            if piece.reasoning:
                out.append({"reasoning_content": piece.reasoning})
            out += self._content(piece.content, final=False)
        out += self._content("", final=True, finish_reason=finish_reason)
        tools = self.plan.tools
        if self.calls and finish_reason == "stop" and tools.choice != "named":
            finish_reason = "function_call" if tools.legacy else "tool_calls"
        return out, finish_reason

    def _content(self, text: str, final: bool,
                 finish_reason: str | None = None) -> list[dict[str, Any]]:
        tools = self.plan.tools
        if tools.choice == "named" and tools.active:
            if self.named_id is None and (text or final):
                self.named_id, self.calls = call_id(), 1
                return [self._call_delta(0, self.named_id, tools.named or "", text)]
            return [self._args_delta(text)] if text else []
        if tools.choice == "required" and tools.active:
            self.buffer += text
            if not final:
                return []
            try:
                calls = forced_calls(tools, self.buffer)
            except ValueError:
                # Cut off before the JSON closed (max_tokens): what was written is all there is.
                return [{"content": self.buffer}] if self.buffer else []
            return self._calls([ParsedCall(name, args) for name, args in calls])
        if self.auto is not None:
            events = self.auto.finish() if final else self.auto.feed(text)
            out = [{"content": events.content}] if events.content else []
            return out + self._calls(events.calls)
        return [{"content": text}] if text else []

    # -- tool-call deltas ---------------------------------------------------------------------
    def _calls(self, calls: list[ParsedCall]) -> list[dict[str, Any]]:
        out = []
        for call in calls:
            if self.calls and not self.plan.tools.parallel:
                break  # parallel_tool_calls false: one call at most
            out.append(self._call_delta(self.calls, call_id(), call.name, call.arguments))
            self.calls += 1
        return out

    def _call_delta(self, index: int, ident: str, name: str, arguments: str) -> dict[str, Any]:
        if self.plan.tools.legacy:
            return {"function_call": {"name": name, "arguments": arguments}}
        return {"tool_calls": [{"index": index, "id": ident, "type": "function",
                                "function": {"name": name, "arguments": arguments}}]}

    def _args_delta(self, arguments: str) -> dict[str, Any]:
        if self.plan.tools.legacy:
            return {"function_call": {"arguments": arguments}}
        return {"tool_calls": [{"index": 0, "function": {"arguments": arguments}}]}


def merge_deltas(deltas: list[dict[str, Any]]) -> dict[str, Any]:
    """The chat message the deltas add up to (content null when there is none)."""
    message: dict[str, Any] = {"role": "assistant", "content": None}
    calls: dict[int, dict[str, Any]] = {}
    for delta in deltas:
        for key in ("content", "reasoning_content"):
            if key in delta:
                message[key] = (message.get(key) or "") + delta[key]
        for call in delta.get("tool_calls", []):
            slot = calls.setdefault(call["index"], {"id": call.get("id"), "type": "function",
                                                    "function": {"name": "", "arguments": ""}})
            fn = call.get("function", {})
            slot["function"]["name"] += fn.get("name", "")
            slot["function"]["arguments"] += fn.get("arguments", "")
        if "function_call" in delta:
            fc = message.setdefault("function_call", {"name": "", "arguments": ""})
            fc["name"] += delta["function_call"].get("name", "")
            fc["arguments"] += delta["function_call"].get("arguments", "")
    if calls:
        message["tool_calls"] = [calls[i] for i in sorted(calls)]
    elif message["content"] is None and "function_call" not in message:
        message["content"] = ""  # an empty answer is empty text, not a missing one
    return message


def whole_message(plan: OutputPlan, text: str,
                  finish_reason: str | None) -> tuple[dict[str, Any], str | None]:
    output = ChoiceOutput(plan)
    deltas = output.feed(text)
    last, finish = output.finish(finish_reason)
    return merge_deltas(deltas + last), finish
