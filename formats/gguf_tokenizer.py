"""A `tokenizers.Tokenizer` rebuilt from a GGUF file's `tokenizer.ggml.*` metadata.

    byte-level BPE (tokenizer.ggml.model "gpt2": GPT-2, SmolLM, Qwen2, Llama 3, ...): vocabulary
        and merges as stored, split text like the model's original Hugging Face tokenizer, chosen
        by llama.cpp's pre-tokenizer name (`tokenizer.ggml.pre`)
    SentencePiece BPE ("llama": Llama 2, Mistral, ...): byte fallback, a "▁" for each space,
        merges recovered from the token scores when the file has none (as transformers does)

Control tokens (token type 3) become special added tokens, user-defined ones (4) plain added
tokens, so that both are matched whole in text.
"""

from __future__ import annotations

import logging
import struct
from typing import Any

import tokenizers

from tessera.formats.tokenizer import ModelTokenizer, TokenizerError

log = logging.getLogger(__name__)

# llama.cpp token types (gguf TokenType)
_CONTROL, _USER_DEFINED = 3, 4

# Split regexes of the Hugging Face tokenizers llama.cpp names by `tokenizer.ggml.pre`.
_LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                 r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
                r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
# Pre-tokenizers that isolate every digit before GPT-2's regex (llama.cpp: "\p{N}" first).
_DIGITS_FIRST = {"smollm", "starcoder", "refact", "codeshell"}
_LLAMA3_NAMES = {"llama3", "llama-v3", "llama-bpe", "falcon3", "dbrx", "smaug-bpe", "pixtral"}
_QWEN2_NAMES = {"qwen2", "deepseek-r1-qwen", "megrez"}


def _pre_tokenizer(pre: str) -> tuple[Any, bool]:
    """(pre_tokenizer, ignore_merges) for llama.cpp's pre-tokenizer name."""
    from tokenizers import Regex, pre_tokenizers

    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    if pre in _DIGITS_FIRST:
        return pre_tokenizers.Sequence([
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)]), False
    if pre in _LLAMA3_NAMES:  # Llama 3's tokenizer.json also sets ignore_merges
        return pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(_LLAMA3_SPLIT), behavior="isolated"), byte_level]), True
    if pre in _QWEN2_NAMES:
        return pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(_QWEN2_SPLIT), behavior="isolated"), byte_level]), False
    if pre not in ("default", "gpt2", "gpt-2", ""):
        log.warning("GGUF pre-tokenizer %r is not known here; splitting text like GPT-2, which "
                    "may differ from the model's own tokenizer", pre)
    return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True), False


# GGUF value types -> struct format (strings = 8 and arrays = 9 are read separately)
_GGUF_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q",
                 11: "q", 12: "d"}


def _gguf_fields(path: str) -> dict[str, Any]:
    """The tokenizer's key/values of a GGUF file (general.architecture, tokenizer.*,
    *.context_length), read straight from its header.

    gguf.GGUFReader would also do, but it maps every string of a 50k-entry vocabulary to a
    numpy view, which takes seconds; the header is all the tokenizer needs.
    """
    try:
        with open(path, "rb") as f:
            return _read_gguf_header(f)
    except (OSError, ValueError, struct.error, UnicodeDecodeError) as exc:
        raise TokenizerError(f"{path} is not a readable GGUF file ({exc}); check the file or "
                             f"download it again") from None


def _read_gguf_header(f: Any) -> dict[str, Any]:
    magic, version = f.read(4), struct.unpack("<I", f.read(4))[0]
    if magic != b"GGUF" or version not in (2, 3):
        raise ValueError(f"not GGUF v2/v3 (magic {magic!r}, version {version})")
    _, kv_count = struct.unpack("<QQ", f.read(16))

    def string() -> str:
        (n,) = struct.unpack("<Q", f.read(8))
        return f.read(n).decode("utf-8")

    def value(kind: int) -> Any:
        if kind == 8:
            return string()
        if kind == 9:
            item, count = struct.unpack("<IQ", f.read(12))
            if item == 8:
                return [string() for _ in range(count)]
            fmt = _GGUF_SCALARS[item]
            return list(struct.unpack(f"<{count}{fmt}", f.read(count * struct.calcsize(fmt))))
        fmt = _GGUF_SCALARS[kind]
        return struct.unpack(f"<{fmt}", f.read(struct.calcsize(fmt)))[0]

    meta: dict[str, Any] = {}
    for _ in range(kv_count):
        key = string()
        (kind,) = struct.unpack("<I", f.read(4))
        val = value(kind)
        if key.startswith("tokenizer.") or key.endswith(".context_length") \
                or key == "general.architecture":
            meta[key] = val
    return meta


