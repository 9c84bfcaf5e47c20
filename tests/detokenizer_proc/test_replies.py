"""Replies to clients: a slow client's outputs wait in order instead of being dropped, other
clients are not held up, and only a client that takes nothing for gone_after_s is gone."""

from __future__ import annotations

from tessera.bus.channel import SendTimeout
from tessera.bus.messages import Shutdown
from tessera.detokenizer_proc.replies import Replies


class Clients:
    """Endpoints with room for `room[endpoint]` more messages (absent: unlimited)."""

    def __init__(self) -> None:
        self.now = 0.0
        self.room: dict[str, int] = {}
        self.got: list[tuple[str, str]] = []
        self.forgotten: list[str] = []

    def send(self, endpoint: str, msg: Shutdown) -> None:
        if self.room.get(endpoint, 1) <= 0:
            raise SendTimeout(endpoint)
        if endpoint in self.room:
            self.room[endpoint] -= 1
        self.got.append((endpoint, msg.reason))

    def replies(self, gone_after_s: float = 2.0) -> Replies:
        return Replies(self.send, gone_after_s, self.forgotten.append, clock=lambda: self.now)


def test_a_slow_client_gets_everything_in_order_and_others_are_not_held() -> None:
    c = Clients()
    r = c.replies()
    c.room["slow"] = 0
    r.send("slow", Shutdown("s1"), ["a"])
    r.send("fast", Shutdown("f1"), ["b"])
    del c.room["slow"]
    r.send("slow", Shutdown("s2"), ["a"])  # behind s1, although the client has room now
    assert c.got == [("fast", "f1")] and r.waiting() == 2
    c.now = 1.5
    assert r.retry() == []
    assert c.got == [("fast", "f1"), ("slow", "s1"), ("slow", "s2")]
    assert r.waiting() == 0 and r.sent == 3 and c.forgotten == []


def test_progress_resets_the_gone_clock() -> None:
    c = Clients()
    r = c.replies()
    c.room["slow"] = 0
    for i in range(3):
        r.send("slow", Shutdown(f"m{i}"), ["a"])
    c.now = 1.9
    assert r.retry() == []
    c.room["slow"] = 1  # takes one message at 1.95 s
    c.now = 1.95
    assert r.retry() == [] and c.got == [("slow", "m0")]
    c.now = 3.5  # 1.55 s after the last progress: still slow, not gone
    assert r.retry() == []
    c.now = 3.95
    [gone] = r.retry()
    assert gone.endpoint == "slow" and gone.rids == ["a"]
    assert c.forgotten == ["slow"] and r.waiting() == 0


def test_a_client_that_takes_nothing_is_gone_with_every_request_it_was_sent() -> None:
    c = Clients()
    r = c.replies(gone_after_s=0.5)
    c.room["dead"] = 0
    r.send("dead", Shutdown("x"), ["a", "b"])
    r.send("dead", Shutdown("y"), ["b", "c"])
    c.now = 0.4
    assert r.retry() == []
    c.now = 0.5
    [gone] = r.retry()
    assert gone.rids == ["a", "b", "c"] and c.forgotten == ["dead"]
    assert r.retry() == [] and c.got == []
