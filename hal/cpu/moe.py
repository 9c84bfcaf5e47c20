"""Reference Mixture-of-Experts MLP (semantics: hal/ops.py `fused_moe`).

The plain algorithm the fused kernels implement: group the (token, choice) pairs by expert,
run each expert's gate/up and down projections on its tokens, and add the weighted results
back into the tokens' rows. Experts are visited in ascending order, as transformers does.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from tessera.hal.cpu.dense import act_and_mul


def fused_moe(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
              topk_ids: torch.Tensor, activation: str = "silu") -> torch.Tensor:
    out = torch.zeros_like(x)
    if x.shape[0] == 0:
        return out
    num_experts = w13.shape[0]
    ids = topk_ids.long()
    held = (ids >= 0) & (ids < num_experts)
    for e in torch.unique(ids[held]).tolist():
        tokens, choice = torch.where(ids == e)
        hidden = act_and_mul(F.linear(x[tokens], w13[e]), activation)
        y = F.linear(hidden, w2[e]).float() * topk_weights[tokens, choice, None].float()
        out.index_add_(0, tokens, y.to(out.dtype))
    return out


def moe_softmax_topk(logits: torch.Tensor, top_k: int, renormalize: bool
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """The fused op's definition (hal/ops.py): softmax in float32, the top_k largest,
    optionally renormalized to sum to one."""
    probs = torch.softmax(logits.float(), dim=-1)
    weights, ids = torch.topk(probs, top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, ids.to(torch.int32)
