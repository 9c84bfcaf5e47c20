"""Typed ZeroMQ channels: an `Inbox` (PULL, drained by a receiver thread into a double buffer)
and `Outbox` / `OutboxPool` (PUSH, every send bounded by a timeout).

High-water marks are set on both ends so back-pressure shows up as a send that times out
(`SendTimeout`), never as memory growth. Malformed or unknown messages are logged, counted in
`Inbox.dropped` and dropped: a bad peer cannot kill a process.
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

import zmq

from tessera.bus import trace
from tessera.bus.codec import DecodeError, decode, encode
from tessera.bus.double_buffer import DoubleBuffer
from tessera.bus.messages import Message

log = logging.getLogger(__name__)

DEFAULT_HWM = 10_000
_POLL_MS = 100
_WAKE_CHECK_S = 0.1  # a loop waiting on its sockets looks at the buffer's wake() this often
_LEND_WAIT_S = 0.5  # between checks that a receiver thread asked for its socket is alive
_CTL_IDS = itertools.count()
# An Outbox closes with a short linger, never 0: libzmq (4.3.5) aborts the whole process
# (`Resource temporarily unavailable (src/session_base.cpp:233)`) when a PUSH socket half-way
# through a large multipart message to a peer that stopped reading is closed at the moment
# the peer closes too -- a slow client that goes away as we give up on it. With a linger the
# half-sent message stays readable while the connection dies, and the socket is released
# after CLOSE_LINGER_MS at most.
CLOSE_LINGER_MS = 250


class SendTimeout(TimeoutError):
    """The peer did not take the message in time (down, or too slow: back-pressure)."""


def context() -> zmq.Context:
    """The process-wide ZeroMQ context (fork-safe: a child gets its own)."""
    global _CTX, _CTX_PID
    if _CTX is None or _CTX_PID != os.getpid():
        _CTX, _CTX_PID = zmq.Context(), os.getpid()
    return _CTX


_CTX: zmq.Context | None = None
_CTX_PID = 0


def _ipc_path(endpoint: str) -> str | None:
    return endpoint[len("ipc://"):] if endpoint.startswith("ipc://") else None


class Inbox:
    """Binds a PULL socket; a daemon thread receives, decodes and appends to a DoubleBuffer.

    `on_reject(msg)` is called (on the receiver thread) for a message refused because the
    buffer is full, so the owner can answer it with an explicit overload error.

    While the owner's loop works, the receiver thread drains the socket into the back buffer.
    With `busy_poll_s` > 0 (the engine's --busy-poll-ms), a loop that has nothing to do and
    waits (`drain` with a timeout, the buffer empty) waits on the sockets itself: the
    receiver threads of every inbox sharing the buffer let go of their sockets (each
    acknowledges before it does), the loop polls them without sleeping for up to
    busy_poll_s, then blocking, takes what arrives and hands them back before it returns. A
    message that finds its loop waiting is taken by the thread that handles it, with no
    thread woken on the way: on an H200 host one hop with a 512-token request took 274 us
    so against 530 us through the receiver thread (benchmarks/bench_hop.py, call 38).
    """

    def __init__(self, endpoint: str, capacity: int = 65_536, name: str = "",
                 on_reject: Callable[[Message], None] | None = None,
                 hwm: int = DEFAULT_HWM, buffer: DoubleBuffer[Message] | None = None,
                 busy_poll_s: float = 0.0) -> None:
        self.endpoint = endpoint
        self.name = name or endpoint
        # Several inboxes may share one buffer, so that one wait covers all their sockets.
        self.buffer: DoubleBuffer[Message] = buffer if buffer is not None else \
            DoubleBuffer(capacity)
        if busy_poll_s < 0:
            raise ValueError(f"busy_poll_s must be 0 or more, got {busy_poll_s}")
        self.busy_poll_s = busy_poll_s
        self.dropped = 0  # malformed / unknown messages
        self.received = 0
        self._on_reject = on_reject
        self._stop = threading.Event()
        self._lent = threading.Event()  # the receiver thread has let go of the socket
        self._home = threading.Event()  # the owner has handed it back
        path = _ipc_path(endpoint)
        if path and os.path.exists(path):
            os.unlink(path)  # a stale socket file from a crashed run
        self._sock = context().socket(zmq.PULL)
        self._sock.setsockopt(zmq.RCVHWM, hwm)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.bind(endpoint)
        # The owner asks the receiver thread to let go of the socket through this pair.
        ctl = f"inproc://inbox-ctl-{next(_CTL_IDS)}"
        self._ctl_owner = context().socket(zmq.PAIR)
        self._ctl_owner.setsockopt(zmq.LINGER, 0)
        self._ctl_owner.bind(ctl)
        self._ctl_thread = context().socket(zmq.PAIR)
        self._ctl_thread.setsockopt(zmq.LINGER, 0)
        self._ctl_thread.connect(ctl)
        self.buffer.inboxes.append(self)
        self._thread = threading.Thread(target=self._run, name=f"inbox-{self.name}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        poller = zmq.Poller()
        poller.register(self._sock, zmq.POLLIN)
        poller.register(self._ctl_thread, zmq.POLLIN)
        while not self._stop.is_set():
            try:
                events = dict(poller.poll(_POLL_MS))
                if not events:
                    continue
                if self._ctl_thread in events:
                    self._ctl_thread.recv()
                    self._lent.set()  # the socket is the owner's until it hands it back
                    self._home.wait()
                    self._home.clear()
                    continue
                frames = self._sock.recv_multipart(copy=False)
            except zmq.ZMQError:
                if self._stop.is_set():
                    break
                log.exception("%s: receive failed", self.name)
                continue
            msg = self._accept(frames)
            if msg is not None and not self.buffer.put(msg) and self._on_reject is not None:
                try:
                    self._on_reject(msg)
                except Exception:
                    log.exception("%s: on_reject failed", self.name)
        self._ctl_thread.close(linger=0)
        self._sock.close(linger=0)

    def _accept(self, frames: list[Any]) -> Message | None:
        """A received message decoded and counted (None: malformed, dropped)."""
        try:
            msg = decode(frames)
        except DecodeError as exc:
            self.dropped += 1
            log.warning("%s: dropped a malformed message (%s)", self.name, exc)
            return None
        self.received += 1
        if trace.active():
            trace.note_message("recv", self.name, msg)
        return msg

    def drain(self, timeout: float | None = 0.0) -> list[Message]:
        """Everything received since the last call (waits up to `timeout` for something)."""
        if self.busy_poll_s > 0 and timeout != 0.0:
            msgs = self.buffer.take()
            if not msgs and not self.buffer.take_wake():
                msgs = self._wait_direct(timeout)
        else:
            msgs = self.buffer.swap(timeout)
        if msgs and trace.active():
            for msg in msgs:
                trace.note_message("take", self.name, msg)
        return msgs

    def _wait_direct(self, timeout: float | None) -> list[Message]:
        """Wait on the sockets of every inbox sharing the buffer, from the owner's thread."""
        boxes: list[Inbox] = list(self.buffer.inboxes)
        lent = [box for box in boxes if box._lend()]
        try:
            msgs = self.buffer.take()  # what the receivers took before they let go
            if len(lent) < len(boxes):  # a receiver is stopping or gone: the plain wait
                for box in lent:
                    box._home.set()
                lent = []
                return msgs or self.buffer.swap(timeout)
            if msgs or self.buffer.take_wake():
                return msgs
            poller = zmq.Poller()
            for box in boxes:
                poller.register(box._sock, zmq.POLLIN)
            now = time.monotonic()
            deadline = None if timeout is None else now + timeout
            spin_end = now + self.busy_poll_s if deadline is None else \
                min(deadline, now + self.busy_poll_s)
            ready = bool(poller.poll(0))
            while not ready and time.monotonic() < spin_end:  # no sleep: no wake-up either
                if self.buffer.take_wake():
                    return []
                ready = bool(poller.poll(0))
            while not ready:
                left = _WAKE_CHECK_S if deadline is None else \
                    min(_WAKE_CHECK_S, deadline - time.monotonic())
                if left <= 0:
                    return []
                ready = bool(poller.poll(max(1, int(left * 1000.0))))
                if not ready and self.buffer.take_wake():  # a signal handler wants the loop
                    return []
            out: list[Message] = []
            room = self.buffer.capacity
            for box in boxes:
                while len(out) < room:
                    try:
                        frames = box._sock.recv_multipart(zmq.NOBLOCK, copy=False)
                    except zmq.Again:
                        break
                    msg = box._accept(frames)
                    if msg is not None:
                        out.append(msg)
            return out
        finally:
            for box in lent:
                box._home.set()

    def _lend(self) -> bool:
        """Ask the receiver thread to let go of the socket; True once it has (False: the
        thread is gone or stopping, and the socket is not the owner's to use)."""
        if self._stop.is_set() or not self._thread.is_alive():
            return False
        self._lent.clear()
        self._ctl_owner.send(b"")
        while not self._lent.wait(_LEND_WAIT_S):
            if self._stop.is_set() or not self._thread.is_alive():
                return False
        return True

    def close(self) -> None:
        self._stop.set()
        self._home.set()
        self.buffer.wake()
        self._thread.join(timeout=2 * _POLL_MS / 1000 + 1)
        self._ctl_owner.close(linger=0)
        if self in self.buffer.inboxes:
            self.buffer.inboxes.remove(self)
        path = _ipc_path(self.endpoint)
        if path and os.path.exists(path):
            os.unlink(path)


class Outbox:
    """A PUSH socket connected to one endpoint. Not thread-safe: one owner thread."""

    def __init__(self, endpoint: str, timeout_ms: int = 2000, hwm: int = DEFAULT_HWM,
                 immediate: bool = False) -> None:
        self.endpoint = endpoint
        self.timeout_ms = timeout_ms
        self.sent = 0  # messages sent (per-hop message counts in stats)
        self._sock = context().socket(zmq.PUSH)
        self._sock.setsockopt(zmq.SNDHWM, hwm)
        self._sock.setsockopt(zmq.LINGER, 0)
        if immediate:
            # Queue only to a connected peer: a vanished client makes sends fail fast.
            self._sock.setsockopt(zmq.IMMEDIATE, 1)
        self._sock.connect(endpoint)

    def send(self, msg: Message, timeout_ms: int | None = None) -> None:
        """Send, waiting at most `timeout_ms` for room; raise SendTimeout otherwise."""
        self.send_frames(encode(msg), timeout_ms)

    def send_frames(self, frames: list[Any], timeout_ms: int | None = None) -> None:
        # At once where there is room (the usual case: one call, no poll); else wait for room.
        began = trace.now() if trace.active() else 0
        try:
            self._sock.send_multipart(frames, flags=zmq.NOBLOCK, copy=False)
        except zmq.Again:
            wait = self.timeout_ms if timeout_ms is None else timeout_ms
            if not self._sock.poll(wait, zmq.POLLOUT):
                raise SendTimeout(f"no room to send to {self.endpoint} within {wait} ms") \
                    from None
            try:
                self._sock.send_multipart(frames, flags=zmq.NOBLOCK, copy=False)
            except zmq.Again:
                raise SendTimeout(f"send to {self.endpoint} would block") from None
        self.sent += 1
        if trace.active():
            trace.note_frames("send", trace.channel_name(self.endpoint), frames, began)

    def close(self) -> None:
        self._sock.close(linger=CLOSE_LINGER_MS)


class OutboxPool:
    """Outboxes to many endpoints (clients' reply_to), created on first use, each immediate."""

    def __init__(self, timeout_ms: int = 200, max_open: int = 4096) -> None:
        self.timeout_ms = timeout_ms
        self.max_open = max_open
        self.sent = 0  # messages sent, to every endpoint
        self._boxes: dict[str, Outbox] = {}

    def send(self, endpoint: str, msg: Message) -> None:
        """Raises SendTimeout for a peer that does not take the message, or an endpoint no
        peer can have (a reply_to that is not an endpoint: the client is unreachable)."""
        box = self._boxes.get(endpoint)
        if box is None:
            if len(self._boxes) >= self.max_open:
                oldest = next(iter(self._boxes))
                self._boxes.pop(oldest).close()
            try:
                box = Outbox(endpoint, self.timeout_ms, immediate=True)
            except (zmq.ZMQError, TypeError) as exc:
                raise SendTimeout(f"cannot connect to {endpoint!r}: {exc}") from None
            self._boxes[endpoint] = box
        box.send(msg)
        self.sent += 1

    def forget(self, endpoint: str) -> None:
        box = self._boxes.pop(endpoint, None)
        if box is not None:
            box.close()

    def close(self) -> None:
        for box in self._boxes.values():
            box.close()
        self._boxes.clear()
