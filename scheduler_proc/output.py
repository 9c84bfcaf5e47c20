"""Collect what the detokenizer must hear into one TokenBatch per step.

Entries come in two kinds: a block of sampled tokens (one per sequence, or several with
speculative decoding, built from arrays) and finish-only entries (aborts: no token). The first
time a rid appears, its `DetokInfo` rides along in `new_requests`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tessera.bus.messages import DetokInfo, TokenBatch
from tessera.scheduler_proc.request import Request


class OutputBuilder:
    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        self.rids: list[str] = []
        self.indices: list[int] = []
        self.counts: list[np.ndarray] = []
        self.tokens: list[np.ndarray] = []
        self.finish: list[str | None] = []
        self.prompt_tokens: list[int] = []
        self.cached_tokens: list[int] = []
        self.matched_stop: list[int | None] = []
        self.new_requests: dict[str, DetokInfo] = {}
        self.logprobs: list[np.ndarray] = []
        self.top_ids: list[np.ndarray] = []
        self.top_logprobs: list[np.ndarray] = []
        self.prompt_rids: list[str] = []
        self.prompt_parts: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []
        self.embedding_rids: list[str] = []
        self.embeddings: list[np.ndarray] = []

    def __bool__(self) -> bool:
        return bool(self.rids) or bool(self.prompt_rids) or bool(self.embedding_rids)

    def _announce(self, reqs: list[Request]) -> None:
        for req in reqs:
            if not req.announced:
                req.announced = True
                self.new_requests[req.rid] = req.detok

    def add_tokens(self, rids: list[str], indices: list[int], fresh: list[Request],
                   tokens: np.ndarray, finish: list[str | None], matched: list[int | None],
                   prompt_tokens: list[int], cached_tokens: list[int],
                   logprobs: tuple[np.ndarray, np.ndarray, np.ndarray] | None,
                   counts: np.ndarray | None = None) -> None:
        """One token for each of len(rids) entries (counts[i] for entry i when given:
        speculative decoding); `fresh`: requests among them that may not have been
        announced yet."""
        self._announce(fresh)
        self.rids.extend(rids)
        self.indices.extend(indices)
        self.counts.append(np.ones(len(rids), dtype=np.int32) if counts is None else counts)
        self.tokens.append(tokens.astype(np.int32, copy=False))
        self.finish.extend(finish)
        self.matched_stop.extend(matched)
        self.prompt_tokens.extend(prompt_tokens)
        self.cached_tokens.extend(cached_tokens)
        if logprobs is not None:
            self.logprobs.append(logprobs[0])
            self.top_ids.append(logprobs[1])
            self.top_logprobs.append(logprobs[2])

    def add_prompt(self, req: Request, ids: np.ndarray, logprobs: np.ndarray,
                   top_ids: np.ndarray, top_logprobs: np.ndarray) -> None:
        """Prompt tokens of a request scoring its prompt, with their logprobs."""
        self._announce([req])
        self.prompt_rids.append(req.rid)
        self.prompt_parts.append((ids, logprobs, top_ids, top_logprobs))

    def add_embedding(self, req: Request, vector: np.ndarray) -> None:
        self._announce([req])
        self.embedding_rids.append(req.rid)
        self.embeddings.append(vector)

    def add_finish(self, req: Request, index: int, reason: str, cached_tokens: int) -> None:
        """A finish without a token (abort)."""
        self._announce([req])
        self.rids.append(req.rid)
        self.indices.append(index)
        self.counts.append(np.zeros(1, dtype=np.int32))
        self.finish.append(reason)
        self.matched_stop.append(None)
        self.prompt_tokens.append(req.prompt_len)
        self.cached_tokens.append(max(cached_tokens, 0))

    def _prompt_fields(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.prompt_rids:
            out.update(prompt_rids=self.prompt_rids, **_prompt_arrays(self.prompt_parts))
        if self.embedding_rids:
            out.update(embedding_rids=self.embedding_rids,
                       embeddings=np.stack(self.embeddings).astype(np.float32))
        return out

    def take(self) -> TokenBatch | None:
        if not self.rids and not self.prompt_rids and not self.embedding_rids:
            return None
        i32 = np.int32
        batch = TokenBatch(
            rids=self.rids, indices=self.indices,
            counts=np.concatenate(self.counts) if self.counts else np.zeros(0, i32),
            token_ids=np.concatenate(self.tokens) if self.tokens else np.zeros(0, i32),
            finish=self.finish, prompt_tokens=self.prompt_tokens,
            cached_tokens=self.cached_tokens, new_requests=self.new_requests,
            matched_stop=self.matched_stop,
            logprobs=_cat(self.logprobs, np.float32),
            top_ids=_cat(self.top_ids, np.int32),
            top_logprobs=_cat(self.top_logprobs, np.float32),
            **self._prompt_fields(),
        )
        self._reset()
        return batch


def _prompt_arrays(parts: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]
                   ) -> dict[str, np.ndarray]:
    if not parts:
        return {}
    return {"prompt_counts": np.array([p[0].shape[0] for p in parts], dtype=np.int32),
            "prompt_token_ids": _cat([p[0] for p in parts], np.int32),
            "prompt_logprobs": _cat([p[1] for p in parts], np.float32),
            "prompt_top_ids": _cat([p[2] for p in parts], np.int32),
            "prompt_top_logprobs": _cat([p[3] for p in parts], np.float32)}


def _cat(parts: list[np.ndarray], dtype: type) -> np.ndarray:
    if not parts:
        return np.zeros(0, dtype=dtype)
    if len(parts) == 1:
        return parts[0]
    if parts[0].ndim == 2:  # top-N: pad to the widest N
        width = max(p.shape[1] for p in parts)
        fill = -1 if dtype is np.int32 else -np.inf
        parts = [np.pad(p, ((0, 0), (0, width - p.shape[1])), constant_values=fill)
                 for p in parts]
    return np.concatenate(parts).astype(dtype, copy=False)
