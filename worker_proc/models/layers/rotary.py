"""Rotary position embedding: its cos/sin table (with rope scaling, hal/rope.py), built on the
device when the model is built, applied through the HAL `rotary_embedding` op."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from tessera.hal.rope import cos_sin_cache

if TYPE_CHECKING:
    from tessera.worker_proc.models.context import ModelContext


class RotaryEmbedding:
    """Not an nn.Module: one table is shared by every layer that uses the same frequencies.

    `rotary_dim` < head_dim (partial rotary, Phi-4-mini, GLM): only the first rotary_dim dims
    of each head rotate (rotate-half within them); the others pass through."""

    def __init__(self, ctx: ModelContext, head_dim: int, theta: float,
                 scaling: dict[str, Any] | None, rotary_dim: int = 0) -> None:
        self.head_dim = head_dim
        self.rotary_dim = rotary_dim or head_dim
        self.cos_sin = cos_sin_cache(self.rotary_dim, ctx.max_positions, theta, scaling,
                                     ctx.device, ctx.dtype)
        self.rotary_op = ctx.op("rotary_embedding")

    def __call__(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor
                 ) -> tuple[torch.Tensor, torch.Tensor]:
        if self.rotary_dim == self.head_dim:
            return self.rotary_op(positions, q, k, self.cos_sin)  # type: ignore[no-any-return]
        r = self.rotary_dim
        q_rot, k_rot = self.rotary_op(positions, q[..., :r], k[..., :r], self.cos_sin)
        return torch.cat((q_rot, q[..., r:]), dim=-1), torch.cat((k_rot, k[..., r:]), dim=-1)
