"""`python -m tessera.detokenizer_proc --run-dir DIR`: the detokenizer as a bus process.

Binds RunPaths.detokenizer (TokenBatch / ErrorReply from the scheduler), answers each request's
reply_to through an OutboxPool, and sends AbortRequest to RunPaths.scheduler when a stop string
or a vanished client ends a request the scheduler is still running.
"""

from __future__ import annotations

import logging

from tessera.bus.channel import Inbox, Outbox, OutboxPool, SendTimeout
from tessera.bus.messages import Message
from tessera.bus.process import BusProcess
from tessera.bus.run_paths import RunPaths
from tessera.config import EngineConfig
from tessera.detokenizer_proc.router import Router
from tessera.formats.tokenizer import load_tokenizer

log = logging.getLogger(__name__)


class Detokenizer(BusProcess):
    name = "detokenizer"

    def __init__(self, paths: RunPaths, config: EngineConfig) -> None:
        super().__init__(paths, config)
        self.router: Router | None = None
        self.replies = OutboxPool()
        self.scheduler: Outbox | None = None

    def setup(self) -> None:
        tokenizer = load_tokenizer(self.config.model,
                                   ids_only_ok=self.config.load_format == "dummy")
        self.scheduler = Outbox(self.paths.scheduler, timeout_ms=self.config.send_timeout_ms)
        self.router = Router(tokenizer, self._send_reply, self._send_scheduler)
        self.inbox = Inbox(self.paths.detokenizer, name=self.name)

    def _send_reply(self, endpoint: str, msg: Message) -> None:
        try:
            self.replies.send(endpoint, msg)
        except SendTimeout:
            self.replies.forget(endpoint)
            raise

    def _send_scheduler(self, msg: Message) -> None:
        assert self.scheduler is not None
        try:
            self.scheduler.send(msg)
        except SendTimeout:
            log.error("detokenizer: the scheduler did not take %s", msg)

    def handle(self, msgs: list[Message]) -> None:
        assert self.router is not None
        self.router.handle(msgs)

    def stats(self) -> dict[str, float]:
        if self.router is None:
            return {}
        return {"active_requests": float(len(self.router.requests)),
                "outputs_sent": float(self.router.outputs_sent),
                "rows_dropped": float(self.router.rows_dropped),
                "clients_gone": float(self.router.clients_gone)}

    def teardown(self) -> None:
        self.replies.close()
        if self.scheduler is not None:
            self.scheduler.close()
