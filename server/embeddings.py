"""POST /v1/embeddings, as OpenAI answers it: one L2-normalized vector per input, from the
served model's final hidden states (`--embedding-pooling last` or `mean`), so that retrieval
and generation share one server.

Inputs: a string, a list of strings, a list of token ids or a list of such lists.
`encoding_format` "float" (a list of numbers) or "base64" (the little-endian float32 bytes,
what the official client asks for by default). `dimensions` is refused: the model's
embedding has the size it has.
"""

from __future__ import annotations

import base64
import time
from typing import Any

import numpy as np
from aiohttp import web

from tessera.bus.messages import SamplingParams
from tessera.server.errors import bad_request
from tessera.server.fields import BOOKKEEPING, check_fields
from tessera.server.formatting import read_body
from tessera.server.generation import Generation
from tessera.server.params import STR, check_model, parse_json_body, take
from tessera.server.state import STATE, ServerState

FIELDS = frozenset({"model", "input", "encoding_format", "dimensions", *BOOKKEEPING})
MAX_INPUTS = 2048


def _is_ids(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(
        isinstance(t, int) and not isinstance(t, bool) for t in value)


def inputs(body: dict[str, Any]) -> list[dict[str, Any]]:
    """Each input as start() keywords: {"prompt": text} or {"input_ids": ids}."""
    value = body.get("input")
    out: list[dict[str, Any]]
    if isinstance(value, str):
        out = [{"prompt": value}]
    elif _is_ids(value):
        out = [{"input_ids": value}]
    elif isinstance(value, list) and value and all(isinstance(v, str) for v in value):
        out = [{"prompt": v} for v in value]
    elif isinstance(value, list) and value and all(_is_ids(v) for v in value):
        out = [{"input_ids": v} for v in value]
    else:
        raise bad_request("'input' must be a string, a non-empty list of strings, a list of "
                          "token ids or a list of such lists", "input")
    if len(out) > MAX_INPUTS:
        raise bad_request(f"at most {MAX_INPUTS} inputs per request, got {len(out)}", "input")
    if any(p.get("prompt") == "" for p in out):
        raise bad_request("'input' must not hold an empty string", "input")
    return out


def _encode(vector: np.ndarray, fmt: str) -> Any:
    if fmt == "base64":
        return base64.b64encode(vector.astype("<f4").tobytes()).decode()
    return vector.tolist()


async def embeddings(request: web.Request) -> web.Response:
    state: ServerState = request.app[STATE]
    body = parse_json_body(await read_body(request))
    check_fields(body, FIELDS, state.config.lenient_params)
    model = check_model(body, state.model_ids)
    batch = inputs(body)
    fmt = take(body, "encoding_format", STR, "float")
    if fmt not in ("float", "base64"):
        raise bad_request("'encoding_format' must be \"float\" or \"base64\"", "encoding_format")
    if body.get("dimensions") is not None:
        raise bad_request("'dimensions' is not supported: the model's embeddings have the "
                          "size of its hidden states; remove it", "dimensions")
    params = SamplingParams(max_tokens=0, embed=state.config.embedding_pooling)
    async with Generation(state) as gen:
        for prompt in batch:
            await gen.start(sampling=params, **prompt)
        vectors: dict[int, np.ndarray] = {}
        prompt_tokens = 0
        for index, delta in await gen.collect():
            if delta.embedding is not None:
                vector = np.asarray(delta.embedding, dtype=np.float32)
                norm = float(np.linalg.norm(vector))
                vectors[index] = vector / norm if norm > 0 else vector
            if delta.usage is not None:
                prompt_tokens += delta.usage.prompt_tokens
    missing = sorted(set(range(len(batch))) - set(vectors))
    if missing:  # the engine ended a request without its embedding (aborted, failed)
        raise bad_request(f"no embedding was produced for input {missing[0]}", "input")
    return web.json_response({
        "object": "list", "model": model, "created": int(time.time()),
        "data": [{"object": "embedding", "index": i, "embedding": _encode(vectors[i], fmt)}
                 for i in range(len(batch))],
        "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens}})
