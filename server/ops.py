"""Operational routes: / (the status page), /status, /health, /health_generate, /metrics,
/v1/models, /openapi.json."""

from __future__ import annotations

import asyncio
import time
from functools import cache
from pathlib import Path

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from tessera.bus.messages import StatusReply
from tessera.client import GenerateResult, TesseraError
from tessera.server.errors import ApiError
from tessera.server.openapi import openapi_document
from tessera.server.state import STATE, ServerState

HEALTH_GENERATE_TIMEOUT_S = 30.0


async def engine_status(state: ServerState, max_age_s: float = 0.5) -> StatusReply | None:
    """The supervisor's latest StatusReply (the liveness watch refreshes it every ~0.5 s)."""
    conn = state.client.conn
    if conn.last_status is not None and time.monotonic() - conn.last_status_at <= max_age_s:
        return conn.last_status
    try:
        return await state.client.status(timeout=1.0)
    except TesseraError:
        return None


def _unhealthy(reason: str, status: str = "unavailable") -> web.Response:
    return web.json_response({"status": status, "reason": reason}, status=503,
                             headers={"Retry-After": "1"})


async def health(request: web.Request) -> web.Response:
    state: ServerState = request.app[STATE]
    if state.draining:
        return _unhealthy("the server is shutting down", status="stopping")
    if not state.ready:
        return _unhealthy("the server is warming up")
    status = await engine_status(state)
    if status is None:
        return _unhealthy("the supervisor does not answer")
    dead = sorted(name for name, info in status.processes.items()
                  if name != "server" and not (isinstance(info, dict) and info.get("alive")))
    if dead:
        return _unhealthy(f"process {', '.join(dead)} not alive")
    if state.client.conn.dead_reason:
        return _unhealthy(state.client.conn.dead_reason)
    return web.json_response({"status": "ok"})


async def health_generate(request: web.Request) -> web.Response:
    """A real one-token generation through every process. It is a generation like any
    other: behind the API key, and it takes a slot (429 when none is free) rather than
    jumping the queue."""
    state: ServerState = request.app[STATE]
    if state.draining:
        return _unhealthy("the server is shutting down")
    state.admit()  # ApiError 429 / 503, answered by the errors middleware
    try:
        result = await asyncio.wait_for(
            state.client.generate("ping", max_tokens=1, temperature=0.0),
            HEALTH_GENERATE_TIMEOUT_S)
    except TimeoutError:
        return _unhealthy(f"no token within {HEALTH_GENERATE_TIMEOUT_S:g} s")
    except TesseraError as exc:
        return _unhealthy(exc.message)
    finally:
        state.release()
    assert isinstance(result, GenerateResult)  # stream=False
    return web.json_response({"status": "ok",
                              "completion_tokens": result.usage.completion_tokens})


async def metrics(request: web.Request) -> web.Response:
    state: ServerState = request.app[STATE]
    state.metrics.engine.status = await engine_status(state)
    body = generate_latest(state.metrics.registry)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


async def status(request: web.Request) -> web.Response:
    """The engine at a glance, as JSON (the status page at / reads it): readiness, every
    process (alive, pid, heartbeat age, restarts, its heartbeat stats), the start-up report,
    and the recent history of throughput, latency, KV usage and cache hits."""
    state: ServerState = request.app[STATE]
    engine = await engine_status(state)
    processes = {} if engine is None else {
        name: {k: info.get(k) for k in ("alive", "pid", "age_s", "ready", "restarts", "stats")}
        for name, info in sorted(engine.processes.items()) if isinstance(info, dict)}
    return web.json_response({
        "model": state.model_id, "ready": state.ready and engine is not None and engine.ready,
        "draining": state.draining, "uptime_s": round(time.time() - state.created, 1),
        "processes": processes, "startup": engine.startup if engine is not None else {},
        "history": state.history.samples() if state.history is not None else [],
    })


@cache
def _page() -> bytes:
    return (Path(__file__).parent / "page.html").read_bytes()


async def page(request: web.Request) -> web.Response:
    """The status page and chat playground: one self-contained HTML file."""
    return web.Response(body=_page(), content_type="text/html", charset="utf-8",
                        headers={"Cache-Control": "no-cache"})


async def sample_history(state: ServerState) -> None:
    """Feeds the status page's history (server/history.py) for as long as the server runs."""
    history = state.history
    while history is not None:
        history.sample(await engine_status(state, max_age_s=history.interval_s),
                       state.in_flight)
        await asyncio.sleep(history.interval_s)


def _model_card(state: ServerState) -> dict[str, object]:
    return {"id": state.model_id, "object": "model", "created": state.created,
            "owned_by": "tessera", "root": state.config.model,
            "max_model_len": state.max_model_len or state.config.context_length}


async def models(request: web.Request) -> web.Response:
    state: ServerState = request.app[STATE]
    return web.json_response({"object": "list", "data": [_model_card(state)]})


async def model(request: web.Request) -> web.Response:
    state: ServerState = request.app[STATE]
    name = request.match_info["model"]
    if name not in state.model_ids:
        raise ApiError(404, f"The model `{name}` does not exist. This server serves "
                            f"`{state.model_id}`.", param="model")
    return web.json_response(_model_card(state))


async def openapi(request: web.Request) -> web.Response:
    return web.json_response(openapi_document(request.app[STATE].model_id))
