"""Write a GGUF the way llama.cpp's convert_hf_to_gguf does (q/k permuted for "llama")."""

from __future__ import annotations

from typing import Any

import numpy as np

from tessera.formats.gguf_file import permute_qk

_TO_GGUF = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}
_BLOCK = {
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}


def gguf_name(hf: str) -> str:
    if hf in _TO_GGUF:
        return _TO_GGUF[hf]
    parts = hf.split(".")
    return f"blk.{parts[2]}.{_BLOCK['.'.join(parts[3:])]}"


def write_gguf(path: str, arch: str, cfg: Any, state: dict[str, Any],
               quant: str = "F32", metadata: dict[str, Any] | None = None,
               rope_freqs: np.ndarray | None = None) -> None:
    """cfg: a transformers config; state: its model's state_dict (torch tensors)."""
    import gguf

    w = gguf.GGUFWriter(path, arch)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    theta = getattr(cfg, "rope_theta", None) or cfg.rope_parameters["rope_theta"]
    w.add_rope_freq_base(theta)
    w.add_vocab_size(cfg.vocab_size)
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    for key, value in (metadata or {}).items():
        w.add_string(key, value) if isinstance(value, str) else w.add_array(key, value)
    if rope_freqs is not None:
        w.add_tensor("rope_freqs.weight", rope_freqs.astype(np.float32))
    qtype = getattr(gguf.GGMLQuantizationType, quant)
    for name, tensor in state.items():
        if name == "lm_head.weight" and cfg.tie_word_embeddings:
            continue
        data = tensor.detach().float().numpy()
        if arch == "llama" and ("q_proj" in name or "k_proj" in name):
            import torch

            heads = cfg.num_attention_heads if "q_proj" in name else cfg.num_key_value_heads
            data = permute_qk(torch.from_numpy(data), heads).numpy()
        if data.ndim == 2 and quant != "F32":
            w.add_tensor(gguf_name(name), gguf.quants.quantize(data, qtype), raw_dtype=qtype)
        else:
            w.add_tensor(gguf_name(name), np.ascontiguousarray(data, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def llama3_rope_factors(head_dim: int, base: float, factor: float, low: float, high: float,
                        old_context: int) -> np.ndarray:
    """The rope_freqs tensor, computed as llama.cpp's convert_hf_to_gguf does for Llama 3."""
    import math

    out = []
    for i in range(0, head_dim, 2):
        freq = 1.0 / (base ** (i / head_dim))
        wavelen = 2 * math.pi / freq
        if wavelen < old_context / high:
            out.append(1.0)
        elif wavelen > old_context / low:
            out.append(factor)
        else:
            smooth = (old_context / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.asarray(out, dtype=np.float32)
