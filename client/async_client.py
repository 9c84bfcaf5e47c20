"""`AsyncClient`: the asyncio client library (what the HTTP server is built on).

    async with AsyncClient(run_dir) as client:
        result = await client.generate("Hello", max_tokens=8)
        stream = await client.generate(messages=[...], stream=True)
        async for delta in stream: ...

The receiver thread of the BusConnection hands replies to the event loop with
`call_soon_threadsafe`; nothing here blocks the loop (a send that finds the tokenizer's queue
full is retried in a worker thread).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from typing import Any

from tessera.bus.channel import SendTimeout
from tessera.bus.messages import GenerateRequest, StatusReply
from tessera.client.connection import Item, LoopSink
from tessera.client.outputs import Delta, GenerateResult, ResultBuilder
from tessera.client.request import (
    ClientBase,
    Prompt,
    RequestTracker,
    StreamBase,
    open_request,
    status_timeout_error,
)
from tessera.client.sampling import SamplingArg


class AsyncStream(StreamBase):
    """The deltas of one streaming request. `aclose()` (or leaving `async with`) before the
    end aborts the request in the engine; so does cancelling the task that iterates."""

    _replies: asyncio.Queue[Item]

    def __init__(self, tracker: RequestTracker, replies: asyncio.Queue[Item],
                 first_timeout_s: float, inter_timeout_s: float) -> None:
        super().__init__(tracker, replies, first_timeout_s, inter_timeout_s)
        self.n = tracker.n

    def __aiter__(self) -> AsyncIterator[Delta]:
        return self

    @property
    def done(self) -> bool:
        return self._tracker.done

    def ready(self) -> bool:
        """A reply is waiting: the next `__anext__` returns without waiting."""
        return not self._replies.empty()

    async def __anext__(self) -> Delta:
        tracker = self._tracker
        if tracker.done:
            tracker.close()
            raise StopAsyncIteration
        self._check_overflow()
        if not self._replies.empty():  # at hand: no timer to arm (the common case under load)
            return self._feed(self._replies.get_nowait())
        timeout = self._next_timeout()
        try:
            # asyncio.timeout, not wait_for: on Python 3.11 wait_for can swallow a
            # cancellation that lands as the reply arrives, and the request would go on.
            async with asyncio.timeout(timeout):
                item = await self._replies.get()
        except TimeoutError:
            raise self._expire(timeout) from None
        except BaseException:  # cancelled: the caller went away
            tracker.close()
            raise
        return self._feed(item)

    async def aclose(self) -> None:
        self._tracker.close()

    async def __aenter__(self) -> AsyncStream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._tracker.close()


class AsyncClient(ClientBase):
    """Asyncio client of a running engine. Create it inside the event loop that uses it;
    `async with AsyncClient(run_dir) as client:` closes it at the end."""

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()

    def _deliver(self, loop: asyncio.AbstractEventLoop,
                 replies: asyncio.Queue[Item]) -> LoopSink:
        return LoopSink(loop, replies)

    async def _send(self, req: GenerateRequest) -> None:
        try:
            self.conn.send_generate(req, timeout_ms=0)
        except SendTimeout:  # queue full right now: wait for room off the event loop
            await asyncio.get_running_loop().run_in_executor(None, self.conn.send_generate, req)

    async def start(self, prompt: Prompt = None,
                    sampling: SamplingArg = None, *,
                    messages: Sequence[dict[str, Any]] | None = None, input_ids: Any = None,
                    stream: bool = True, rid: str | None = None, priority: int = 0,
                    add_generation_prompt: bool = True,
                    tools: list[dict[str, Any]] | None = None,
                    chat_template_kwargs: dict[str, Any] | None = None,
                    **sampling_kwargs: Any) -> AsyncStream:
        """Send a request and return its stream of deltas (errors before sending, such as
        bad parameters or an open breaker, raise here)."""
        replies: asyncio.Queue[Item] = asyncio.Queue()
        req, tracker = open_request(self.conn, prompt, sampling, sampling_kwargs,
                                    self._deliver(asyncio.get_running_loop(), replies),
                                    messages=messages, input_ids=input_ids, stream=stream,
                                    rid=rid, priority=priority,
                                    add_generation_prompt=add_generation_prompt,
                                    tools=tools, chat_template_kwargs=chat_template_kwargs,
                                    buffer_limit=self.buffer_limit)
        try:
            await self._send(req)
        except BaseException:
            self.conn.unregister(req.rid)
            raise
        return AsyncStream(tracker, replies, self.first_timeout_s, self.inter_timeout_s)

    async def generate(self, prompt: Prompt = None,
                       sampling: SamplingArg = None, *,
                       stream: bool = False, **kwargs: Any) -> GenerateResult | AsyncStream:
        """Like `Client.generate`: the whole GenerateResult, or (stream=True) an AsyncStream."""
        out = await self.start(prompt, sampling, stream=stream, **kwargs)
        if stream:
            return out
        builder = ResultBuilder(out.rid, out.n)
        async with out:
            async for delta in out:
                builder.add(delta)
        return builder.result()

    async def status(self, timeout: float = 2.0) -> StatusReply:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[StatusReply] = loop.create_future()

        def done(reply: StatusReply) -> None:
            def settle() -> None:
                if not future.done():
                    future.set_result(reply)
            try:
                loop.call_soon_threadsafe(settle)
            except RuntimeError:
                pass

        nonce = self.conn.request_status(done)
        try:
            return await asyncio.wait_for(future, timeout)
        except TimeoutError:
            raise status_timeout_error(timeout) from None
        finally:
            self.conn.forget_status_request(nonce)
