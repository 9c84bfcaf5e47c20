from __future__ import annotations

import json

import pytest

from tessera.formats import ModelConfig, ModelFormatError, UnsupportedModelError, open_model
from tessera.formats.layout import hf_tensor_shapes

LLAMA31_V4 = {  # transformers 4.x layout, as Llama 3.1 8B ships it
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
    "intermediate_size": 14336, "num_attention_heads": 32, "num_hidden_layers": 32,
    "num_key_value_heads": 8, "vocab_size": 128256, "rms_norm_eps": 1e-05,
    "rope_theta": 500000.0, "max_position_embeddings": 131072, "tie_word_embeddings": False,
    "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009],
    "torch_dtype": "bfloat16",
}


def test_llama31_transformers4_layout():
    c = ModelConfig.from_hf_dict(LLAMA31_V4)
    assert (c.arch, c.head_dim, c.num_kv_heads, c.rope_theta) == ("llama", 128, 8, 500000.0)
    assert c.rope_scaling is not None and c.rope_scaling["rope_type"] == "llama3"
    assert c.eos_token_ids == (128001, 128008, 128009)
    assert not c.qkv_bias and not c.qk_norm and c.source_dtype == "bfloat16"


def test_transformers5_rope_parameters_layout():
    data = {k: v for k, v in LLAMA31_V4.items() if k not in ("rope_theta", "rope_scaling")}
    data["rope_parameters"] = {**LLAMA31_V4["rope_scaling"], "rope_theta": 500000.0}
    assert ModelConfig.from_hf_dict(data) == ModelConfig.from_hf_dict(LLAMA31_V4)
    plain = {**data, "rope_parameters": {"rope_type": "default", "rope_theta": 1e6}}
    c = ModelConfig.from_hf_dict(plain)
    assert c.rope_scaling is None and c.rope_theta == 1e6


def test_qwen_defaults():
    base = {"hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
            "num_hidden_layers": 2, "num_key_value_heads": 2, "vocab_size": 256}
    qwen2 = ModelConfig.from_hf_dict({**base, "model_type": "qwen2"})
    assert qwen2.qkv_bias and not qwen2.qk_norm
    qwen3 = ModelConfig.from_hf_dict({**base, "model_type": "qwen3", "head_dim": 32,
                                      "attention_bias": False})
    assert qwen3.qk_norm and not qwen3.qkv_bias and qwen3.head_dim == 32
    shapes = hf_tensor_shapes(qwen3)
    assert shapes["model.layers.1.self_attn.q_proj.weight"] == (128, 64)
    assert shapes["model.layers.1.self_attn.k_norm.weight"] == (32,)
    assert "lm_head.weight" in shapes


def test_round_trip_through_hf_dict_and_transformers():
    import transformers as tf

    c = ModelConfig.from_hf_dict(LLAMA31_V4)
    assert ModelConfig.from_hf_dict(c.to_hf_dict()) == c
    hf = tf.LlamaConfig(**c.to_hf_dict())
    assert hf.num_key_value_heads == 8 and hf.tie_word_embeddings is False


def test_errors_say_what_is_wrong(tmp_path):
    with pytest.raises(UnsupportedModelError, match="'gpt_neox'.*supported"):
        ModelConfig.from_hf_dict({**LLAMA31_V4, "model_type": "gpt_neox"})
    data = dict(LLAMA31_V4)
    del data["hidden_size"]
    with pytest.raises(ModelFormatError, match="hidden_size"):
        ModelConfig.from_hf_dict(data)
    with pytest.raises(ModelFormatError, match="multiple of num_key_value_heads"):
        ModelConfig.from_hf_dict({**LLAMA31_V4, "num_key_value_heads": 5})
    folder = tmp_path / "m"
    folder.mkdir()
    with pytest.raises(ModelFormatError, match="no config.json"):
        open_model(str(folder))
    (folder / "config.json").write_text(json.dumps(LLAMA31_V4))
    with pytest.raises(ModelFormatError, match="no \\*.safetensors"):
        open_model(str(folder))
    (folder / "pytorch_model.bin").write_bytes(b"x")
    with pytest.raises(ModelFormatError, match="safe_serialization"):
        open_model(str(folder))
    with pytest.raises(ModelFormatError, match="not found"):
        open_model(str(tmp_path / "missing"))


