"""What the sync and async clients share: the engine's config and the connection, building a
GenerateRequest from the caller's arguments, the per-request state machine that turns replies
into deltas or errors, and the parts of a stream and of a client that do not wait."""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import zmq

from tessera.bus.breaker import CircuitBreaker
from tessera.bus.messages import ErrorReply, GenerateRequest, RequestOutput, SamplingParams
from tessera.bus.process import load_config
from tessera.bus.run_paths import RunPaths
from tessera.client.connection import BusConnection, ForwardingSink, Item
from tessera.client.errors import (
    BadRequestError,
    EngineNotFoundError,
    RequestTimeoutError,
    SlowConsumerError,
    TesseraError,
    UnavailableError,
    from_reply,
)
from tessera.client.outputs import Delta, delta_from_output
from tessera.client.sampling import SamplingArg, check_sampling
from tessera.config import EngineConfig

Prompt = str | Sequence[dict[str, Any]] | Sequence[int] | np.ndarray | None
# A request id travels in every message about its request: keep it short.
MAX_RID_CHARS = 256


def _paths(run_dir: str | RunPaths) -> RunPaths:
    return run_dir if isinstance(run_dir, RunPaths) else RunPaths(run_dir=str(run_dir))


def engine_config(run_dir: str | RunPaths, config: EngineConfig | None) -> EngineConfig:
    """The given config, else the running engine's own (its run directory's config.json:
    timeouts, tokenizer workers), else the defaults."""
    if config is not None:
        return config
    paths = _paths(run_dir)
    if os.path.isfile(paths.config_file):
        return load_config(paths)
    return EngineConfig()


def make_connection(run_dir: str | RunPaths, config: EngineConfig, *,
                    watch_engine: bool, self_name: str) -> BusConnection:
    return BusConnection(
        _paths(run_dir), send_timeout_ms=config.send_timeout_ms,
        breaker=CircuitBreaker("engine", config.breaker_failures, config.breaker_cooldown_s),
        watch_engine=watch_engine, status_interval_s=min(0.5, config.heartbeat_interval_s),
        silence_timeout_s=config.heartbeat_timeout_s, self_name=self_name,
        tokenizer_workers=config.tokenizer_workers)


def build_request(conn: BusConnection, prompt: Prompt, sampling: SamplingParams, *,
                  messages: Sequence[dict[str, Any]] | None, input_ids: Any, stream: bool,
                  rid: str | None, priority: int = 0,
                  add_generation_prompt: bool = True,
                  tools: list[dict[str, Any]] | None = None,
                  chat_template_kwargs: dict[str, Any] | None = None) -> GenerateRequest:
    """One GenerateRequest: `prompt` may be text, chat messages (a list of dicts) or token ids
    (a list of ints / int array); exactly one form must be given."""
    if prompt is not None:
        if isinstance(prompt, str):
            pass
        elif isinstance(prompt, np.ndarray) or (
                isinstance(prompt, Sequence) and prompt and all(
                    isinstance(t, int | np.integer) and not isinstance(t, bool) for t in prompt)):
            if input_ids is not None:
                raise BadRequestError("give the token ids once: as prompt or as input_ids")
            input_ids, prompt = prompt, None
        elif isinstance(prompt, Sequence) and prompt and all(isinstance(m, dict) for m in prompt):
            if messages is not None:
                raise BadRequestError("give the chat messages once: as prompt or as messages")
            messages, prompt = list(prompt), None  # type: ignore[arg-type]
        else:
            raise BadRequestError("prompt must be a string, a non-empty list of chat messages "
                                  "or a non-empty list of token ids", param="prompt")
    given = sum(x is not None for x in (prompt, messages, input_ids))
    if given != 1:
        raise BadRequestError("give exactly one of prompt, messages or input_ids")
    if rid is not None and rid != "":  # "" or None: a fresh id
        check_rid(rid)
    ids = None
    if input_ids is not None:
        ids = np.asarray(input_ids)
        if ids.ndim != 1 or ids.size == 0 or not np.issubdtype(ids.dtype, np.integer):
            raise BadRequestError("input_ids must be a non-empty list of integers",
                                  param="input_ids")
        # Only what the message's int32 array can hold is checked here: whether an id is
        # in the vocabulary is the scheduler's to judge, where the model's vocabulary is.
        wire = np.iinfo(np.int32)
        if ids.min() < wire.min or ids.max() > wire.max:
            raise BadRequestError("input_ids holds a value that is no token id (ids are 32-bit "
                                  "integers)", param="input_ids")
        ids = ids.astype(np.int32)
    return GenerateRequest(
        rid=rid or uuid.uuid4().hex, reply_to=conn.endpoint, sampling=sampling, prompt=prompt,
        messages=list(messages) if messages is not None else None, input_ids=ids,
        stream=stream, priority=priority, add_generation_prompt=add_generation_prompt,
        tools=tools, chat_template_kwargs=chat_template_kwargs,
        arrival_time=time.time())


