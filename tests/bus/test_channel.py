"""Inbox / Outbox over real ipc sockets: delivery, drops, back-pressure, socket files."""

from __future__ import annotations

import logging
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import zmq

from tessera.bus.channel import Inbox, Outbox, OutboxPool, SendTimeout
from tessera.bus.codec import encode
from tessera.bus.messages import AbortRequest, Message, SampledTokens
from tessera.bus.run_paths import RunPaths


@pytest.fixture
def paths(run_root: Path) -> RunPaths:
    return RunPaths.create()


def drain_until(inbox: Inbox, count: int, timeout: float = 5.0) -> list[Message]:
    got: list[Message] = []
    deadline = time.monotonic() + timeout
    while len(got) < count and time.monotonic() < deadline:
        got += inbox.drain(0.05)
    return got


def test_run_dir_is_private(paths: RunPaths) -> None:
    assert stat.S_IMODE(os.stat(paths.run_dir).st_mode) == 0o700
    assert paths.scheduler.startswith("ipc://" + paths.run_dir)


def test_messages_arrive_in_order_with_arrays(paths: RunPaths) -> None:
    inbox = Inbox(paths.scheduler, name="scheduler")
    out = Outbox(paths.scheduler)
    try:
        for step in range(50):
            out.send(SampledTokens(step=step, token_ids=np.full(3, step, dtype=np.int32)))
        got = drain_until(inbox, 50)
        assert [m.step for m in got] == list(range(50))
        assert all(int(m.token_ids.sum()) == 3 * m.step for m in got)
        assert inbox.received == 50 and inbox.dropped == 0
    finally:
        out.close()
        inbox.close()


def test_malformed_messages_are_dropped_counted_and_logged(
        paths: RunPaths, caplog: pytest.LogCaptureFixture) -> None:
    inbox = Inbox(paths.detokenizer, name="detokenizer")
    # One connection for all three: PULL queues fairly between connections, so only one
    # sender guarantees that the good message comes after the bad ones.
    raw = zmq.Context.instance().socket(zmq.PUSH)
    raw.connect(paths.detokenizer)
    try:
        with caplog.at_level(logging.WARNING, logger="tessera.bus.channel"):
            raw.send_multipart([b"\xc1garbage"])
            raw.send_multipart([b"\x84\xa1t\xa3Foo\xa1v\x01\xa1f\x80\xa1a\x90"])  # unknown type
            raw.send_multipart(encode(AbortRequest(rid="after", reason="still works")))
            got = drain_until(inbox, 1)
        assert [m.rid for m in got] == ["after"]  # type: ignore[attr-defined]
        assert inbox.dropped == 2 and inbox.received == 1
        dropped = [r.getMessage() for r in caplog.records if "dropped" in r.getMessage()]
        assert len(dropped) == 2 and "unknown message type 'Foo'" in dropped[1]
    finally:
        raw.close(linger=0)
        inbox.close()


def test_full_inbox_calls_on_reject(paths: RunPaths) -> None:
    rejected: list[Message] = []
    inbox = Inbox(paths.tokenizer, capacity=5, on_reject=rejected.append)
    out = Outbox(paths.tokenizer)
    try:
        for i in range(8):
            out.send(AbortRequest(rid=str(i)))
        deadline = time.monotonic() + 5
        while len(rejected) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert [m.rid for m in rejected] == ["5", "6", "7"]  # type: ignore[attr-defined]
        assert [m.rid for m in inbox.drain()] == ["0", "1", "2", "3", "4"]  # type: ignore[attr-defined]
    finally:
        out.close()
        inbox.close()


