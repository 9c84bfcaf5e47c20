"""Validate one GenerateRequest and turn it into a TokenizedRequest, or say why not.

Everything a client can get wrong is caught here, before the scheduler sees the request, and
answered with an ErrorReply that names the field, what was wrong and what to do:
    400  malformed input: not exactly one of prompt / messages / input_ids, a bad message,
         a sampling value out of range, a token id outside the vocabulary, an empty prompt
    413  a text too long to fit whatever its tokens (more characters than context x the
         longest token), or more ids or messages than the context holds, is refused before
         any work, so no request costs more tokenizer work than a full context
Whether the prompt plus max_tokens fits is the scheduler's rule alone (scheduler_proc/
admission.py): it knows the worker's context length and KV pool, which this process may not.
The `DetokInfo` written here is everything the detokenizer needs to finish the request; the
scheduler carries it unchanged (see detokenizer_proc/sequence.py for the reader).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tessera.bus.messages import (
    DetokInfo,
    ErrorReply,
    GenerateRequest,
    SamplingParams,
    TokenizedRequest,
)
from tessera.formats.chat_guard import ChatTokenError
from tessera.formats.chat_template import ChatTemplateError
from tessera.formats.tokenizer import ModelTokenizer, TokenizerError
from tessera.tokenizer_proc.tool_prompt import template_inputs

ROLES = frozenset({"system", "user", "assistant", "tool", "developer", "function"})


class Rejected(Exception):
    def __init__(self, status: int, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param


def _bad(message: str, param: str | None = None) -> Rejected:
    return Rejected(400, message, param)


def _message_text(content: Any, i: int) -> str:
    """A message's content as the template wants it: a string (text parts joined)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text" \
                    or not isinstance(part.get("text"), str):
                raise _bad(f"messages[{i}].content: only text parts ({{\"type\": \"text\", "
                           f"\"text\": ...}}) are supported by this model", "messages")
            texts.append(part["text"])
        return "\n".join(texts)
    raise _bad(f"messages[{i}].content must be a string or a list of text parts, got "
               f"{type(content).__name__}", "messages")


def check_messages(messages: Any) -> list[dict[str, Any]]:
    if not isinstance(messages, list) or not messages:
        raise _bad("messages must be a non-empty list of {\"role\", \"content\"} objects",
                   "messages")
    clean = []
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict):
            raise _bad(f"messages[{i}] must be an object with role and content", "messages")
        role = msg.get("role")
        if not isinstance(role, str) or role not in ROLES:
            raise _bad(f"messages[{i}].role must be one of {', '.join(sorted(ROLES))}, got "
                       f"{role!r}", "messages")
        content = msg.get("content")
        if content is None and role == "assistant":
            content = ""  # an assistant turn that only made tool calls
        clean.append({**msg, "content": _message_text(content, i)})
    return clean


_RESERVED_TEMPLATE_VARS = frozenset({"messages", "tools", "add_generation_prompt", "documents"})


def _check_tools(tools: Any) -> list[dict[str, Any]] | None:
    if tools is None:
        return None
    if not isinstance(tools, list) or not all(
            isinstance(t, dict) and isinstance(t.get("function"), dict)
            and isinstance(t["function"].get("name"), str) for t in tools):
        raise _bad("tools must be a list of {\"type\": \"function\", \"function\": {\"name\", "
                   "...}} objects", "tools")
    return tools


def _check_template_kwargs(kwargs: Any) -> dict[str, Any]:
    if kwargs is None:
        return {}
    if not isinstance(kwargs, dict) or not all(isinstance(k, str) for k in kwargs):
        raise _bad("chat_template_kwargs must be an object of template variables",
                   "chat_template_kwargs")
    clash = sorted(set(kwargs) & _RESERVED_TEMPLATE_VARS)
    if clash:
        raise _bad(f"chat_template_kwargs may not set {', '.join(clash)}; use the request "
                   f"fields for them", "chat_template_kwargs")
    return kwargs


def _check_chars(chars: int, what: str, param: str, tok: ModelTokenizer,
                 context: int | None) -> None:
    """413 before tokenizing a text that cannot fit the context whatever it encodes to."""
    if context is None or not tok.max_token_chars:
        return
    limit = context * tok.max_token_chars
    if chars > limit:
        raise Rejected(413, f"{what} has {chars} characters: more than the model's context of "
                       f"{context} tokens can hold (no token of this model is longer than "
                       f"{tok.max_token_chars} characters, so at most {limit} could fit); "
                       f"shorten it", param)


def _text_chars(*values: Any) -> int:
    """Characters of every string in `values`, keys included, at any depth. Iterative: a
    bus client can send nesting deeper than the stack."""
    total, todo = 0, list(values)
    while todo:
        value = todo.pop()
        if isinstance(value, str):
            total += len(value)
        elif isinstance(value, dict):
            todo.extend(value.keys())
            todo.extend(value.values())
        elif isinstance(value, list | tuple):
            todo.extend(value)
    return total


