"""POST /v1/chat/completions, as OpenAI answers it (plain JSON or SSE chunks): structured
output, tool calls and reasoning content included (see chat_output.py)."""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from aiohttp import web

from tessera.bus.messages import GrammarSpec
from tessera.client import Delta
from tessera.server.chat_output import ChoiceOutput, OutputPlan, whole_message
from tessera.server.errors import bad_request
from tessera.server.fields import CHAT, check_fields
from tessera.server.formatting import UsageTally, chat_logprobs, gather, read_body
from tessera.server.generation import Generation, SendChoice, stream_choices
from tessera.server.params import (
    BOOL,
    INT,
    chat_messages,
    check_model,
    common_sampling,
    parse_json_body,
    sampling,
    stream_options,
    take,
    take_priority,
)
from tessera.server.reasoning import ReasoningParser
from tessera.server.state import STATE, ServerState
from tessera.server.tools.parsers import make_parser
from tessera.server.tools.request import ToolRequest, forced_schema, read_tools


def _top_n(body: dict[str, Any]) -> int | None:
    """Top alternatives asked for: None (no logprobs) or a count (SamplingParams.logprobs,
    whose range `sampling` checks)."""
    wanted = take(body, "logprobs", BOOL, False)
    top = take(body, "top_logprobs", INT)
    if top is not None and not wanted:
        raise bad_request("'top_logprobs' requires 'logprobs': true", "top_logprobs")
    return (top or 0) if wanted else None


def _grammar(values: dict[str, Any], tools: ToolRequest) -> GrammarSpec | None:
    """The request's output constraint: its structured-output field, or a forced tool call."""
    grammar = values.get("grammar")
    forced = forced_schema(tools)
    if forced is None:
        return grammar
    if grammar is not None:
        raise bad_request(f"tool_choice {tools.choice!r} forces a tool call, which cannot be "
                          f"combined with '{grammar.param}'", "tool_choice")
    return GrammarSpec("json_schema", json.dumps(forced),
                       "function_call" if tools.legacy else "tool_choice")


def _template_kwargs(body: dict[str, Any]) -> dict[str, Any] | None:
    kwargs = body.get("chat_template_kwargs")
    if kwargs is not None and not isinstance(kwargs, dict):
        raise bad_request("'chat_template_kwargs' must be an object", "chat_template_kwargs")
    return kwargs


def _plan(state: ServerState, tools: ToolRequest) -> OutputPlan:
    parser = make_parser(state.tool_call_parser) if tools.active else None
    reasoning = state.config.reasoning_parser
    return OutputPlan(tools, parser, ReasoningParser(reasoning) if reasoning else None)


async def chat_completions(request: web.Request) -> web.StreamResponse:
    state: ServerState = request.app[STATE]
    body = parse_json_body(await read_body(request))
    check_fields(body, CHAT, state.config.lenient_params)
    model = check_model(body, state.model_ids)
    tools = read_tools(body)
    messages = chat_messages(body)
    opts = stream_options(body)
    top_n = _top_n(body)
    values = common_sampling(body)
    values["grammar"] = _grammar(values, tools)
    values["max_tokens"] = take(body, "max_completion_tokens", INT,
                                take(body, "max_tokens", INT))
    values["logprobs"] = top_n
    params = sampling(values, keep_none=("max_tokens",), names={"logprobs": "top_logprobs"})
    add_generation_prompt = take(body, "add_generation_prompt", BOOL, True)  # vLLM's extra
    plan = _plan(state, tools)
    priority = take_priority(body, state.config.schedule_policy)
    rid = uuid.uuid4().hex
    head = {"id": f"chatcmpl-{rid}", "created": int(time.time()), "model": model,
            "system_fingerprint": None}

    async with Generation(state) as gen:
        await gen.start(messages=messages, sampling=params, rid=rid, priority=priority,
                        add_generation_prompt=add_generation_prompt,
                        tools=tools.tools if tools.active else None,
                        chat_template_kwargs=_template_kwargs(body))
        if not opts.stream:
            tally = UsageTally()
            choices = gather(await gen.collect(), tally)
            out = []
            for i, c in choices.items():
                message, finish = whole_message(plan, c.text, c.finish_reason)
                out.append({"index": i, "message": {**message, "refusal": None},
                            "logprobs": chat_logprobs(c.logprobs, top_n)
                            if top_n is not None else None,
                            "finish_reason": finish})
            return web.json_response({**head, "object": "chat.completion", "choices": out,
                                      "usage": tally.body()})
        outputs: dict[int, ChoiceOutput] = {}

        def emit(index: int, delta: Delta, send_choice: SendChoice) -> None:
            send = send_choice.delta  # (index, delta, logprobs, finish_reason)
            output = outputs.get(index)
            if output is None:
                output = outputs[index] = ChoiceOutput(plan)
                send(index, {"role": "assistant", "content": "", "refusal": None})
            pieces = output.feed(delta.text) if delta.text else []
            lps = chat_logprobs(delta.logprobs or (), top_n) \
                if top_n is not None and delta.logprobs else None
            if lps is not None and not pieces:
                pieces = [{"content": ""}]  # the logprobs of text held back (a tag, a call)
            for k, piece in enumerate(pieces):
                send(index, piece, lps if k == 0 else None)
            if delta.finish_reason is not None:
                last, finish = output.finish(delta.finish_reason)
                for piece in last:
                    send(index, piece)
                send(index, {}, None, finish)

        return await stream_choices(request, gen, {**head, "object": "chat.completion.chunk"},
                                    opts.include_usage, emit)
