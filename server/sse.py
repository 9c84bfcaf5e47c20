"""Server-sent events as OpenAI streams them: `data: {json}\\n\\n` per chunk, then
`data: [DONE]\\n\\n`. A failure after the stream started is one `data: {"error": {...}}`
event, after which the stream ends (no [DONE]).

Events are buffered by `send` (or `queue`, for bytes already made) and written by `flush`:
the relay flushes once it has handled every delta that is ready (`Generation.relay`), so the
events of one event-loop turn leave in one socket write.

`ChunkEvents` makes the events of one stream's chunks: the chunk's fixed fields are encoded
once per stream, and the choices of most tokens (text or content only) are written from a
template; every event is byte for byte what `event({**chunk, "choices": [choice]})` gives."""

from __future__ import annotations

import asyncio
import json
import socket
from json.encoder import encode_basestring  # what the encoder below writes strings with
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
# What a write adds to its data, at most: the chunk's size line and CRLF (and, on the first,
# the response's headers, written with it)
_FRAMING_BYTES = 4096
# json.dumps(obj, ensure_ascii=False, separators=(",", ":")), without building an encoder
# per call (dumps does, for any argument other than its defaults)
_encode = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode


def event(obj: Any) -> bytes:
    """One SSE event: `data: {json}\\n\\n`."""
    return b"data: " + _encode(obj).encode() + b"\n\n"


class ChunkEvents:
    """The events `{**chunk, "choices": [choice]}` of one stream, its chunk encoded once.
    `text` and `delta` write the shapes of most tokens from a template and hand anything
    else to the encoder; either way the bytes are those of `event`."""

    def __init__(self, chunk: dict[str, Any]) -> None:
        self.chunk = chunk
        head = _encode(chunk)
        # "choices" is the last key of {**chunk, "choices": ...} unless the chunk has one
        self.templated = "choices" not in chunk and head.endswith("}")
        self.prefix = "data: " + head[:-1] + (',"choices":[' if chunk else '"choices":[')
        self.suffix = "]}\n\n"

    def choice(self, choice: dict[str, Any]) -> bytes:
        if not self.templated:
            return event({**self.chunk, "choices": [choice]})
        return (self.prefix + _encode(choice) + self.suffix).encode()

    def text(self, index: int, text: str, finish_reason: str | None) -> bytes:
        """Completions: {"index", "text", "logprobs": null, "finish_reason"}."""
        if self.templated and type(index) is int and type(text) is str and (
                finish_reason is None or type(finish_reason) is str):
            finish = "null" if finish_reason is None else encode_basestring(finish_reason)
            return (f'{self.prefix}{{"index":{index},"text":{encode_basestring(text)},'
                    f'"logprobs":null,"finish_reason":{finish}}}{self.suffix}').encode()
        return self.choice({"index": index, "text": text, "logprobs": None,
                            "finish_reason": finish_reason})

    def delta(self, index: int, delta: dict[str, Any], logprobs: Any = None,
              finish_reason: str | None = None) -> bytes:
        """Chat: {"index", "delta", "logprobs", "finish_reason"}; a content-only delta
        without logprobs or finish_reason from the template."""
        if self.templated and logprobs is None and finish_reason is None and \
                type(index) is int and type(delta) is dict and len(delta) == 1:
            content = delta.get("content")
            if type(content) is str:
                return (f'{self.prefix}{{"index":{index},"delta":{{"content":'
                        f'{encode_basestring(content)}}},"logprobs":null,'
                        f'"finish_reason":null}}{self.suffix}').encode()
        return self.choice({"index": index, "delta": delta, "logprobs": logprobs,
                            "finish_reason": finish_reason})


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
        self.queue(event(obj))

    def queue(self, data: bytes) -> None:
        """Queue one event already made (`event`, `ChunkEvents`); `flush` writes it."""
        self.state.sse_events += 1
        self._pending.append(data)

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
        """The write cannot wait: the writer is not paused now, and this write cannot pause
        it (the transport pauses it above its high-water mark; a drain of a writer that is
        not paused returns at once). Not the low-water mark: uvloop's is 16 bytes."""
        transport = self.request.transport
        if transport is None or transport.is_closing():
            return False
        protocol = self.request.protocol
        if protocol is None or protocol.writing_paused:
            return False
        return transport.get_write_buffer_size() + size + _FRAMING_BYTES <= \
            transport.get_write_buffer_limits()[1]