def _prompt_ids(req: GenerateRequest, tok: ModelTokenizer, context: int | None,
                allowed_special: frozenset[str]) -> list[int]:
    given = [name for name in ("prompt", "messages", "input_ids")
             if getattr(req, name) is not None]
    if len(given) != 1:
        raise _bad(f"give exactly one of prompt, messages or input_ids (got "
                   f"{', '.join(given) or 'none'})", given[-1] if given else "prompt")
    if req.prompt is not None:
        if not isinstance(req.prompt, str):
            raise _bad(f"prompt must be a string, got {type(req.prompt).__name__}", "prompt")
        if not req.prompt:
            raise _bad("prompt is empty: send at least one character", "prompt")
        _check_chars(len(req.prompt), "the prompt", "prompt", tok, context)
        try:
            return tok.encode(req.prompt, add_special_tokens=True)
        except TokenizerError as exc:  # a model without a tokenizer takes only input_ids
            raise _bad(str(exc), "prompt") from None
    if req.messages is not None:
        messages = check_messages(req.messages)
        if not isinstance(req.add_generation_prompt, bool):
            raise _bad("add_generation_prompt must be true or false", "add_generation_prompt")
        if context is not None and len(messages) > context:
            raise Rejected(413, f"messages has {len(messages)} messages: more than the model's "
                           f"context of {context} tokens can hold; send fewer", "messages")
        tools = _check_tools(req.tools)
        kwargs = _check_template_kwargs(req.chat_template_kwargs)
        # Every text the template may write counts, not only the content: a name, a tool
        # call's arguments or a tool's description can be as long as the body allows.
        _check_chars(_text_chars(messages, tools, kwargs), "the messages' text (content, "
                     "names, tool calls, tools)", "messages", tok, context)
        messages, extra = template_inputs(messages, tools, tok.chat_template)
        extra = {**kwargs, **extra}
        try:
            # As transformers' apply_chat_template(tokenize=True): the template writes BOS
            # itself; a special token's text inside a message stays text (chat_guard.py).
            return tok.encode_chat(messages, req.add_generation_prompt, allowed_special,
                                   **extra)
        except (ChatTemplateError, ChatTokenError, TokenizerError) as exc:
            raise _bad(str(exc), "messages") from None
    ids = np.asarray(req.input_ids)
    if ids.ndim != 1 or not np.issubdtype(ids.dtype, np.integer):
        raise _bad(f"input_ids must be a flat list of integers, got {ids.dtype} {ids.shape}",
                   "input_ids")
    if ids.size == 0:
        raise _bad("input_ids is empty: send at least one token", "input_ids")
    if context is not None and ids.size > context:
        raise Rejected(413, f"input_ids has {ids.size} tokens: more than the model's context "
                       f"length of {context}; shorten the prompt", "input_ids")
    bad = ids[(ids < 0) | (ids >= tok.vocab_size)]
    if bad.size:
        raise _bad(f"input_ids holds token {int(bad[0])}, outside the vocabulary "
                   f"[0, {tok.vocab_size})", "input_ids")
    return ids.astype(np.int32).tolist()


def _check_sampling(sp: Any, tok: ModelTokenizer) -> SamplingParams:
    if not isinstance(sp, SamplingParams):
        raise _bad("sampling must be an object of sampling parameters", "sampling")
    problem = sp.validate()
    if problem:
        raise _bad(problem.message, problem.param)
    for token in sp.stop_token_ids:
        if token >= tok.vocab_size:
            raise _bad(f"stop_token_ids holds {token}, outside the vocabulary "
                       f"[0, {tok.vocab_size})", "stop_token_ids")
    return sp


def prepare(req: GenerateRequest, tok: ModelTokenizer, context_length: int | None,
            allowed_special: frozenset[str] = frozenset()) -> TokenizedRequest | ErrorReply:
    """The TokenizedRequest for `req`, or the ErrorReply to send to its reply_to.
    `allowed_special`: special tokens a chat message may hold as control tokens."""
    try:
        sampling = _check_sampling(req.sampling, tok)
        if not isinstance(req.stream, bool):
            raise _bad("stream must be true or false", "stream")
        if isinstance(req.priority, bool) or not isinstance(req.priority, int):
            raise _bad("priority must be an integer", "priority")
        ids = _prompt_ids(req, tok, context_length, allowed_special)
        if not ids:
            raise _bad("the prompt encodes to no tokens; send some text", "prompt")
    except Rejected as rej:
        return ErrorReply(rid=req.rid, status=rej.status, message=rej.message,
                          param=rej.param, reply_to=req.reply_to)
    hidden = [] if sampling.ignore_eos else list(tok.eos_token_ids)
    detok = DetokInfo(
        reply_to=req.reply_to,
        stream=req.stream,
        n=sampling.n,
        stop=tuple(sampling.stop),
        stop_token_ids=tuple(sorted(set(sampling.stop_token_ids) | set(hidden))),
        skip_special_tokens=sampling.skip_special_tokens,
        logprobs=sampling.logprobs,
        prompt_tokens=len(ids),
    )
    return TokenizedRequest(rid=req.rid, input_ids=np.asarray(ids, dtype=np.int32),
                            sampling=sampling, detok=detok, priority=req.priority,
                            arrival_time=req.arrival_time, resent=req.resent is True)
