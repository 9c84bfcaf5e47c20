"""hal.rope against Hugging Face transformers' own rotary embedding, bit for bit."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from tessera.hal.cpu.dense import rotary_embedding
from tessera.hal.rope import cos_sin_cache, inv_freq

transformers = pytest.importorskip("transformers")
from transformers.models.llama.modeling_llama import (  # noqa: E402
    LlamaRotaryEmbedding,
    apply_rotary_pos_emb,
)

SCALINGS: dict[str, dict[str, Any] | None] = {
    "default": None,
    "linear": {"rope_type": "linear", "factor": 4.0},
    "llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 1024},
    "llama3_old_key": {"type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                       "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
}


def _hf_rope(head_dim: int, base: float, scaling: dict[str, Any] | None) -> LlamaRotaryEmbedding:
    params = {"rope_type": "default", "rope_theta": base}
    if scaling:
        params.update({k: v for k, v in scaling.items() if k != "type"})
        params["rope_type"] = scaling.get("rope_type", scaling.get("type"))
    config = transformers.LlamaConfig(hidden_size=head_dim * 4, num_attention_heads=4,
                                      head_dim=head_dim, max_position_embeddings=16384,
                                      rope_parameters=params)
    return LlamaRotaryEmbedding(config)


@pytest.mark.parametrize("name", sorted(SCALINGS))
@pytest.mark.parametrize("head_dim", [64, 128])
def test_inv_freq_matches_transformers(name: str, head_dim: int) -> None:
    base = 500000.0 if name.startswith("llama3") else 10000.0
    ours = inv_freq(head_dim, base, SCALINGS[name])
    theirs = _hf_rope(head_dim, base, SCALINGS[name]).inv_freq
    assert torch.equal(ours, theirs)


@pytest.mark.parametrize("name", ["default", "llama3"])
def test_rotary_matches_transformers(name: str) -> None:
    head_dim, base = 64, 500000.0
    hf = _hf_rope(head_dim, base, SCALINGS[name])
    positions = torch.tensor([0, 1, 7, 1023, 1024, 5000, 16000])
    q = torch.randn(len(positions), 4, head_dim, generator=torch.Generator().manual_seed(0))
    k = torch.randn(len(positions), 2, head_dim, generator=torch.Generator().manual_seed(1))
    cos, sin = hf(q, positions[None])  # [1, T, D]
    # HF layout is [batch, heads, seq, dim]; ours is [seq, heads, dim]
    q_hf, k_hf = apply_rotary_pos_emb(q.transpose(0, 1)[None], k.transpose(0, 1)[None], cos, sin)
    table = cos_sin_cache(head_dim, 16384, base, SCALINGS[name], "cpu", torch.float32)
    q_ours, k_ours = rotary_embedding(positions, q, k, table)
    torch.testing.assert_close(q_ours, q_hf[0].transpose(0, 1), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(k_ours, k_hf[0].transpose(0, 1), atol=1e-5, rtol=1e-5)


def test_cache_layout_is_cos_then_sin() -> None:
    table = cos_sin_cache(8, 3, 10000.0, None, "cpu", torch.float32)
    assert table.shape == (3, 8)
    assert torch.equal(table[0], torch.tensor([1.0] * 4 + [0.0] * 4))
    freqs = inv_freq(8, 10000.0)
    torch.testing.assert_close(table[2, :4], torch.cos(2 * freqs))
    torch.testing.assert_close(table[2, 4:], torch.sin(2 * freqs))


def test_unsupported_scaling_says_what_is_supported() -> None:
    with pytest.raises(ValueError, match="'yarn' is not supported; supported: default, linear"):
        cos_sin_cache(64, 16, 10000.0, {"rope_type": "yarn", "factor": 4.0}, "cpu",
                      torch.float32)
    with pytest.raises(ValueError, match="needs 'low_freq_factor'"):
        inv_freq(64, 10000.0, {"rope_type": "llama3", "factor": 8.0})
