"""One HTTP generation request's life: admission, starting engine requests, merging their
deltas, metrics, and aborting whatever is still running when the handler leaves (the
client disconnected, a write failed, or an error).

    async with Generation(state) as gen:
        await gen.start(prompt=..., sampling=params)      # one per prompt (completions lists)
        first = await gen.first()                         # errors here become HTTP statuses
        async for index, delta in gen.rest(): ...
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from aiohttp import web

from tessera.bus.logs import CURRENT_RID
from tessera.client import AsyncStream, Delta, TesseraError
from tessera.server.errors import ApiError
from tessera.server.formatting import UsageTally
from tessera.server.sse import ChunkEvents, SseWriter
from tessera.server.state import CURRENT_KEY, ServerState

log = logging.getLogger("tessera.server.requests")
_END = object()
Emit = Callable[[int, Delta], Awaitable[None]]


class Generation:
    def __init__(self, state: ServerState) -> None:
        self.state = state
        self.streams: list[AsyncStream] = []
        self.started_at = time.monotonic()
        self.first_at: float | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._queue: asyncio.Queue[Any] = asyncio.Queue()
        self._iter: AsyncIterator[tuple[int, Delta]] | None = None
        self._admitted = False
        self.key = CURRENT_KEY.get()  # whose rate limits this generation counts against
        self.tokens = 0  # prompt + completion tokens, charged to the key at the end
        self.prompt_tokens = 0
        self.output_tokens = 0
        self.last_token_at: float | None = None
        self.finish_reasons: list[str] = []

    async def __aenter__(self) -> Generation:
        self.state.admit()
        self._admitted = True
        return self

    async def __aexit__(self, *exc: object) -> None:
        for task in self._tasks:
            task.cancel()
        for stream in self.streams:
            await stream.aclose()  # aborts the engine request unless it finished
        if self._admitted:
            self.state.release()
            self._record_end()
        if self.key is not None:
            self.state.limiter.charge(self.key, self.tokens)

    async def start(self, **kwargs: Any) -> AsyncStream:
        try:
            stream = await self.state.client.start(stream=True, **kwargs)
        except TesseraError as exc:
            raise ApiError.from_client(exc) from None
        if not self.streams:
            CURRENT_RID.set(stream.rid)  # this task's log lines name the request
        self.streams.append(stream)
        return stream

    def _count(self, delta: Delta) -> None:
        metrics = self.state.metrics
        now = time.monotonic()
        if self.first_at is None:
            self.first_at = now
            metrics.ttft.observe(self.first_at - self.started_at)
        n = len(delta.token_ids)
        if n:
            last = self.last_token_at
            if last is not None:
                # k tokens that came together after a gap g: each waited g / k
                gap = (now - last) / n
                observe = metrics.itl.observe
                for _ in range(n):
                    observe(gap)
            self.last_token_at = now
        metrics.generation_tokens.inc(n)
        self.tokens += n
        self.output_tokens += n
        if delta.finish_reason is not None:
            self.finish_reasons.append(delta.finish_reason)
        usage = delta.usage
        if usage is not None:
            if usage.decode_steps:
                metrics.tokens_per_step.observe(usage.tokens_per_step)
            if delta.index == 0:
                metrics.prompt_tokens.inc(usage.prompt_tokens)
                self.tokens += usage.prompt_tokens
                self.prompt_tokens += usage.prompt_tokens

    def _record_end(self) -> None:
        """The request's E2E, TPOT and finish reasons, and its line in the log."""
        if self.first_at is None:
            return  # refused or failed before any output: counted as an HTTP error
        metrics = self.state.metrics
        end = time.monotonic()
        e2e = end - self.started_at
        metrics.e2e.observe(e2e)
        if self.output_tokens > 1 and self.last_token_at is not None:
            metrics.tpot.observe((self.last_token_at - self.first_at) /
                                 (self.output_tokens - 1))
        reasons = self.finish_reasons or ["abort"]  # left before the end: the client went
        for reason in reasons:
            metrics.request_success.labels(reason).inc()
        rid = self.streams[0].rid if self.streams else None
        log.info("request done: prompt %d tokens, output %d tokens, ttft %.1f ms, e2e %.1f ms, "
                 "finish %s", self.prompt_tokens, self.output_tokens,
                 (self.first_at - self.started_at) * 1000.0, e2e * 1000.0,
                 ",".join(sorted(set(reasons))), extra={"rid": rid})

    async def _pump(self, offset: int, stream: AsyncStream) -> None:
        try:
            async for delta in stream:
                self._queue.put_nowait((offset, delta))
        except TesseraError as exc:
            self._queue.put_nowait(exc)
        self._queue.put_nowait(_END)

    async def _merged(self) -> AsyncIterator[tuple[int, Delta]]:
        """Deltas of every stream; choice indices of stream k are offset by k * n."""
        if len(self.streams) == 1:
            async for delta in self.streams[0]:
                self._count(delta)
                yield delta.index, delta
            return
        offset = 0
        for stream in self.streams:
            self._tasks.append(asyncio.create_task(self._pump(offset, stream)))
            offset += stream.n
        running = len(self.streams)
        while running:
            item = await self._queue.get()
            if item is _END:
                running -= 1
            elif isinstance(item, TesseraError):
                raise item
            else:
                base, delta = item
                self._count(delta)
                yield base + delta.index, delta

    def ready(self) -> bool:
        """A delta is waiting: reading it will not wait."""
        if len(self.streams) == 1:
            return self.streams[0].ready()
        return not self._queue.empty()

    async def first(self) -> tuple[int, Delta] | None:
        """The first delta; an engine error here raises ApiError (answered as HTTP status)."""
        self._iter = self._merged()
        try:
            return await anext(self._iter)
        except StopAsyncIteration:
            return None
        except TesseraError as exc:
            raise ApiError.from_client(exc) from None

    def rest(self) -> AsyncIterator[tuple[int, Delta]]:
        """Every delta after `first()`; engine errors raise TesseraError."""
        assert self._iter is not None, "call first() before rest()"
        return self._iter

    async def collect(self) -> list[tuple[int, Delta]]:
        """Every delta (non-streaming answers); errors raise ApiError."""
        out = []
        head = await self.first()
        if head is not None:
            out.append(head)
        try:
            async for item in self.rest():
                out.append(item)
        except TesseraError as exc:
            raise ApiError.from_client(exc) from None
        return out

    async def relay(self, sse: SseWriter, first: tuple[int, Delta] | None,
                    emit: Emit) -> bool:
        """Pass every delta to `emit` (which writes SSE events). True when the stream ended
        normally (the caller writes usage and [DONE]); after a failure it has written one
        error event and the stream is over; after a disconnect there is nobody to tell."""
        try:
            if first is not None:
                await emit(*first)
            if not self.ready():
                await sse.flush()
            async for index, delta in self.rest():
                await emit(index, delta)
                if not self.ready():  # the events of every delta at hand go in one write
                    await sse.flush()
            return True
        except TesseraError as exc:
            await self._fail(sse, ApiError.from_client(exc))
        except ConnectionResetError:
            pass  # the client left; leaving the `async with` aborts the engine request
        except Exception:
            log.exception("streaming failed")
            await self._fail(sse, ApiError(500, "internal server error while streaming; the "
                                                "server log has the details"))
        return False

    async def _fail(self, sse: SseWriter, error: ApiError) -> None:
        # The status line said 200 long ago: count the real outcome here.
        self.state.metrics.errors.labels(str(error.status), error.error_type).inc()
        try:
            await sse.error(error.body())
        except ConnectionResetError:
            pass  # nobody left to tell


