"""Mixture-of-Experts: the router (top-k over softmax or grouped sigmoid scores), the experts
of one layer (the HAL `fused_moe` op) and the block that adds shared experts.

Routing runs in plain torch on the device, like the sampler's glue: a few small ops on
[T, E] scores, written once for every plugin. The experts' matmuls are the plugin's fused op.
Tensor/expert parallelism (worker_proc/tp.py): each rank holds the intermediate slice
`moe_tp_rank` of the experts of group `ep_rank`; the block sums the routed and shared partial
outputs and reduces once over all ranks.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from tessera.formats.config_moe import MoEConfig
from tessera.formats.layout import moe_names
from tessera.hal.reference import reference_op
from tessera.worker_proc.models.layers.linear import Linear
from tessera.worker_proc.models.layers.mlp import GatedMLP
from tessera.worker_proc.models.layers.params import (
    Target,
    Targets,
    add_target,
    materialize,
    meta_param,
    narrow,
)

if TYPE_CHECKING:
    from tessera.worker_proc.models.context import ModelContext


class TopKRouter(nn.Module):
    """(weights float32 [T, K], expert ids int32 [T, K]) for each token, as transformers
    computes them. Sigmoid (DeepSeek-style) routers keep their weights and math in float32."""

    def __init__(self, ctx: ModelContext, moe: MoEConfig, hidden: int) -> None:
        super().__init__()
        self.ctx, self.moe = ctx, moe
        self.fp32 = moe.scoring == "sigmoid"
        self.gate = Linear.replicated(ctx, hidden, moe.num_experts,
                                      params_dtype=torch.float32 if self.fp32 else None)
        self.correction = meta_param(moe.num_experts) if moe.score_correction_bias else None
        # softmax routers: the plugin's one-launch router where it has one, else the
        # composition that defines it (hal/ops.py; device-generic torch)
        self.softmax_topk = (ctx.fused_op("moe_softmax_topk")
                             or reference_op("moe_softmax_topk")) \
            if moe.scoring == "softmax" else None

    def load(self, param: str, tensor: torch.Tensor, part: str | None = None) -> None:
        del part
        if param != "e_score_correction_bias" or self.correction is None:
            raise KeyError(f"the router has no tensor {param!r}")
        materialize(self, "correction", torch.float32, self.ctx.device).copy_(tensor)

    def forward(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        moe = self.moe
        logits = self.gate(h.float() if self.fp32 else h)
        if moe.scoring == "softmax":
            assert self.softmax_topk is not None
            weights, ids = self.softmax_topk(logits, moe.top_k, moe.norm_topk_prob)
            if moe.style != "mixtral":
                weights = weights.to(h.dtype).float()  # Qwen rounds them to the model dtype
            return weights, ids
        scores = logits.sigmoid()
        choice = scores if self.correction is None else scores + self.correction
        if moe.num_groups > 1:
            t = choice.shape[0]
            grouped = choice.view(t, moe.num_groups, -1)
            group_scores = grouped.topk(2, dim=-1)[0].sum(dim=-1)
            keep = torch.topk(group_scores, moe.topk_groups, dim=-1, sorted=False)[1]
            mask = torch.zeros_like(group_scores).scatter_(1, keep, 1.0).bool()
            choice = grouped.masked_fill(~mask[:, :, None], float("-inf")).view(t, -1)
        ids = torch.topk(choice, moe.top_k, dim=-1, sorted=False)[1]
        weights = scores.gather(1, ids)
        if moe.norm_topk_prob:
            weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
        return weights * moe.routed_scaling_factor, ids.to(torch.int32)


class FusedMoE(nn.Module):
    """This rank's experts: w13 [E_local, 2 I_local, H] (gate rows, then up rows) and
    w2 [E_local, H, I_local]. Returns the partial sum (not reduced)."""

    def __init__(self, ctx: ModelContext, num_experts: int, hidden: int, intermediate: int,
                 *, activation: str = "silu") -> None:
        super().__init__()
        tp = ctx.tp
        self.ctx, self.activation = ctx, activation
        self.num_local = num_experts // tp.ep_size
        self.first = tp.ep_rank * self.num_local
        self.inter = intermediate // tp.moe_tp_size
        self.inter_start = tp.moe_tp_rank * self.inter
        self.w13 = meta_param(self.num_local, 2 * self.inter, hidden)
        self.w2 = meta_param(self.num_local, hidden, self.inter)
        self.moe_op = ctx.op("fused_moe")

    def load(self, param: str, tensor: torch.Tensor, part: str | None = None) -> None:
        """part = "<expert>.gate" | "<expert>.up" | "<expert>.down" (global expert index)."""
        assert part is not None
        expert, which = part.split(".")
        e = int(expert) - self.first
        if not 0 <= e < self.num_local:
            return  # held by another expert-parallel rank
        dtype, dev = self.ctx.dtype, self.ctx.device
        if which == "down":
            dest = materialize(self, "w2", dtype, dev)[e]
            dest.copy_(narrow(tensor, 1, self.inter_start, self.inter))
            return
        rows = slice(0, self.inter) if which == "gate" else slice(self.inter, 2 * self.inter)
        dest = materialize(self, "w13", dtype, dev)[e, rows]
        dest.copy_(narrow(tensor, 0, self.inter_start, self.inter))

    def forward(self, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor
                ) -> torch.Tensor:
        # Global ids -> this rank's; ids of experts held elsewhere fall outside [0, E_local).
        local = ids - self.first if self.first else ids
        return self.moe_op(x, self.w13, self.w2, weights, local,  # type: ignore[no-any-return]
                           activation=self.activation)


class SparseMoEBlock(nn.Module):
    """Router + routed experts (+ shared experts, optionally gated); one all_reduce."""

    def __init__(self, ctx: ModelContext, moe: MoEConfig, hidden: int, *,
                 activation: str = "silu") -> None:
        super().__init__()
        self.ctx = ctx
        self.router = TopKRouter(ctx, moe, hidden)
        self.experts = FusedMoE(ctx, moe.num_experts, hidden, moe.intermediate_size,
                                activation=activation)
        self.shared = GatedMLP(ctx, hidden, moe.shared_intermediate_size, activation=activation,
                               reduce=False) if moe.shared_intermediate_size else None
        self.shared_gate = Linear.replicated(ctx, hidden, 1) if moe.shared_expert_gate else None

    def targets(self, prefix: str) -> Targets:
        """Checkpoint names under `prefix` (the MoE block): gate.weight (the router),
        experts.<e>.<gate|up|down name>.weight, the shared expert(s) (formats/layout.py)."""
        _, *expert_names, shared = moe_names(self.router.moe)
        out: Targets = {}
        add_target(out, prefix + "gate.weight", Target(self.router.gate))
        if self.router.correction is not None:
            add_target(out, prefix + "gate.e_score_correction_bias",
                       Target(self.router, "e_score_correction_bias"))
        for e in range(self.router.moe.num_experts):
            for which, name in zip(("gate", "up", "down"), expert_names, strict=True):
                add_target(out, f"{prefix}experts.{e}.{name}.weight",
                           Target(self.experts, "weight", f"{e}.{which}"))
        if self.shared is not None:
            out.update(self.shared.targets(f"{prefix}{shared}."))
        if self.shared_gate is not None:
            add_target(out, prefix + "shared_expert_gate.weight", Target(self.shared_gate))
        return out

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        weights, ids = self.router(h)
        out = self.experts(h, weights, ids)
        if self.shared is not None:
            shared = self.shared(h)
            if self.shared_gate is not None:
                shared = torch.sigmoid(self.shared_gate(h)) * shared
            out = out + shared
        return self.ctx.all_reduce(out)
