"""Shared helpers for worker tests: tiny HF models saved as safetensors folders, a runner on
the cpu plugin, and transformers' own greedy decoding as the oracle."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from tessera.config import EngineConfig

TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=256, max_position_embeddings=512,
            initializer_range=0.1)


def tiny_hf_model(kind: str, folder: str, **overrides: Any) -> Any:
    """Build a random tiny transformers model of `kind`, save it (safetensors) to folder."""
    import transformers as tf

    torch.manual_seed(1234)
    cfg: dict[str, Any] = dict(TINY, bos_token_id=1, eos_token_id=2)
    if kind == "llama31":
        cls, conf = tf.LlamaForCausalLM, tf.LlamaConfig
        cfg["rope_scaling"] = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                               "high_freq_factor": 4.0, "original_max_position_embeddings": 32}
        cfg["rope_theta"] = 500000.0
    elif kind == "qwen2":
        cls, conf = tf.Qwen2ForCausalLM, tf.Qwen2Config
        cfg["tie_word_embeddings"] = True
    elif kind == "qwen3":
        cls, conf = tf.Qwen3ForCausalLM, tf.Qwen3Config
        cfg["head_dim"] = 32  # != hidden / heads, as in real Qwen3
    elif kind == "mistral":  # MQA, and a sliding window shorter than the prompts
        cls, conf = tf.MistralForCausalLM, tf.MistralConfig
        cfg.update(num_key_value_heads=1, sliding_window=9)
    elif kind == "gemma2":  # soft-capping that bites (scale 1), layer 0 sliding
        cls, conf = tf.Gemma2ForCausalLM, tf.Gemma2Config
        cfg.update(head_dim=16, sliding_window=10, query_pre_attn_scalar=1,
                   attn_logit_softcapping=2.0, final_logit_softcapping=3.0)
    elif kind == "gemma3":  # q/k norm; sliding layers with their own rope base
        cls, conf = tf.Gemma3ForCausalLM, tf.Gemma3TextConfig
        cfg.update(head_dim=16, num_hidden_layers=3, sliding_window=11,
                   layer_types=["sliding_attention", "full_attention", "sliding_attention"],
                   rope_parameters={"full_attention": {"rope_type": "linear", "factor": 2.0,
                                                       "rope_theta": 1e6},
                                    "sliding_attention": {"rope_type": "default",
                                                          "rope_theta": 1e4}})
    elif kind == "phi3":  # fused qkv / gate_up checkpoint, partial rotary, sliding window
        cls, conf = tf.Phi3ForCausalLM, tf.Phi3Config
        cfg.update(pad_token_id=0, sliding_window=12, partial_rotary_factor=0.5)
    elif kind == "granite":
        cls, conf = tf.GraniteForCausalLM, tf.GraniteConfig
        cfg.update(embedding_multiplier=4.0, residual_multiplier=0.5, attention_multiplier=0.3,
                   logits_scaling=3.0)
    elif kind == "mixtral":
        cls, conf = tf.MixtralForCausalLM, tf.MixtralConfig
        cfg.update(num_local_experts=4, num_experts_per_tok=2, intermediate_size=48)
    elif kind == "qwen2_moe":
        cls, conf = tf.Qwen2MoeForCausalLM, tf.Qwen2MoeConfig
        cfg.update(num_experts=6, num_experts_per_tok=2, moe_intermediate_size=32,
                   shared_expert_intermediate_size=48, norm_topk_prob=False)
    elif kind == "qwen3_moe":
        cls, conf = tf.Qwen3MoeForCausalLM, tf.Qwen3MoeConfig
        cfg.update(head_dim=32, num_experts=8, num_experts_per_tok=3, moe_intermediate_size=32,
                   norm_topk_prob=True, mlp_only_layers=[1])  # layer 1: a dense MLP
    elif kind == "dots1":  # DeepSeek-V3 routing: grouped sigmoid scores, shared experts
        cls, conf = tf.Dots1ForCausalLM, tf.Dots1Config
        cfg.update(num_hidden_layers=3, n_routed_experts=8, num_experts_per_tok=2,
                   moe_intermediate_size=32, n_shared_experts=1, first_k_dense_replace=1,
                   n_group=4, topk_group=2, norm_topk_prob=True, routed_scaling_factor=2.5)
    else:
        raise ValueError(kind)
    cfg.update(overrides)
    if cfg.get("attn_logit_softcapping"):
        # transformers' SDPA path drops the attention soft-cap without a word (releases
        # before about 5.2x even pick it for Gemma 2 by default): eager applies it.
        cfg["attn_implementation"] = "eager"
    model = cls(conf(**cfg)).eval()
    if kind == "qwen2":  # qkv biases start at zero: make them matter
        with torch.no_grad():
            for layer in model.model.layers:
                for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj,
                             layer.self_attn.v_proj):
                    proj.bias.normal_(0.0, 0.5)
    if kind in ("gemma2", "gemma3"):  # norm weights (1 + w) start at w = 0: make them matter
        with torch.no_grad():
            for name, param in model.named_parameters():
                if name.endswith("norm.weight"):
                    param.normal_(0.0, 0.3)
    if kind == "dots1":  # the score correction biases start at zero: make them matter
        with torch.no_grad():
            for layer in model.model.layers[1:]:
                layer.mlp.gate.e_score_correction_bias.normal_(0.0, 0.3)
    model.save_pretrained(folder, safe_serialization=True)
    return model


def hf_greedy(model: Any, prompt: list[int], max_new: int) -> list[int]:
    """transformers' greedy decoding with its KV cache, one prompt at a time (no padding)."""
    out: list[int] = []
    ids = torch.tensor([prompt])
    cache: dict[str, Any] = {}
    with torch.no_grad():
        for _ in range(max_new):
            res = model(input_ids=ids, use_cache=True, **cache)
            # transformers 5 names the KV cache `cache`; 4.x `past_key_values`.
            cache = {"cache": res["cache"]} if "cache" in res else \
                {"past_key_values": res.past_key_values}
            token = int(res.logits[0, -1].argmax())
            out.append(token)
            ids = torch.tensor([[token]])
    return out


def hf_last_logits(model: Any, prompt: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=torch.tensor([prompt])).logits[0, -1].float()


def make_runner(model: str, **overrides: Any) -> Any:
    from tessera.hal.registry import load_platform
    from tessera.worker_proc.model_runner import ModelRunner

    values: dict[str, Any] = dict(model=model, hal="cpu", dtype="float32", page_size=4,
                                  max_running_requests=64, context_length=256,
                                  max_total_tokens=8192)
    values.update(overrides)
    config = EngineConfig(**values)
    return ModelRunner(config, 0, load_platform(config.hal))


def prompts(vocab: int, lengths: list[int], seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(3, vocab, size=n).tolist() for n in lengths]
