"""The Hugging Face tensor names and shapes a Llama-family config implies. Readers of other
formats rename their tensors to these; the model and the dummy loader check against them."""

from __future__ import annotations

from tessera.formats.config import ModelConfig


def hf_tensor_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """name -> shape of every tensor a checkpoint of `config` holds (lm_head only if untied)."""
    h, d = config.hidden_size, config.head_dim
    shapes: dict[str, tuple[int, ...]] = {
        "model.embed_tokens.weight": (config.vocab_size, h),
        "model.norm.weight": (h,),
    }
    if not config.tie_word_embeddings:
        shapes["lm_head.weight"] = (config.vocab_size, h)
    for i in range(config.num_layers):
        p = f"model.layers.{i}."
        shapes[p + "input_layernorm.weight"] = (h,)
        shapes[p + "post_attention_layernorm.weight"] = (h,)
        shapes[p + "self_attn.q_proj.weight"] = (config.q_size, h)
        shapes[p + "self_attn.k_proj.weight"] = (config.kv_size, h)
        shapes[p + "self_attn.v_proj.weight"] = (config.kv_size, h)
        shapes[p + "self_attn.o_proj.weight"] = (h, config.q_size)
        if config.qkv_bias:
            shapes[p + "self_attn.q_proj.bias"] = (config.q_size,)
            shapes[p + "self_attn.k_proj.bias"] = (config.kv_size,)
            shapes[p + "self_attn.v_proj.bias"] = (config.kv_size,)
        if config.qk_norm:
            shapes[p + "self_attn.q_norm.weight"] = (d,)
            shapes[p + "self_attn.k_norm.weight"] = (d,)
        shapes[p + "mlp.gate_proj.weight"] = (config.intermediate_size, h)
        shapes[p + "mlp.up_proj.weight"] = (config.intermediate_size, h)
        shapes[p + "mlp.down_proj.weight"] = (h, config.intermediate_size)
    return shapes


def is_norm_weight(name: str) -> bool:
    return name.endswith("norm.weight")


def is_linear_weight(name: str) -> bool:
    """A weight multiplied as a linear layer (projections and the LM head): the tensors a
    quantization scheme applies to. Embeddings and norms stay in floating point."""
    return name.endswith("_proj.weight") or name == "lm_head.weight"
