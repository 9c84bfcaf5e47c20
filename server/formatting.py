"""Pieces of OpenAI response bodies shared by chat and completions: usage, logprobs, and
the HTTP body reader."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from aiohttp import web

from tessera.client import Delta, PromptLogprob, TokenLogprob
from tessera.server.errors import ApiError

# Half the bus's largest message header (bus/codec.py MAX_HEADER_BYTES): whatever a body
# holds becomes at most about as many bytes of msgpack, plus the fixed fields of one request,
# so every request the server accepts can travel on the bus.
MAX_BODY_BYTES = 8 << 20


async def read_body(request: web.Request) -> bytes:
    try:
        return await request.read()
    except web.HTTPRequestEntityTooLarge:
        raise ApiError(413, f"the request body is larger than {MAX_BODY_BYTES >> 20} MiB; "
                            f"send a shorter prompt") from None


class UsageTally:
    """Usage over every choice of every prompt: each prompt counts once, completions add."""

    def __init__(self) -> None:
        self.prompt: dict[str, int] = {}
        self.cached: dict[str, int] = {}
        self.completion = 0

    def add(self, delta: Delta) -> None:
        if delta.usage is None:
            return
        self.prompt[delta.rid] = delta.usage.prompt_tokens
        self.cached[delta.rid] = delta.usage.cached_tokens
        self.completion += delta.usage.completion_tokens

    def body(self) -> dict[str, Any]:
        prompt = sum(self.prompt.values())
        return {"prompt_tokens": prompt, "completion_tokens": self.completion,
                "total_tokens": prompt + self.completion,
                "prompt_tokens_details": {"cached_tokens": sum(self.cached.values())}}


def _bytes(text: str) -> list[int]:
    return list(text.encode("utf-8", errors="replace"))


def chat_logprobs(entries: Sequence[TokenLogprob], top_n: int) -> dict[str, Any]:
    return {"content": [
        {"token": e.token, "logprob": e.logprob, "bytes": _bytes(e.token),
         "top_logprobs": [{"token": t.token, "logprob": t.logprob, "bytes": _bytes(t.token)}
                          for t in e.top[:top_n]]}
        for e in entries], "refusal": None}


def completion_logprobs(entries: Sequence[TokenLogprob | PromptLogprob], top_n: int,
                        text_offset: int) -> tuple[dict[str, Any], int]:
    """Legacy completions logprobs; returns the body and the text offset after it. A prompt
    token without a logprob (the first, under echo) shows null, as OpenAI's does."""
    tokens, token_lps, tops, offsets = [], [], [], []
    for e in entries:
        tokens.append(e.token)
        token_lps.append(e.logprob)
        tops.append({t.token: t.logprob for t in e.top[:top_n]}
                    if top_n and e.logprob is not None else None)
        offsets.append(text_offset)
        text_offset += len(e.token)
    return {"tokens": tokens, "token_logprobs": token_lps, "top_logprobs": tops,
            "text_offset": offsets}, text_offset


class ChoiceText:
    """Accumulates one choice's text, logprob entries and finish reason (non-streaming)."""

    def __init__(self) -> None:
        self.text = ""
        self.logprobs: list[TokenLogprob] = []
        self.prompt_logprobs: list[PromptLogprob] = []
        self.finish_reason: str | None = None

    def add(self, delta: Delta) -> None:
        self.text += delta.text
        if delta.logprobs:
            self.logprobs.extend(delta.logprobs)
        if delta.prompt_logprobs:
            self.prompt_logprobs.extend(delta.prompt_logprobs)
        if delta.finish_reason is not None:
            self.finish_reason = delta.finish_reason


def gather(items: Sequence[tuple[int, Delta]], tally: UsageTally) -> dict[int, ChoiceText]:
    choices: dict[int, ChoiceText] = {}
    for index, delta in items:
        choices.setdefault(index, ChoiceText()).add(delta)
        tally.add(delta)
    return dict(sorted(choices.items()))
