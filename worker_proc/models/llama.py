"""The Llama family: Llama 2/3/3.1 (rope scaling), Mistral (sliding window), Qwen2/2.5 (qkv
bias), Qwen3 (q/k norm), Granite (multipliers on embeddings, residual branches, attention
scores and logits), tied or untied embeddings.

A pre-norm decoder layer: x + attn(norm(x)), then + mlp(norm(...)), the residual adds fused
into the next norm (`fused_add_rms_norm`). A one-token step over quantized weights that the
plugin's GEMV fuses instead carries x itself, the norms and adds inside the products
(`forward_one_token`).
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


class LlamaDecoderLayer(nn.Module):
    """`mlp` is any module with targets(prefix) (a GatedMLP, a SparseMoEBlock), whose
    checkpoint tensors sit under `mlp_prefix` in the layer."""

    def __init__(self, ctx: ModelContext, index: int, rotary: RotaryEmbedding, mlp: nn.Module,
                 mlp_prefix: str = "mlp.") -> None:
        super().__init__()
        c = ctx.config
        self.input_norm = RMSNorm(ctx, c.hidden_size, c.rms_norm_eps)
        self.attn = Attention(ctx, index, rotary, head_dim=c.head_dim, qkv_bias=c.qkv_bias,
                              qk_norm=c.qk_norm, scale=c.attn_scale,
                              sliding_window=c.sliding_window if index in c.sliding_layers
                              else 0)
        self.residual_scale = c.residual_scale
        self.post_norm = RMSNorm(ctx, c.hidden_size, c.rms_norm_eps)
        self.mlp = mlp
        self.mlp_prefix = mlp_prefix
        self._fuses_rows: bool | None = None

    def targets(self, prefix: str) -> Targets:
        out = self.attn.targets(prefix + "self_attn.")
        out.update(self.mlp.targets(prefix + self.mlp_prefix))
        add_target(out, prefix + "input_layernorm.weight", Target(self.input_norm))
        add_target(out, prefix + "post_attention_layernorm.weight", Target(self.post_norm))
        return out

    def forward(self, h: torch.Tensor, residual: torch.Tensor | None, inp: ForwardInputs,
                kv: KVArena) -> tuple[torch.Tensor, torch.Tensor]:
        if self.fuses_rows():
            return self.forward_rows_fused(h, residual, inp, kv)
        if residual is None:
            residual, h = h, self.input_norm(h)
        else:
            h, residual = self.input_norm.add_forward(h, residual)
        h = self.attn(h, inp, kv)
        if self.residual_scale != 1.0:
            h = h * self.residual_scale
        h, residual = self.post_norm.add_forward(h, residual)
        h = self.mlp(h)
        if self.residual_scale != 1.0:
            h = h * self.residual_scale
        return h, residual

    def fuses_rows(self) -> bool:
        """Whether forward_rows_fused runs: a plain gated SiLU MLP, no residual multiplier,
        the qkv, gate/up and down products each its plugin's rows_fused (Linear.fuses_rows:
        quantized, one segment; decided once, after loading)."""
        if self._fuses_rows is None:
            mlp = self.mlp
            self._fuses_rows = self.residual_scale == 1.0 and isinstance(mlp, GatedMLP) and \
                mlp.activation == "silu" and all(
                    lin.fuses_rows() for lin in (self.attn.qkv, mlp.gate_up, mlp.down))
        return self._fuses_rows

    def forward_rows_fused(self, h: torch.Tensor, residual: torch.Tensor | None,
                           inp: ForwardInputs, kv: KVArena
                           ) -> tuple[torch.Tensor, torch.Tensor]:
        """forward with each norm and the SiLU handed to the product after it
        (Linear.rows_fused): an fp8 plugin quantizes the activations in those kernels."""
        mlp = self.mlp
        assert isinstance(mlp, GatedMLP)
        norm = (self.input_norm.weight, self.input_norm.eps)
        qkv, new_residual = self.attn.qkv.rows_fused(h, norm=norm, residual=residual)
        residual = h if new_residual is None else new_residual
        h = self.attn.o(self.attn.attend(qkv, inp, kv))
        gate_up, new_residual = mlp.gate_up.rows_fused(
            h, norm=(self.post_norm.weight, self.post_norm.eps), residual=residual)
        assert new_residual is not None
        h, _ = mlp.down.rows_fused(gate_up, silu=True)
        return h, new_residual

    def fuses_one_token(self) -> bool:
        """Whether forward_one_token's four products are one launch each: a plain gated SiLU
        MLP, no residual multiplier, every projection fused (Linear.fuses_one_token: a
        quantized weight its plugin's GEMV takes, one tensor-parallel rank)."""
        mlp = self.mlp
        return self.residual_scale == 1.0 and isinstance(mlp, GatedMLP) and \
            mlp.activation == "silu" and all(
                lin.fuses_one_token() for lin in (self.attn.qkv, self.attn.o, mlp.gate_up,
                                                  mlp.down))

    def forward_one_token(self, x: torch.Tensor, inp: ForwardInputs, kv: KVArena
                          ) -> torch.Tensor:
        """forward for one token, on the residual stream x itself (the sum forward keeps as
        h + residual): each norm the prologue of the product after it, each residual add
        the epilogue of the product before it, the SiLU the gate/up product's epilogue, the
        rotary and the KV store the qkv product's (Attention.rotary_store); four launches and
        the attention's where forward has eight and the attention's."""
        mlp = self.mlp
        assert isinstance(mlp, GatedMLP)
        norm = (self.input_norm.weight, self.input_norm.eps)
        rope = self.attn.rotary_store(inp, kv)
        if rope is not None:  # the rotary and the KV store in the qkv product's epilogue
            q = self.attn.qkv.one_token_fused(x, norm=norm, rope=rope)
            o_in = self.attn.attend_stored(q, inp, kv)
        else:
            o_in = self.attn.attend(self.attn.qkv.one_token_fused(x, norm=norm), inp, kv)
        x = self.attn.o.one_token_fused(o_in, residual=x)
        act = mlp.gate_up.one_token_fused(x, norm=(self.post_norm.weight, self.post_norm.eps),
                                          silu=True)
        return mlp.down.one_token_fused(act, residual=x)


@register("llama", "mistral", "qwen2", "qwen3", "granite")
class LlamaForCausalLM(CausalLM):
    def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        c = self.config
        rotary = RotaryEmbedding(self.ctx, c.head_dim, c.rope_theta, c.rope_scaling,
                                 c.rotary_dim)
        self.layers = nn.ModuleList(LlamaDecoderLayer(self.ctx, i, rotary, *self.make_mlp(i))
                                    for i in self.stage.layers)
        self._fuses_one_token: bool | None = None

    def make_mlp(self, index: int) -> tuple[nn.Module, str]:
        """Layer `index`'s MLP and the prefix of its checkpoint tensors."""
        c = self.config
        return GatedMLP(self.ctx, c.hidden_size, c.intermediate_size,
                        activation=c.hidden_act), "mlp."

    def layer_targets(self) -> Targets:
        out: Targets = {}
        for i, layer in self.layer_prefixes():
            out.update(layer.targets(f"model.layers.{i}."))  # type: ignore[operator]
        return out

    def fuses_one_token(self) -> bool:
        """Whether a one-token step runs forward_one_token in every layer (decided once,
        after loading): the whole model on this rank's one pipeline stage, every layer
        fusing its products (LlamaDecoderLayer.fuses_one_token)."""
        if self._fuses_one_token is None:
            self._fuses_one_token = len(self.layers) == self.config.num_layers and all(
                layer.fuses_one_token() for layer in self.layers)  # type: ignore[operator]
        return self._fuses_one_token

    def hidden(self, inp: ForwardInputs, kv: KVArena) -> tuple[torch.Tensor, torch.Tensor | None]:
        h, residual = self.stage_input(inp)
        if h.shape[0] == 1 and residual is None and self.fuses_one_token():
            for layer in self.layers:
                h = layer.forward_one_token(h, inp, kv)  # type: ignore[operator]
            return h, None
        for layer in self.layers:
            h, residual = layer(h, residual, inp, kv)
        return h, residual
