"""RMSNorm over the last dimension, through the HAL `rms_norm` / `fused_add_rms_norm` ops."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from tessera.worker_proc.models.layers.params import materialize, meta_param

if TYPE_CHECKING:
    from tessera.worker_proc.models.context import ModelContext


class RMSNorm(nn.Module):
    """`unit_offset`: the checkpoint stores w - 1 and the model scales by (1 + w) (Gemma);
    the 1 is added once at load time, in float32, so the op stays the plain one."""

    def __init__(self, ctx: ModelContext, dim: int, eps: float, *,
                 unit_offset: bool = False) -> None:
        super().__init__()
        self.ctx, self.eps, self.unit_offset = ctx, eps, unit_offset
        self.weight = meta_param(dim)
        self.norm_op = ctx.op("rms_norm")
        self.add_norm_op = ctx.op("fused_add_rms_norm")

    def load(self, param: str, tensor: torch.Tensor, part: str | None = None) -> None:
        del param, part
        if self.unit_offset:
            tensor = tensor.float() + 1.0
        materialize(self, "weight", self.ctx.dtype, self.ctx.device).copy_(tensor)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm_op(x, self.weight, self.eps)  # type: ignore[no-any-return]

    def add_forward(self, x: torch.Tensor, residual: torch.Tensor
                    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(norm(x + residual), x + residual)."""
        return self.add_norm_op(x, residual, self.weight, self.eps)  # type: ignore[no-any-return]

    def heads(self, x: torch.Tensor) -> torch.Tensor:
        """Per-head norm of x [T, H, D] (q/k norm)."""
        t, h, d = x.shape
        return self.forward(x.reshape(t * h, d)).view(t, h, d)
