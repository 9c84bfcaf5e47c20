"""Tool-call parsers: find the calls in what a model wrote, in its family's own format.

    hermes       Qwen 2.5 / Qwen 3 / Hermes: <tool_call>{"name": ..., "arguments": {...}}</tool_call>
    llama3_json  Llama 3.1+: the answer is a JSON object {"name": ..., "parameters": {...}}
                 (after an optional <|python_tag|>), several separated by ';'
    mistral      Mistral: [TOOL_CALLS][{"name": ..., "arguments": {...}}, ...] (v3 tokenizers) or
                 [TOOL_CALLS]name[ARGS]{...} (v11+ tokenizers)

A parser only reads text. It says where the tool-call region starts (`region_start`), how
much of an unfinished text is surely plain content (`safe_prefix`, for streaming), and which
complete calls a region holds (`calls`). Text before the region is the message content; a
region that holds no call it can read is given back as content.
"""

from __future__ import annotations

import json
import re
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar

_DECODER = json.JSONDecoder()


@dataclass(frozen=True)
class ParsedCall:
    """One call as the model wrote it: the function name and its arguments as JSON text."""

    name: str
    arguments: str


@dataclass(frozen=True)
class RegionCalls:
    """The complete calls found in a region, and whether the region may still grow more."""

    calls: list[ParsedCall]
    complete: bool  # nothing unfinished follows the last call


def _held_suffix(text: str, markers: tuple[str, ...]) -> int:
    """How many trailing characters of `text` could begin one of `markers`."""
    held = 0
    for marker in markers:
        for n in range(min(len(marker) - 1, len(text)), held, -1):
            if marker.startswith(text[-n:]):
                held = n
                break
    return held


def _call_from_object(obj: Any, argument_keys: tuple[str, ...]) -> ParsedCall | None:
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args: Any = {}
    for key in argument_keys:
        if key in obj:
            args = obj[key]
            break
    if isinstance(args, str):  # some models write the arguments as a JSON string
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            return None
    if not isinstance(args, dict):
        return None
    return ParsedCall(obj["name"], json.dumps(args, ensure_ascii=False))


class ToolParser(ABC):
    name: ClassVar[str]
    markers: ClassVar[tuple[str, ...]]
    # Calls only open the answer: once content was written, nothing after it is a call.
    start_only: ClassVar[bool] = False

    def region_start(self, text: str, final: bool) -> int | None:
        """Index where the tool calls begin, or None (none yet)."""
        found = [i for i in (text.find(m) for m in self.markers) if i >= 0]
        return min(found) if found else None

    def safe_prefix(self, text: str) -> int:
        """Characters of `text` (which has no region yet) that are surely content."""
        return len(text) - _held_suffix(text, self.markers)

    @abstractmethod
    def calls(self, region: str, final: bool) -> RegionCalls:
        """The complete calls in `region` (which starts at the region's start)."""

    def parse(self, text: str) -> tuple[str | None, list[ParsedCall]]:
        """(content, calls) of a whole answer."""
        start = self.region_start(text, final=True)
        if start is None:
            return text, []
        found = self.calls(text[start:], final=True).calls
        if not found:
            return text, []
        content = text[:start]
        return content if content.strip() else None, found


class HermesParser(ToolParser):
    name = "hermes"
    markers = ("<tool_call>",)
    _CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)

    def calls(self, region: str, final: bool) -> RegionCalls:
        found = []
        end = 0
        for match in self._CALL.finditer(region):
            try:
                obj = json.loads(match.group(1))
            except json.JSONDecodeError:
                continue
            call = _call_from_object(obj, ("arguments", "parameters"))
            if call is not None:
                found.append(call)
            end = match.end()
        rest = region[end:]
        if final and "<tool_call>" in rest:
            # A call cut off before its closing tag (max_tokens, EOS): read it if its JSON is
            # whole, as the streaming parser would have at the end.
            tail = rest[rest.index("<tool_call>") + len("<tool_call>"):].strip()
            try:
                obj, _ = _DECODER.raw_decode(tail)
                call = _call_from_object(obj, ("arguments", "parameters"))
                if call is not None:
                    found.append(call)
            except json.JSONDecodeError:
                pass
        return RegionCalls(found, complete="<tool_call>" not in rest)


class Llama3JsonParser(ToolParser):
    name = "llama3_json"
    markers = ("<|python_tag|>", "{")
    start_only = True

    def region_start(self, text: str, final: bool) -> int | None:
        # Llama 3 calls tools with an answer that *is* the JSON (no content before it).
        stripped = text.lstrip()
        if stripped.startswith(self.markers):
            return len(text) - len(stripped)
        return None

    def safe_prefix(self, text: str) -> int:
        stripped = text.lstrip()
        if not stripped or "<|python_tag|>".startswith(stripped):
            return 0  # the answer may still turn out to be a call
        return len(text)

    def calls(self, region: str, final: bool) -> RegionCalls:
        text = region.removeprefix("<|python_tag|>") if region.startswith("<|python_tag|>") \
            else region
        found: list[ParsedCall] = []
        pos = 0
        while True:
            while pos < len(text) and text[pos] in " \t\r\n;":
                pos += 1
            if pos >= len(text):
                return RegionCalls(found, True)
            try:
                obj, pos = _DECODER.raw_decode(text, pos)
            except json.JSONDecodeError:
                return RegionCalls(found, False)
            call = _call_from_object(obj, ("parameters", "arguments"))
            if call is None:
                return RegionCalls(found, False)
            found.append(call)


class MistralParser(ToolParser):
    name = "mistral"
    markers = ("[TOOL_CALLS]",)

    def calls(self, region: str, final: bool) -> RegionCalls:
        found: list[ParsedCall] = []
        for part in region.split("[TOOL_CALLS]")[1:]:
            part = part.strip()
            if part.startswith("["):  # [{"name": ..., "arguments": ...}, ...]
                try:
                    objs, _ = _DECODER.raw_decode(part)
                except json.JSONDecodeError:
                    return RegionCalls(found, False)
                for obj in objs if isinstance(objs, list) else [objs]:
                    call = _call_from_object(obj, ("arguments", "parameters"))
                    if call is not None:
                        found.append(call)
            elif "[ARGS]" in part:  # name[ARGS]{...}
                name, _, args = part.partition("[ARGS]")
                try:
                    obj, _ = _DECODER.raw_decode(args.strip())
                except json.JSONDecodeError:
                    return RegionCalls(found, False)
                call = _call_from_object({"name": name.strip(), "arguments": obj},
                                         ("arguments",))
                if call is not None:
                    found.append(call)
            else:
                return RegionCalls(found, False)
        return RegionCalls(found, True)


PARSERS: dict[str, type[ToolParser]] = {
    cls.name: cls for cls in (HermesParser, Llama3JsonParser, MistralParser)}


def make_parser(name: str) -> ToolParser:
    cls = PARSERS.get(name)
    if cls is None:
        raise ValueError(f"unknown tool-call parser {name!r}; choose one of "
                         f"{', '.join(sorted(PARSERS))}")
    return cls()
