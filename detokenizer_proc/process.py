"""`python -m tessera.detokenizer_proc --run-dir DIR`: the detokenizer as a bus process.

Binds RunPaths.detokenizer (TokenBatch / ErrorReply from the scheduler), answers each request's
reply_to through an OutboxPool (one RequestOutputBatch per client and step), and sends
AbortRequest to RunPaths.scheduler when a stop string or a vanished client ends a request the
scheduler is still running.
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
        # Sends to clients never wait (timeout 0): what a slow client cannot take waits in
        # the router's reply queues instead of stalling every other client.
        self.replies = OutboxPool(timeout_ms=0)
        self.scheduler: Outbox | None = None

    def setup(self) -> None:
        tokenizer = load_tokenizer(self.config.model,
                                   ids_only_ok=self.config.load_format == "dummy")
        self.scheduler = Outbox(self.paths.scheduler, timeout_ms=self.config.send_timeout_ms)
        self.router = Router(tokenizer, self.replies.send, self._send_scheduler,
                             gone_after_s=self.config.send_timeout_ms / 1000.0,
                             forget=self.replies.forget)
        self.inbox = Inbox(self.paths.detokenizer, name=self.name,
                           busy_poll_s=self.config.inbox_busy_poll_s())

    def _send_scheduler(self, msg: Message) -> None:
        assert self.scheduler is not None
        try:
            self.scheduler.send(msg)
        except SendTimeout:
            log.error("detokenizer: the scheduler did not take %s", msg)

    def handle(self, msgs: list[Message]) -> None:
        assert self.router is not None
        self.router.handle(msgs)

    def tick(self) -> None:
        if self.router is not None:
            self.router.tick()

    def wait_timeout(self) -> float:
        # Outputs waiting for a slow client: come back soon to retry them.
        if self.router is not None and self.router.replies.waiting():
            return 0.002
        return self.loop_timeout_s

    def stats(self) -> dict[str, float]:
        if self.router is None:
            return {}
        return {"active_requests": float(len(self.router.requests)),
                "outputs_sent": float(self.router.outputs_sent),
                "messages_sent": float(self.replies.sent),
                "messages_waiting": float(self.router.replies.waiting()),
                "rows_dropped": float(self.router.rows_dropped),
                "clients_gone": float(self.router.clients_gone)}

    def teardown(self) -> None:
        self.replies.close()
        if self.scheduler is not None:
            self.scheduler.close()
