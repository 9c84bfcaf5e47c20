"""POST /v1/completions, as OpenAI answers it. `prompt` may be a string, a list of
strings, a list of token ids or a list of such lists; choice `i` of prompt `p` is
index `p * n + i`."""

from __future__ import annotations

import time
import uuid
from typing import Any

from aiohttp import web

from tessera.client import Delta, PromptLogprob
from tessera.server.errors import bad_request
from tessera.server.fields import COMPLETIONS, check_fields
from tessera.server.formatting import UsageTally, completion_logprobs, gather, read_body
from tessera.server.generation import Generation, SendChoice, stream_choices
from tessera.server.params import (
    BOOL,
    INT,
    check_model,
    common_sampling,
    parse_json_body,
    reject_unsupported,
    sampling,
    stream_options,
    take,
    take_priority,
)
from tessera.server.state import STATE, ServerState

MAX_PROMPTS = 128


def _is_ids(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(
        isinstance(t, int) and not isinstance(t, bool) for t in value)


def prompts(body: dict[str, Any]) -> list[dict[str, Any]]:
    """Each prompt as start() keywords: {"prompt": text} or {"input_ids": ids}."""
    prompt = body.get("prompt")
    if prompt is None:
        raise bad_request("'prompt' is required: a string, a list of strings or token ids",
                          "prompt")
    if isinstance(prompt, str):
        out = [{"prompt": prompt}]
    elif _is_ids(prompt):
        out = [{"input_ids": prompt}]
    elif isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
        out = [{"prompt": p} for p in prompt]
    elif isinstance(prompt, list) and prompt and all(_is_ids(p) for p in prompt):
        out = [{"input_ids": p} for p in prompt]
    else:
        raise bad_request("'prompt' must be a string, a non-empty list of strings, a list "
                          "of token ids or a list of such lists", "prompt")
    if len(out) > MAX_PROMPTS:
        raise bad_request(f"at most {MAX_PROMPTS} prompts per request, got {len(out)}; "
                          f"split the batch", "prompt")
    if any(p.get("prompt") == "" for p in out):
        raise bad_request("'prompt' must not be empty", "prompt")
    return out


async def completions(request: web.Request) -> web.StreamResponse:
    state: ServerState = request.app[STATE]
    body = parse_json_body(await read_body(request))
    check_fields(body, COMPLETIONS, state.config.lenient_params)
    model = check_model(body, state.model_ids)
    reject_unsupported(body)
    batch = prompts(body)
    opts = stream_options(body)
    echo = take(body, "echo", BOOL, False)
    top_n = take(body, "logprobs", INT)
    scoring = echo and top_n is not None  # the prompt's tokens get logprobs too
    best_of = take(body, "best_of", INT)
    values = common_sampling(body)
    if best_of is not None and best_of != (values["n"] or 1):
        raise bad_request("'best_of' other than n is not supported", "best_of")
    values["max_tokens"] = take(body, "max_tokens", INT, 16)
    values["logprobs"] = top_n
    if scoring:
        values["prompt_logprobs"] = top_n
    elif values["max_tokens"] == 0:
        raise bad_request("'max_tokens' 0 generates nothing: it needs 'echo' with 'logprobs' "
                          "(scoring the prompt)", "max_tokens")
    checked = sampling(values, names={"prompt_logprobs": "logprobs"})
    params = checked.params
    if scoring and opts.stream and params.n > 1:
        raise bad_request("streamed 'echo' with 'logprobs' takes n = 1; send n requests or "
                          "stream=false", "n")
    priority = take_priority(body, state.config.schedule_policy)
    rid = uuid.uuid4().hex
    head = {"id": f"cmpl-{rid}", "object": "text_completion", "created": int(time.time()),
            "model": model, "system_fingerprint": None}

    def echo_of(index: int, scored: list[PromptLogprob] | None = None) -> str:
        if not echo:
            return ""
        prompt = batch[index // params.n].get("prompt")
        if prompt is None and scored:  # token ids: their text, as the scoring read them
            return "".join(e.token for e in scored)
        return prompt or ""

    async with Generation(state) as gen:
        for i, prompt in enumerate(batch):
            await gen.start(sampling=checked, rid=rid if i == 0 else f"{rid}-{i}",
                            priority=priority, **prompt)
        if not opts.stream:
            tally = UsageTally()
            choices = gather(await gen.collect(), tally)
            # The prompt is scored once per prompt (its first choice) and shown in each.
            scored = {i: choices[i - i % params.n].prompt_logprobs for i in choices}
            return web.json_response({**head, "choices": [
                {"index": i, "text": echo_of(i, scored[i]) + c.text,
                 "logprobs": completion_logprobs([*scored[i], *c.logprobs], top_n, 0)[0]
                 if top_n is not None else None,
                 "finish_reason": c.finish_reason}
                for i, c in choices.items()], "usage": tally.body()})
        offsets: dict[int, int] = {}

        def emit(index: int, delta: Delta, send: SendChoice) -> None:
            if top_n is None and index in offsets:  # most tokens: text only
                if delta.text or delta.finish_reason is not None:
                    send.text(index, delta.text, delta.finish_reason)
                return
            first = index not in offsets
            prompt = list(delta.prompt_logprobs or ()) if first else []
            text = delta.text if not first else echo_of(index, prompt) + delta.text
            lps = None
            if top_n is not None:
                lps, offsets[index] = completion_logprobs([*prompt, *(delta.logprobs or ())],
                                                          top_n, offsets.get(index, 0))
            offsets.setdefault(index, 0)
            if lps is None:
                if text or delta.finish_reason is not None:
                    send.text(index, text, delta.finish_reason)
            elif text or lps or delta.finish_reason is not None:
                send({"index": index, "text": text, "logprobs": lps,
                      "finish_reason": delta.finish_reason})

        return await stream_choices(request, gen, head, opts.include_usage, emit)
