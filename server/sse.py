"""Server-sent events as OpenAI streams them: `data: {json}\\n\\n` per chunk, then
`data: [DONE]\\n\\n`. A failure after the stream started is one `data: {"error": {...}}`
event, after which the stream ends (no [DONE]).

Events are buffered by `send` and written by `flush`: the relay flushes once it has handled
every delta that is ready (`Generation.relay`), so the events of one event-loop turn leave in
one socket write."""

from __future__ import annotations

import asyncio
import json
import socket
from typing import Any

from aiohttp import web

from tessera.server.state import STATE

HEADERS = {
    "Content-Type": "text/event-stream; charset=utf-8",
    "Cache-Control": "no-cache",
    "X-Accel-Buffering": "no",  # proxies must not hold the stream back
}
# Unsent bytes the kernel may hold for a stream. Its send buffer grows by itself to megabytes
# (net.ipv4.tcp_wmem), which a client that reads nothing would let a slow engine fill for
# minutes before any write of ours waits and the stall timer starts. Data in flight to a
# client that reads is not limited by this, so throughput over long links is unchanged.
UNSENT_LIMIT_BYTES = 64 * 1024


class SseWriter:
    """Every write waits for the client at most `stream_stall_timeout_s`: a client that stops
    reading holds its connection's buffers full, and would otherwise hold the request (and
    its generation slot) for as long as it stays connected."""

    def __init__(self, request: web.Request) -> None:
        self.request = request
        self.response = web.StreamResponse(status=200, headers=HEADERS)
        self.started = False
        self.state = request.app[STATE]  # counts events and writes (host-path figures)
        self.stall_timeout_s = self.state.config.stream_stall_timeout_s
        self._pending: list[bytes] = []

    async def start(self) -> None:
        self._limit_unsent()
        await self.response.prepare(self.request)
        self.started = True

    def _limit_unsent(self) -> None:
        transport = self.request.transport
        sock = transport.get_extra_info("socket") if transport is not None else None
        option = getattr(socket, "TCP_NOTSENT_LOWAT", None)  # Linux and macOS
        if sock is None or option is None or sock.family not in (socket.AF_INET,
                                                                  socket.AF_INET6):
            return
        try:
            sock.setsockopt(socket.IPPROTO_TCP, option, UNSENT_LIMIT_BYTES)
        except OSError:
            pass  # a kernel without it: the stall timer alone, after its buffer fills

    async def send(self, obj: dict[str, Any]) -> None:
        """Queue one event; `flush` writes it."""
        data = json.dumps(obj, ensure_ascii=False, separators=(",", ":"))
        self.state.sse_events += 1
        self._pending.append(b"data: " + data.encode() + b"\n\n")

    async def flush(self) -> None:
        """Write the queued events at once (ConnectionResetError: the client has gone)."""
        if not self._pending:
            return
        data = b"".join(self._pending)
        self._pending.clear()
        self.state.sse_writes += 1
        await self._write(data)

    async def done(self) -> None:
        self._pending.append(b"data: [DONE]\n\n")
        await self.flush()
        await self._write(None)

    async def error(self, body: dict[str, Any]) -> None:
        await self.send(body)
        await self.flush()
        await self._write(None)

    async def _write(self, data: bytes | None) -> None:
        """Write (None: end the body); a client that takes nothing for the stall timeout is
        cut off (ConnectionResetError: the caller aborts the request)."""
        if data is not None and self._fits(len(data)):
            # The write cannot wait for the client, so it needs no stall timer (arming and
            # cancelling one per write costs more than the write at 128 streams).
            await self.response.write(data)
            return
        try:
            async with asyncio.timeout(self.stall_timeout_s):
                if data is None:
                    await self.response.write_eof()
                else:
                    await self.response.write(data)
        except TimeoutError:
            transport = self.request.transport
            if transport is not None:
                transport.abort()  # drop what it never read; free the connection now
            raise ConnectionResetError(f"the client read nothing for "
                                       f"{self.stall_timeout_s:g} s") from None

    def _fits(self, size: int) -> bool:
        """Below the low-water mark the writer is not paused (it resumes there) and this
        write cannot pause it."""
        transport = self.request.transport
        if transport is None or transport.is_closing():
            return False
        return transport.get_write_buffer_size() + size <= transport.get_write_buffer_limits()[0]
