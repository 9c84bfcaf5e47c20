"""The OpenAPI 3 description of the server's routes (hand-written, served at /openapi.json)."""

from __future__ import annotations

from typing import Any

import tessera


def _obj(required: tuple[str, ...] = (), /, **props: Any) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "object", "properties": props}
    if required:
        schema["required"] = list(required)
    return schema


_NUM = {"type": "number"}
_INT = {"type": "integer"}
_BOOL = {"type": "boolean"}
_STR = {"type": "string"}
_STOP = {"oneOf": [_STR, {"type": "array", "items": _STR}]}

_SAMPLING = dict(
    temperature=_NUM, top_p=_NUM, n=_INT, seed=_INT, stop=_STOP, presence_penalty=_NUM,
    frequency_penalty=_NUM, top_k=_INT, min_p=_NUM, repetition_penalty=_NUM, min_tokens=_INT,
    ignore_eos=_BOOL, skip_special_tokens=_BOOL, stop_token_ids={"type": "array", "items": _INT},
    stream=_BOOL, stream_options=_obj(include_usage=_BOOL))

_MESSAGE = _obj(("role", "content"),
                role={"type": "string",
                      "enum": ["system", "developer", "user", "assistant", "tool"]},
                content={"oneOf": [_STR, {"type": "array", "items": _obj(
                    ("type", "text"), type={"type": "string", "enum": ["text"]}, text=_STR)}]},
                name=_STR)

_ERROR = _obj(("error",), error=_obj(("message", "type"), message=_STR, type=_STR,
                                     param={"type": "string", "nullable": True},
                                     code={"type": "string", "nullable": True}))


def _errors(*statuses: int) -> dict[str, Any]:
    words = {400: "invalid request", 401: "missing or wrong API key", 404: "unknown model",
             413: "body or prompt too long", 429: "too many requests in flight (Retry-After)",
             503: "overloaded, unavailable or shutting down (Retry-After)",
             504: "no progress within the request timeout"}
    return {str(s): {"description": words[s], "content": {"application/json": {
        "schema": {"$ref": "#/components/schemas/Error"}}}} for s in statuses}


def _json_op(summary: str, body: dict[str, Any] | None, ok: str,
             streams: bool = False, errors: tuple[int, ...] = ()) -> dict[str, Any]:
    content: dict[str, Any] = {"application/json": {"schema": {"type": "object"}}}
    if streams:
        content["text/event-stream"] = {"schema": {"type": "string", "description":
                                        "`data: {json}` events, then `data: [DONE]`"}}
    op: dict[str, Any] = {"summary": summary,
                          "responses": {"200": {"description": ok, "content": content},
                                        **_errors(*errors)}}
    if body is not None:
        op["requestBody"] = {"required": True, "content": {"application/json": {
            "schema": body}}}
    return op


def openapi_document(model_id: str) -> dict[str, Any]:
    gen_errors = (400, 401, 404, 413, 429, 503, 504)
    chat = _obj(("messages",), model={"type": "string", "example": model_id},
                messages={"type": "array", "items": _MESSAGE}, max_tokens=_INT,
                max_completion_tokens=_INT, logprobs=_BOOL, top_logprobs=_INT, **_SAMPLING)
    completion = _obj(("prompt",), model={"type": "string", "example": model_id},
                      prompt={"oneOf": [_STR, {"type": "array"}]}, max_tokens=_INT,
                      logprobs=_INT, echo=_BOOL, **_SAMPLING)
    embed = _obj(("input",), model={"type": "string", "example": model_id},
                 input={"oneOf": [_STR, {"type": "array"}]},
                 encoding_format={"type": "string", "enum": ["float", "base64"]})
    native = _obj((), text=_STR, input_ids={"type": "array", "items": _INT},
                  sampling_params=_obj(max_new_tokens=_INT, min_new_tokens=_INT,
                                       **{k: v for k, v in _SAMPLING.items()
                                          if k not in ("stream", "stream_options")}),
                  stream=_BOOL, return_logprob=_BOOL, top_logprobs_num=_INT, rid=_STR)
    return {
        "openapi": "3.0.3",
        "info": {"title": "tessera", "version": tessera.__version__,
                 "description": "OpenAI-compatible and SGLang-native LLM serving API"},
        "components": {
            "schemas": {"Error": _ERROR},
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}},
        "security": [{"bearer": []}],
        "paths": {
            "/v1/chat/completions": {"post": _json_op(
                "chat completion (OpenAI)", chat, "chat.completion or chunks", True,
                gen_errors)},
            "/v1/completions": {"post": _json_op(
                "text completion (OpenAI)", completion, "text_completion or chunks", True,
                gen_errors)},
            "/v1/embeddings": {"post": _json_op(
                "embeddings (OpenAI): the model's pooled final hidden states", embed,
                "a list of embeddings", False, (400, 401, 404, 413, 429, 503, 504))},
            "/v1/models": {"get": _json_op("models served", None, "a list of models",
                                           errors=(401,))},
            "/v1/models/{model}": {"get": {
                **_json_op("one model", None, "a model card", errors=(401, 404)),
                "parameters": [{"name": "model", "in": "path", "required": True,
                                "schema": _STR}]}},
            "/generate": {"post": _json_op("generation (SGLang native)", native,
                                           "text, output_ids and meta_info", True,
                                           gen_errors)},
            "/health": {"get": {**_json_op("every process alive and ready", None, "healthy",
                                           errors=(503,)), "security": []}},
            "/health_generate": {"get": _json_op("a real one-token generation (a slot and "
                                                 "the API key, like any generation)", None,
                                                 "generated", errors=(401, 429, 503))},
            "/metrics": {"get": {"summary": "Prometheus metrics", "security": [],
                                 "responses": {"200": {"description": "text exposition",
                                                       "content": {"text/plain": {}}}}}},
            "/openapi.json": {"get": {"summary": "this document", "security": [],
                                      "responses": {"200": {"description": "OpenAPI 3"}}}},
        },
    }
