"""Chat templates: the model's jinja2 template rendered as Hugging Face transformers renders it.

The environment mirrors `transformers.utils.chat_template_utils` (sandboxed, trim_blocks,
lstrip_blocks, loop controls, `raise_exception`, `strftime_now`, a `tojson` that keeps
non-ASCII text), so the rendered prompt is the same text transformers' `apply_chat_template`
produces. Templates come from model files, which are untrusted: hence the immutable sandbox.
"""

from __future__ import annotations

import json
from datetime import datetime
from functools import lru_cache
from typing import Any

import jinja2
import jinja2.ext
import jinja2.sandbox


class ChatTemplateError(ValueError):
    """The template could not render these messages (the message says why)."""


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    # jinja's own tojson escapes HTML characters; templates expect plain JSON.
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


@lru_cache(maxsize=16)
def compile_template(source: str) -> jinja2.Template:
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    try:
        return env.from_string(source)
    except jinja2.TemplateSyntaxError as exc:
        raise ChatTemplateError(f"the model's chat template does not compile: {exc}") from None


def render_chat(source: str, messages: list[dict[str, Any]], *, add_generation_prompt: bool,
                special_tokens: dict[str, str], **extra: Any) -> str:
    """Render `messages` with the template `source`.

    `special_tokens` (bos_token, eos_token, ...) are visible to the template as transformers
    passes them; `extra` (tools, documents, ...) wins over them, as in transformers.
    """
    template = compile_template(source)
    # transformers drops None-valued keys from each message before rendering.
    clean = [{k: v for k, v in m.items() if v is not None} for m in messages]
    variables = {**special_tokens, **extra}
    variables.setdefault("tools", None)
    variables.setdefault("documents", None)
    try:
        return template.render(messages=clean, add_generation_prompt=add_generation_prompt,
                               **variables)
    except jinja2.exceptions.TemplateError as exc:
        raise ChatTemplateError(f"the chat template rejected the messages: {exc}") from None
    except (TypeError, ValueError, KeyError, AttributeError, IndexError) as exc:
        raise ChatTemplateError(
            f"the chat template failed on these messages ({type(exc).__name__}: {exc}); check "
            f"each message's role and content") from None


def template_knows_tools(source: str | None) -> bool:
    """Whether the template renders `tools` itself (tool definitions in the prompt)."""
    return bool(source) and "tools" in source  # type: ignore[operator]


def template_tool_format(source: str | None) -> str:
    """The tool-call format the template teaches its model: "mistral" ([TOOL_CALLS]),
    "llama3_json" (Llama 3.1+ JSON calls), or "hermes" (<tool_call> tags: Qwen, Hermes, and
    the format tessera describes itself to a model whose template knows no tools)."""
    text = source or ""
    if "[TOOL_CALLS]" in text:
        return "mistral"
    if "<|python_tag|>" in text or ("<|eot_id|>" in text and "tools" in text):
        return "llama3_json"
    return "hermes"
