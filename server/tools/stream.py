"""Tool calls out of streamed text: content deltas pass through until the tool-call region
starts; from there each call is emitted once it is complete.

The text that might begin a region marker is held back (a few characters), so a client never
sees half a `<tool_call>` tag as content. At the end, a region with no readable call is
given back as content, as the non-streaming parser does.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tessera.server.tools.parsers import ParsedCall, ToolParser


@dataclass
class StreamEvents:
    content: str = ""
    calls: list[ParsedCall] = field(default_factory=list)


class ToolCallStream:
    def __init__(self, parser: ToolParser) -> None:
        self.parser = parser
        self.text = ""
        self.sent = 0  # characters of content already emitted
        self.region: int | None = None
        self.emitted = 0  # calls already emitted

    def feed(self, delta: str) -> StreamEvents:
        self.text += delta
        return self._advance(final=False)

    def finish(self) -> StreamEvents:
        return self._advance(final=True)

    @property
    def called(self) -> bool:
        return self.emitted > 0

    def _advance(self, final: bool) -> StreamEvents:
        out = StreamEvents()
        if self.region is None and self.parser.start_only and self.text[:self.sent].strip():
            out.content = self.text[self.sent:]  # an answer, not a call
            self.sent = len(self.text)
            return out
        if self.region is None:
            self.region = self.parser.region_start(self.text[self.sent:], final)
            if self.region is not None:
                self.region += self.sent
            else:
                upto = len(self.text) if final else \
                    self.sent + self.parser.safe_prefix(self.text[self.sent:])
                out.content = self.text[self.sent:upto]
                self.sent = upto
                return out
            out.content = self.text[self.sent:self.region]
            self.sent = self.region
        found = self.parser.calls(self.text[self.region:], final).calls
        out.calls = found[self.emitted:]
        self.emitted = len(found)
        if final and not found:
            out.content += self.text[self.region:]  # not a call after all
        return out
