"""Rotary position embedding: its cos/sin table (with rope scaling, hal/rope.py), built on the
device when the model is built, applied through the HAL `rotary_embedding` op."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from tessera.hal.rope import cos_sin_cache

if TYPE_CHECKING:
    from tessera.worker_proc.models.context import ModelContext


class RotaryEmbedding:
    """Not an nn.Module: one table is shared by every layer that uses the same frequencies."""

    def __init__(self, ctx: ModelContext, head_dim: int, theta: float,
                 scaling: dict[str, Any] | None) -> None:
        self.cos_sin = cos_sin_cache(head_dim, ctx.max_positions, theta, scaling, ctx.device,
                                     ctx.dtype)
        self.rotary_op = ctx.op("rotary_embedding")

    def __call__(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor
                 ) -> tuple[torch.Tensor, torch.Tensor]:
        return self.rotary_op(positions, q, k, self.cos_sin)  # type: ignore[no-any-return]
