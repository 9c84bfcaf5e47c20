"""Gemma 3's multimodal checkpoints (model_type "gemma3": a text_config, the language model's
tensors under language_model.*, a vision tower beside it) serve their text model: the same
greedy tokens as the text-only checkpoint of the same weights. Hub configs of Gemma 3 list
only what differs from transformers' defaults; those defaults are applied."""

from __future__ import annotations

import json

import torch
from safetensors.torch import load_file, save_file

from tessera.formats import ModelConfig
from tests.worker_proc.driver import MiniScheduler
from tests.worker_proc.helpers import hf_greedy, make_runner, prompts, tiny_hf_model


def test_multimodal_checkpoint_serves_its_text_model(tmp_path):
    text_dir, mm_dir = tmp_path / "text", tmp_path / "mm"
    model = tiny_hf_model("gemma3", str(text_dir))
    batch = prompts(model.config.vocab_size, [5, 23, 40], seed=3)
    expected = [hf_greedy(model, p, 16) for p in batch]
    text_config = json.loads((text_dir / "config.json").read_text())
    mm_dir.mkdir()
    (mm_dir / "config.json").write_text(json.dumps({
        "model_type": "gemma3", "architectures": ["Gemma3ForConditionalGeneration"],
        "text_config": {k: v for k, v in text_config.items() if k != "eos_token_id"},
        "vision_config": {"model_type": "siglip_vision_model", "hidden_size": 8},
        "eos_token_id": [1, 106]}))
    tensors = {f"language_model.{name}": t
               for name, t in load_file(str(text_dir / "model.safetensors")).items()}
    tensors["vision_tower.vision_model.embeddings.patch_embedding.weight"] = torch.ones(8, 3)
    tensors["multi_modal_projector.mm_input_projection_weight"] = torch.ones(8, 64)
    save_file(tensors, str(mm_dir / "model.safetensors"))
    runner = make_runner(str(mm_dir))
    assert runner.model_config.arch == "gemma3_text"
    assert runner.model_config.eos_token_ids == (1, 106)  # the top-level ids
    assert [r.out for r in MiniScheduler(runner).generate(batch, 16)] == expected


def test_gemma3_hub_defaults():
    c = ModelConfig.from_hf_dict({"model_type": "gemma3", "text_config": {
        "model_type": "gemma3_text", "hidden_size": 2560, "intermediate_size": 10240,
        "num_hidden_layers": 34, "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
        "sliding_window": 1024}})  # google/gemma-3-4b-it's text_config, in full
    assert (c.num_heads, c.num_kv_heads, c.head_dim, c.vocab_size) == (8, 4, 256, 262208)
    assert c.rope_theta == 1e6 and c.local_rope_theta == 1e4
    assert c.rope_scaling == {"factor": 8.0, "rope_type": "linear"}
    assert c.sliding_window == 1024 and c.attn_scale == 256 ** -0.5
    assert c.sliding_layers == tuple(i for i in range(34) if (i + 1) % 6)
    assert c.tie_word_embeddings and c.hidden_act == "gelu_tanh"
