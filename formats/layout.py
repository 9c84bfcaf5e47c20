"""The Hugging Face tensor names and shapes a config implies. Readers of other formats rename
their tensors to these; the model and the dummy loader check against them."""

from __future__ import annotations

from tessera.formats.config import SUPPORTED_ARCHS, ModelConfig
from tessera.formats.config_moe import MoEConfig

# MoE style -> (block name, expert gate / up / down names, shared expert name)
_MOE_NAMES = {
    "mixtral": ("block_sparse_moe", "w1", "w3", "w2", ""),
    "qwen2_moe": ("mlp", "gate_proj", "up_proj", "down_proj", "shared_expert"),
    "qwen3_moe": ("mlp", "gate_proj", "up_proj", "down_proj", ""),
    "deepseek": ("mlp", "gate_proj", "up_proj", "down_proj", "shared_experts"),
}


def moe_names(moe: MoEConfig) -> tuple[str, str, str, str, str]:
    """(block, expert gate, expert up, expert down, shared expert) tensor names of a style."""
    return _MOE_NAMES[moe.style]


def hf_tensor_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """name -> shape of every tensor a checkpoint of `config` holds (lm_head only if untied)."""
    h, d = config.hidden_size, config.head_dim
    shapes: dict[str, tuple[int, ...]] = {
        "model.embed_tokens.weight": (config.vocab_size, h),
        "model.norm.weight": (h,),
    }
    if not config.tie_word_embeddings:
        shapes["lm_head.weight"] = (config.vocab_size, h)
    traits = SUPPORTED_ARCHS[config.arch]
    for i in range(config.num_layers):
        p = f"model.layers.{i}."
        shapes[p + "input_layernorm.weight"] = (h,)
        shapes[p + "post_attention_layernorm.weight"] = (h,)
        if traits.gemma_norms:
            shapes[p + "pre_feedforward_layernorm.weight"] = (h,)
            shapes[p + "post_feedforward_layernorm.weight"] = (h,)
        if traits.fused_checkpoint:
            shapes[p + "self_attn.qkv_proj.weight"] = (config.q_size + 2 * config.kv_size, h)
        else:
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
        if config.moe is not None and config.moe.is_moe_layer(i):
            shapes.update(_moe_shapes(config, config.moe, p))
        elif traits.fused_checkpoint:
            inter = config.intermediate_size
            shapes[p + "mlp.gate_up_proj.weight"] = (2 * inter, h)
            shapes[p + "mlp.down_proj.weight"] = (h, inter)
        else:
            shapes.update(mlp_shapes(p + "mlp.", h, config.intermediate_size))
    return shapes


def mlp_shapes(prefix: str, hidden: int, inter: int) -> dict[str, tuple[int, ...]]:
    return {prefix + "gate_proj.weight": (inter, hidden), prefix + "up_proj.weight": (inter, hidden),
            prefix + "down_proj.weight": (hidden, inter)}


def _moe_shapes(config: ModelConfig, moe: MoEConfig, p: str) -> dict[str, tuple[int, ...]]:
    h, inter = config.hidden_size, moe.intermediate_size
    block, gate, up, down, shared = moe_names(moe)
    b = f"{p}{block}."
    shapes: dict[str, tuple[int, ...]] = {b + "gate.weight": (moe.num_experts, h)}
    if moe.score_correction_bias:
        shapes[b + "gate.e_score_correction_bias"] = (moe.num_experts,)
    for e in range(moe.num_experts):
        x = f"{b}experts.{e}."
        shapes[x + f"{gate}.weight"] = (inter, h)
        shapes[x + f"{up}.weight"] = (inter, h)
        shapes[x + f"{down}.weight"] = (h, inter)
    if moe.shared_intermediate_size:
        shapes.update(mlp_shapes(f"{b}{shared}.", h, moe.shared_intermediate_size))
    if moe.shared_expert_gate:
        shapes[b + "shared_expert_gate.weight"] = (1, h)
    return shapes


def is_norm_weight(name: str) -> bool:
    return name.endswith("norm.weight")


def is_linear_weight(name: str) -> bool:
    """A weight multiplied as a linear layer (projections and the LM head): the tensors a
    quantization scheme applies to. Embeddings and norms stay in floating point."""
    return name.endswith("_proj.weight") or name == "lm_head.weight"