def test_dummy_from_a_benchmark_config(tmp_path):
    path = tmp_path / "llama8b.json"
    path.write_text(json.dumps(LLAMA31_V4))
    files = open_model(str(path), load_format="dummy", seed=1)
    assert files.kind == "dummy" and files.config.hidden_size == 4096
    assert set(files.tensor_names()) == set(hf_tensor_shapes(files.config))
    tiny = tmp_path / "tiny.json"
    tiny.write_text(json.dumps({**LLAMA31_V4, "hidden_size": 64, "intermediate_size": 96,
                                "num_attention_heads": 4, "num_key_value_heads": 2,
                                "num_hidden_layers": 1, "vocab_size": 50}))
    a = dict(open_model(str(tiny), "dummy", seed=1).iter_tensors(progress=False))
    b = dict(open_model(str(tiny), "dummy", seed=1).iter_tensors(progress=False))
    c = dict(open_model(str(tiny), "dummy", seed=2).iter_tensors(progress=False))
    name = "model.layers.0.mlp.up_proj.weight"
    assert a[name].shape == (96, 64)
    assert (a[name] == b[name]).all() and not (a[name] == c[name]).all()
    assert (a["model.norm.weight"] == 1).all()
    assert 0.015 < float(a[name].std()) < 0.025


MOE_BASE = {"hidden_size": 64, "intermediate_size": 96, "num_attention_heads": 4,
            "num_hidden_layers": 4, "num_key_value_heads": 2, "vocab_size": 128}


def test_moe_configs_normalize_and_round_trip():
    mixtral = ModelConfig.from_hf_dict({**MOE_BASE, "model_type": "mixtral",
                                        "num_local_experts": 8, "num_experts_per_tok": 2})
    assert mixtral.moe is not None and mixtral.moe.intermediate_size == 96
    assert mixtral.moe.scoring == "softmax" and mixtral.moe.norm_topk_prob
    qwen = ModelConfig.from_hf_dict({**MOE_BASE, "model_type": "qwen3_moe", "num_experts": 8,
                                     "num_experts_per_tok": 2, "moe_intermediate_size": 32,
                                     "decoder_sparse_step": 2, "mlp_only_layers": [3]})
    assert qwen.moe is not None and qwen.moe.dense_layers == (0, 2, 3)
    dots = ModelConfig.from_hf_dict({**MOE_BASE, "model_type": "dots1", "n_routed_experts": 8,
                                     "num_experts_per_tok": 2, "moe_intermediate_size": 32,
                                     "n_shared_experts": 2, "first_k_dense_replace": 1,
                                     "n_group": 4, "topk_group": 2})
    assert dots.moe is not None and dots.moe.scoring == "sigmoid"
    assert dots.moe.shared_intermediate_size == 64 and dots.moe.dense_layers == (0,)
    for c in (mixtral, qwen, dots):
        assert ModelConfig.from_hf_dict(c.to_hf_dict()) == c
    shapes = hf_tensor_shapes(dots)
    assert "model.layers.0.mlp.gate_proj.weight" in shapes  # the dense first layer
    assert shapes["model.layers.1.mlp.experts.7.down_proj.weight"] == (64, 32)
    assert shapes["model.layers.1.mlp.gate.e_score_correction_bias"] == (8,)
    assert shapes["model.layers.1.mlp.shared_experts.up_proj.weight"] == (64, 64)
    assert "model.layers.2.block_sparse_moe.experts.0.w1.weight" in hf_tensor_shapes(mixtral)


def test_bad_moe_configs_are_refused():
    with pytest.raises(ModelFormatError, match="num_experts_per_tok"):
        ModelConfig.from_hf_dict({**MOE_BASE, "model_type": "mixtral",
                                  "num_local_experts": 2, "num_experts_per_tok": 3})
    with pytest.raises(ModelFormatError, match="number of experts"):
        ModelConfig.from_hf_dict({**MOE_BASE, "model_type": "qwen3_moe"})
