"""Rotary embedding tables, with rope scaling computed exactly as Hugging Face transformers
does (`modeling_rope_utils`): default, "linear" and "llama3" (Llama 3.1)."""

from __future__ import annotations

import math
from typing import Any

import torch

SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")


def inv_freq(head_dim: int, base: float, scaling: dict[str, Any] | None = None,
             device: torch.device | str | None = None) -> torch.Tensor:
    """float32 [head_dim // 2] inverse frequencies, scaled as `scaling` says."""
    # Same expression as transformers, so that the float32 rounding matches bit for bit.
    arange = torch.arange(0, head_dim, 2, dtype=torch.int64).to(device=device, dtype=torch.float)
    freqs = 1.0 / (base ** (arange / head_dim))
    rope_type = _rope_type(scaling)
    if rope_type == "default":
        return freqs
    assert scaling is not None
    if rope_type == "linear":
        return freqs / float(scaling["factor"])
    return _llama3(freqs, scaling)


def cos_sin_cache(head_dim: int, max_positions: int, base: float,
                  scaling: dict[str, Any] | None, device: torch.device | str | None,
                  dtype: torch.dtype) -> torch.Tensor:
    """[max_positions, head_dim]: cos in [:, :head_dim//2], sin in [:, head_dim//2:].

    The layout `rotary_embedding` expects (hal/ops.py). Angles are computed in float32 as
    transformers does, then cast to `dtype`.
    """
    if head_dim % 2:
        raise ValueError(f"rotary head_dim must be even, got {head_dim}")
    freqs = inv_freq(head_dim, base, scaling, device)
    positions = torch.arange(max_positions, device=device, dtype=torch.float)
    angles = positions[:, None] * freqs[None, :]
    return torch.cat((angles.cos(), angles.sin()), dim=-1).to(dtype)


def _rope_type(scaling: dict[str, Any] | None) -> str:
    if not scaling:
        return "default"
    # config.json spells it "rope_type" (newer) or "type" (older checkpoints).
    rope_type = str(scaling.get("rope_type", scaling.get("type", "default")))
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise ValueError(f"rope scaling type {rope_type!r} is not supported; "
                         f"supported: {', '.join(SUPPORTED_ROPE_TYPES)}")
    return rope_type


def _llama3(freqs: torch.Tensor, scaling: dict[str, Any]) -> torch.Tensor:
    try:
        factor = scaling["factor"]
        low_freq_factor = scaling["low_freq_factor"]
        high_freq_factor = scaling["high_freq_factor"]
        old_context_len = scaling["original_max_position_embeddings"]
    except KeyError as e:
        raise ValueError(f"llama3 rope scaling needs {e.args[0]!r} in rope_scaling") from None
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    wavelen = 2 * math.pi / freqs
    # Long wavelengths are slowed by `factor`, short ones kept, the band between blended.
    scaled = torch.where(wavelen > low_freq_wavelen, freqs / factor, freqs)
    smooth = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled)
