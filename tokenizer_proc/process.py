"""`python -m tessera.tokenizer_proc --run-dir DIR --index I`: the engine's front door.

Each of the `--tokenizer-workers N` processes binds its own endpoint
(RunPaths.tokenizer_endpoint(I)); clients connect to all of them and ZeroMQ spreads requests
round-robin. A process validates and tokenizes every GenerateRequest (prepare.py), pushes the
TokenizedRequest to the scheduler, answers bad ones itself straight to their reply_to, and
forwards AbortRequests. When the scheduler does not take a request in time (or the circuit
breaker is open after repeated timeouts) the client gets a 503 at once instead of waiting.
"""

from __future__ import annotations

import logging
from typing import Any

from tessera.bus.breaker import CircuitBreaker, CircuitOpenError
from tessera.bus.channel import Inbox, Outbox, OutboxPool, SendTimeout
from tessera.bus.codec import EncodeError, MessageTooLarge
from tessera.bus.messages import (
    AbortRequest,
    ErrorReply,
    GenerateRequest,
    Message,
    TokenizedRequest,
)
from tessera.bus.process import BusProcess, process_main
from tessera.bus.run_paths import RunPaths
from tessera.config import EngineConfig
from tessera.formats.chat_template import template_knows_tools, template_tool_format
from tessera.formats.tokenizer import IdsOnlyTokenizer, ModelTokenizer, load_tokenizer
from tessera.tokenizer_proc.prepare import prepare

log = logging.getLogger(__name__)


