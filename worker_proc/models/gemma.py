"""Gemma 2 and Gemma 3 (text): norms that scale by (1 + w), a norm after attention and after
the MLP as well as before each, embeddings scaled by sqrt(hidden), GELU (tanh) MLPs, a score
scale from query_pre_attn_scalar, sliding-window layers interleaved with global ones (the
paged attention ops skip the KV outside the window). Gemma 2 soft-caps attention scores and
final logits; Gemma 3 has q/k norms and a rope base of its own for the sliding layers.
"""

from __future__ import annotations

import torch
from torch import nn

from tessera.hal.platform import KVArena
from tessera.worker_proc.forward_inputs import ForwardInputs
from tessera.worker_proc.models.base import CausalLM
from tessera.worker_proc.models.context import ModelContext
from tessera.worker_proc.models.layers import (
    Attention,
    GatedMLP,
    RMSNorm,
    RotaryEmbedding,
    Target,
    Targets,
    add_target,
)
from tessera.worker_proc.models.registry import register


class GemmaDecoderLayer(nn.Module):
    def __init__(self, ctx: ModelContext, index: int, rotary: RotaryEmbedding) -> None:
        super().__init__()
        c = ctx.config

        def norm() -> RMSNorm:
            return RMSNorm(ctx, c.hidden_size, c.rms_norm_eps, unit_offset=True)

        self.input_norm, self.post_attn_norm = norm(), norm()
        self.pre_mlp_norm, self.post_mlp_norm = norm(), norm()
        sliding = index in c.sliding_layers
        self.attn = Attention(ctx, index, rotary, head_dim=c.head_dim, qkv_bias=c.qkv_bias,
                              qk_norm=c.qk_norm, norm_unit_offset=True, scale=c.attn_scale,
                              sliding_window=c.sliding_window if sliding else 0,
                              logit_cap=c.attn_logit_softcap)
        self.mlp = GatedMLP(ctx, c.hidden_size, c.intermediate_size, activation=c.hidden_act)

    def targets(self, prefix: str) -> Targets:
        out = self.attn.targets(prefix + "self_attn.")
        out.update(self.mlp.targets(prefix + "mlp."))
        for name, norm in (("input_layernorm", self.input_norm),
                           ("post_attention_layernorm", self.post_attn_norm),
                           ("pre_feedforward_layernorm", self.pre_mlp_norm),
                           ("post_feedforward_layernorm", self.post_mlp_norm)):
            add_target(out, f"{prefix}{name}.weight", Target(norm))
        return out

    def forward(self, h: torch.Tensor, residual: torch.Tensor | None, inp: ForwardInputs,
                kv: KVArena) -> tuple[torch.Tensor, torch.Tensor]:
        if residual is None:
            residual, h = h, self.input_norm(h)
        else:
            h, residual = self.input_norm.add_forward(h, residual)
        h = self.post_attn_norm(self.attn(h, inp, kv))
        h, residual = self.pre_mlp_norm.add_forward(h, residual)
        return self.post_mlp_norm(self.mlp(h)), residual


@register("gemma2", "gemma3_text")
class GemmaForCausalLM(CausalLM):
    norm_unit_offset = True

    def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        c = self.config
        full = RotaryEmbedding(self.ctx, c.head_dim, c.rope_theta, c.rope_scaling, c.rotary_dim)
        local = full if not c.local_rope_theta else RotaryEmbedding(
            self.ctx, c.head_dim, c.local_rope_theta, None, c.rotary_dim)
        self.layers = nn.ModuleList(
            GemmaDecoderLayer(self.ctx, i, local if i in c.sliding_layers else full)
            for i in self.stage.layers)

    def layer_targets(self) -> Targets:
        out: Targets = {}
        for i, layer in self.layer_prefixes():
            out.update(layer.targets(f"model.layers.{i}."))  # type: ignore[operator]
        return out

    def hidden(self, inp: ForwardInputs, kv: KVArena) -> tuple[torch.Tensor, torch.Tensor | None]:
        h, residual = self.stage_input(inp)
        for layer in self.layers:
            h, residual = layer(h, residual, inp, kv)
        return h, residual
