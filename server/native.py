"""POST /generate: SGLang's native API.

    {"text": "...", | "input_ids": [...], "sampling_params": {"max_new_tokens": 16, ...},
     "stream": false, "return_logprob": false, "top_logprobs_num": 0, "rid": "..."}

Answer: {"text", "output_ids", "meta_info": {"id", "finish_reason": {"type"}, "prompt_tokens",
"completion_tokens", "cached_tokens", "decode_steps", "e2e_latency"}} (a list of them when n > 1). Streaming
sends SGLang's cumulative form: each event carries the whole text so far, then [DONE].
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from aiohttp import web

from tessera.bus.messages import SamplingParams
from tessera.client import Delta
from tessera.server.errors import ApiError, bad_request
from tessera.server.fields import check_fields
from tessera.server.formatting import read_body
from tessera.server.generation import Generation
from tessera.server.params import (
    BOOL,
    INT,
    NUMBER,
    STR,
    parse_json_body,
    sampling,
    take,
    take_int_list,
    take_logit_bias,
    take_priority,
    take_stop,
)
from tessera.server.sse import SseWriter
from tessera.server.state import STATE, ServerState
from tessera.server.structured import read_grammar

# SGLang name -> SamplingParams name
_RENAMES = {"max_new_tokens": "max_tokens", "min_new_tokens": "min_tokens",
            "sampling_seed": "seed"}
_NUMBERS = ("temperature", "top_p", "min_p", "frequency_penalty", "presence_penalty",
            "repetition_penalty")
_INTS = ("max_new_tokens", "min_new_tokens", "top_k", "n", "sampling_seed", "seed")
_SAMPLING_FIELDS = frozenset({*_NUMBERS, *_INTS, "ignore_eos", "skip_special_tokens", "stop",
                              "stop_token_ids", "logit_bias", "json_schema", "regex", "ebnf"})
_BODY_FIELDS = frozenset({"text", "input_ids", "sampling_params", "stream", "return_logprob",
                          "top_logprobs_num", "rid", "model", "priority"})


def native_sampling(body: dict[str, Any], lenient: bool = False) -> dict[str, Any]:
    raw = body.get("sampling_params") or {}
    if not isinstance(raw, dict):
        raise bad_request("'sampling_params' must be an object", "sampling_params")
    check_fields(body, _BODY_FIELDS, lenient)
    check_fields(raw, _SAMPLING_FIELDS, lenient)
    values: dict[str, Any] = {"max_tokens": 128}
    for name in _NUMBERS:
        values[name] = take(raw, name, NUMBER)
    for name in _INTS:
        value = take(raw, name, INT)
        if value is not None:
            values[_RENAMES.get(name, name)] = value
    for name in ("ignore_eos", "skip_special_tokens"):
        values[name] = take(raw, name, BOOL)
    values["stop"] = take_stop(raw)
    values["stop_token_ids"] = take_int_list(raw, "stop_token_ids")
    values["logit_bias"] = take_logit_bias(raw)
    values["grammar"] = read_grammar(raw)  # SGLang's json_schema / regex / ebnf
    return values


# SamplingParams name -> the field a /generate caller wrote, for naming it in a 400
_NATIVE_NAMES = {"max_tokens": "max_new_tokens", "min_tokens": "min_new_tokens",
                 "logprobs": "top_logprobs_num"}


def _native_params(values: dict[str, Any]) -> SamplingParams:
    try:
        return sampling(values)
    except ApiError as exc:
        native = _NATIVE_NAMES.get(exc.param or "")
        if native is None or exc.param is None:
            raise
        message = exc.message.replace(exc.param, native, 1)
        raise bad_request(message, native) from None


class _Choice:
    def __init__(self) -> None:
        self.text = ""
        self.ids: list[int] = []
        self.logprobs: list[list[Any]] = []
        self.finish: str | None = None
        self.usage: dict[str, int] = {}

    def add(self, delta: Delta) -> None:
        self.text += delta.text
        self.ids.extend(delta.token_ids)
        for e in delta.logprobs or ():
            self.logprobs.append([e.logprob, e.token_id, e.token])
        if delta.finish_reason is not None:
            self.finish = delta.finish_reason
        if delta.usage is not None:
            self.usage = {"prompt_tokens": delta.usage.prompt_tokens,
                          "completion_tokens": delta.usage.completion_tokens,
                          "cached_tokens": delta.usage.cached_tokens,
                          "decode_steps": delta.usage.decode_steps}

    def body(self, rid: str, index: int, started: float, logprobs: bool) -> dict[str, Any]:
        meta: dict[str, Any] = {
            "id": rid, "index": index,
            "finish_reason": {"type": self.finish} if self.finish else None,
            "prompt_tokens": self.usage.get("prompt_tokens", 0),
            "completion_tokens": self.usage.get("completion_tokens", len(self.ids)),
            "cached_tokens": self.usage.get("cached_tokens", 0),
            # steps that gave the completion (completion_tokens / decode_steps: the mean
            # acceptance length under speculative decoding, as SGLang's spec_verify_ct)
            "decode_steps": self.usage.get("decode_steps", 0),
            "e2e_latency": time.monotonic() - started}
        if logprobs:
            meta["output_token_logprobs"] = self.logprobs
        return {"text": self.text, "output_ids": self.ids, "index": index, "meta_info": meta}


async def generate(request: web.Request) -> web.StreamResponse:
    state: ServerState = request.app[STATE]
    body = parse_json_body(await read_body(request))
    text, ids = body.get("text"), body.get("input_ids")
    if isinstance(text, list) or (isinstance(ids, list) and ids and isinstance(ids[0], list)):
        raise bad_request("batched /generate is not supported; send one prompt per request",
                          "text")
    if (text is None) == (ids is None):
        raise bad_request("give exactly one of 'text' (a string) or 'input_ids'", "text")
    prompt: dict[str, Any] = {"input_ids": take_int_list(body, "input_ids")} if ids is not None \
        else {"prompt": take(body, "text", STR)}
    values = native_sampling(body, state.config.lenient_params)
    want_logprobs = take(body, "return_logprob", BOOL, False)
    values["logprobs"] = take(body, "top_logprobs_num", INT, 0) if want_logprobs else None
    params = _native_params(values)
    stream = take(body, "stream", BOOL, False)
    rid = take(body, "rid", STR) or uuid.uuid4().hex
    priority = take_priority(body, state.config.schedule_policy)
    started = time.monotonic()
    choices = [_Choice() for _ in range(params.n)]

    async with Generation(state) as gen:
        await gen.start(sampling=params, rid=rid, priority=priority, **prompt)
        if not stream:
            for index, delta in await gen.collect():
                choices[index].add(delta)
            out = [c.body(rid, i, started, want_logprobs) for i, c in enumerate(choices)]
            return web.json_response(out[0] if params.n == 1 else out)
        first = await gen.first()
        sse = SseWriter(request)
        await sse.start()
        async def emit(index: int, delta: Delta) -> None:
            choices[index].add(delta)
            await sse.send(choices[index].body(rid, index, started, want_logprobs))

        if await gen.relay(sse, first, emit):
            try:
                await sse.done()
            except ConnectionResetError:
                pass  # the client left (or stopped reading) at the very end
        return sse.response
