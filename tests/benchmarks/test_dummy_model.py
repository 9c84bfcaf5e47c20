"""Shape configs under --load-format dummy become model folders the whole engine can open."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest

from tessera.benchmarks.dummy_model import dummy_model_dir, resolve_dummy_model
from tessera.formats import open_model
from tessera.formats.tokenizer import load_tokenizer

CONFIG = {"model_type": "llama", "hidden_size": 32, "intermediate_size": 64,
          "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1,
          "vocab_size": 300, "max_position_embeddings": 128, "bos_token_id": 256,
          "eos_token_id": [257, 258]}


def test_folder_has_config_and_tokenizer_of_the_vocab(tmp_path: Path) -> None:
    path = tmp_path / "tiny.json"
    path.write_text(json.dumps(CONFIG))
    folder = dummy_model_dir(str(path), root=str(tmp_path / "models"))
    assert dummy_model_dir(str(path), root=str(tmp_path / "models")) == folder  # reused
    tok = load_tokenizer(folder)
    assert tok.backend.get_vocab_size() == 300
    assert set(tok.eos_token_ids) == {257, 258}
    assert tok.encode("t5 t7", add_special_tokens=False) == [5, 7]
    assert tok.decode([5, 7, 256], skip_special_tokens=True) == "t5 t7"
    files = open_model(folder, "dummy")
    assert files.kind == "dummy" and files.config.vocab_size == 300


def test_only_dummy_json_is_resolved(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # keep the folder in tmp_path
    path = tmp_path / "tiny.json"
    path.write_text(json.dumps(CONFIG))
    assert resolve_dummy_model("default", "dummy") == "default"
    assert resolve_dummy_model(str(path), "auto") == str(path)
    assert resolve_dummy_model(str(path), "dummy").startswith(str(tmp_path))
