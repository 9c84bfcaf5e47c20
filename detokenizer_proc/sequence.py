"""One request's detokenization state: a sequence per sample index, text deltas out.

`RequestState.add(index, tokens, ...)` turns one TokenBatch row into the RequestOutput to send
(or None while there is nothing to send yet). The DetokInfo the tokenizer process
wrote (see tokenizer_proc/prepare.py) travels with the request's first TokenBatch row.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tessera.bus.messages import DetokInfo, RequestOutput
from tessera.detokenizer_proc.incremental import IncrementalDecoder
from tessera.detokenizer_proc.stops import StopStrings
from tessera.formats.tokenizer import ModelTokenizer

_NO_LOGPROBS = np.zeros(0, np.float32)
# Shared empty arrays for outputs without logprobs (the dataclass defaults allocate each time).
_NO_EXTRA: dict[str, Any] = {"logprobs": _NO_LOGPROBS, "top_ids": np.zeros(0, np.int32),
                             "top_logprobs": _NO_LOGPROBS}


@dataclass
class Logprobs:
    """Per-token logprob rows of one TokenBatch row, for a request that asked for them."""

    logprobs: np.ndarray
    top_ids: np.ndarray
    top_logprobs: np.ndarray

    def head(self, n: int) -> Logprobs:
        return Logprobs(self.logprobs[:n], self.top_ids[:n], self.top_logprobs[:n])

    @classmethod
    def rows(cls, batch: Any, start: int, count: int, top_k: int | None) -> Logprobs | None:
        """This request's rows of a TokenBatch's logprob arrays, exactly `top_k` alternatives
        wide (the batch pads every row to the largest k asked in that step; a narrower batch
        is padded with id -1 / -inf, so rows of different steps always line up)."""
        if top_k is None:
            return None
        end = start + count
        if batch.logprobs.shape[0] < end:
            return cls(_NO_LOGPROBS, np.zeros((0, top_k), np.int32),  # none were sent
                       np.zeros((0, top_k), np.float32))
        top_ids = np.full((count, top_k), -1, np.int32)
        top_lp = np.full((count, top_k), -np.inf, np.float32)
        if batch.top_ids.ndim == 2 and batch.top_ids.shape[0] >= end:
            width = min(top_k, batch.top_ids.shape[1])
            top_ids[:, :width] = batch.top_ids[start:end, :width]
            top_lp[:, :width] = batch.top_logprobs[start:end, :width]
        return cls(batch.logprobs[start:end], top_ids, top_lp)


@dataclass
class Sequence:
    decoder: IncrementalDecoder
    stops: StopStrings
    completion_tokens: int = 0
    decode_steps: int = 0  # TokenBatch rows that brought tokens (engine steps)
    finished: bool = False
    scheduler_done: bool = False  # the scheduler finished it too (else it is still running)
    # stream=False: everything since the start, sent once at the end
    text: list[str] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[Logprobs] = field(default_factory=list)
    token_texts: list[str] = field(default_factory=list)
    top_token_texts: list[list[str]] = field(default_factory=list)


class RequestState:
    def __init__(self, rid: str, detok: DetokInfo, tokenizer: ModelTokenizer) -> None:
        self.rid = rid
        self.tokenizer = tokenizer
        self.reply_to = detok.reply_to
        self.stream = detok.stream
        self.n = detok.n
        self.skip_special = detok.skip_special_tokens
        self.top_logprobs = detok.logprobs
        self.prompt_tokens = detok.prompt_tokens
        self.stop = list(detok.stop)
        # Tokens that end a sequence without being shown (EOS, stop_token_ids).
        self.hidden_stop_ids = set(detok.stop_token_ids) | set(tokenizer.eos_token_ids)
        self.seqs: dict[int, Sequence] = {}
        self.finished_count = 0
        self.told: set[int] = set()  # samples the scheduler was told to stop (take_stops)
        # prompt_logprobs: scored prompt tokens not sent yet (they go with sample 0's output)
        self.prompt: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []
        self.embedding: np.ndarray | None = None  # embed: sent with sample 0's output

    def _seq(self, index: int) -> Sequence:
        seq = self.seqs.get(index)
        if seq is None:
            seq = self.seqs[index] = Sequence(
                IncrementalDecoder(self.tokenizer, self.skip_special), StopStrings(self.stop))
        return seq

    def _token_text(self, token_id: int) -> str:
        # One token alone (logprobs): a byte-level piece of a character shows as U+FFFD,
        # padding (-1: fewer alternatives asked than the batch's widest) as "".
        if token_id < 0:
            return ""
        return self.tokenizer.decode([token_id], skip_special_tokens=False)

    @property
    def done(self) -> bool:
        return self.finished_count >= self.n

    @property
    def scheduler_running(self) -> bool:
        """Some sample ended on a stop string here while the scheduler still generates it
        and was not told yet: once the whole request is done, it must be told to abort it."""
        return any(s.finished and not s.scheduler_done and i not in self.told
                   for i, s in self.seqs.items())

    def take_stops(self) -> list[int]:
        """n > 1: samples that just ended on a stop string while the scheduler still runs
        them and other samples go on; the scheduler stops each at once (its own choice)."""
        if self.n == 1 or self.done:
            return []
        stopped = [i for i, s in self.seqs.items()
                   if s.finished and not s.scheduler_done and i not in self.told]
        self.told.update(stopped)
        return stopped

    def add_prompt(self, ids: np.ndarray, logprobs: np.ndarray, top_ids: np.ndarray,
                   top_logprobs: np.ndarray) -> None:
        self.prompt.append((ids, logprobs, top_ids, top_logprobs))

    def _take_prompt(self) -> dict[str, Any]:
        """The scored prompt tokens gathered so far, as RequestOutput fields."""
        if not self.prompt:
            return {}
        parts, self.prompt = self.prompt, []
        width = max(p[2].shape[1] if p[2].ndim == 2 else 0 for p in parts)

        def pad(a: np.ndarray, fill: float) -> np.ndarray:
            a = a.reshape(a.shape[0], -1)
            return np.pad(a, ((0, 0), (0, width - a.shape[1])), constant_values=fill)
        ids = np.concatenate([p[0] for p in parts]).astype(np.int32)
        top_ids = np.concatenate([pad(p[2], -1) for p in parts]).astype(np.int32)
        return {"prompt_token_ids": ids,
                "prompt_logprobs": np.concatenate([p[1] for p in parts]).astype(np.float32),
                "prompt_top_ids": top_ids,
                "prompt_top_logprobs": np.concatenate(
                    [pad(p[3], -np.inf) for p in parts]).astype(np.float32),
                "prompt_token_texts": [self._token_text(t) for t in ids.tolist()],
                "prompt_top_token_texts": [[self._token_text(t) for t in row]
                                           for row in top_ids.tolist()]}

    def add(self, index: int, tokens: list[int], finish: str | None, matched_stop: Any,
            cached_tokens: int, logprobs: Logprobs | None) -> RequestOutput | None:
        """The output to send for one TokenBatch row (None: nothing to send yet)."""
        seq = self._seq(index)
        if seq.finished:
            return None  # rows already in flight when a stop string ended it
        if tokens:
            seq.decode_steps += 1
        pieces: list[str] = []
        used = 0
        last = len(tokens) - 1
        for k, token in enumerate(tokens):
            used = k + 1
            if k == last and finish == "stop" and (
                    token == matched_stop or token in self.hidden_stop_ids):
                # the EOS / stop token: counted as generated, never shown
                break
            pieces.append(seq.stops.feed(seq.decoder.step(token)))
            if seq.stops.matched is not None:
                break
        seq.scheduler_done = finish is not None
        if seq.stops.matched is not None:
            finish = "stop"
        elif finish is not None:
            pieces.append(seq.stops.feed(seq.decoder.flush()))
            if seq.stops.matched is not None:
                finish = "stop"
            pieces.append(seq.stops.flush())
        seq.completion_tokens += used
        if finish is not None:
            seq.finished = True
            self.finished_count += 1
        new_ids = tokens[:used]
        text = "".join(pieces)
        probs = logprobs.head(used) if logprobs is not None else None
        texts: list[str] = []
        top_texts: list[list[str]] = []
        if probs is not None:
            texts = [self._token_text(t) for t in new_ids]
            top_texts = [[self._token_text(t) for t in row] for row in probs.top_ids.tolist()]
        if not self.stream:
            seq.text.append(text)
            seq.token_ids += new_ids
            if probs is not None:
                seq.logprobs.append(probs)
                seq.token_texts += texts
                seq.top_token_texts += top_texts
            if finish is None:
                return None
            text, new_ids = "".join(seq.text), seq.token_ids
            texts, top_texts = seq.token_texts, seq.top_token_texts
            if seq.logprobs:
                probs = Logprobs(*(np.concatenate([getattr(p, name) for p in seq.logprobs])
                                   for name in ("logprobs", "top_ids", "top_logprobs")))
        elif finish is None and not text and not new_ids and not (
                index == 0 and (self.prompt or self.embedding is not None)):
            return None
        extra = _NO_EXTRA if probs is None else {
            "logprobs": probs.logprobs, "top_ids": probs.top_ids,
            "top_logprobs": probs.top_logprobs, "token_texts": texts,
            "top_token_texts": top_texts}
        if index == 0 and self.prompt:
            extra = {**extra, **self._take_prompt()}
        if index == 0 and self.embedding is not None:
            extra = {**extra, "embedding": self.embedding}
            self.embedding = None
        return RequestOutput(
            rid=self.rid, index=index, text=text, token_ids=np.array(new_ids, np.int32),
            finish_reason=finish, prompt_tokens=self.prompt_tokens,
            completion_tokens=seq.completion_tokens, cached_tokens=cached_tokens,
            decode_steps=seq.decode_steps, **extra)
