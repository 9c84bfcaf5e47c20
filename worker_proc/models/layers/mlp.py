"""The gated MLP: down(act(gate(x)) * up(x)), gate and up fused into one column-parallel
matrix, down row-parallel."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from tessera.worker_proc.models.layers.linear import Linear, split_parts
from tessera.worker_proc.models.layers.params import Target, Targets, add_target

if TYPE_CHECKING:
    from tessera.worker_proc.models.context import ModelContext

# hidden_act of config.json -> the HAL op that applies it to the fused [gate | up] output
ACTIVATION_OPS = {"silu": "silu_and_mul", "gelu_tanh": "gelu_tanh_and_mul"}


class GatedMLP(nn.Module):
    def __init__(self, ctx: ModelContext, hidden: int, intermediate: int, *,
                 activation: str = "silu", reduce: bool = True) -> None:
        super().__init__()
        if activation not in ACTIVATION_OPS:
            raise ValueError(f"MLP activation {activation!r} is not supported; supported: "
                             f"{', '.join(ACTIVATION_OPS)}")
        self.gate_up = Linear.column(ctx, hidden, split_parts(ctx, {"gate": intermediate,
                                                                    "up": intermediate}))
        self.down = Linear.row(ctx, intermediate, hidden, reduce=reduce)
        self.activation = activation
        self.act_op = ctx.op(ACTIVATION_OPS[activation])
        # The activation as the down projection's prologue where the plugin fuses them (a
        # quantized down projection keeps the two ops).
        self.act_down = ctx.fused_op("silu_and_mul_linear") \
            if activation == "silu" and self.down.is_dense else None

    def targets(self, prefix: str) -> Targets:
        out: Targets = {}
        add_target(out, f"{prefix}gate_proj.weight", Target(self.gate_up, "weight", "gate"))
        add_target(out, f"{prefix}up_proj.weight", Target(self.gate_up, "weight", "up"))
        add_target(out, f"{prefix}down_proj.weight", Target(self.down))
        return out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate_up = self.gate_up(x)
        if self.act_down is not None:
            return self.down.forward_fused(self.act_down, gate_up)
        return self.down(self.act_op(gate_up))  # type: ignore[no-any-return]
