"""Reading OpenAI request bodies: typed fields, chat messages, and SamplingParams.

Unknown fields are refused (fields.py); a known field of the wrong type is a 400 that names
the field and the type it must have. Values are then checked by
`SamplingParams.validate`, whose message also names the field.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from tessera.bus.messages import SamplingParams
from tessera.server.errors import ApiError, bad_request
from tessera.server.structured import read_grammar

_MISSING = object()
# A lone surrogate in parsed JSON comes only from a \uD800-\uDFFF escape: bytes that are not
# UTF-8 fail to decode. A UTF-8 body without such an escape needs no walk over its strings.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
ROLES = ("system", "developer", "user", "assistant", "tool")

# name -> (accepted python types, how to say it)
NUMBER = ((int, float), "a number")
INT = ((int,), "an integer")
BOOL = ((bool,), "true or false")
STR = ((str,), "a string")


def take(body: dict[str, Any], name: str, kind: tuple[tuple[type, ...], str],
         default: Any = None) -> Any:
    """body[name] if present and not null, checked against `kind`; else `default`."""
    value = body.get(name, _MISSING)
    if value is _MISSING or value is None:
        return default
    types, said = kind
    if isinstance(value, bool) and bool not in types:
        raise bad_request(f"'{name}' must be {said}, got a boolean", name)
    if not isinstance(value, types):
        raise bad_request(f"'{name}' must be {said}, got {json.dumps(value)[:40]}", name)
    return value


def take_priority(body: dict[str, Any], schedule_policy: str) -> int:
    """The request's `priority` (higher runs first, and may pre-empt lower ones). Only the
    priority policy orders by it: under another a priority other than 0 would be ignored, so
    it is refused."""
    priority: int = take(body, "priority", INT, 0)
    if not -2**31 <= priority < 2**31:
        raise bad_request("'priority' must fit in 32 bits", "priority")
    if priority != 0 and schedule_policy != "priority":
        raise bad_request(f"'priority' orders requests only when the server runs with "
                          f"--schedule-policy priority; this one runs {schedule_policy!r}",
                          "priority")
    return priority


def parse_json_body(raw: bytes) -> dict[str, Any]:
    if not raw:
        raise bad_request("the request body is empty; send a JSON object")
    try:
        body = json.loads(raw)
    except RecursionError:
        raise bad_request("the request body is not valid JSON (nested too deeply)") from None
    except ValueError as exc:  # bad JSON, bad UTF-8, or an integer of thousands of digits
        raise bad_request(f"the request body is not valid JSON ({str(exc)[:200]})") from None
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object")
    if json.detect_encoding(raw) == "utf-8" and not _SURROGATE_ESCAPE.search(raw):
        return body  # the walk below takes seconds for a body of millions of items
    bad = field_with_invalid_text(body)
    if bad is not None:
        raise bad_request(f"'{bad}' holds a lone UTF-16 surrogate (such as \\ud800), which is "
                          f"not valid Unicode text; send valid UTF-8 text", bad)
    return body


def field_with_invalid_text(body: dict[str, Any]) -> str | None:
    """The top-level field whose value (at any depth) holds a string that is not valid
    Unicode (JSON's "\\ud800" escapes decode to lone surrogates): such text can be neither
    tokenized nor sent on the bus."""
    if not _valid_text(body):  # a key of the body itself
        return "body"
    for key, value in body.items():
        stack = [value]
        while stack:
            item = stack.pop()
            if isinstance(item, str):
                if not _valid_text(item):
                    return key
            elif isinstance(item, list):
                stack.extend(item)
            elif isinstance(item, dict):
                stack.extend(item.keys())
                stack.extend(item.values())
    return None


def _valid_text(text: str | dict[str, Any]) -> bool:
    for item in (text,) if isinstance(text, str) else text:
        if not item.isascii():
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                return False
    return True


def take_stop(body: dict[str, Any], name: str = "stop") -> tuple[str, ...]:
    value = body.get(name)
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,)
    if isinstance(value, list) and all(isinstance(s, str) for s in value):
        return tuple(value)
    raise bad_request(f"'{name}' must be a string or a list of strings", name)


def take_int_list(body: dict[str, Any], name: str) -> tuple[int, ...]:
    value = body.get(name)
    if value is None:
        return ()
    if isinstance(value, list) and all(isinstance(t, int) and not isinstance(t, bool)
                                       for t in value):
        return tuple(value)
    raise bad_request(f"'{name}' must be a list of integers", name)


def check_model(body: dict[str, Any], served: tuple[str, ...]) -> str:
    """The model id to answer with; 404 if the body names a model this server lacks."""
    model = take(body, "model", STR)
    if model is None:
        return served[0]
    if model not in served:
        raise ApiError(404, f"The model `{model}` does not exist. This server serves "
                            f"`{served[0]}` (see GET /v1/models).", param="model")
    return served[0]


def sampling(values: dict[str, Any], keep_none: tuple[str, ...] = ()) -> SamplingParams:
    """SamplingParams from already type-checked values; an out-of-range value is a 400.
    None means "the default" except for the names in `keep_none` (max_tokens=None: no cap)."""
    params = SamplingParams.from_dict({k: v for k, v in values.items()
                                       if v is not None or k in keep_none})
    problem = params.validate()
    if problem:
        raise bad_request(problem.message, problem.param)
    return params


def take_logit_bias(body: dict[str, Any]) -> dict[int, float] | None:
    """OpenAI's {"token id as a string": bias}; the range is SamplingParams' to check."""
    value = body.get("logit_bias")
    if value is None:
        return None
    if not isinstance(value, dict):
        raise bad_request("'logit_bias' must be an object mapping token ids to numbers",
                          "logit_bias")
    out: dict[int, float] = {}
    for key, bias in value.items():
        try:
            token = int(key)
        except ValueError:
            raise bad_request(f"logit_bias keys must be token ids, got {json.dumps(key)[:40]}",
                              "logit_bias") from None
        if isinstance(bias, bool) or not isinstance(bias, int | float):
            raise bad_request(f"logit_bias values must be numbers, got {json.dumps(bias)[:40]}",
                              "logit_bias")
        out[token] = float(bias)
    return out


def common_sampling(body: dict[str, Any]) -> dict[str, Any]:
    """The sampling fields chat and completions share (OpenAI + vLLM/SGLang extras)."""
    return {
        "temperature": take(body, "temperature", NUMBER),
        "top_p": take(body, "top_p", NUMBER),
        "top_k": take(body, "top_k", INT),
        "min_p": take(body, "min_p", NUMBER),
        "repetition_penalty": take(body, "repetition_penalty", NUMBER),
        "frequency_penalty": take(body, "frequency_penalty", NUMBER),
        "presence_penalty": take(body, "presence_penalty", NUMBER),
        "seed": take(body, "seed", INT),
        "min_tokens": take(body, "min_tokens", INT),
        "ignore_eos": take(body, "ignore_eos", BOOL),
        "skip_special_tokens": take(body, "skip_special_tokens", BOOL),
        "n": take(body, "n", INT),
        "stop": take_stop(body),
        "stop_token_ids": take_int_list(body, "stop_token_ids"),
        "logit_bias": take_logit_bias(body),
        "grammar": read_grammar(body),
    }


@dataclass(frozen=True)
class StreamOptions:
    stream: bool
    include_usage: bool


def stream_options(body: dict[str, Any]) -> StreamOptions:
    stream = take(body, "stream", BOOL, False)
    options = body.get("stream_options")
    if options is None:
        return StreamOptions(stream, False)
    if not isinstance(options, dict):
        raise bad_request("'stream_options' must be an object", "stream_options")
    if not stream:
        raise bad_request("'stream_options' is only allowed when 'stream' is true",
                          "stream_options")
    return StreamOptions(stream, take(options, "include_usage", BOOL, False))


def _content_text(content: Any, where: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text" or \
                    not isinstance(part.get("text"), str):
                raise bad_request(f"{where}.content: only text parts ({{\"type\": \"text\", "
                                  f"\"text\": \"...\"}}) are supported", "messages")
            parts.append(part["text"])
        return "\n".join(parts)  # as the tokenizer joins text parts
    raise bad_request(f"{where}.content must be a string or a list of text parts", "messages")


def _tool_calls(value: Any, where: str) -> list[dict[str, Any]]:
    """An assistant turn's earlier tool calls, as the template and the model saw them."""
    if not isinstance(value, list):
        raise bad_request(f"{where}.tool_calls must be a list", "messages")
    calls = []
    for j, call in enumerate(value):
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or \
                not isinstance(fn.get("arguments", ""), str):
            raise bad_request(f"{where}.tool_calls[{j}] must be {{\"id\", \"type\": "
                              f"\"function\", \"function\": {{\"name\", \"arguments\": "
                              f"JSON text}}}}", "messages")
        calls.append({"id": str(call.get("id") or f"call_{j}"), "type": "function",
                      "function": {"name": fn["name"], "arguments": fn.get("arguments", "")}})
    return calls


def chat_messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    """OpenAI messages, reduced to {"role", "content": str} plus `name`, an assistant's
    `tool_calls` and a tool result's `tool_call_id`. Legacy forms map to them: an assistant's
    `function_call` to one tool call, a "function" message to a tool result."""
    messages = body.get("messages")
    if messages is None:
        raise bad_request("'messages' is required: a list of {\"role\", \"content\"} objects",
                          "messages")
    if not isinstance(messages, list) or not messages:
        raise bad_request("'messages' must be a non-empty list", "messages")
    out = []
    for i, msg in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(msg, dict):
            raise bad_request(f"{where} must be an object with 'role' and 'content'",
                              "messages")
        role = msg.get("role")
        if role not in ROLES and role != "function":
            raise bad_request(f"{where}.role must be one of {', '.join(ROLES)}; got "
                              f"{json.dumps(role)[:40]}", "messages")
        if "content" not in msg and role != "assistant":
            raise bad_request(f"{where}.content is required", "messages")
        entry: dict[str, Any] = {"role": "tool" if role == "function" else role,
                                 "content": _content_text(msg.get("content"), where)}
        if isinstance(msg.get("name"), str):
            entry["name"] = msg["name"]
        if role == "assistant" and msg.get("tool_calls") is not None:
            entry["tool_calls"] = _tool_calls(msg["tool_calls"], where)
        elif role == "assistant" and isinstance(msg.get("function_call"), dict):
            entry["tool_calls"] = _tool_calls([{"id": f"call_{i}", "type": "function",
                                                "function": msg["function_call"]}], where)
        if role == "tool":
            call = msg.get("tool_call_id")
            if not isinstance(call, str):
                raise bad_request(f"{where}.tool_call_id is required: the id of the call this "
                                  f"result answers", "messages")
            entry["tool_call_id"] = call
        if role == "assistant" and isinstance(msg.get("reasoning_content"), str):
            entry["reasoning_content"] = msg["reasoning_content"]
        out.append(entry)
    return out


def reject_unsupported(body: dict[str, Any]) -> None:
    """Known fields this server cannot honour (a value that would change the answer)."""
    suffix = body.get("suffix")
    if suffix:
        raise bad_request("'suffix' is not supported; remove it", "suffix")
