"""Which request fields each route honours. Anything else is answered 400 naming the field:
a parameter dropped silently gives wrong results with no error, which is worse than a refusal.
`--lenient-params` restores ignoring unknown fields (each one logged once).

Fields accepted with no effect on the output are the ones that never have one: `user` and
`metadata` (bookkeeping), `service_tier` "auto"/"default", `store` false, `modalities`
["text"]; their other values are refused.

A router made for SGLang workers (the SGLang Model Gateway) parses each request into its own
typed form and sends it on with every SGLang extension written out at its default value
(`no_stop_trim: false`, `return_hidden_states: false`, ...). Those defaults are what this
server does anyway, so they are accepted (`ROUTER_DEFAULTS`); any other value of them is
refused like an unknown field.
"""

from __future__ import annotations

import logging
from typing import Any

from tessera.server.errors import bad_request
from tessera.server.structured import GRAMMAR_FIELDS

log = logging.getLogger(__name__)

SAMPLING = frozenset({
    "temperature", "top_p", "top_k", "min_p", "repetition_penalty", "frequency_penalty",
    "presence_penalty", "seed", "min_tokens", "ignore_eos", "skip_special_tokens", "n", "stop",
    "stop_token_ids", "logit_bias", "stream", "stream_options", "model", "max_tokens",
    *GRAMMAR_FIELDS})
BOOKKEEPING = frozenset({"user", "metadata", "service_tier", "store", "modalities"})
# `priority` (vLLM's and SGLang's extension): honoured under --schedule-policy priority
SCHEDULING = frozenset({"priority"})
CHAT = SAMPLING | BOOKKEEPING | SCHEDULING | {
    "messages", "max_completion_tokens", "logprobs", "top_logprobs", "tools", "tool_choice",
    "parallel_tool_calls", "functions", "function_call", "add_generation_prompt",
    "chat_template_kwargs"}
COMPLETIONS = SAMPLING | BOOKKEEPING | SCHEDULING | {"prompt", "echo", "logprobs", "best_of", "suffix"}

# name -> the values that mean "what this server does anyway" (see the module docstring).
# `log_metrics` is bookkeeping: every request gets its log line either way.
ROUTER_DEFAULTS: dict[str, tuple[Any, ...]] = {
    "no_stop_trim": (False,), "return_hidden_states": (False,),
    "continue_final_message": (False,), "separate_reasoning": (True,),
    "stream_reasoning": (True,), "return_text_in_logprobs": (False,),
    "log_metrics": (True, False), "background": (False,), "no_logs": (False,),
    "return_bytes": (False,), "return_entropy": (False,)}

_warned: set[str] = set()


def check_fields(body: dict[str, Any], known: frozenset[str], lenient: bool) -> None:
    unknown = sorted(name for name in set(body) - known
                     if not (name in ROUTER_DEFAULTS and _is_default(name, body[name])))
    if unknown:
        if not lenient:
            raise bad_request(
                f"unknown or unsupported field {', '.join(repr(u) for u in unknown)}: this "
                f"server does not honour it, so it refuses it rather than ignore it (start the "
                f"server with --lenient-params to ignore unknown fields)", unknown[0])
        for name in unknown:
            if name not in _warned:
                _warned.add(name)
                log.warning("ignoring the unknown request field %r (--lenient-params)", name)
    _check_bookkeeping(body)


def _is_default(name: str, value: Any) -> bool:
    # `is` on the booleans: 0 == False, and a 0 is not what the router sends.
    return value is None or any(value is d for d in ROUTER_DEFAULTS[name])


def _check_bookkeeping(body: dict[str, Any]) -> None:
    tier = body.get("service_tier")
    if tier is not None and tier not in ("auto", "default"):
        raise bad_request("'service_tier' may only be \"auto\" or \"default\" here",
                          "service_tier")
    if body.get("store") not in (None, False):
        raise bad_request("'store' is not supported: this server keeps no completions",
                          "store")
    modalities = body.get("modalities")
    if modalities is not None and modalities != ["text"]:
        raise bad_request("'modalities' may only be [\"text\"]", "modalities")
    user = body.get("user")
    if user is not None and not isinstance(user, str):
        raise bad_request("'user' must be a string", "user")
    metadata = body.get("metadata")
    if metadata is not None and not isinstance(metadata, dict):
        raise bad_request("'metadata' must be an object", "metadata")
