"""The HTTP server process: `python -m tessera.server --run-dir DIR`.

Started by the supervisor as the last process; its life cycle is `AsyncBusProcess`'s
(bus/process.py):
  setup: bind the HTTP socket, one warm-up generation (1 token, unless --disable-warmup)
  Ready(process="server") to the supervisor, then serve
  SIGTERM / SIGINT: answer new requests with 503 (Retry-After) and /health with "stopping",
  let requests in flight finish for up to drain_timeout_s, fail what is left with an error
  event, close the socket, exit 0.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import time
from typing import Any

from aiohttp import web

from tessera.bus import trace
from tessera.bus.process import AsyncBusProcess, StartupError, load_config, setup_logging
from tessera.bus.run_paths import RunPaths
from tessera.client import AsyncClient, EngineDeadError, TesseraError, UnavailableError
from tessera.config import ServerConfig
from tessera.server.app import create_app
from tessera.server.history import History
from tessera.server.ops import sample_history
from tessera.server.state import ServerState, max_concurrency, served_model_ids

log = logging.getLogger("tessera.server")

NAME = "server"
WARMUP_ATTEMPTS = 3


class ServerProcess(AsyncBusProcess):
    name = NAME

    def __init__(self, paths: RunPaths, config: ServerConfig) -> None:
        super().__init__(paths, config)
        self.config: ServerConfig = config
        self.client = AsyncClient(paths, config, process_name=NAME)
        self.state = ServerState(config=config, paths=paths, client=self.client,
                                 model_ids=served_model_ids(config),
                                 max_concurrent=max_concurrency(config))
        self.runner: web.AppRunner | None = None
        self.site: web.TCPSite | None = None
        self.url = ""
        self.takes_text = True  # the tokenizer reads text (read_engine_info)
        self.phases: dict[str, float] = {}
        self.state.history = History(self.state.metrics)
        self._sampler: asyncio.Task[None] | None = None

    def stats(self) -> dict[str, float]:
        s = self.state
        return {"requests_in_flight": float(s.in_flight), "ready": float(s.ready),
                "draining": float(s.draining), **self.host_path_stats()}

    def host_path_stats(self) -> dict[str, float]:
        """Counters of the way back to HTTP clients (`tessera bench host` reads them)."""
        return {"cpu_s": time.process_time(),
                "bus_messages_received": float(self.client.conn.received),
                "loop_wakeups": float(self.client.conn.loop_wakeups),
                "sse_events": float(self.state.sse_events),
                "sse_writes": float(self.state.sse_writes)}

    def ready_info(self) -> dict[str, Any]:
        return {"url": self.url, "model": self.state.model_id, "phases": self.phases}

    async def setup(self) -> None:
        await self.bind()
        self._sampler = asyncio.create_task(sample_history(self.state))
        await self.read_engine_info()
        if not self.config.disable_warmup:
            warm_start = time.perf_counter()
            try:
                await self.warmup()
            except TesseraError as exc:
                raise StartupError(f"warm-up generation failed ({exc}); the engine cannot "
                                   f"serve") from exc
            self.phases["warmup"] = round(time.perf_counter() - warm_start, 4)
        self.state.ready = True

    async def serve(self) -> None:
        log.info("serving %s at %s", self.state.model_id, self.url)
        await self.stop.wait()
        await self.drain()

    async def teardown(self) -> None:
        if self._sampler is not None:
            self._sampler.cancel()
        if self.runner is not None:
            await self.runner.cleanup()
        self.client.close()

    async def bind(self) -> None:
        self.runner = web.AppRunner(create_app(self.state), handler_cancellation=True,
                                    access_log=None, shutdown_timeout=1.0)
        await self.runner.setup()
        self.site = web.TCPSite(self.runner, self.config.host, self.config.port)
        try:
            await self.site.start()
        except OSError as exc:
            raise StartupError(f"cannot listen on {self.config.host}:{self.config.port} "
                               f"({exc.strerror}); pick another --port or stop the program "
                               f"using it") from None
        host, port = self.runner.addresses[0][:2]
        self.url = f"http://{host}:{port}"

    async def warmup(self) -> None:
        """One real generation, so the first user request does not pay for lazy start-up:
        text through the whole path, or token ids where the model has no tokenizer (dummy
        weights from a config JSON)."""
        prompt: dict[str, Any] = {"prompt": "Hello"} if self.takes_text else \
            {"input_ids": [0]}
        for attempt in range(1, WARMUP_ATTEMPTS + 1):
            try:
                await self.client.generate(**prompt, max_tokens=1, temperature=0.0)
                return
            except EngineDeadError:
                raise
            except TesseraError as exc:
                log.warning("warm-up attempt %d/%d failed: %s", attempt, WARMUP_ATTEMPTS, exc)
                if attempt == WARMUP_ATTEMPTS:
                    raise
                await asyncio.sleep(1.0)

    async def read_engine_info(self) -> None:
        """What the engine's processes reported when they became ready: the context length
        (/v1/models) and the chat template's tool-call format (--tool-call-parser auto)."""
        try:
            status = await self.client.status(timeout=2.0)
        except TesseraError as exc:
            log.warning("no engine info from the supervisor (%s): defaults apply", exc)
            return
        def info(name: str) -> dict[str, Any]:
            entry = status.processes.get(name)
            found = entry.get("info") if isinstance(entry, dict) else None
            return found if isinstance(found, dict) else {}
        context = info("scheduler").get("max_context_len")
        if isinstance(context, int):
            self.state.max_model_len = context
        fmt = info("tokenizer0").get("tool_call_format")
        if isinstance(fmt, str):
            self.state.tool_call_format = fmt
        self.takes_text = info("tokenizer0").get("takes_text") is not False

    async def drain(self) -> None:
        state, conn = self.state, self.client.conn
        # The socket stays open while we drain: a new request is answered 503 with
        # Retry-After (a load balancer moves on) and /health says "stopping", instead of a
        # refused connection that says nothing.
        state.draining = True
        # A supervisor stopping the engine cleanly stops answering status while we drain:
        # from now on only the pids of the engine processes tell whether it is alive.
        conn.silence_timeout_s = float("inf")
        conn.check_pids()  # after a crash the supervisor stops us at once: fail fast
        deadline = time.monotonic() + self.config.drain_timeout_s
        log.info("draining %d request(s), for at most %.1f s", state.in_flight,
                 self.config.drain_timeout_s)
        while state.in_flight and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        if state.in_flight:
            log.warning("%d request(s) still running at the drain deadline; failing them",
                        state.in_flight)
            conn.fail_all(UnavailableError("the server shut down before this request "
                                           "finished; retry it"))
            end = time.monotonic() + 1.0
            while state.in_flight and time.monotonic() < end:
                await asyncio.sleep(0.02)


class _QuietProbes(logging.Filter):
    """The SGLang Model Gateway probes each replica for gRPC (an HTTP/2 preface, "PRI * ...")
    before it settles on HTTP; aiohttp answers 400 and would log a traceback per probe. One
    debug line instead: anything else the parser refuses is still logged in full."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if exc is not None and "PRI/Upgrade" in str(exc):
            log.debug("refused an HTTP/2 (gRPC) probe: this server speaks HTTP/1.1")
            return False
        return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tessera.server",
                                     description="tessera's OpenAI-compatible HTTP server")
    parser.add_argument("--run-dir", required=True, help="the engine's run directory")
    args = parser.parse_args(argv)
    paths = RunPaths(run_dir=os.path.abspath(args.run_dir))
    config = load_config(paths)
    setup_logging(config.log_level, NAME, config.log_format)
    trace.start(config.trace_messages_dir, NAME)
    logging.getLogger("aiohttp.server").addFilter(_QuietProbes())
    try:
        import uvloop
    except ImportError:  # Windows: the default loop serves too, only slower
        return asyncio.run(ServerProcess(paths, config).run())
    return uvloop.run(ServerProcess(paths, config).run())
