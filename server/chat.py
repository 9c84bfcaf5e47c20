"""POST /v1/chat/completions, as OpenAI answers it (plain JSON or SSE chunks)."""

from __future__ import annotations

import time
import uuid
from typing import Any

from aiohttp import web

from tessera.client import Delta
from tessera.server.errors import bad_request
from tessera.server.formatting import UsageTally, chat_logprobs, gather, read_body
from tessera.server.generation import Generation, SendChoice, stream_choices
from tessera.server.params import (
    BOOL,
    INT,
    chat_messages,
    check_model,
    common_sampling,
    parse_json_body,
    reject_unsupported,
    sampling,
    stream_options,
    take,
)
from tessera.server.state import STATE, ServerState


def _top_n(body: dict[str, Any]) -> int | None:
    """Top alternatives asked for: None (no logprobs) or 0..20."""
    wanted = take(body, "logprobs", BOOL, False)
    top = take(body, "top_logprobs", INT)
    if top is not None and not wanted:
        raise bad_request("'top_logprobs' requires 'logprobs': true", "top_logprobs")
    return (top or 0) if wanted else None


async def chat_completions(request: web.Request) -> web.StreamResponse:
    state: ServerState = request.app[STATE]
    body = parse_json_body(await read_body(request))
    model = check_model(body, state.model_ids)
    reject_unsupported(body)
    messages = chat_messages(body)
    opts = stream_options(body)
    top_n = _top_n(body)
    values = common_sampling(body)
    values["max_tokens"] = take(body, "max_completion_tokens", INT,
                                take(body, "max_tokens", INT))
    values["logprobs"] = top_n
    params = sampling(values, keep_none=("max_tokens",))
    add_generation_prompt = take(body, "add_generation_prompt", BOOL, True)  # vLLM's extra
    rid = uuid.uuid4().hex
    head = {"id": f"chatcmpl-{rid}", "created": int(time.time()), "model": model,
            "system_fingerprint": None}

    async with Generation(state) as gen:
        await gen.start(messages=messages, sampling=params, rid=rid,
                        add_generation_prompt=add_generation_prompt)
        if not opts.stream:
            tally = UsageTally()
            choices = gather(await gen.collect(), tally)
            return web.json_response({**head, "object": "chat.completion", "choices": [
                {"index": i, "message": {"role": "assistant", "content": c.text,
                                         "refusal": None},
                 "logprobs": chat_logprobs(c.logprobs, top_n) if top_n is not None else None,
                 "finish_reason": c.finish_reason}
                for i, c in choices.items()], "usage": tally.body()})
        started: set[int] = set()

        async def emit(index: int, delta: Delta, send_choice: SendChoice) -> None:
            async def send(d: dict[str, Any], logprobs: Any = None,
                           finish: str | None = None) -> None:
                await send_choice({"index": index, "delta": d, "logprobs": logprobs,
                                   "finish_reason": finish})
            if index not in started:
                started.add(index)
                await send({"role": "assistant", "content": "", "refusal": None})
            if delta.text or delta.logprobs:
                lps = chat_logprobs(delta.logprobs or (), top_n) if top_n is not None else None
                await send({"content": delta.text}, lps)
            if delta.finish_reason is not None:
                await send({}, None, delta.finish_reason)

        return await stream_choices(request, gen, {**head, "object": "chat.completion.chunk"},
                                    opts.include_usage, emit)
