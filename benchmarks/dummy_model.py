"""A model folder for `--load-format dummy` runs of a shape config (benchmarks/configs/*.json).

The engine's tokenizer and detokenizer need a tokenizer even when the weights are random, and
no real one may be downloaded. This writes, once, a folder holding the config as config.json
and a synthetic word-level tokenizer of the config's vocabulary size: token i reads "t{i}",
with the config's BOS / EOS ids as special tokens. Benchmarks send token ids, so the
vocabulary's text never matters; its size and special ids do.
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


def dummy_model_dir(config_path: str, root: str | None = None) -> str:
    """The folder for `config_path` (created on first use; content-addressed, so a changed
    config gets a new folder)."""
    with open(config_path, encoding="utf-8") as f:
        raw = f.read()
    config = json.loads(raw)
    if isinstance(config.get("hf_config"), dict):
        config = config["hf_config"]
    digest = hashlib.sha256(raw.encode()).hexdigest()[:12]
    name = os.path.splitext(os.path.basename(config_path))[0]
    folder = os.path.join(root or os.path.join(tempfile.gettempdir(), _ROOT_NAME),
                          f"{name}-{digest}")
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
        "tokenizer.json": tokenizer_json(config),
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


def resolve_dummy_model(model: str, load_format: str) -> str:
    """`model` unchanged, except a shape config .json under --load-format dummy, which
    becomes its dummy model folder."""
    if load_format == "dummy" and model.endswith(".json") and os.path.isfile(model):
        return dummy_model_dir(model)
    return model


def _unknown_token(config: dict[str, Any], special: dict[int, str]) -> str:
    bos = config.get("bos_token_id")
    return special.get(bos, "t0") if isinstance(bos, int) else "t0"
