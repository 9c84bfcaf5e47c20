"""A tiny OpenAI-style streaming completions server for benchmark tests (no engine): it
answers `max_tokens` chunks `token_delay_s` apart, reports usage (cached tokens: the prompt
tokens it has seen as a prefix before, in 16-token pages, when `cache` is on) and counts
requests in /metrics."""

from __future__ import annotations

import asyncio
import json
import threading
from typing import Any

from aiohttp import web


class FakeOpenAI:
    def __init__(self, token_delay_s: float = 0.001, cache: bool = True,
                 fail_every: int = 0) -> None:
        self.token_delay_s = token_delay_s
        self.cache = cache
        self.fail_every = fail_every
        self.document = ""  # the answer to requests with a response_format
        self.bodies: list[dict[str, Any]] = []
        self._prefixes: set[tuple[int, ...]] = set()
        self.prompt_tokens = 0
        self.cached_tokens = 0
        self._loop = asyncio.new_event_loop()
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()
        self._started.wait(10)

    def _cached(self, ids: list[int]) -> int:
        if not self.cache:
            return 0
        hit = 0
        for end in range(16, len(ids) + 1, 16):
            if tuple(ids[:end]) in self._prefixes:
                hit = end
        for end in range(16, len(ids) + 1, 16):
            self._prefixes.add(tuple(ids[:end]))
        return hit

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.bodies.append(body)
        if self.fail_every and len(self.bodies) % self.fail_every == 0:
            return web.json_response({"error": {"message": "fake failure"}}, status=503)
        ids = body["prompt"]
        cached = self._cached(ids)
        self.prompt_tokens += len(ids)
        self.cached_tokens += cached
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        # With a response_format, a document that fits it (the `document` the test gives),
        # one character a token, ended by the grammar; else `max_tokens` words.
        pieces = list(self.document) if "response_format" in body and self.document else \
            [f" t{i}" for i in range(body["max_tokens"])]
        for i, piece in enumerate(pieces):
            await asyncio.sleep(self.token_delay_s)
            last = i == len(pieces) - 1
            chunk = {"choices": [{"index": 0, "text": piece, "finish_reason": (
                "stop" if self.document and "response_format" in body else "length")
                if last else None}]}
            await resp.write(f"data: {json.dumps(chunk)}\n\n".encode())
        usage = {"prompt_tokens": len(ids), "completion_tokens": len(pieces),
                 "prompt_tokens_details": {"cached_tokens": cached}}
        await resp.write(f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n".encode())
        await resp.write(b"data: [DONE]\n\n")
        return resp

    async def _generate(self, request: web.Request) -> web.StreamResponse:
        """SGLang-style /generate: cumulative output_ids; text stays empty (no tokenizer)."""
        body = await request.json()
        self.bodies.append(body)
        ids = body["input_ids"]
        cached = self._cached(ids)
        n = body["sampling_params"]["max_new_tokens"]
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for i in range(n):
            await asyncio.sleep(self.token_delay_s)
            done = i == n - 1
            meta = {"finish_reason": {"type": "length"} if done else None,
                    "completion_tokens": i + 1, "cached_tokens": cached}
            event = {"text": "", "output_ids": list(range(i + 1)), "meta_info": meta}
            await resp.write(f"data: {json.dumps(event)}\n\n".encode())
        await resp.write(b"data: [DONE]\n\n")
        return resp

    async def _health(self, request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def _metrics(self, request: web.Request) -> web.Response:
        return web.Response(text=f"# TYPE x counter\ntessera_prompt_tokens_total "
                            f"{self.prompt_tokens}\ntessera_cached_tokens_total "
                            f"{self.cached_tokens}\n")

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        app = web.Application()
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_post("/generate", self._generate)
        app.router.add_get("/health", self._health)
        app.router.add_get("/metrics", self._metrics)
        self._runner = web.AppRunner(app)
        self._loop.run_until_complete(self._runner.setup())
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        self._loop.run_until_complete(site.start())
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{self.port}"
        self._started.set()
        self._loop.run_forever()

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(5)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
