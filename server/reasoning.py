"""Reasoning models: the thinking between `<think>` and `</think>` goes to `reasoning_content`.

    --reasoning-parser qwen3        the model writes `<think>` itself when it thinks; an answer
                                    without it has no reasoning (thinking switched off)
    --reasoning-parser deepseek-r1  the chat template opens `<think>` in the prompt: everything
                                    before `</think>` is reasoning, even without `<think>`

A response cut before `</think>` is all reasoning. `split` parses a whole text; `ReasoningStream`
does the same over streamed deltas, holding back only the characters that may begin a tag.
"""

from __future__ import annotations

from dataclasses import dataclass

START, END = "<think>", "</think>"
PARSERS = ("qwen3", "deepseek-r1")


@dataclass(frozen=True)
class ReasoningSplit:
    reasoning: str | None
    content: str | None


def _held(text: str, tag: str) -> int:
    """How many trailing characters of `text` could be the beginning of `tag`."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-n:]):
            return n
    return 0


class ReasoningParser:
    def __init__(self, name: str) -> None:
        if name not in PARSERS:
            raise ValueError(f"unknown reasoning parser {name!r}; choose one of "
                             f"{', '.join(PARSERS)}")
        self.name = name
        # deepseek-r1's template has already opened the thinking block.
        self.starts_thinking = name == "deepseek-r1"

    def split(self, text: str) -> ReasoningSplit:
        stream = self.stream()
        first = stream.feed(text)
        last = stream.finish()
        reasoning = first.reasoning + last.reasoning
        content = first.content + last.content
        return ReasoningSplit(reasoning if stream.saw_reasoning else None,
                              content if content or not stream.saw_reasoning else None)

    def stream(self) -> ReasoningStream:
        return ReasoningStream(self.starts_thinking)


@dataclass
class StreamPiece:
    reasoning: str = ""
    content: str = ""


class ReasoningStream:
    """Text deltas in, (reasoning, content) deltas out.

    States: `opening` (at the start of the answer: leading whitespace and a `<think>` tag may
    come), `thinking` (until `</think>`), `after_think` (blank lines after `</think>`, dropped),
    `answering` (everything else is content).
    """

    def __init__(self, starts_thinking: bool) -> None:
        self.state = "opening"
        self.pending = ""
        self.starts_thinking = starts_thinking
        self.saw_reasoning = starts_thinking

    def feed(self, delta: str) -> StreamPiece:
        out = StreamPiece()
        text = self.pending + delta
        self.pending = ""
        while text:
            if self.state == "opening":
                stripped = text.lstrip()
                if stripped.startswith(START):
                    self.state, self.saw_reasoning = "thinking", True
                    text = stripped[len(START):]
                elif not stripped or START.startswith(stripped) or (
                        not self.starts_thinking and END.startswith(stripped)):
                    self.pending = text  # may still become `<think>`
                    return out
                elif self.starts_thinking:
                    self.state = "thinking"
                elif stripped.startswith(END):
                    # `</think>` first: the template opened the block (a deepseek-style
                    # template under the qwen3 parser); nothing was thought in the output.
                    self.state, self.saw_reasoning = "after_think", True
                    text = stripped[len(END):]
                else:
                    self.state = "answering"
            elif self.state == "thinking":
                end = text.find(END)
                if end < 0:
                    keep = _held(text, END)
                    out.reasoning += text[:len(text) - keep]
                    self.pending = text[len(text) - keep:]
                    return out
                out.reasoning += text[:end]
                # The answer after `</think>` usually starts with blank lines: not content.
                self.state = "after_think"
                text = text[end + len(END):]
            elif self.state == "after_think":
                text = text.lstrip("\n")
                if text:
                    self.state = "answering"
            else:
                out.content += text
                text = ""
        return out

    def finish(self) -> StreamPiece:
        """Flush what was held back (a partial tag that never completed)."""
        text, self.pending = self.pending, ""
        if self.state == "thinking" or (self.state == "opening" and self.starts_thinking):
            return StreamPiece(reasoning=text)
        return StreamPiece(content=text)
