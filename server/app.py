"""The aiohttp application: routes and the middlewares every request passes through.

    errors    any ApiError, aiohttp HTTP error (404 route, 405 method, 413 body) or bug
              becomes OpenAI's error JSON with its status (and Retry-After for 429/503)
    metrics   tessera:http_requests{route, status}
    auth      with API keys configured (server/keys.py), /v1/*, /generate and
              /health_generate (it runs a generation) need `Authorization: Bearer KEY`;
              /health and /metrics stay open. A generation then counts against its key's
              rate limits (server/ratelimit.py): 429 with Retry-After beyond them
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from tessera.config import Env
from tessera.server import chat, completions, embeddings, native, ops, worker_info
from tessera.server.errors import ApiError
from tessera.server.formatting import MAX_BODY_BYTES
from tessera.server.keys import ApiKey, find_key, load_keys
from tessera.server.state import CURRENT_KEY, STATE, ServerState

log = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
_PROTECTED = ("/v1/", "/generate", "/health_generate")
# Every route that runs the model counts against a key's rate limits (aiohttp answers HEAD
# with the GET handler: it generates too).
_GENERATIONS = frozenset({("POST", "/v1/chat/completions"), ("POST", "/v1/completions"),
                          ("POST", "/v1/embeddings"), ("POST", "/generate"),
                          ("GET", "/health_generate"), ("HEAD", "/health_generate")})


def _route_name(request: web.Request) -> str:
    info = request.match_info.route.resource
    return info.canonical if info is not None else "unmatched"


@web.middleware
async def errors_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    state: ServerState = request.app[STATE]
    kind = "error"
    try:
        response = await handler(request)
    except ApiError as exc:
        kind = exc.error_type
        response = exc.response()
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        message = {404: f"no route {request.method} {request.path}; see /openapi.json",
                   405: f"{request.method} is not allowed on {request.path}",
                   413: f"the request body is larger than {MAX_BODY_BYTES >> 20} MiB"}.get(
            exc.status, exc.reason)
        error = ApiError(exc.status, message)
        kind, response = error.error_type, error.response()
    except Exception:
        log.exception("%s %s failed", request.method, request.path)
        response = ApiError(500, "internal server error; the server log has the "
                                 "details").response()
        kind = "internal_error"
    if response.status >= 400:
        state.metrics.errors.labels(str(response.status), kind).inc()
    state.metrics.requests.labels(_route_name(request), str(response.status)).inc()
    return response


def auth_middleware(keys: list[ApiKey]) -> Callable[[web.Request, Handler],
                                                    Awaitable[web.StreamResponse]]:
    @web.middleware
    async def check(request: web.Request, handler: Handler) -> web.StreamResponse:
        if not request.path.startswith(_PROTECTED):
            return await handler(request)
        key = find_key(keys, request.headers.get("Authorization", ""))
        if key is None:
            raise ApiError(401, "Incorrect or missing API key: send the header "
                                "'Authorization: Bearer <key>' with a key the server was "
                                "started with (--api-key-file / TESSERA_API_KEY).")
        if (request.method, request.path) in _GENERATIONS:
            state: ServerState = request.app[STATE]
            try:
                state.limiter.admit(key)
            except ApiError:
                state.metrics.rate_limited.labels(key.name).inc()
                raise
        token = CURRENT_KEY.set(key)  # the generation charges its tokens to it
        try:
            return await handler(request)
        finally:
            CURRENT_KEY.reset(token)

    return check


def create_app(state: ServerState) -> web.Application:
    middlewares: list[Any] = [errors_middleware]
    config = state.config
    keys = load_keys(config.api_key_file, Env.read().api_key, config.key_rpm, config.key_tpm)
    if keys:
        middlewares.append(auth_middleware(keys))
    app = web.Application(client_max_size=MAX_BODY_BYTES, middlewares=middlewares)
    app[STATE] = state
    app.router.add_post("/v1/chat/completions", chat.chat_completions)
    app.router.add_post("/v1/completions", completions.completions)
    app.router.add_post("/v1/embeddings", embeddings.embeddings)
    app.router.add_get("/v1/models", ops.models)
    app.router.add_get("/v1/models/{model}", ops.model)
    app.router.add_post("/generate", native.generate)
    app.router.add_get("/health", ops.health)
    app.router.add_get("/health_generate", ops.health_generate)
    app.router.add_get("/metrics", ops.metrics)
    app.router.add_get("/status", ops.status)
    app.router.add_get("/", ops.page)
    app.router.add_get("/openapi.json", ops.openapi)
    worker_info.add_routes(app)
    return app