def test_a_waiting_loop_takes_a_message_itself_and_hands_the_socket_back(
        paths: RunPaths) -> None:
    """With busy polling a loop waiting in drain() waits on the socket itself: the message
    is taken there, counted as received; once drain() returns, the receiver thread has the
    socket again and fills the back buffer while the loop is busy."""
    import threading

    inbox = Inbox(paths.scheduler, name="scheduler", busy_poll_s=0.05)
    out = Outbox(paths.scheduler)
    try:
        timer = threading.Timer(0.2, lambda: out.send(AbortRequest(rid="late")))
        timer.start()
        t0 = time.monotonic()
        got = inbox.drain(5.0)
        timer.join()
        assert [m.rid for m in got] == ["late"]  # type: ignore[attr-defined]
        assert 0.15 < time.monotonic() - t0 < 2.0 and inbox.received == 1
        out.send(AbortRequest(rid="while busy"))
        deadline = time.monotonic() + 5
        while len(inbox.buffer) < 1 and time.monotonic() < deadline:
            time.sleep(0.01)  # not draining: only the receiver thread can take it
        assert len(inbox.buffer) == 1
        assert [m.rid for m in inbox.drain()] == ["while busy"]  # type: ignore[attr-defined]
    finally:
        out.close()
        inbox.close()


def test_a_direct_wait_covers_every_inbox_sharing_the_buffer(paths: RunPaths) -> None:
    import threading

    first = Inbox(paths.scheduler, name="scheduler", busy_poll_s=0.05)
    second = Inbox(paths.scheduler_results, name="results", buffer=first.buffer,
                   busy_poll_s=0.05)
    out = Outbox(paths.scheduler_results)
    try:
        timer = threading.Timer(0.2, lambda: out.send(AbortRequest(rid="to the second")))
        timer.start()
        got = first.drain(5.0)
        timer.join()
        assert [m.rid for m in got] == ["to the second"]  # type: ignore[attr-defined]
        assert second.received == 1 and first.received == 0
    finally:
        out.close()
        second.close()
        first.close()


def test_wake_ends_a_direct_wait(paths: RunPaths) -> None:
    """buffer.wake() (what a SIGTERM handler calls) makes a loop waiting on its sockets
    return, empty-handed, without waiting for its timeout, polling or blocked."""
    import threading

    inbox = Inbox(paths.worker(0), name="worker", busy_poll_s=0.05)
    try:
        threading.Timer(0.2, inbox.buffer.wake).start()
        t0 = time.monotonic()
        assert inbox.drain(None) == []
        assert time.monotonic() - t0 < 2.0
    finally:
        inbox.close()


@pytest.mark.parametrize("busy_poll_s", [0.0, 0.0005])
def test_order_survives_the_socket_changing_hands(paths: RunPaths, busy_poll_s: float) -> None:
    """Messages sent in bursts while the loop alternates between waiting (the socket its)
    and working (the receiver thread's) arrive once each, in order."""
    import threading

    inbox = Inbox(paths.detokenizer, name="detokenizer", busy_poll_s=busy_poll_s)
    out = Outbox(paths.detokenizer)
    count = 1500

    def send() -> None:
        for i in range(count):
            out.send(AbortRequest(rid=str(i)))
            if i % 50 == 0:
                time.sleep(0.002)

    sender = threading.Thread(target=send)
    sender.start()
    got: list[Message] = []
    deadline = time.monotonic() + 20
    try:
        while len(got) < count and time.monotonic() < deadline:
            got += inbox.drain(0.001)
            time.sleep(0.0005)  # "working": the receiver thread holds the socket
            got += inbox.drain(0.0)
        sender.join()
        assert [int(m.rid) for m in got] == list(range(count))  # type: ignore[attr-defined]
        assert inbox.received == count
    finally:
        out.close()
        inbox.close()


def test_send_without_a_peer_times_out(paths: RunPaths) -> None:
    out = Outbox(paths.worker(0), timeout_ms=50, immediate=True)
    t0 = time.monotonic()
    with pytest.raises(SendTimeout, match="within 50 ms"):
        out.send(AbortRequest(rid="x"))
    assert time.monotonic() - t0 < 5.0  # it gave up, loosely bounded for a busy machine
    out.close()


def test_back_pressure_shows_as_send_timeout(paths: RunPaths) -> None:
    # A receiver that never reads, small high-water marks: sends must start failing.
    pull = zmq.Context.instance().socket(zmq.PULL)
    pull.setsockopt(zmq.RCVHWM, 4)
    pull.bind(paths.worker(1))
    out = Outbox(paths.worker(1), timeout_ms=20, hwm=4)
    payload = SampledTokens(step=0, token_ids=np.zeros(1 << 16, dtype=np.int32))
    try:
        with pytest.raises(SendTimeout):
            for _ in range(10_000):
                out.send(payload)
    finally:
        out.close()
        pull.close(linger=0)