def check_rid(rid: Any) -> None:
    if not isinstance(rid, str) or not rid:
        raise BadRequestError("rid must be a non-empty string", param="rid")
    if len(rid) > MAX_RID_CHARS:
        raise BadRequestError(f"rid has {len(rid)} characters; at most {MAX_RID_CHARS} are "
                              f"allowed", param="rid")
    if not rid.isascii():
        try:
            rid.encode("utf-8")
        except UnicodeEncodeError:
            raise BadRequestError("rid holds a lone surrogate: not valid Unicode text",
                                  param="rid") from None


class BoundedSink(ForwardingSink):
    """Hands a request's replies to its consumer, with at most `limit` outputs unread. A
    consumer that far behind has stopped reading (an HTTP client that never reads its
    stream): the request is aborted in the engine instead of buffered without end, and the
    consumer gets SlowConsumerError at its next read.

    Called on the connection's receiver thread; `consumed` is counted by the consumer's
    thread. Each count has one writer, so no lock is needed.
    """

    def __init__(self, conn: BusConnection, rid: str, put: Callable[[Item], None],
                 limit: int) -> None:
        self.conn = conn
        self.rid = rid
        self.put = put
        self.limit = limit
        self.delivered = 0
        self.consumed = 0
        self.overflow: SlowConsumerError | None = None

    def admit(self, item: Item) -> Item | None:
        if self.overflow is not None:
            return None
        if isinstance(item, RequestOutput) and self.limit > 0 and \
                self.delivered - self.consumed >= self.limit:
            self.overflow = SlowConsumerError(
                f"the stream's reader left {self.limit} outputs unread; the request was "
                f"aborted (read streams as they come)")
            self.conn.unregister(self.rid)
            self.conn.send_abort(self.rid, "slow consumer")
            return self.overflow  # wakes a consumer waiting for the next output
        self.delivered += 1
        return item


class RequestTracker:
    """State of one request as its replies arrive: which choices have finished, whether the
    engine answered at all (a breaker success), and what to raise on an error."""

    def __init__(self, conn: BusConnection, rid: str, n: int,
                 sink: BoundedSink | None = None) -> None:
        self.conn = conn
        self.rid = rid
        self.n = n
        self.answered = False
        self.finished: set[int] = set()
        self.failed = False
        self.sink = sink

    def check_overflow(self) -> None:
        """Raise SlowConsumerError if the reader fell too far behind (the request is gone)."""
        if self.sink is not None and self.sink.overflow is not None:
            self.failed = True
            raise self.sink.overflow

    @property
    def done(self) -> bool:
        return self.failed or len(self.finished) >= self.n

    def feed(self, item: Item) -> Delta:
        """The delta in `item`; raises the matching TesseraError for an error."""
        if self.sink is not None:
            self.sink.consumed += 1
        if isinstance(item, TesseraError):
            self.failed = True
            raise item
        if not self.answered:
            self.answered = True
            self.conn.breaker.record_success()
        if isinstance(item, ErrorReply):
            self.failed = True
            raise from_reply(item)
        assert isinstance(item, RequestOutput)
        if not 0 <= item.index < self.n:
            self.failed = True
            raise TesseraError(f"the engine answered choice {item.index} of a request with "
                               f"n={self.n}", status=500)
        if item.finish_reason is not None:
            self.finished.add(item.index)
        return delta_from_output(item)

    def timed_out(self) -> None:
        self.failed = True
        self.conn.breaker.record_failure("timeout")

    def close(self) -> None:
        """Stop routing replies; abort the request in the engine if it is still running."""
        self.conn.unregister(self.rid)
        if not self.done:
            self.failed = True
            self.conn.send_abort(self.rid)


