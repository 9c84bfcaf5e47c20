"""A model folder for `--load-format dummy` runs of a shape config (benchmarks/configs/*.json).

The engine's tokenizer and detokenizer need a tokenizer even when the weights are random, and
no real one may be downloaded. This writes, once, a folder holding the config as config.json
and a synthetic word-level tokenizer of the config's vocabulary size: token i reads "t{i}",
with the config's BOS / EOS ids as special tokens. Benchmarks send token ids, so the
vocabulary's text never matters; its size and special ids do.

Structured output is different: a grammar engine needs tokens that spell JSON. With
`byte_level=True` the folder gets a byte-level vocabulary instead: the 256 bytes, then
generated pieces shaped like a real BPE vocabulary's (words with and without a leading space,
capitalised words, digit groups, punctuation and JSON fragments, whitespace runs), decoded
exactly by a ByteLevel decoder. It has no merges: benchmarks never encode text.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from typing import Any

_ROOT_NAME = "tessera-bench-models"


def _special_names(config: dict[str, Any]) -> dict[int, str]:
    names: dict[int, str] = {}
    if isinstance(config.get("bos_token_id"), int):
        names[config["bos_token_id"]] = "<|begin_of_text|>"
    eos = config.get("eos_token_id")
    for i, e in enumerate(eos if isinstance(eos, list) else [eos]):
        if isinstance(e, int):
            names.setdefault(e, "<|end_of_text|>" if i == 0 else f"<|eos_{i}|>")
    return names


def tokenizer_json(config: dict[str, Any]) -> dict[str, Any]:
    """A `tokenizers` WordLevel tokenizer.json with `vocab_size` entries."""
    vocab_size = int(config["vocab_size"])
    special = _special_names(config)
    vocab = {special.get(i, f"t{i}"): i for i in range(vocab_size)}
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [{"id": i, "content": name, "single_word": False, "lstrip": False,
                          "rstrip": False, "normalized": False, "special": True}
                         for i, name in sorted(special.items())],
        "normalizer": None,
        "pre_tokenizer": {"type": "WhitespaceSplit"},
        "post_processor": None,
        "decoder": None,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": _unknown_token(config,
                                                                                   special)},
    }


_PUNCT = ['",', '":', '{"', '"}', '},', '],', '["', '"]', ', ', '. ', '.\n', ':"', '":"',
          '","', '{', '}', '[', ']', '(', ')', ' (', ');', '();', ' =', ' ==', ' +', '->', ' -',
          '--', '...', '?', '!', ' "', "'s", "'t", ' {', ' }', '\n\n', '\n  ', '  ', '    ']


def _byte_alphabet() -> dict[int, str]:
    """GPT-2's byte -> printable character table (what ByteLevel vocabularies are written in)."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + \
        list(range(0xAE, 0x100))
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def byte_level_pieces(count: int, seed: int = 0) -> list[str]:
    """`count` distinct text pieces (besides the 256 bytes), deterministic for `seed`."""
    import random

    rng = random.Random(seed)
    letters = "etaoinshrdlucmfwypvbgkjqxz"
    weights = [12.7, 9.1, 8.2, 7.5, 7.0, 6.7, 6.3, 6.1, 6.0, 4.3, 4.0, 2.8, 2.8, 2.4, 2.2, 2.4,
               2.0, 2.0, 1.0, 1.5, 2.0, 0.8, 0.2, 0.1, 0.2, 0.1]
    out: list[str] = []
    seen: set[str] = {chr(b) for b in range(128)}
    for piece in _PUNCT + [str(i) for i in range(1000)] + [f" {i}" for i in range(1000)]:
        if piece not in seen:
            seen.add(piece)
            out.append(piece)
    while len(out) < count:
        kind = rng.random()
        word = "".join(rng.choices(letters, weights, k=rng.choice((2, 3, 3, 4, 4, 5, 5, 6,
                                                                     7, 8, 9, 10))))
        if kind < 0.5:
            piece = " " + word
        elif kind < 0.6:
            piece = " " + word.capitalize()
        elif kind < 0.65:
            piece = word.capitalize()
        else:
            piece = word
        if piece not in seen:
            seen.add(piece)
            out.append(piece)
    return out[:count]


def byte_level_tokenizer_json(config: dict[str, Any]) -> dict[str, Any]:
    """A `tokenizers` ByteLevel BPE tokenizer.json with `vocab_size` entries (no merges)."""
    vocab_size = int(config["vocab_size"])
    special = _special_names(config)
    alphabet = _byte_alphabet()
    free = [i for i in range(vocab_size) if i not in special]
    encoded = [alphabet[b] for b in range(256)]
    encoded += ["".join(alphabet[b] for b in piece.encode()) for piece in
                byte_level_pieces(len(free) - 256)]
    vocab = {special[i]: i for i in special}
    vocab.update({text: i for i, text in zip(free, encoded, strict=True)})
    return {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [{"id": i, "content": name, "single_word": False, "lstrip": False,
                          "rstrip": False, "normalized": False, "special": True}
                         for i, name in sorted(special.items())],
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                          "use_regex": True},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                    "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": None, "end_of_word_suffix": None,
                  "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": vocab, "merges": []},
    }


def dummy_model_dir(config_path: str, root: str | None = None, byte_level: bool = False) -> str:
    """The folder for `config_path` (created on first use; content-addressed, so a changed
    config gets a new folder); `byte_level`: with a vocabulary that can spell text (JSON)."""
    with open(config_path, encoding="utf-8") as f:
        raw = f.read()
    config = json.loads(raw)
    if isinstance(config.get("hf_config"), dict):
        config = config["hf_config"]
    digest = hashlib.sha256(raw.encode()).hexdigest()[:12]
    name = os.path.splitext(os.path.basename(config_path))[0]
    folder = os.path.join(root or os.path.join(tempfile.gettempdir(), _ROOT_NAME),
                          f"{name}-{digest}{'-bytes' if byte_level else ''}")
    if os.path.isfile(os.path.join(folder, "tokenizer.json")):
        return folder
    tmp = f"{folder}.tmp-{os.getpid()}"
    os.makedirs(tmp, exist_ok=True)
    special = _special_names(config)
    files: dict[str, Any] = {
        "config.json": config,
        "tokenizer_config.json": {
            "bos_token": special.get(config.get("bos_token_id")),
            "eos_token": special.get(config.get("eos_token_id")) if isinstance(
                config.get("eos_token_id"), int) else None,
            "model_max_length": config.get("max_position_embeddings"),
        },
        # written last: its presence marks a complete folder
        "tokenizer.json": byte_level_tokenizer_json(config) if byte_level
        else tokenizer_json(config),
    }
    for fname, content in files.items():
        with open(os.path.join(tmp, fname), "w", encoding="utf-8") as f:
            json.dump(content, f)
    try:
        os.rename(tmp, folder)
    except OSError:  # another process made it first
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
    return folder


def resolve_dummy_model(model: str, load_format: str, byte_level: bool = False) -> str:
    """`model` unchanged, except a shape config .json under --load-format dummy, which
    becomes its dummy model folder."""
    if load_format == "dummy" and model.endswith(".json") and os.path.isfile(model):
        return dummy_model_dir(model, byte_level=byte_level)
    return model


def _unknown_token(config: dict[str, Any], special: dict[int, str]) -> str:
    bos = config.get("bos_token_id")
    return special.get(bos, "t0") if isinstance(bos, int) else "t0"
