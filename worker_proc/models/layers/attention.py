"""The attention block: fused q/k/v projection, optional per-head q/k norm, rotary embedding,
KV store, paged attention (extend or decode) and the output projection."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from tessera.hal.platform import KVArena, RotaryStore
from tessera.worker_proc.forward_inputs import ForwardInputs
from tessera.worker_proc.models.layers.linear import Linear, qkv_parts
from tessera.worker_proc.models.layers.norm import RMSNorm
from tessera.worker_proc.models.layers.params import Target, Targets, add_target

if TYPE_CHECKING:
    from tessera.worker_proc.models.context import ModelContext
    from tessera.worker_proc.models.layers.rotary import RotaryEmbedding


class Attention(nn.Module):
    """One layer's self-attention on this rank's heads. `scale` defaults to head_dim^-0.5;
    sliding_window > 0 limits each query to the last sliding_window positions; logit_cap > 0
    soft-caps the scores (hal/ops.py)."""

    def __init__(self, ctx: ModelContext, layer_index: int, rotary: RotaryEmbedding, *,
                 head_dim: int, qkv_bias: bool = False, qk_norm: bool = False,
                 norm_unit_offset: bool = False, scale: float | None = None,
                 sliding_window: int = 0, logit_cap: float = 0.0) -> None:
        super().__init__()
        c, tp = ctx.config, ctx.tp
        self.ctx, self.layer_index, self.rotary = ctx, layer_index, rotary
        # The KV arena holds this pipeline stage's layers only.
        self.kv_index = layer_index - ctx.layers.first
        self.head_dim = head_dim
        self.num_heads, self.num_kv_heads = tp.num_heads, tp.num_kv_heads
        self.scale = head_dim ** -0.5 if not scale else scale
        # Only what is set is passed, so that a plugin without these options still serves
        # models that do not need them.
        self.attn_options: dict[str, float] = {}
        if sliding_window > 0:
            self.attn_options["sliding_window"] = sliding_window
        if logit_cap > 0:
            self.attn_options["logit_cap"] = logit_cap
        self.qkv = Linear.column(ctx, c.hidden_size, qkv_parts(ctx, head_dim), bias=qkv_bias)
        self.o = Linear.row(ctx, c.num_heads * head_dim, c.hidden_size)
        self.q_norm = self.k_norm = None
        if qk_norm:
            self.q_norm = RMSNorm(ctx, head_dim, c.rms_norm_eps, unit_offset=norm_unit_offset)
            self.k_norm = RMSNorm(ctx, head_dim, c.rms_norm_eps, unit_offset=norm_unit_offset)
        # (k_scale, v_scale) of an fp8 KV cache (CausalLM.set_kv_cache_scales); None: the
        # cache is in the serving dtype and the ops take no scales.
        self.kv_scales: tuple[float, float] | None = None
        self.store_kv = ctx.op("store_kv")
        # Rotary and the KV store in one op where the plugin fuses them (partial rotary keeps
        # the two ops: the fused op rotates the whole head).
        self.rotary_store_kv = ctx.fused_op("rotary_store_kv") \
            if rotary.rotary_dim == head_dim else None
        self.attention_extend = ctx.op("attention_extend")
        self.attention_decode = ctx.op("attention_decode")

    def targets(self, prefix: str) -> Targets:
        """Hugging Face names under `prefix` (e.g. "model.layers.3.self_attn.")."""
        out: Targets = {}
        for part in ("q", "k", "v"):
            add_target(out, f"{prefix}{part}_proj.weight", Target(self.qkv, "weight", part))
            if self.qkv.has_bias:
                add_target(out, f"{prefix}{part}_proj.bias", Target(self.qkv, "bias", part))
        add_target(out, f"{prefix}o_proj.weight", Target(self.o))
        if self.q_norm is not None and self.k_norm is not None:
            add_target(out, f"{prefix}q_norm.weight", Target(self.q_norm))
            add_target(out, f"{prefix}k_norm.weight", Target(self.k_norm))
        return out

    def forward(self, h: torch.Tensor, inp: ForwardInputs, kv: KVArena) -> torch.Tensor:
        return self.o(self.attend(self.qkv(h), inp, kv))  # type: ignore[no-any-return]

    def attend(self, qkv: torch.Tensor, inp: ForwardInputs, kv: KVArena) -> torch.Tensor:
        """The attention between the two projections: the qkv projection's output [T, (Hq +
        2 Hk) D] in, the o projection's input [T, Hq D] out (the KV stored on the way)."""
        t, d, hq, hk = qkv.shape[0], self.head_dim, self.num_heads, self.num_kv_heads
        q, k, v = qkv.split([hq * d, hk * d, hk * d], dim=-1)
        q, k, v = q.reshape(t, hq, d), k.reshape(t, hk, d), v.reshape(t, hk, d)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm.heads(q), self.k_norm.heads(k)
        k_cache, v_cache = kv.k[self.kv_index], kv.v[self.kv_index]
        scales = {} if self.kv_scales is None else \
            {"k_scale": self.kv_scales[0], "v_scale": self.kv_scales[1]}
        if self.rotary_store_kv is not None:
            q = self.rotary_store_kv(inp.positions, q, k, v, self.rotary.cos_sin, k_cache,
                                     v_cache, inp.out_slots, **scales)
        else:
            q, k = self.rotary(inp.positions, q, k)
            self.store_kv(k_cache, v_cache, k, v, inp.out_slots, **scales)
        return self.attend_stored(q, inp, kv)

    def rotary_store(self, inp: ForwardInputs, kv: KVArena) -> RotaryStore | None:
        """What a qkv product with the rotary and the KV store as its epilogue needs
        (QuantLinearKernel.one_token_fused's rope), where attend would run rotary_store_kv
        as it is: whole-head rotary, no q/k norm, a cache in the serving dtype. None
        otherwise."""
        if self.rotary_store_kv is None or self.q_norm is not None or \
                self.kv_scales is not None:
            return None
        k_cache = kv.k[self.kv_index]
        if k_cache.dtype != self.ctx.dtype:
            return None
        return RotaryStore(inp.positions, self.rotary.cos_sin, k_cache, kv.v[self.kv_index],
                           inp.out_slots, self.num_heads, self.num_kv_heads, self.head_dim)

    def attend_stored(self, q: torch.Tensor, inp: ForwardInputs, kv: KVArena) -> torch.Tensor:
        """attend after the rotary and the KV store: the rotated q [T, Hq, D] (or
        [T, Hq D]) in, the o projection's input [T, Hq D] out."""
        t, d, hq = q.shape[0], self.head_dim, self.num_heads
        q = q.reshape(t, hq, d)
        k_cache, v_cache = kv.k[self.kv_index], kv.v[self.kv_index]
        scales = {} if self.kv_scales is None else \
            {"k_scale": self.kv_scales[0], "v_scale": self.kv_scales[1]}
        if inp.is_decode:
            o = self.attention_decode(q, k_cache, v_cache, inp.req_to_token, inp.seq_lens,
                                      self.scale, **self.attn_options, **scales)
        else:
            o = self.attention_extend(q, k_cache, v_cache, inp.req_to_token, inp.seq_lens,
                                      inp.extend_lens, inp.qo_indptr, self.scale,
                                      max_extend_len=inp.max_extend_len, **self.attn_options,
                                      **scales)
        return o.reshape(t, hq * d)  # type: ignore[no-any-return]