def _byte_level(meta: dict[str, Any]) -> tuple[tokenizers.Tokenizer, bool]:
    """(tokenizer, add_bos default) for tokenizer.ggml.model == "gpt2"."""
    from tokenizers import decoders, models

    tokens: list[str] = meta["tokenizer.ggml.tokens"]
    merges = [tuple(m.split(" ", 1)) for m in meta.get("tokenizer.ggml.merges", [])]
    vocab: dict[str, int] = {}
    for i, tok in enumerate(tokens):
        vocab.setdefault(tok, i)
    pre_tok, ignore_merges = _pre_tokenizer(meta.get("tokenizer.ggml.pre", "default"))
    backend = tokenizers.Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False,
                                              byte_fallback=False, ignore_merges=ignore_merges))
    backend.pre_tokenizer = pre_tok
    backend.decoder = decoders.ByteLevel()
    return backend, False


def spm_merges(tokens: list[str], scores: list[float]) -> list[tuple[str, str]]:
    """BPE merges implied by a SentencePiece vocabulary: every split of a token into two
    vocabulary pieces, best token score first (transformers' `generate_merges`)."""
    vocab = {tok: i for i, tok in enumerate(tokens)}
    found: list[tuple[str, str, float]] = []
    for tok, score in zip(tokens, scores, strict=True):
        local = [(tok[:k], tok[k:], score) for k in range(1, len(tok))
                 if tok[:k] in vocab and tok[k:] in vocab]
        local.sort(key=lambda m: (vocab[m[0]], vocab[m[1]]))
        found += local
    found.sort(key=lambda m: (m[2], len(m[0]), len(m[1])), reverse=True)
    return [(left, right) for left, right, _ in found]


def _sentencepiece(meta: dict[str, Any]) -> tuple[tokenizers.Tokenizer, bool]:
    """(tokenizer, add_bos default) for tokenizer.ggml.model == "llama" (Llama 2, Mistral)."""
    from tokenizers import decoders, models, pre_tokenizers

    tokens: list[str] = meta["tokenizer.ggml.tokens"]
    if "tokenizer.ggml.merges" in meta:
        merges = [tuple(m.split(" ", 1)) for m in meta["tokenizer.ggml.merges"]]
    else:
        scores = meta.get("tokenizer.ggml.scores") or [0.0] * len(tokens)
        merges = spm_merges(tokens, [float(x) for x in scores])
    vocab = {tok: i for i, tok in enumerate(tokens)}
    backend = tokenizers.Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=True,
                                              byte_fallback=True))
    prefix = meta.get("tokenizer.ggml.add_space_prefix", True) is not False
    backend.pre_tokenizer = pre_tokenizers.Metaspace(
        replacement="\u2581", prepend_scheme="first" if prefix else "never", split=False)
    steps = [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()]
    if prefix:
        steps.append(decoders.Strip(content=" ", left=1))
    backend.decoder = decoders.Sequence(steps)
    return backend, True  # llama.cpp adds BOS to SentencePiece models unless told not to


def load_gguf_tokenizer(path: str) -> ModelTokenizer:
    from tokenizers import AddedToken, processors

    meta = _gguf_fields(path)
    kind = meta.get("tokenizer.ggml.model")
    builders = {"gpt2": _byte_level, "llama": _sentencepiece}
    if kind not in builders or "tokenizer.ggml.tokens" not in meta:
        raise TokenizerError(
            f"{path}: GGUF tokenizer type {kind!r} is not supported (byte-level BPE 'gpt2' and "
            f"SentencePiece 'llama' are); serve the model from its Hugging Face folder with "
            f"tokenizer.json")
    backend, add_bos_default = builders[kind](meta)
    tokens: list[str] = meta["tokenizer.ggml.tokens"]
    types: list[int] = meta.get("tokenizer.ggml.token_type") or [1] * len(tokens)
    backend.add_tokens([AddedToken(tokens[i], special=types[i] == _CONTROL, normalized=False)
                        for i in range(len(tokens)) if types[i] in (_CONTROL, _USER_DEFINED)])

    def token_of(key: str) -> tuple[int, str] | None:
        tid = meta.get(f"tokenizer.ggml.{key}_token_id")
        return (tid, tokens[tid]) if isinstance(tid, int) and 0 <= tid < len(tokens) else None

    bos, eos = token_of("bos"), token_of("eos")
    special = {f"{name}_token": found[1] for name in ("bos", "eos", "unknown", "padding")
               if (found := token_of(name)) is not None}
    special = {k.replace("unknown", "unk").replace("padding", "pad"): v
               for k, v in special.items()}
    single, extra = "$A", []
    if meta.get("tokenizer.ggml.add_bos_token", add_bos_default) and bos is not None:
        single, extra = f"{bos[1]} $A", [(bos[1], bos[0])]
    if meta.get("tokenizer.ggml.add_eos_token") and eos is not None:
        single, extra = f"{single} {eos[1]}", [*extra, (eos[1], eos[0])]
    backend.post_processor = processors.TemplateProcessing(
        single=single, pair=f"{single} $B:1", special_tokens=sorted(set(extra)))
    eos_ids = [t[0] for key in ("eos", "eot", "eom") if (t := token_of(key)) is not None]
    arch = meta.get("general.architecture")
    context = meta.get(f"{arch}.context_length")
    return ModelTokenizer(backend, name=path, chat_template=meta.get("tokenizer.chat_template"),
                          special_tokens=special, eos_token_ids=eos_ids,
                          context_length=int(context) if isinstance(context, int) else None)
