from __future__ import annotations

import json

import pytest
import torch

from tessera.formats import ModelFormatError, hf_tensor_shapes, open_model
from tests.worker_proc.helpers import tiny_hf_model


def test_folder_tensors_equal_the_model_state(tmp_path):
    model = tiny_hf_model("qwen3", str(tmp_path))
    files = open_model(str(tmp_path))
    assert files.kind == "safetensors" and files.tokenizer_dir == str(tmp_path)
    assert files.gguf_metadata is None
    got = dict(files.iter_tensors(torch.bfloat16, progress=False))
    assert set(got) == set(hf_tensor_shapes(files.config))
    state = model.state_dict()
    for name, tensor in got.items():
        assert tensor.dtype == torch.bfloat16
        assert torch.equal(tensor, state[name].to(torch.bfloat16)), name


def test_sharded_folder_and_missing_shard(tmp_path):
    model = tiny_hf_model("llama31", str(tmp_path / "one"))
    model.save_pretrained(str(tmp_path / "many"), safe_serialization=True, max_shard_size="40KB")
    one = dict(open_model(str(tmp_path / "one")).iter_tensors(progress=False))
    many = open_model(str(tmp_path / "many"))
    names = many.tensor_names()
    assert sorted(names) == sorted(one)
    assert all(torch.equal(t, one[n]) for n, t in many.iter_tensors(progress=False))
    index = json.loads((tmp_path / "many" / "model.safetensors.index.json").read_text())
    victim = sorted(set(index["weight_map"].values()))[-1]
    (tmp_path / "many" / victim).unlink()
    with pytest.raises(ModelFormatError, match=f"missing: {victim}"):
        open_model(str(tmp_path / "many"))


def test_a_file_that_is_not_a_model(tmp_path):
    path = tmp_path / "weights.bin"
    path.write_bytes(b"\0" * 16)
    with pytest.raises(ModelFormatError, match="not a .gguf"):
        open_model(str(path))
