"""The client's side of the bus: one reply socket, one receiver thread, routing by request id.

Every client object owns a `BusConnection`:
  - a PULL socket bound at its own `reply_to` endpoint; a daemon thread receives
    `RequestOutput` / `ErrorReply` and hands each to the sink registered for its rid, and
    `StatusReply` to whoever asked (and to the liveness watch);
  - PUSH outboxes to the tokenizer endpoint(s) (a request and its abort go to the same one)
    and to the supervisor;
  - the circuit breaker that turns timeouts and a dead engine into fast 503s;
  - the liveness watch: every `status_interval_s` it asks the supervisor for the status of
    every process. A process of the request path (scheduler, worker, detokenizer) seen up
    before and now reported dead or not ready (or a supervisor that stops answering, or
    never answers while requests wait: an engine of another protocol version) trips
    the breaker and fails every request in flight at once, so a streaming caller learns of a
    `kill -9` within about a second instead of at its timeout; once every process is up again
    (the supervisor restarted it) new requests go through. A dead tokenizer only loses the
    requests in its queue: those not answered yet are sent again when it is back (resend.py).
    The HTTP server is not on a bus client's path: its death changes nothing here.
    On one host it also checks the reported pids itself every `_PID_CHECK_S`: the
    supervisor reaps a dead child and starts stopping everyone at once, sometimes before its
    next status answer, and the caller must still get an error rather than a cut stream.

Sinks are called on the receiver thread; they must only hand the item over (a queue put or
`loop.call_soon_threadsafe`), never block. The receiver takes every message waiting on the
socket at once (each RequestOutputBatch holds a step's outputs for many requests) and wakes
each event loop once for all of them: `LoopSink`s are handed over together, so 128 streams
served by one asyncio server cost one wake-up per step, not 128.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import threading
import time
import zlib
from collections.abc import Callable
from typing import Any, TypeAlias

import zmq

from tessera.bus import trace
from tessera.bus.breaker import CircuitBreaker, CircuitOpenError
from tessera.bus.channel import DEFAULT_HWM, Outbox, SendTimeout, context
from tessera.bus.codec import DecodeError, EncodeError, MessageTooLarge, decode, encode
from tessera.bus.messages import (
    PROTOCOL_VERSION,
    AbortRequest,
    ErrorReply,
    GenerateRequest,
    Message,
    RequestOutput,
    RequestOutputBatch,
    StatusReply,
    StatusRequest,
)
from tessera.bus.output_batch import unpack_outputs
from tessera.bus.run_paths import RunPaths
from tessera.client.errors import (
    BadRequestError,
    EngineDeadError,
    OverloadedError,
    PromptTooLongError,
    TesseraError,
)
from tessera.client.resend import Resender, tokenizer_index
from tessera.codes import OVERLOADED, coded

log = logging.getLogger(__name__)

Item: TypeAlias = RequestOutput | ErrorReply | TesseraError
Sink: TypeAlias = Callable[[Item], None]

_POLL_MS = 50
_PID_CHECK_S = 0.05
SERVER_PROCESS = "server"  # the HTTP front end: not on the path of a bus client's requests
_DRAIN_MAX = 256  # messages taken off the socket before their items are handed over


class ForwardingSink:
    """A sink that looks at each item before passing it on to `put` (which may be a
    LoopSink): `admit` returns what to pass on, or None to drop it."""

    put: Sink

    def admit(self, item: Item) -> Item | None:
        raise NotImplementedError

    def __call__(self, item: Item) -> None:
        passed = self.admit(item)
        if passed is not None:
            self.put(passed)


class LoopSink:
    """A sink whose items go to an asyncio queue on the loop that owns it. Called alone it
    wakes the loop for one item; the receiver thread hands many over in one wake-up."""

    def __init__(self, loop: asyncio.AbstractEventLoop, queue: asyncio.Queue[Any]) -> None:
        self.loop = loop
        self.queue = queue

    def __call__(self, item: Item) -> None:
        _wake(self.loop, [(self.queue, item)])


def _wake(loop: asyncio.AbstractEventLoop, items: list[tuple[asyncio.Queue[Any], Item]]) -> None:
    try:
        loop.call_soon_threadsafe(_put_all, items)
    except RuntimeError:  # the loop is closed: nobody is waiting any more
        pass


def _put_all(items: list[tuple[asyncio.Queue[Any], Item]]) -> None:
    for queue, item in items:
        queue.put_nowait(item)


def tokenizer_endpoints(paths: RunPaths, workers: int = 1) -> list[str]:
    """The endpoint of each tokenizer process (one per `tokenizer_workers` when the run paths
    name them per index, else the single shared one)."""
    per_index = getattr(paths, "tokenizer_endpoint", None)
    if workers > 1 and callable(per_index):
        return [per_index(i) for i in range(workers)]
    return [paths.tokenizer]


class BusConnection:
    def __init__(self, paths: RunPaths, *, send_timeout_ms: int = 2000,
                 breaker: CircuitBreaker | None = None, watch_engine: bool = True,
                 status_interval_s: float = 0.5, silence_timeout_s: float = 5.0,
                 self_name: str = "", tokenizer_workers: int = 1) -> None:
        self.paths = paths
        self.endpoint = paths.client_endpoint()
        self.send_timeout_ms = send_timeout_ms
        self.breaker = breaker or CircuitBreaker("engine")
        self.watch_engine = watch_engine
        self.status_interval_s = status_interval_s
        self.silence_timeout_s = silence_timeout_s
        self.self_name = self_name
        self.dead_reason: str | None = None
        self.last_status: StatusReply | None = None
        self.last_status_at = 0.0
        self._unanswered_since: float | None = None  # requests in flight, no status ever
        self.dropped = 0
        self.received = 0  # messages taken from the reply socket
        self.loop_wakeups = 0  # event-loop wake-ups that handed items to LoopSinks
        self._seen_alive: set[str] = set()
        # name -> pid of engine processes on this host (ipc transport), from status replies
        self._pids: dict[str, int] = {}
        self._dead_pids: set[int] = set()  # a late status saying "alive" must not revive them
        self._next_pid_check = 0.0
        self._routes: dict[str, Sink] = {}
        self._resend = Resender()
        self._status_waiters: dict[int, Callable[[StatusReply], None]] = {}
        self._lock = threading.Lock()
        self._nonce = itertools.count(1)
        self._stop = threading.Event()
        path = endpoint_path(self.endpoint)
        self._sock = context().socket(zmq.PULL)
        self._sock.setsockopt(zmq.RCVHWM, DEFAULT_HWM)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.bind(self.endpoint)
        if path and os.path.exists(path):
            os.chmod(path, 0o600)  # only this user may push replies to us
        # immediate: a request waits only for a tokenizer that is connected, so an engine
        # that is not running fails the send in send_timeout_ms instead of queueing forever.
        self._tokenizers = [Outbox(ep, send_timeout_ms, immediate=True)
                            for ep in tokenizer_endpoints(paths, tokenizer_workers)]
        self._tok_locks = [threading.Lock() for _ in self._tokenizers]
        # A small queue toward the supervisor: status requests are worthless once stale.
        self._supervisor = Outbox(paths.supervisor, timeout_ms=0, hwm=16)
        self._sup_lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="client-receiver", daemon=True)
        self._thread.start()

    # -- requests ---------------------------------------------------------------------------
    def check_available(self) -> None:
        """Raise at once if new requests cannot succeed (dead engine, open breaker)."""
        if self.dead_reason is not None:
            raise EngineDeadError(f"the engine cannot serve now ({self.dead_reason}); retry "
                                  f"once it has restarted", retry_after=self.breaker.cooldown_s)
        try:
            self.breaker.check()
        except CircuitOpenError as exc:
            raise OverloadedError(str(exc), retry_after=max(1.0, exc.retry_after_s)) from None

    def register(self, rid: str, sink: Sink) -> None:
        with self._lock:
            if rid in self._routes:
                raise BadRequestError(f"request id {rid!r} is already in flight; use a "
                                      f"unique rid", param="rid")
            self._routes[rid] = sink

    def unregister(self, rid: str) -> None:
        with self._lock:
            self._routes.pop(rid, None)
        self._resend.forget(rid)

    def in_flight(self) -> int:
        with self._lock:
            return len(self._routes)

    def _tokenizer_index(self, rid: str) -> int:
        return zlib.crc32(rid.encode()) % len(self._tokenizers)

    def send_generate(self, req: GenerateRequest, timeout_ms: int | None = None) -> None:
        """Push a request to its tokenizer; a full or absent tokenizer counts as a breaker
        failure and raises OverloadedError (503)."""
        i = self._tokenizer_index(req.rid)
        wait = self.send_timeout_ms if timeout_ms is None else timeout_ms
        frames = encode_request(req)
        try:
            with self._tok_locks[i]:
                self._tokenizers[i].send_frames(frames, timeout_ms=wait)
        except SendTimeout:
            if timeout_ms == 0:
                raise  # a non-blocking attempt: the caller retries with the full timeout
            self.breaker.record_failure("send timeout")
            raise OverloadedError(
                f"the engine did not accept the request within {wait} ms (overloaded or "
                f"not running); retry later" + coded(OVERLOADED)) from None
        self._resend.sent(i, req)

    def send_abort(self, rid: str, reason: str = "abort") -> None:
        """Best effort and never blocking: an abort that cannot be sent now is dropped (the
        engine also aborts a request whose reply_to has gone)."""
        i = self._tokenizer_index(rid)
        abort = AbortRequest(rid=rid, reason=reason)
        try:
            with self._tok_locks[i]:
                self._tokenizers[i].send(abort, timeout_ms=0)
        except SendTimeout:
            if i in self._resend.down:
                self._resend.abort_failed(i, abort)  # sent when the tokenizer is back
            else:
                log.debug("abort of %s not sent: tokenizer queue full", rid)

    def fail_all(self, error: TesseraError) -> int:
        """Deliver `error` to every request in flight; returns how many there were."""
        with self._lock:
            sinks = list(self._routes.values())
        for sink in sinks:
            sink(error)
        return len(sinks)

    # -- status -----------------------------------------------------------------------------
    def request_status(self, callback: Callable[[StatusReply], None] | None = None) -> int:
        nonce = next(self._nonce)
        if callback is not None:
            with self._lock:
                self._status_waiters[nonce] = callback
        try:
            with self._sup_lock:
                self._supervisor.send(StatusRequest(reply_to=self.endpoint, nonce=nonce),
                                      timeout_ms=0)
        except SendTimeout:
            log.debug("status request not sent: supervisor queue full")
        return nonce

    def forget_status_request(self, nonce: int) -> None:
        with self._lock:
            self._status_waiters.pop(nonce, None)

    def _on_status(self, reply: StatusReply) -> None:
        self.last_status, self.last_status_at = reply, time.monotonic()
        with self._lock:
            waiter = self._status_waiters.pop(reply.nonce, None)
        if waiter is not None:
            waiter(reply)
        self._check_liveness(reply)

    def _check_liveness(self, reply: StatusReply) -> None:
        down = []
        for name, info in reply.processes.items():
            if name in (self.self_name, SERVER_PROCESS) or not isinstance(info, dict):
                continue
            pid = info.get("pid")
            up = bool(info.get("alive", False)) and info.get("ready", True) is not False \
                and pid not in self._dead_pids
            if up:
                self._seen_alive.add(name)
                if self.endpoint.startswith("ipc://") and isinstance(pid, int) and pid > 0 \
                        and pid != os.getpid():
                    self._pids[name] = pid
                index = tokenizer_index(name)
                if index is not None and index in self._resend.down:
                    self._tokenizer_back(index)
            elif name in self._seen_alive or reply.ready:
                down.append(name)
        self._lost(down)
        if self.dead_reason is not None and all(tokenizer_index(n) is not None for n in down):
            log.info("the engine answers again and every process is up")
            self.dead_reason = None
            self.breaker.record_success()

    def _lost(self, names: list[str]) -> None:
        """Processes of the request path that are down (dead, hung, or restarting)."""
        core = []
        for name in sorted(names):
            index = tokenizer_index(name)
            if index is None:
                core.append(name)
            elif index < len(self._tokenizers) and self._resend.tokenizer_down(index):
                log.warning("%s is down: requests it had not answered are sent again when it "
                            "is back", name)
        if core:
            self._engine_dead(f"process {', '.join(core)} is down")

    def _tokenizer_back(self, index: int) -> None:
        again, aborts = self._resend.tokenizer_back(index)
        if again:
            log.warning("tokenizer%d is back: sending %d unanswered request(s) again", index,
                        len(again))
        pending: list[GenerateRequest | AbortRequest] = [*again, *aborts]
        for k, msg in enumerate(pending):
            try:
                frames = encode(msg)
                with self._tok_locks[index]:
                    self._tokenizers[index].send_frames(frames, timeout_ms=self.send_timeout_ms)
            except SendTimeout:
                # Not connected yet: everything left waits for the next status (the requests
                # are still unanswered; the aborts are queued again), without blocking here
                # once per message.
                self._resend.tokenizer_down(index)
                for left in pending[k:]:
                    if isinstance(left, AbortRequest):
                        self._resend.abort_failed(index, left)
                return

    def _engine_dead(self, reason: str) -> None:
        first = self.dead_reason is None
        self.dead_reason = reason
        self.breaker.trip(reason)
        if first:
            log.error("engine unavailable: %s; failing requests in flight", reason)
        self.fail_all(EngineDeadError(f"an engine process stopped while generating ({reason});"
                                      f" retry the request", retry_after=self.breaker.cooldown_s))

    def check_pids(self) -> None:
        """Fail fast when an engine process this host knows of has vanished."""
        gone = []
        for name, pid in list(self._pids.items()):
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                gone.append(name)
                self._dead_pids.add(pid)
                self._pids.pop(name, None)
            except PermissionError:  # exists, owned by someone else
                pass
        if gone:
            self._lost(gone)

    def _watch(self, now: float, next_poll: float) -> float:
        if now >= self._next_pid_check:
            self._next_pid_check = now + _PID_CHECK_S
            self.check_pids()
        if now < next_poll:
            return next_poll
        self.request_status()
        silent = now - self.last_status_at
        if self.last_status is not None and silent > self.silence_timeout_s:
            self._engine_dead(f"the supervisor has not answered for {silent:.1f} s")
        elif self.last_status is None:
            self._watch_unanswered(now)
        return now + self.status_interval_s

    def _watch_unanswered(self, now: float) -> None:
        """No status has ever come back. A tokenizer that took requests (its socket is
        connected) while the supervisor stays silent is an engine that drops what this
        client sends: one speaking another protocol version (each side discards messages of
        a version it does not know) or one whose supervisor hangs. Its requests would wait
        forever, so after silence_timeout_s with requests in flight they fail and new ones
        are refused, until a status arrives (then _check_liveness lets them through)."""
        if self.in_flight() == 0 or self.dead_reason is not None:
            self._unanswered_since = None
            return
        if self._unanswered_since is None:
            self._unanswered_since = now
        elif now - self._unanswered_since > self.silence_timeout_s:
            self._unanswered_since = None
            self._engine_dead(
                f"the supervisor at {self.paths.supervisor} has not answered a status request "
                f"in {self.silence_timeout_s:.1f} s while requests wait: an engine of another "
                f"tessera version (this client speaks bus protocol {PROTOCOL_VERSION}) or a "
                f"hung supervisor")

    # -- receiver thread --------------------------------------------------------------------
    def _run(self) -> None:
        poller = zmq.Poller()
        poller.register(self._sock, zmq.POLLIN)
        next_poll = 0.0
        while not self._stop.is_set():
            try:
                if self.watch_engine:
                    next_poll = self._watch(time.monotonic(), next_poll)
                if not poller.poll(_POLL_MS):
                    continue
                batch = [self._sock.recv_multipart(copy=False)]
                while len(batch) < _DRAIN_MAX:
                    try:
                        batch.append(self._sock.recv_multipart(zmq.NOBLOCK, copy=False))
                    except zmq.Again:
                        break
            except zmq.ZMQError:
                if self._stop.is_set():
                    break
                log.exception("client receive failed")
                continue
            self.received += len(batch)
            deliveries: list[tuple[Sink, Item]] = []
            for frames in batch:
                self._take(frames, deliveries)
            self._deliver(deliveries)
        self._sock.close(linger=0)

    def _take(self, frames: list[Any], deliveries: list[tuple[Sink, Item]]) -> None:
        """Decode one message; its items for registered requests join `deliveries`."""
        try:
            msg = decode(frames)
            items: list[Message] = list(unpack_outputs(msg)) \
                if isinstance(msg, RequestOutputBatch) else [msg]
        except (DecodeError, ValueError) as exc:
            self.dropped += 1
            log.warning("client dropped a malformed message (%s)", exc)
            return
        if trace.active():
            trace.note_message("recv", "client", msg)
        if isinstance(msg, StatusReply):
            # What arrived before it goes first: a death it reports comes after those outputs.
            self._deliver(deliveries)
            deliveries.clear()
            self._on_status(msg)
            return
        if not isinstance(msg, RequestOutput | ErrorReply | RequestOutputBatch):
            self.dropped += 1
            log.warning("client dropped an unexpected %s", type(msg).__name__)
            return
        outputs = [item for item in items if isinstance(item, RequestOutput | ErrorReply)]
        with self._lock:
            for item in outputs:
                sink = self._routes.get(item.rid)
                if sink is not None:  # outputs of finished or aborted requests are dropped
                    deliveries.append((sink, item))
        for item in outputs:
            self._resend.answered(item.rid)

    def _deliver(self, deliveries: list[tuple[Sink, Item]]) -> None:
        """Hand items over in arrival order: each event loop is woken once for all of its
        items, other sinks are called one by one."""
        loops: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Queue[Any], Item]]] = {}
        for sink, item in deliveries:
            passed: Item | None = item
            while isinstance(sink, ForwardingSink) and passed is not None:
                passed, sink = sink.admit(passed), sink.put
            if passed is None:
                continue
            item = passed
            if isinstance(sink, LoopSink):
                loops.setdefault(sink.loop, []).append((sink.queue, item))
            else:
                sink(item)
        for loop, items in loops.items():
            self.loop_wakeups += 1
            _wake(loop, items)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=1.0)
        for box in self._tokenizers:
            box.close()
        self._supervisor.close()
        path = endpoint_path(self.endpoint)
        if path and os.path.exists(path):
            os.unlink(path)


def encode_request(req: GenerateRequest) -> list[object]:
    """The request's frames; a request the bus cannot carry is the caller's error (400, or
    413 when it is too large), raised here at once instead of being dropped on the way."""
    try:
        return encode(req)
    except MessageTooLarge as exc:
        raise PromptTooLongError(f"the request is too large for the engine ({exc}); send a "
                                 f"shorter prompt") from None
    except EncodeError as exc:
        raise BadRequestError(f"the request cannot be sent: {exc}") from None


def endpoint_path(endpoint: str) -> str | None:
    return endpoint[len("ipc://"):] if endpoint.startswith("ipc://") else None
