"""Replies to clients that never block the detokenizer and never drop a slow client's outputs.

One client endpoint often serves many requests (the HTTP server has one reply socket for all
of them). A send that finds the endpoint's queue full therefore says "this client is slow",
not "this request's client is gone": closing the endpoint then would throw away the queued
outputs of every other request it serves. So a message that cannot leave at once waits in
the endpoint's own queue (later messages to it queue behind, in order) and is retried every
loop; only an endpoint that has taken nothing for `gone_after_s` is declared gone, and with
it the requests of the messages it did not take.

    replies = Replies(send, gone_after_s=2.0)
    replies.send(endpoint, msg, rids)         # sent now, or queued
    for endpoint, rids in replies.retry():    # each loop: send what waits; who is gone
        ...
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from tessera.bus.channel import SendTimeout
from tessera.bus.messages import Message


@dataclass
class _Waiting:
    since: float  # the last time this endpoint took a message (or the first refusal)
    messages: deque[tuple[Message, list[str]]] = field(default_factory=deque)


@dataclass
class GoneClient:
    endpoint: str
    rids: list[str]  # the requests of the messages it never took


class Replies:
    def __init__(self, send: Callable[[str, Message], None], gone_after_s: float,
                 forget: Callable[[str], None] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._send = send  # (endpoint, message): sends without waiting or raises SendTimeout
        self._forget = forget or (lambda endpoint: None)
        self.gone_after_s = gone_after_s
        self._clock = clock
        self._waiting: dict[str, _Waiting] = {}
        self.sent = 0
        self.queued = 0  # messages that had to wait at least once

    def waiting(self) -> int:
        """Messages waiting for their client."""
        return sum(len(w.messages) for w in self._waiting.values())

    def send(self, endpoint: str, msg: Message, rids: list[str]) -> None:
        waiting = self._waiting.get(endpoint)
        if waiting is None:
            try:
                self._send(endpoint, msg)
                self.sent += 1
                return
            except SendTimeout:
                waiting = self._waiting[endpoint] = _Waiting(self._clock())
        waiting.messages.append((msg, rids))  # behind the others: a client sees them in order
        self.queued += 1

    def retry(self) -> list[GoneClient]:
        """Send what waits, oldest first, as far as each client takes it; return the clients
        that have taken nothing for gone_after_s (their queues are dropped)."""
        gone: list[GoneClient] = []
        now = self._clock()
        for endpoint in list(self._waiting):
            waiting = self._waiting[endpoint]
            while waiting.messages:
                msg, _ = waiting.messages[0]
                try:
                    self._send(endpoint, msg)
                except SendTimeout:
                    break
                waiting.messages.popleft()
                waiting.since = now
                self.sent += 1
            if not waiting.messages:
                del self._waiting[endpoint]
            elif now - waiting.since >= self.gone_after_s:
                del self._waiting[endpoint]
                self._forget(endpoint)
                rids = list(dict.fromkeys(r for _, ids in waiting.messages for r in ids))
                gone.append(GoneClient(endpoint, rids))
        return gone
