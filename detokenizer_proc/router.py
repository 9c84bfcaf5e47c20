"""The detokenizer's logic: TokenBatch rows in, RequestOutput deltas out to each reply_to.

It keeps one RequestState per live request (created from the detok dict that comes with the
request's first row) and forgets it when every sample has finished, when the scheduler reports
an error for it, or when its client is gone. A stop string is found here, not in the scheduler,
so when one ends a request the scheduler is told with AbortRequest(reason="stop") to free it.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable

import numpy as np

from tessera.bus.channel import SendTimeout
from tessera.bus.messages import AbortRequest, ErrorReply, Message, RequestOutput, TokenBatch
from tessera.detokenizer_proc.sequence import Logprobs, RequestState
from tessera.formats.tokenizer import ModelTokenizer

log = logging.getLogger(__name__)

# Rows can still arrive for a request we finished (steps already in flight when a stop string
# matched, the scheduler's closing "abort" row): remember that many finished rids to drop them.
_FINISHED_MEMORY = 4096


class Router:
    """Independent of sockets: `process.py` gives it two send functions (tests give lists)."""

    def __init__(self, tokenizer: ModelTokenizer, send_reply: Callable[[str, Message], None],
                 send_scheduler: Callable[[Message], None]) -> None:
        self.tokenizer = tokenizer
        self._send_reply = send_reply  # (endpoint, message) -> None, may raise SendTimeout
        self._send_scheduler = send_scheduler  # (message) -> None
        self.requests: dict[str, RequestState] = {}
        self._finished: OrderedDict[str, None] = OrderedDict()
        self.outputs_sent = 0
        self.rows_dropped = 0
        self.clients_gone = 0

    def handle(self, msgs: list[Message]) -> None:
        for msg in msgs:
            try:
                if isinstance(msg, TokenBatch):
                    self._on_batch(msg)
                elif isinstance(msg, ErrorReply):
                    self._on_error(msg)
                else:
                    log.warning("detokenizer: unexpected %s dropped", type(msg).__name__)
            except Exception:  # one bad message must not stop every other request's output
                log.exception("detokenizer: failed to handle %s", type(msg).__name__)

    # -- TokenBatch -------------------------------------------------------------------------
    def _on_batch(self, batch: TokenBatch) -> None:
        # Plain lists: per-row numpy slicing would cost more than the decoding itself.
        tokens = batch.token_ids.tolist()
        counts = batch.counts.tolist()
        n_matched, n_cached = len(batch.matched_stop), len(batch.cached_tokens)
        if batch.prompt_rids:
            self._on_prompt_scores(batch)
        for e, rid in enumerate(batch.embedding_rids):
            state = self._state(rid, batch)
            if state is not None:
                state.embedding = np.array(batch.embeddings[e], dtype=np.float32)
        start = 0
        for r, rid in enumerate(batch.rids):
            row_start, count = start, counts[r]
            start += count
            state = self.requests.get(rid)
            if state is None:
                if rid in self._finished:
                    continue
                detok = batch.new_requests.get(rid)
                if detok is None or "reply_to" not in detok:
                    self.rows_dropped += 1
                    log.warning("detokenizer: row for unknown request %s dropped", rid)
                    continue
                state = self.requests[rid] = RequestState(rid, detok, self.tokenizer)
            out = state.add(
                index=int(batch.indices[r]),
                tokens=tokens[row_start:row_start + count],
                finish=batch.finish[r],
                matched_stop=batch.matched_stop[r] if r < n_matched else None,
                cached_tokens=int(batch.cached_tokens[r]) if r < n_cached else 0,
                logprobs=Logprobs.rows(batch, row_start, count, state.top_logprobs))
            if out is not None and not self._reply(state, out):
                continue
            for index in state.take_stops():
                self._send_scheduler(AbortRequest(rid=rid, reason="stop", index=index))
            if state.done:
                self._finish(rid, abort_reason="stop" if state.scheduler_running else None)

    def _on_prompt_scores(self, batch: TokenBatch) -> None:
        """Scored prompt tokens: kept by their request until its sample 0 sends an output."""
        start = 0
        for q, rid in enumerate(batch.prompt_rids):
            count = int(batch.prompt_counts[q])
            part = slice(start, start + count)
            start += count
            state = self._state(rid, batch)
            if state is None:
                continue
            state.add_prompt(batch.prompt_token_ids[part], batch.prompt_logprobs[part],
                             batch.prompt_top_ids[part], batch.prompt_top_logprobs[part])

    def _state(self, rid: str, batch: TokenBatch) -> RequestState | None:
        state = self.requests.get(rid)
        if state is None and rid not in self._finished:
            detok = batch.new_requests.get(rid)
            if detok is not None and "reply_to" in detok:
                state = self.requests[rid] = RequestState(rid, detok, self.tokenizer)
        return state

    def _reply(self, state: RequestState, msg: RequestOutput | ErrorReply) -> bool:
        """Send to the client; False (and the request dropped) when the client is gone."""
        try:
            self._send_reply(state.reply_to, msg)
        except SendTimeout:
            self.clients_gone += 1
            log.info("detokenizer: client of %s is gone, aborting it", state.rid)
            self._finish(state.rid, abort_reason="client_gone")
            return False
        self.outputs_sent += 1
        return True

    def _finish(self, rid: str, abort_reason: str | None) -> None:
        self.requests.pop(rid, None)
        self._finished[rid] = None
        while len(self._finished) > _FINISHED_MEMORY:
            self._finished.popitem(last=False)
        if abort_reason is not None:
            self._send_scheduler(AbortRequest(rid=rid, reason=abort_reason))

    # -- ErrorReply -------------------------------------------------------------------------
    def _on_error(self, err: ErrorReply) -> None:
        state = self.requests.get(err.rid)
        reply_to = err.reply_to or (state.reply_to if state else None)
        self.requests.pop(err.rid, None)
        self._finished[err.rid] = None
        if reply_to is None:
            log.warning("detokenizer: error for unknown request %s dropped: %s", err.rid,
                        err.message)
            return
        try:
            self._send_reply(reply_to, err)
            self.outputs_sent += 1
        except SendTimeout:
            self.clients_gone += 1