class TokenizerProcess(BusProcess):
    name = "tokenizer"

    def __init__(self, paths: RunPaths, config: EngineConfig, index: int = 0) -> None:
        super().__init__(paths, config)
        self.index = index
        self.name = f"tokenizer{index}"
        self.tokenizer: ModelTokenizer | None = None
        self.context_length: int | None = None
        self.scheduler: Outbox | None = None
        self.replies = OutboxPool()
        self._overload_replies = OutboxPool(max_open=64)
        self.breaker = CircuitBreaker("scheduler", config.breaker_failures,
                                      config.breaker_cooldown_s)
        self.breakers.append(self.breaker)
        self.counts = {"accepted": 0, "rejected": 0, "unavailable": 0, "aborts": 0}

    def setup(self) -> None:
        self.tokenizer = load_tokenizer(self.config.model,
                                   ids_only_ok=self.config.load_format == "dummy")
        self.context_length = self.config.context_length or self.tokenizer.context_length
        self.scheduler = Outbox(self.paths.scheduler, timeout_ms=self.config.send_timeout_ms)
        self.inbox = Inbox(self.paths.tokenizer_endpoint(self.index), name=self.name,
                           on_reject=self._on_full,
                           busy_poll_s=self.config.inbox_busy_poll_s())
        log.info("%s: model %s, vocabulary %d, context %s", self.name, self.tokenizer.name,
                 self.tokenizer.vocab_size, self.context_length)

    def ready_info(self) -> dict[str, Any]:
        assert self.tokenizer is not None
        template = self.tokenizer.chat_template
        return {"vocab_size": self.tokenizer.vocab_size, "context_length": self.context_length,
                "takes_text": not isinstance(self.tokenizer, IdsOnlyTokenizer),
                "eos_token_ids": self.tokenizer.eos_token_ids,
                # what the server's --tool-call-parser auto reads
                "tool_call_format": template_tool_format(template),
                "template_knows_tools": template_knows_tools(template)}

    # -- messages ---------------------------------------------------------------------------
    def handle(self, msgs: list[Message]) -> None:
        for msg in msgs:
            try:
                if isinstance(msg, GenerateRequest):
                    self._on_generate(msg)
                elif isinstance(msg, AbortRequest):
                    self.counts["aborts"] += 1
                    self._to_scheduler(msg)
                else:
                    log.warning("%s: unexpected %s dropped", self.name, type(msg).__name__)
            except Exception as exc:  # a bug on one request must not take the front door down
                log.exception("%s: failed on %s", self.name, type(msg).__name__)
                if isinstance(msg, GenerateRequest):
                    try:
                        self._error(msg, 500, f"internal error while tokenizing: {exc}",
                                    "server_error")
                    except Exception:
                        log.exception("%s: could not answer %r either", self.name,
                                      getattr(msg, "rid", None))

    def _on_generate(self, req: GenerateRequest) -> None:
        assert self.tokenizer is not None
        if not isinstance(req.reply_to, str) or not req.reply_to:
            log.warning("%s: request without a reply_to dropped", self.name)
            return
        if not isinstance(req.rid, str) or not req.rid:
            self._reply(req.reply_to, ErrorReply(rid=str(req.rid), status=400,
                                                 message="rid must be a non-empty string",
                                                 param="rid", reply_to=req.reply_to))
            return
        result = prepare(req, self.tokenizer, self.context_length,
                         self.config.allowed_special)
        if isinstance(result, ErrorReply):
            self.counts["rejected"] += 1
            self._reply(req.reply_to, result)
            return
        self._submit(req, result)

    def _submit(self, req: GenerateRequest, tokenized: TokenizedRequest) -> None:
        try:
            self.breaker.check()
        except CircuitOpenError as exc:
            self._error(req, 503, str(exc), "server_error")
            return
        try:
            sent = self._to_scheduler(tokenized)
        except EncodeError as exc:  # answered now: the scheduler would drop it unread
            status = 413 if isinstance(exc, MessageTooLarge) else 400
            self._error(req, status, f"the request cannot be passed on: {exc}",
                        "invalid_request_error")
            return
        if sent:
            self.counts["accepted"] += 1
        else:
            self._error(req, 503, "the scheduler did not take the request in time (overloaded "
                        "or down); retry later", "server_error")

    def _to_scheduler(self, msg: Message) -> bool:
        assert self.scheduler is not None
        try:
            self.scheduler.send(msg)
        except SendTimeout:
            self.breaker.record_failure("scheduler send timed out")
            return False
        self.breaker.record_success()
        return True

    def _error(self, req: GenerateRequest, status: int, message: str, kind: str) -> None:
        if status >= 500:
            self.counts["unavailable"] += 1
        self._reply(req.reply_to, ErrorReply(rid=req.rid, status=status, message=message,
                                             error_type=kind, reply_to=req.reply_to))

    def _reply(self, endpoint: str, msg: Message) -> None:
        try:
            self.replies.send(endpoint, msg)
        except SendTimeout:
            self.replies.forget(endpoint)
            log.info("%s: client %s is gone", self.name, endpoint)

    def _on_full(self, msg: Message) -> None:
        # Runs on the inbox's receiver thread when the buffer is full: answer 503 at once
        # through a pool of that thread's own (sockets are not thread-safe).
        self.counts["unavailable"] += 1
        if isinstance(msg, GenerateRequest) and isinstance(msg.reply_to, str) and msg.reply_to:
            try:
                self._overload_replies.send(msg.reply_to, ErrorReply(
                    rid=str(msg.rid), status=503, error_type="server_error",
                    message=f"{self.name} is overloaded (its queue is full); retry later",
                    reply_to=msg.reply_to))
            except SendTimeout:
                self._overload_replies.forget(msg.reply_to)

    def stats(self) -> dict[str, float]:
        return {k: float(v) for k, v in self.counts.items()}

    def teardown(self) -> None:
        self.replies.close()  # (_overload_replies belongs to the inbox thread: left to exit)
        if self.scheduler is not None:
            self.scheduler.close()


def main(argv: list[str] | None = None) -> int:
    return process_main(TokenizerProcess, argv,
                        extra_args={"--index": {"type": int, "default": 0,
                                                "help": "which tokenizer worker (0..N-1)"}})
