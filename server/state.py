"""What every route handler shares: config, the AsyncClient, model ids, metrics, and the
admission state (concurrency limit, warm-up done, draining)."""

from __future__ import annotations

import os
import re
import time
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from tessera.bus.run_paths import RunPaths
from tessera.client import AsyncClient
from tessera.config import ServerConfig
from tessera.server.errors import ApiError
from tessera.server.keys import ApiKey
from tessera.server.metrics import ServerMetrics
from tessera.server.ratelimit import RateLimiter

DEFAULT_MODEL_ID = "SmolLM2-135M-Instruct"
_QUANT_SUFFIX = re.compile(r"\.(q\d\w*|iq\d\w*|f16|f32|bf16)$", re.IGNORECASE)


def served_model_ids(config: ServerConfig) -> tuple[str, ...]:
    """(the id /v1/models shows, other names a request may use for the same model).

    The id is --served-model-name, else the model's file or folder name without `.gguf` and
    its quantization tag (`SmolLM2-135M-Instruct.Q4_1.gguf` -> `SmolLM2-135M-Instruct`).
    """
    model = config.model
    if model == "default":
        name = DEFAULT_MODEL_ID
    else:
        name = os.path.basename(os.path.normpath(model))
        name = _QUANT_SUFFIX.sub("", name.removesuffix(".gguf"))
    primary = config.served_model_name or name
    aliases = [primary, name, model]
    return tuple(dict.fromkeys(a for a in aliases if a))


def max_concurrency(config: ServerConfig) -> int:
    configured = config.max_concurrent_requests
    return configured if configured > 0 else \
        config.max_running_requests + config.max_queued_requests


@dataclass
class ServerState:
    config: ServerConfig
    paths: RunPaths
    client: AsyncClient
    model_ids: tuple[str, ...]
    metrics: ServerMetrics = field(default_factory=ServerMetrics)
    limiter: RateLimiter = field(default_factory=RateLimiter)
    max_concurrent: int = 0
    created: int = field(default_factory=lambda: int(time.time()))
    in_flight: int = 0
    ready: bool = False
    draining: bool = False
    sse_events: int = 0  # SSE events written, and the writes that carried them
    sse_writes: int = 0
    # From the engine's Ready info (server/main.py read_engine_info); None / hermes until then.
    max_model_len: int | None = None
    tool_call_format: str = "hermes"
    history: Any = None  # server/history.py: recent figures for the status page

    @property
    def model_id(self) -> str:
        return self.model_ids[0]

    @property
    def tool_call_parser(self) -> str:
        """--tool-call-parser, or under "auto" the format the chat template teaches."""
        chosen = self.config.tool_call_parser
        return self.tool_call_format if chosen == "auto" else chosen

    def admit(self) -> None:
        """Take a generation slot, or raise 503 (draining / not ready) or 429 (full)."""
        if self.draining:
            raise ApiError(503, "the server is shutting down; retry on another instance",
                           retry_after=self.config.drain_timeout_s)
        if self.max_concurrent and self.in_flight >= self.max_concurrent:
            raise ApiError(429, f"too many requests in flight ({self.in_flight}, the limit "
                                f"is {self.max_concurrent}); retry shortly", retry_after=1.0)
        self.in_flight += 1
        self.metrics.in_flight.set(self.in_flight)

    def release(self) -> None:
        self.in_flight -= 1
        self.metrics.in_flight.set(self.in_flight)


STATE = web.AppKey("state", ServerState)
# The API key of the request being handled (set by the auth middleware; None without keys).
CURRENT_KEY: ContextVar[ApiKey | None] = ContextVar("tessera_api_key", default=None)
