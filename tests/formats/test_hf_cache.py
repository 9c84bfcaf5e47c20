"""`--model org/name` finds a model in the local Hugging Face cache (never downloads), and says
where it looked when the model is not there."""

from __future__ import annotations

import os
import shutil

import pytest

from tessera.formats import ModelFormatError, open_model
from tessera.formats.hf_cache import cached_snapshot, looks_like_repo_id
from tessera.formats.tokenizer import TokenizerError, load_tokenizer
from tests.worker_proc.helpers import tiny_hf_model


@pytest.fixture
def hub(tmp_path, monkeypatch):
    from huggingface_hub import constants

    cache = tmp_path / "hub"
    cache.mkdir()
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    return cache


def _cache_model(hub, repo_id: str, source: str, commit: str = "abc123") -> str:
    root = hub / ("models--" + repo_id.replace("/", "--"))
    snapshot = root / "snapshots" / commit
    shutil.copytree(source, snapshot)
    (root / "refs").mkdir(parents=True)
    (root / "refs" / "main").write_text(commit)
    return str(snapshot)


def test_repo_ids_and_paths_are_told_apart():
    assert looks_like_repo_id("Qwen/Qwen3-0.6B") and looks_like_repo_id("org/name.v2")
    for path in ("./org/name", "/models/x", "~/x/y", "a/b/c", "model.gguf", "dir/cfg.json",
                 "default"):
        assert not looks_like_repo_id(path), path


def test_cached_model_opens_by_repo_id(hub, tmp_path, monkeypatch):
    tiny_hf_model("qwen3", str(tmp_path / "src"))
    snapshot = _cache_model(hub, "tiny-org/tiny-qwen3", str(tmp_path / "src"))
    # an older snapshot next to it: refs/main decides
    shutil.copytree(tmp_path / "src", os.path.dirname(snapshot) + "/old000")
    monkeypatch.chdir(tmp_path)  # no local folder of that name
    files = open_model("tiny-org/tiny-qwen3")
    assert files.path == snapshot and files.config.arch == "qwen3"
    assert cached_snapshot("tiny-org/tiny-qwen3") == snapshot
    # no tokenizer.json in a tiny test model: with dummy weights, ids only
    assert load_tokenizer("tiny-org/tiny-qwen3", ids_only_ok=True).vocab_size == 256


def test_a_local_folder_of_that_name_wins(hub, tmp_path, monkeypatch):
    tiny_hf_model("qwen3", str(tmp_path / "src"))
    _cache_model(hub, "org/model", str(tmp_path / "src"))
    local = tmp_path / "org" / "model"
    tiny_hf_model("llama31", str(local))
    monkeypatch.chdir(tmp_path)
    assert open_model("org/model").config.arch == "llama"


def test_missing_model_says_where_it_looked(hub, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ModelFormatError) as info:
        open_model("nobody/nothing")
    message = str(info.value)
    assert str(hub / "models--nobody--nothing") in message
    assert "huggingface-cli download nobody/nothing" in message and "never downloads" in message
    with pytest.raises(TokenizerError, match="not in the Hugging Face cache"):
        load_tokenizer("nobody/nothing")
    (hub / "models--nobody--nothing" / "snapshots").mkdir(parents=True)  # empty: still missing
    with pytest.raises(ModelFormatError, match="not in the Hugging Face cache"):
        open_model("nobody/nothing")
