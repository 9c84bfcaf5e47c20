"""A miniature scheduler for tests: drives a ModelRunner with real ForwardBatch messages and a
page table, the way scheduler_proc does, with page allocation, a prefix cache (longest
page-aligned common prefix with any earlier request) and chunked prefill. Every request is
batched with every other: prefill chunks and decodes share one forward."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tessera.bus import codec
from tessera.bus.messages import ForwardBatch, SampledTokens


@dataclass
class _Req:
    row: int
    prompt: list[int]
    max_new: int
    params: dict[str, Any]
    kv_len: int = 0  # tokens whose KV is stored
    out: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top: list[tuple[np.ndarray, np.ndarray]] = field(default_factory=list)

    @property
    def tokens(self) -> list[int]:
        return self.prompt + self.out

    @property
    def done(self) -> bool:
        return len(self.out) >= self.max_new


_DEFAULTS: dict[str, Any] = {
    "temperature": 0.0, "top_p": 1.0, "top_k": -1, "min_p": 0.0, "repetition_penalty": 1.0,
    "frequency_penalty": 0.0, "presence_penalty": 0.0, "seed": -1, "logprobs": -1,
}


class MiniScheduler:
    def __init__(self, runner: Any, *, chunk_size: int = 0, prefix_cache: bool = False,
                 through_codec: bool = True, req_to_token: np.ndarray | None = None,
                 refer_back: bool = True) -> None:
        """`refer_back` False: decodes carry their last token instead of -1 (a pipeline's
        first stage cannot know the token the last one sampled)."""
        self.runner = runner
        self.refer_back = refer_back
        cfg = runner.config
        self.page_size = cfg.page_size
        self.req_to_token = req_to_token if req_to_token is not None else np.zeros(
            (cfg.max_running_requests, runner.max_context_len), dtype=np.int32)
        self.next_page = 1  # page 0 is reserved for padding
        self.num_pages = runner.kv_plan.num_pages
        self.next_row = 0
        self.chunk_size = chunk_size
        self.prefix_cache = prefix_cache
        self.history: list[_Req] = []
        self.step_id = 0
        self.through_codec = through_codec
        self.cached_tokens = 0

    def _alloc_upto(self, req: _Req, n: int) -> None:
        """Give req slots for tokens [0, n)."""
        have = -(-req.kv_len // self.page_size) * self.page_size if req.kv_len else 0
        row = self.req_to_token[req.row]
        while have < n:
            if self.next_page >= self.num_pages:
                raise MemoryError("test KV arena full")
            page = self.next_page
            self.next_page += 1
            row[have:have + self.page_size] = np.arange(page * self.page_size,
                                                        (page + 1) * self.page_size)
            have += self.page_size

    def _match_prefix(self, req: _Req) -> None:
        best, src = 0, None
        for old in self.history:
            a, b = np.asarray(old.tokens[: old.kv_len]), np.asarray(req.prompt)
            n = min(len(a), len(b) - 1)
            diff = np.flatnonzero(a[:n] != b[:n])
            common = int(diff[0]) if diff.size else n
            common = common // self.page_size * self.page_size
            if common > best:
                best, src = common, old
        if src is not None:
            self.req_to_token[req.row, :best] = self.req_to_token[src.row, :best]
            req.kv_len = best
            self.cached_tokens += best

    def generate(self, prompts: list[list[int]], max_new: int,
                 params: list[dict[str, Any]] | None = None) -> list[_Req]:
        reqs = []
        for i, prompt in enumerate(prompts):
            req = _Req(self.next_row, list(prompt), max_new, {**_DEFAULTS, **(params[i] if
                                                                           params else {})})
            self.next_row += 1
            if self.prefix_cache:
                self._match_prefix(req)
            reqs.append(req)
        while not all(r.done for r in reqs):
            self._step([r for r in reqs if not r.done])
        self.history.extend(reqs)
        return reqs

    def prefill_logits(self, prompts: list[list[int]]) -> Any:
        """float32 logits [B, V] after each whole prompt, from one batched forward."""
        import torch

        from tessera.worker_proc.forward_inputs import build_forward_inputs

        reqs = [_Req(self.next_row + i, list(p), 1, dict(_DEFAULTS))
                for i, p in enumerate(prompts)]
        self.next_row += len(prompts)
        chunk, self.chunk_size = self.chunk_size, 0  # whole prompts: one logits row each
        try:
            batch, _, _ = self._make_batch(reqs)
        finally:
            self.chunk_size = chunk
        with torch.inference_mode():
            return self.runner.forward(build_forward_inputs(
                batch, self.req_to_token, self.runner.platform, self.runner.device))

    def _step(self, active: list[_Req]) -> None:
        batch, ext, sample = self._make_batch(active)
        if self.through_codec:  # what a worker really receives: read-only frame views
            batch = codec.decode([bytes(f) for f in codec.encode(batch)])  # type: ignore[assignment]
        result: SampledTokens = self.runner.step(batch, self.req_to_token)
        assert result.error is None, result.error
        j = 0
        for r, n, s in zip(active, ext, sample, strict=True):
            r.kv_len += int(n)
            if s:
                r.out.append(int(result.token_ids[j]))
                if result.logprobs.size:
                    r.logprobs.append(float(result.logprobs[j]))
                if result.top_ids.size:
                    r.top.append((result.top_ids[j].copy(), result.top_logprobs[j].copy()))
                j += 1
        assert j == result.token_ids.shape[0]

    def _make_batch(self, active: list[_Req]) -> tuple[ForwardBatch, np.ndarray, list[int]]:
        ids: list[np.ndarray] = []
        extend, sample = [], []
        budget = self.chunk_size or 1 << 30
        for r in active:
            pending = len(r.prompt) - r.kv_len
            if pending > 0:
                n = min(pending, max(budget, 1))
                budget -= n
                chunk = np.asarray(r.prompt[r.kv_len:r.kv_len + n], dtype=np.int32)
                ids.append(chunk)
                extend.append(n)
                sample.append(1 if r.kv_len + n == len(r.prompt) else 0)
            else:
                # A decode: "-1" means "the token you sampled last for this row".
                last = -1 if self.refer_back else r.out[-1]
                ids.append(np.asarray([last], dtype=np.int32))
                extend.append(1)
                sample.append(1)
        ext = np.asarray(extend, dtype=np.int32)
        for r, n in zip(active, ext, strict=True):
            self._alloc_upto(r, r.kv_len + int(n))
        seq = np.asarray([r.kv_len for r in active], dtype=np.int32) + ext
        p = {k: np.asarray([r.params[k] for r in active]) for k in _DEFAULTS}
        hist_ids = np.concatenate([np.asarray(r.tokens, np.int32) for r in active])
        hist_off = np.concatenate([[0], np.cumsum([len(r.tokens) for r in active])])
        batch = ForwardBatch(
            step=self.step_id, rows=np.asarray([r.row for r in active], np.int32),
            seq_lens=seq, extend_lens=ext, input_ids=np.concatenate(ids),
            sample=np.asarray(sample, np.uint8),
            output_lens=np.asarray([len(r.out) for r in active], np.int32),
            temperature=p["temperature"].astype(np.float32), top_p=p["top_p"].astype(np.float32),
            top_k=p["top_k"].astype(np.int32), min_p=p["min_p"].astype(np.float32),
            repetition_penalty=p["repetition_penalty"].astype(np.float32),
            frequency_penalty=p["frequency_penalty"].astype(np.float32),
            presence_penalty=p["presence_penalty"].astype(np.float32),
            seeds=p["seed"].astype(np.int64), logprobs=p["logprobs"].astype(np.int32),
            block_offsets=np.zeros(len(active) + 1, np.int32),
            hist_offsets=hist_off.astype(np.int32), hist_ids=hist_ids,
            hist_prompt_lens=np.asarray([len(r.prompt) for r in active], np.int32),
            is_decode=bool((ext == 1).all() and all(r.kv_len >= len(r.prompt) for r in active)),
        )
        self.step_id += 1
        return batch, ext, sample