class SendChoice:
    """Queues choice objects as chunks of one stream: `send(choice)` any choice, `text` and
    `delta` the shapes of completions and chat (from a template where they allow)."""

    __slots__ = ("_events", "_queue")

    def __init__(self, sse: SseWriter, events: ChunkEvents) -> None:
        self._events = events
        self._queue = sse.queue

    def __call__(self, choice: dict[str, Any]) -> None:
        self._queue(self._events.choice(choice))

    def text(self, index: int, text: str, finish_reason: str | None) -> None:
        """{"index", "text", "logprobs": null, "finish_reason"}"""
        self._queue(self._events.text(index, text, finish_reason))

    def delta(self, index: int, delta: dict[str, Any], logprobs: Any = None,
              finish_reason: str | None = None) -> None:
        """{"index", "delta", "logprobs", "finish_reason"}"""
        self._queue(self._events.delta(index, delta, logprobs, finish_reason))


EmitChoices = Callable[[int, Delta, SendChoice], None]


async def stream_choices(request: web.Request, gen: Generation, chunk: dict[str, Any],
                         include_usage: bool, emit: EmitChoices) -> web.StreamResponse:
    """The OpenAI streaming answer (chat and completions): `emit(index, delta, send)` queues
    each of a delta's choice objects with `send`, as one chunk `{**chunk, "choices": [choice]}`
    each; with `include_usage` every chunk carries `"usage": null` and a last chunk the usage;
    then [DONE]. Errors before the first delta raise here (an HTTP status)."""
    first = await gen.first()
    sse = SseWriter(request)
    await sse.start()
    if include_usage:
        chunk = {**chunk, "usage": None}
    tally = UsageTally()
    send = SendChoice(sse, ChunkEvents(chunk))

    async def counted(index: int, delta: Delta) -> None:
        tally.add(delta)
        emit(index, delta, send)

    if not await gen.relay(sse, first, counted):
        return sse.response
    try:
        if include_usage:
            await sse.send({**chunk, "choices": [], "usage": tally.body()})
        await sse.done()
    except ConnectionResetError:
        pass  # the client left (or stopped reading) at the very end
    return sse.response
