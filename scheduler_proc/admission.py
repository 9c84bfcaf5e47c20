"""Admission: accept a TokenizedRequest into the queue, or say clearly why not.

A request is refused here, never later, when it cannot possibly complete. This is the one
place that judges whether a prompt plus max_tokens fits: the tokenizer bounds only the work a
request may cost before it is tokenized.
  400  empty prompt, token ids outside the vocabulary, a rid already in use
  413  prompt + max_tokens longer than the model's context
  503  prompt + max_tokens needs more KV pages than the whole pool (it could never run), or the
       queue is full (retry later)
`max_tokens=None` means "until the context is full"; where the KV pool is smaller than the
context, it means "until the pool is full", so such a request always fits.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tessera.bus.messages import ErrorReply, TokenizedRequest
from tessera.scheduler_proc.config import SchedulerConfig
from tessera.scheduler_proc.request import Request, Sequence


@dataclass(frozen=True)
class Limits:
    config: SchedulerConfig
    total_pages: int  # usable KV pages (page 0 excluded)

    def check(self, req: TokenizedRequest, ids: np.ndarray, queued: int, known: bool
              ) -> tuple[int, str, str | None] | None:
        """(status, message, param) if the request must be refused, else None."""
        c = self.config
        n = int(ids.shape[0])
        sp = req.sampling
        if known:
            return 400, f"request id {req.rid!r} is already in use; use a unique id", "rid"
        if n == 0:
            return 400, "the prompt is empty: send at least one token", "prompt"
        if c.vocab_size > 0 and (int(ids.min()) < 0 or int(ids.max()) >= c.vocab_size):
            return (400, f"token ids must be in [0, {c.vocab_size}); got ids from "
                    f"{int(ids.min())} to {int(ids.max())}", "input_ids")
        if c.vocab_size > 0 and sp.logit_bias and \
                max(t for t, _ in sp.logit_bias) >= c.vocab_size:
            return (400, f"logit_bias names token {max(t for t, _ in sp.logit_bias)}, outside "
                    f"the vocabulary [0, {c.vocab_size})", "logit_bias")
        if queued >= c.max_queued_requests:
            return (503, f"the server has {queued} requests waiting (max_queued_requests="
                    f"{c.max_queued_requests}); retry later", None)
        ctx = c.max_context_len
        if sp.max_tokens is not None and n + sp.max_tokens > ctx:
            return (413, f"the prompt has {n} tokens and max_tokens is {sp.max_tokens}: "
                    f"{n + sp.max_tokens} tokens, more than the model's context length of "
                    f"{ctx}; shorten the prompt or lower max_tokens", "max_tokens")
        if sp.max_tokens is None and n >= ctx:
            return (413, f"the prompt has {n} tokens, which fills the model's context length "
                    f"of {ctx} and leaves no room for output; shorten the prompt", "prompt")
        pool = self.total_pages * c.page_size
        need = n + (sp.max_tokens if sp.max_tokens is not None else 1)
        if -(-need // c.page_size) > self.total_pages:
            return (503, f"the prompt ({n} tokens) plus max_tokens needs {need} KV cache "
                    f"slots but the whole KV cache holds {pool}; lower max_tokens or shorten "
                    f"the prompt, or start the engine with more KV memory (--mem-fraction, "
                    f"--max-total-tokens)", "max_tokens")
        return None

    def max_total(self, prompt_len: int, max_tokens: int | None) -> int:
        """Tokens (prompt + output) after which the request finishes with "length"."""
        if max_tokens is not None:
            return prompt_len + max_tokens
        pool = self.total_pages * self.config.page_size
        return min(self.config.max_context_len, pool)


def refuse(req: TokenizedRequest, status: int, message: str, param: str | None) -> ErrorReply:
    return ErrorReply(rid=req.rid, status=status, message=message,
                      error_type="invalid_request_error" if status < 500 else "server_error",
                      param=param, reply_to=req.detok.reply_to)


def make_request(req: TokenizedRequest, ids: np.ndarray, order: int, max_total: int,
                 eos_ids: tuple[int, ...]) -> Request:
    sp = req.sampling
    stop_ids = frozenset(int(t) for t in sp.stop_token_ids)
    blocked = set(stop_ids) if sp.ignore_eos else set(stop_ids) | set(eos_ids)
    request = Request(
        rid=req.rid, prompt=ids, sampling=sp, detok=req.detok, priority=int(req.priority),
        order=order, arrival_time=req.arrival_time, max_total=max_total,
        block_ids=np.asarray(sorted(blocked), dtype=np.int32), stop_ids=stop_ids)
    if sp.logit_bias:
        request.bias_ids = np.array([t for t, _ in sp.logit_bias], dtype=np.int32)
        request.bias_values = np.array([b for _, b in sp.logit_bias], dtype=np.float32)
    request.seqs = [Sequence(request, i, ids) for i in range(max(1, sp.n))]
    request.live = len(request.seqs)
    request.fork_pending = request.seqs[1:]
    return request