def test_stale_socket_file_is_replaced_and_removed_on_close(paths: RunPaths) -> None:
    path = paths.scheduler_results.removeprefix("ipc://")
    Path(path).write_text("left by a crashed run")
    inbox = Inbox(paths.scheduler_results)
    out = Outbox(paths.scheduler_results)
    out.send(AbortRequest(rid="fresh"))
    assert [m.rid for m in drain_until(inbox, 1)] == ["fresh"]  # type: ignore[attr-defined]
    out.close()
    inbox.close()
    assert not os.path.exists(path)


def test_outbox_pool_reaches_many_clients_and_caps_open_sockets(paths: RunPaths) -> None:
    inboxes = [Inbox(paths.client_endpoint()) for _ in range(3)]
    pool = OutboxPool(timeout_ms=500, max_open=2)
    try:
        for i, inbox in enumerate(inboxes):
            pool.send(inbox.endpoint, AbortRequest(rid=str(i)))
        assert len(pool._boxes) == 2
        for i, inbox in enumerate(inboxes):
            assert [m.rid for m in drain_until(inbox, 1)] == [str(i)]  # type: ignore[attr-defined]
    finally:
        pool.close()
        for inbox in inboxes:
            inbox.close()


def test_closing_a_stalled_outbox_as_its_peer_closes_does_not_abort() -> None:
    """Back-pressure then both ends closing at once (a slow client that leaves as we give up
    on it): libzmq must not abort the process. Run in a child, since an abort kills it."""
    repo = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-m", "tests.bus.stalled_close", "60"], cwd=repo,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "survived 60"


def test_busy_poll_is_on_only_where_cores_are_to_spare() -> None:
    """--busy-poll-ms: an explicit value wins; auto (-1) polls on a host of at least 16 CPUs
    and four for each polling process only; a negative value other than -1 is refused by
    name, and so is a negative Inbox setting."""
    from tessera.config import BUSY_POLL_AUTO_MS, EngineConfig, ServerConfig, busy_poll_s

    auto = BUSY_POLL_AUTO_MS / 1000
    assert busy_poll_s(-1, 16) == auto and busy_poll_s(-1, 2) == 0.0
    assert busy_poll_s(-1, 16, processes=5) == 0.0 and busy_poll_s(-1, 32, processes=5) == auto
    assert busy_poll_s(0, 64) == 0.0 and busy_poll_s(5, 2) == 0.005
    assert busy_poll_s(-1, None) == 0.0
    assert EngineConfig(busy_poll_ms=3).inbox_busy_poll_s() == 0.003
    # the engine counts its polling processes: 8 tokenizers + scheduler + worker + detokenizer
    # need 44 CPUs, two replicas of the default twice 16
    from tessera.config import usable_cores

    cpus = usable_cores()
    assert EngineConfig(tokenizer_workers=8).inbox_busy_poll_s() == (auto if cpus >= 44 else 0.0)
    assert ServerConfig(dp_size=2).inbox_busy_poll_s() == (auto if cpus >= 32 else 0.0)
    with pytest.raises(ValueError, match="--busy-poll-ms"):
        EngineConfig(busy_poll_ms=-2)
    with pytest.raises(ValueError, match="busy_poll_s"):
        Inbox("ipc:///nonexistent/never-bound", busy_poll_s=-1.0)


@pytest.mark.parametrize("busy_poll_s", [0.0, 0.05])
def test_a_wake_before_the_wait_is_not_lost(paths: RunPaths, busy_poll_s: float) -> None:
    """wake() called while the loop works (a SIGTERM between two drains) makes the next
    drain return at once, not after its timeout, polling or not."""
    inbox = Inbox(paths.worker(0), name="worker", busy_poll_s=busy_poll_s)
    try:
        inbox.buffer.wake()
        t0 = time.monotonic()
        assert inbox.drain(5.0) == []
        assert time.monotonic() - t0 < 1.0
    finally:
        inbox.close()
