"""The reasoning parsers on whole texts and on every way of cutting them into deltas."""

from __future__ import annotations

import pytest

from tessera.server.reasoning import ReasoningParser, ReasoningSplit


def _streamed(parser: ReasoningParser, text: str, cuts: list[int]) -> tuple[str, str]:
    stream = parser.stream()
    reasoning = content = ""
    last = 0
    for cut in [*cuts, len(text)]:
        piece = stream.feed(text[last:cut])
        reasoning, content, last = reasoning + piece.reasoning, content + piece.content, cut
    piece = stream.finish()
    return reasoning + piece.reasoning, content + piece.content


CASES = [
    ("qwen3", "<think>\nplan it\n</think>\n\nThe answer.", ReasoningSplit("\nplan it\n",
                                                                          "The answer.")),
    ("qwen3", "Just an answer, <think> inside is text.",
     ReasoningSplit(None, "Just an answer, <think> inside is text.")),
    ("qwen3", "<think>cut off while thinking", ReasoningSplit("cut off while thinking", None)),
    ("qwen3", "<think></think>\n\nno thoughts", ReasoningSplit("", "no thoughts")),
    ("qwen3", "</think>\n\nafter a template-opened block", ReasoningSplit(
        "", "after a template-opened block")),
    ("deepseek-r1", "step 1, step 2</think>\n\n42", ReasoningSplit("step 1, step 2", "42")),
    ("deepseek-r1", "<think>step</think>42", ReasoningSplit("step", "42")),
    ("deepseek-r1", "never closed", ReasoningSplit("never closed", None)),
    ("qwen3", "<thin", ReasoningSplit(None, "<thin")),
    ("qwen3", "a < b </thi", ReasoningSplit(None, "a < b </thi")),
]


@pytest.mark.parametrize("name,text,expected", CASES)
def test_split(name: str, text: str, expected: ReasoningSplit) -> None:
    assert ReasoningParser(name).split(text) == expected


@pytest.mark.parametrize("name,text,expected", CASES)
def test_every_two_cut_stream_matches_split(name: str, text: str,
                                            expected: ReasoningSplit) -> None:
    parser = ReasoningParser(name)
    want = (expected.reasoning or "", expected.content or "")
    for a in range(len(text) + 1):
        for b in range(a, len(text) + 1, 3):
            assert _streamed(parser, text, [a, b]) == want, (a, b)
    assert _streamed(parser, text, list(range(len(text)))) == want  # one character at a time


def test_unknown_parser_is_refused() -> None:
    with pytest.raises(ValueError, match="qwen3"):
        ReasoningParser("o1")
