"""The endpoints a router made for SGLang workers reads to register a worker: /get_model_info
and /get_server_info (and their newer names /model_info and /server_info).

The SGLang Model Gateway (`sglang-router`) calls them once per worker when it adds it; what it
reads is the model id, a local folder to read the tokenizer from (never a name it would
download), `is_generation`, and the server's `tp_size` / `dp_size` (a worker whose `dp_size`
> 1 is split into DP-aware workers, which tessera is not: each tessera replica is one
worker)."""

from __future__ import annotations

import os

from aiohttp import web

from tessera.config import ServerConfig
from tessera.server.state import STATE, ServerState


def local_model_folder(config: ServerConfig) -> str | None:
    """The model as a path a router may read its tokenizer from: a local folder only. Given a
    name that is not a path (`default`, `org/name`), the gateway would try to download it."""
    return os.path.abspath(config.model) if os.path.isdir(config.model) else None


async def model_info(request: web.Request) -> web.Response:
    state: ServerState = request.app[STATE]
    folder = local_model_folder(state.config)
    return web.json_response({
        "model_path": folder, "tokenizer_path": folder,
        "served_model_name": state.model_id, "is_generation": True,
        "max_model_len": state.max_model_len or state.config.context_length,
        "model_type": None, "architectures": None})


async def server_info(request: web.Request) -> web.Response:
    state: ServerState = request.app[STATE]
    cfg = state.config
    folder = local_model_folder(cfg)
    return web.json_response({
        "model_path": folder, "tokenizer_path": folder,
        "served_model_name": state.model_id, "tp_size": cfg.tp_size, "dp_size": 1,
        "max_total_tokens": cfg.max_total_tokens, "max_running_requests":
            cfg.max_running_requests, "page_size": cfg.page_size,
        "disable_radix_cache": cfg.disable_radix_cache, "version": _version()})


def _version() -> str:
    from tessera import __version__

    return __version__


def add_routes(app: web.Application) -> None:
    for path in ("/get_model_info", "/model_info"):
        app.router.add_get(path, model_info)
    for path in ("/get_server_info", "/server_info"):
        app.router.add_get(path, server_info)
