"""Requests that hold the server's event loop do not make it look hung: its heartbeats go on
(from a thread) while handlers parse and check big bodies, so the supervisor does not restart
it and fail every stream in flight."""

from __future__ import annotations

import json
import threading
import time

import numpy as np

from tessera.bus.messages import Heartbeat
from tests.server.harness import ServerUnderTest

TIMEOUT_S = 3.0  # the supervisor's heartbeat timeout here (default 5 s)
BODIES = 8


def test_big_bodies_at_once_do_not_silence_the_heartbeat() -> None:
    # 8 MiB of 240,000 tiny messages: parsing and checking one holds the event loop for a
    # good part of a second on a busy machine; eight at once held it for several seconds.
    body = json.dumps({"messages": [{"role": "user", "content": "a"}] * 240_000,
                       "max_tokens": 1}).encode()
    srv = ServerUnderTest(heartbeat_interval_s=0.1, heartbeat_timeout_s=TIMEOUT_S,
                          request_timeout_s=120.0)
    try:
        statuses: list[int] = []

        def post() -> None:
            conn = srv.connection(timeout=120.0)
            conn.request("POST", "/v1/chat/completions", body=body,
                         headers={"Content-Type": "application/json"})
            statuses.append(conn.getresponse().status)
            conn.close()

        started = time.time()
        posts = [threading.Thread(target=post) for _ in range(BODIES)]
        for t in posts:
            t.start()
        for t in posts:
            t.join()
        time.sleep(0.5)
        beats = sorted(m.time for m in srv.engine.control
                       if isinstance(m, Heartbeat) and m.process == "server"
                       and m.time >= started)
        gaps = np.diff([started, *beats, time.time()])
        assert statuses == [200] * BODIES
        assert gaps.max() < TIMEOUT_S, f"the server was silent for {gaps.max():.1f} s"
        assert srv.request("GET", "/health")[0] == 200
    finally:
        srv.stop()
