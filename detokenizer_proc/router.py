"""The detokenizer's logic: TokenBatch rows in, RequestOutput deltas out to each reply_to.

The outputs of one TokenBatch (one step) that go to the same reply_to leave as one
RequestOutputBatch: a client serving 128 streams gets one message per step, not 128. Sends
never wait: what a slow client cannot take yet waits for it (`replies.py`), and only a client
that takes nothing for `gone_after_s` counts as gone, its requests aborted.

It keeps one RequestState per live request (created from the DetokInfo that comes with the
request's first row) and forgets it when every sample has finished, when the scheduler reports
an error for it, or when its client is gone. A stop string is found here, not in the scheduler,
so when one ends a request the scheduler is told with AbortRequest(reason="stop") to free it.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable

import numpy as np

from tessera.bus.messages import (
    AbortRequest,
    ErrorReply,
    Message,
    RequestOutput,
    ResetRequests,
    TokenBatch,
)
from tessera.bus.output_batch import batchable, pack_outputs
from tessera.detokenizer_proc.replies import Replies
from tessera.detokenizer_proc.sequence import Logprobs, RequestState
from tessera.formats.tokenizer import ModelTokenizer

log = logging.getLogger(__name__)

# Rows can still arrive for a request we finished (steps already in flight when a stop string
# matched, the scheduler's closing "abort" row): remember that many finished rids to drop them.
_FINISHED_MEMORY = 4096


class Router:
    """Independent of sockets: `process.py` gives it two send functions (tests give lists)."""

    def __init__(self, tokenizer: ModelTokenizer, send_reply: Callable[[str, Message], None],
                 send_scheduler: Callable[[Message], None], *, gone_after_s: float = 0.0,
                 forget: Callable[[str], None] | None = None) -> None:
        self.tokenizer = tokenizer
        # send_reply(endpoint, message) must not wait: it sends or raises SendTimeout
        self.replies = Replies(send_reply, gone_after_s, forget)
        self._send_scheduler = send_scheduler  # (message) -> None
        self.requests: dict[str, RequestState] = {}
        self._finished: OrderedDict[str, None] = OrderedDict()
        self.outputs_sent = 0
        self.rows_dropped = 0
        self.clients_gone = 0
        # reply_to -> this step's outputs for it, sent together by _flush
        self._pending: dict[str, list[tuple[RequestState, RequestOutput]]] = {}

    def handle(self, msgs: list[Message]) -> None:
        for msg in msgs:
            try:
                if isinstance(msg, TokenBatch):
                    self._on_batch(msg)
                elif isinstance(msg, ErrorReply):
                    self._on_error(msg)
                elif isinstance(msg, ResetRequests):
                    self._on_reset(msg)
                else:
                    log.warning("detokenizer: unexpected %s dropped", type(msg).__name__)
            except Exception:  # one bad message must not stop every other request's output
                log.exception("detokenizer: failed to handle %s", type(msg).__name__)
            finally:
                self._flush()  # before the next message: a client sees outputs in step order
        self.tick()

    def tick(self) -> None:
        """Send what waits for slow clients; abort the requests of clients that are gone."""
        for gone in self.replies.retry():
            log.info("detokenizer: client %s took nothing for %.1f s: gone, aborting %d "
                     "request(s)", gone.endpoint, self.replies.gone_after_s, len(gone.rids))
            for rid in gone.rids:
                self.clients_gone += 1
                if rid in self.requests:
                    self._finish(rid, abort_reason="client_gone")

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
                if detok is None:
                    # Started before this detokenizer (a restart): its route and text so far
                    # are lost. The scheduler fails it to its reply_to, which it knows.
                    self.rows_dropped += 1
                    log.warning("detokenizer: request %s started before this detokenizer; "
                                "asking the scheduler to fail it", rid)
                    self._finish(rid, abort_reason=AbortRequest.LOST_ROUTE)
                    continue
                state = self.requests[rid] = RequestState(rid, detok, self.tokenizer)
            out = state.add(
                index=int(batch.indices[r]),
                tokens=tokens[row_start:row_start + count],
                finish=batch.finish[r],
                matched_stop=batch.matched_stop[r] if r < n_matched else None,
                cached_tokens=int(batch.cached_tokens[r]) if r < n_cached else 0,
                logprobs=Logprobs.rows(batch, row_start, count, state.top_logprobs))
            if out is not None:
                self._pending.setdefault(state.reply_to, []).append((state, out))
            for index in state.take_stops():
                self._send_scheduler(AbortRequest(rid=rid, reason="stop", index=index))
            if state.done:
                self._finish(rid, abort_reason="stop" if state.scheduler_running else None)

    def _flush(self) -> None:
        """Send each client its outputs of this step in one message (an output that carries
        a scored prompt, once per such request, travels on its own after it)."""
        pending, self._pending = self._pending, {}
        for endpoint, items in pending.items():
            plain = [(state, out) for state, out in items if batchable(out)]
            if plain:
                rids = list(dict.fromkeys(state.rid for state, _ in plain))
                self.replies.send(endpoint, pack_outputs([out for _, out in plain]), rids)
            for state, out in items:
                if not batchable(out):
                    self.replies.send(endpoint, out, [state.rid])
            self.outputs_sent += len(items)

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
            if detok is not None:
                state = self.requests[rid] = RequestState(rid, detok, self.tokenizer)
        return state

    def _finish(self, rid: str, abort_reason: str | None) -> None:
        self.requests.pop(rid, None)
        self._finished[rid] = None
        while len(self._finished) > _FINISHED_MEMORY:
            self._finished.popitem(last=False)
        if abort_reason is not None:
            self._send_scheduler(AbortRequest(rid=rid, reason=abort_reason))

    # -- ResetRequests ----------------------------------------------------------------------
    def _on_reset(self, msg: ResetRequests) -> None:
        if self.requests:
            log.warning("detokenizer: failing %d request(s): %s", len(self.requests),
                        msg.reason)
        for rid, state in list(self.requests.items()):
            self._finish(rid, abort_reason=None)
            self.replies.send(state.reply_to, ErrorReply(
                rid=rid, status=503, error_type="engine_restarted",
                message=f"{msg.reason or 'the engine restarted'}; this request was lost, "
                        f"retry it"), [rid])

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
        self.replies.send(reply_to, err, [])  # the request is over: nothing to abort
        self.outputs_sent += 1
