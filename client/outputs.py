"""What a generation returns: streamed `Delta`s, or one `GenerateResult` with every choice.

The engine sends one `RequestOutput` per (request, sample index) each time new text is ready;
`delta_from_output` turns it into a `Delta`, and `ResultBuilder` folds deltas into the final
result (what `generate(stream=False)` returns).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tessera.bus.messages import RequestOutput


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    decode_steps: int = 0  # engine steps that gave the completion tokens

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    @property
    def tokens_per_step(self) -> float:
        """Completion tokens per engine step: the mean acceptance length under speculative
        decoding (accepted proposals + 1 per step), 1.0 without (0.0: unknown)."""
        return self.completion_tokens / self.decode_steps if self.decode_steps else 0.0


@dataclass(frozen=True)
class TopLogprob:
    token_id: int
    token: str
    logprob: float


@dataclass(frozen=True)
class TokenLogprob:
    """The sampled token's log-probability and the top alternatives (best first)."""

    token_id: int
    token: str
    logprob: float
    top: tuple[TopLogprob, ...] = ()


@dataclass(frozen=True)
class Delta:
    """New output of one choice since the previous delta. `finish_reason` ("stop", "length",
    "abort") and `usage` are set on the last delta of that choice."""

    rid: str
    index: int
    text: str
    token_ids: tuple[int, ...]
    finish_reason: str | None = None
    usage: Usage | None = None
    logprobs: tuple[TokenLogprob, ...] | None = None
    # prompt_logprobs asked: every prompt token with its logprob (None for the first), once
    prompt_logprobs: tuple[PromptLogprob, ...] | None = None
    embedding: tuple[float, ...] | None = None  # embed asked: the prompt's (not normalized)


@dataclass(frozen=True)
class PromptLogprob:
    """A prompt token's log-probability given the tokens before it (None for the first
    token of the prompt) and the top alternatives at its position."""

    token_id: int
    token: str
    logprob: float | None
    top: tuple[TopLogprob, ...] = ()


@dataclass
class Choice:
    index: int
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    logprobs: list[TokenLogprob] | None = None
    usage: Usage | None = None
    prompt_logprobs: list[PromptLogprob] | None = None
    embedding: tuple[float, ...] | None = None


@dataclass
class GenerateResult:
    rid: str
    choices: list[Choice]
    usage: Usage

    @property
    def text(self) -> str:
        """The first choice's text (the only one when n == 1)."""
        return self.choices[0].text

    @property
    def finish_reason(self) -> str | None:
        return self.choices[0].finish_reason


def _logprobs(out: RequestOutput) -> tuple[TokenLogprob, ...] | None:
    if out.logprobs.size == 0:
        return None
    ids = out.token_ids.tolist()
    texts = list(out.token_texts)
    top_texts = out.top_token_texts
    entries = []
    for i, (tid, lp) in enumerate(zip(ids, out.logprobs.tolist(), strict=False)):
        top: list[TopLogprob] = []
        if out.top_ids.ndim == 2 and i < out.top_ids.shape[0]:
            row_texts = top_texts[i] if i < len(top_texts) else []
            for j, (alt, alt_lp) in enumerate(zip(out.top_ids[i].tolist(),
                                                  out.top_logprobs[i].tolist(), strict=False)):
                if alt < 0:  # padding: this request asked for fewer alternatives
                    continue
                alt_text = row_texts[j] if j < len(row_texts) else (
                    texts[i] if alt == tid and i < len(texts) else "")
                top.append(TopLogprob(int(alt), alt_text, float(alt_lp)))
        entries.append(TokenLogprob(int(tid), texts[i] if i < len(texts) else "", float(lp),
                                    tuple(top)))
    return tuple(entries)


def _prompt_logprobs(out: RequestOutput) -> tuple[PromptLogprob, ...] | None:
    if out.prompt_token_ids.size == 0:
        return None
    texts = out.prompt_token_texts
    top_texts = out.prompt_top_token_texts
    entries = []
    for i, (tid, lp) in enumerate(zip(out.prompt_token_ids.tolist(),
                                      out.prompt_logprobs.tolist(), strict=True)):
        top = tuple(TopLogprob(int(alt), top_texts[i][j] if i < len(top_texts) else "",
                               float(alt_lp))
                    for j, (alt, alt_lp) in enumerate(zip(out.prompt_top_ids[i].tolist(),
                                                          out.prompt_top_logprobs[i].tolist(),
                                                          strict=True)) if alt >= 0) \
            if out.prompt_top_ids.ndim == 2 else ()
        entries.append(PromptLogprob(int(tid), texts[i] if i < len(texts) else "",
                                     None if lp != lp else float(lp), top))  # NaN: the first
    return tuple(entries)


def delta_from_output(out: RequestOutput) -> Delta:
    usage = None
    if out.finish_reason is not None:
        usage = Usage(out.prompt_tokens, out.completion_tokens, out.cached_tokens,
                      out.decode_steps)
    return Delta(rid=out.rid, index=out.index, text=out.text,
                 token_ids=tuple(int(t) for t in out.token_ids.tolist()),
                 finish_reason=out.finish_reason, usage=usage, logprobs=_logprobs(out),
                 prompt_logprobs=_prompt_logprobs(out),
                 embedding=tuple(out.embedding.tolist()) if out.embedding.size else None)


class ResultBuilder:
    """Folds the deltas of all n choices of one request into a GenerateResult."""

    def __init__(self, rid: str, n: int) -> None:
        self.rid = rid
        self.choices = [Choice(index=i) for i in range(n)]

    def add(self, delta: Delta) -> None:
        choice = self.choices[delta.index]
        choice.text += delta.text
        choice.token_ids.extend(delta.token_ids)
        if delta.logprobs is not None:
            choice.logprobs = (choice.logprobs or []) + list(delta.logprobs)
        if delta.prompt_logprobs is not None:
            choice.prompt_logprobs = (choice.prompt_logprobs or []) + list(delta.prompt_logprobs)
        if delta.embedding is not None:
            choice.embedding = delta.embedding
        if delta.finish_reason is not None:
            choice.finish_reason = delta.finish_reason
            choice.usage = delta.usage

    def result(self) -> GenerateResult:
        return GenerateResult(self.rid, self.choices, total_usage(self.choices))


def total_usage(choices: list[Choice]) -> Usage:
    """Usage over all choices: the prompt counts once (as OpenAI counts it), completions add."""
    usages = [c.usage for c in choices if c.usage is not None]
    if not usages:
        return Usage()
    return Usage(prompt_tokens=max(u.prompt_tokens for u in usages),
                 completion_tokens=sum(u.completion_tokens for u in usages),
                 cached_tokens=max(u.cached_tokens for u in usages),
                 decode_steps=sum(u.decode_steps for u in usages))
