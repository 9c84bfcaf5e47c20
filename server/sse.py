"""Server-sent events as OpenAI streams them: `data: {json}\\n\\n` per chunk, then
`data: [DONE]\\n\\n`. A failure after the stream started is one `data: {"error": {...}}`
event, after which the stream ends (no [DONE])."""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

HEADERS = {
    "Content-Type": "text/event-stream; charset=utf-8",
    "Cache-Control": "no-cache",
    "X-Accel-Buffering": "no",  # proxies must not hold the stream back
}


class SseWriter:
    def __init__(self, request: web.Request) -> None:
        self.request = request
        self.response = web.StreamResponse(status=200, headers=HEADERS)
        self.started = False

    async def start(self) -> None:
        await self.response.prepare(self.request)
        self.started = True

    async def send(self, obj: dict[str, Any]) -> None:
        """Raises ConnectionResetError when the client has gone (the caller aborts)."""
        data = json.dumps(obj, ensure_ascii=False, separators=(",", ":"))
        await self.response.write(b"data: " + data.encode() + b"\n\n")

    async def done(self) -> None:
        await self.response.write(b"data: [DONE]\n\n")
        await self.response.write_eof()

    async def error(self, body: dict[str, Any]) -> None:
        await self.send(body)
        await self.response.write_eof()