def open_request(conn: BusConnection, prompt: Prompt,
                 sampling: SamplingArg,
                 sampling_kwargs: dict[str, Any], sink: Callable[[Item], None], *,
                 messages: Sequence[dict[str, Any]] | None, input_ids: Any, stream: bool,
                 rid: str | None, priority: int, add_generation_prompt: bool,
                 buffer_limit: int = 0, tools: list[dict[str, Any]] | None = None,
                 chat_template_kwargs: dict[str, Any] | None = None,
                 ) -> tuple[GenerateRequest, RequestTracker]:
    """Check the parameters and the breaker, build the request and route its replies to
    `sink` (at most `buffer_limit` unread outputs, 0: no limit); the caller sends it (and
    unregisters `req.rid` if the send fails)."""
    params = check_sampling(sampling, sampling_kwargs).params
    conn.check_available()
    req = build_request(conn, prompt, params, messages=messages, input_ids=input_ids,
                        stream=stream, rid=rid, priority=priority,
                        add_generation_prompt=add_generation_prompt, tools=tools,
                        chat_template_kwargs=chat_template_kwargs)
    bounded = BoundedSink(conn, req.rid, sink, buffer_limit)
    conn.register(req.rid, bounded)
    return req, RequestTracker(conn, req.rid, params.n, bounded)


class StreamBase:
    """What Stream and AsyncStream share; they differ only in how they wait for a reply."""

    def __init__(self, tracker: RequestTracker, replies: Any,
                 first_timeout_s: float, inter_timeout_s: float) -> None:
        self.rid = tracker.rid
        self._tracker = tracker
        self._replies = replies
        self._first_timeout_s = first_timeout_s
        self._inter_timeout_s = inter_timeout_s

    def _next_timeout(self) -> float:
        """How long to wait for the next reply: longer for the first one."""
        return self._inter_timeout_s if self._tracker.answered else self._first_timeout_s

    def _expire(self, timeout: float) -> RequestTimeoutError:
        """No reply within `timeout`: abort the request and return the error to raise."""
        tracker = self._tracker
        tracker.timed_out()
        tracker.conn.send_abort(self.rid, "timeout")
        tracker.close()
        what = "output" if not tracker.answered else "further output"
        return RequestTimeoutError(f"no {what} from the engine within {timeout:g} s; the "
                                   f"request was aborted")

    def _check_overflow(self) -> None:
        try:
            self._tracker.check_overflow()
        except BaseException:
            self._tracker.close()
            raise

    def _feed(self, item: Item) -> Delta:
        try:
            self._tracker.check_overflow()
            return self._tracker.feed(item)
        except BaseException:
            self._tracker.close()
            raise


class ClientBase:
    """The construction, abort and close that Client and AsyncClient share."""

    def __init__(self, run_dir: str | RunPaths, config: EngineConfig | None = None, *,
                 request_timeout_s: float | None = None,
                 first_output_timeout_s: float | None = None,
                 watch_engine: bool = True, process_name: str = "") -> None:
        check_run_dir(_paths(run_dir))
        config = engine_config(run_dir, config)
        self.config = config
        self.buffer_limit = config.stream_buffer_outputs
        self.inter_timeout_s = request_timeout_s or config.request_timeout_s
        self.first_timeout_s = first_output_timeout_s or self.inter_timeout_s
        try:
            self.conn = make_connection(run_dir, config, watch_engine=watch_engine,
                                        self_name=process_name)
        except zmq.ZMQError as exc:
            raise EngineNotFoundError(
                f"cannot open a reply socket in the run directory {_paths(run_dir).run_dir} "
                f"({exc}); pass the run directory of a running engine") from None

    def abort(self, rid: str) -> None:
        self.conn.send_abort(rid)

    def close(self) -> None:
        self.conn.close()


def check_run_dir(paths: RunPaths) -> None:
    """A clear error for a run directory that does not exist (instead of a socket error).
    A directory whose engine is not running (yet) is accepted: requests then fail fast with
    503 "not running", and work once the engine is up."""
    if not os.path.isdir(paths.run_dir):
        raise EngineNotFoundError(
            f"no engine run directory at {paths.run_dir} (it does not exist); pass the run "
            f"directory a running engine uses: `tessera serve --run-dir DIR`, or "
            f"`LLM(...).run_dir` of the offline engine")


def status_timeout_error(timeout: float) -> UnavailableError:
    return UnavailableError(f"the supervisor did not answer within {timeout:g} s; "
                            f"is the engine running?")
