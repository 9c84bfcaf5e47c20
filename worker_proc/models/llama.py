"""The Llama family in one implementation: Llama 2/3/3.1, Mistral, Qwen2/2.5 (qkv bias), Qwen3
(q/k norm), tied or untied embeddings.

Built on the meta device; each parameter is materialized on the real device when its first
tensor streams in (`load_weights`), so loading never holds two copies of the model. q/k/v
and gate/up are fused into one matrix each (one matmul instead of three / two). Every op goes
through the HAL op table (`platform.op`); sharding for tensor parallelism follows
`worker_proc/tp.py`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn

from tessera.formats.config import ModelConfig
from tessera.formats.errors import ModelFormatError, WeightShapeError
from tessera.formats.layout import hf_tensor_shapes
from tessera.hal.platform import Communicator, KVArena, Platform
from tessera.worker_proc.forward_inputs import ForwardInputs
from tessera.worker_proc.tp import TPShape

_OPS = ("embedding", "rms_norm", "fused_add_rms_norm", "rotary_embedding", "silu_and_mul",
        "linear", "store_kv", "attention_extend", "attention_decode")


def _param(*shape: int) -> nn.Parameter:
    return nn.Parameter(torch.empty(shape, device="meta"), requires_grad=False)


class LlamaLayer(nn.Module):
    def __init__(self, config: ModelConfig, tp: TPShape) -> None:
        super().__init__()
        h, d = config.hidden_size, config.head_dim
        qkv = (tp.num_heads + 2 * tp.num_kv_heads) * d
        self.input_norm = _param(h)
        self.post_norm = _param(h)
        self.qkv_weight = _param(qkv, h)
        self.qkv_bias = _param(qkv) if config.qkv_bias else None
        self.o_weight = _param(h, tp.num_heads * d)
        self.q_norm = _param(d) if config.qk_norm else None
        self.k_norm = _param(d) if config.qk_norm else None
        self.gate_up_weight = _param(2 * tp.intermediate, h)
        self.down_weight = _param(h, tp.intermediate)


class LlamaForCausalLM(nn.Module):
    def __init__(self, config: ModelConfig, platform: Platform, *, dtype: torch.dtype,
                 device: torch.device, max_positions: int, tp_rank: int = 0, tp_size: int = 1,
                 communicator: Communicator | None = None) -> None:
        super().__init__()
        self.config = config
        self.tp = TPShape.of(config, tp_rank, tp_size)
        if tp_size > 1 and communicator is None:
            raise ValueError("tensor parallelism needs a communicator")
        self.communicator = communicator
        self.dtype, self.device = dtype, device
        self.max_positions = max_positions
        self.ops: dict[str, Callable[..., Any]] = {name: platform.op(name) for name in _OPS}
        self.embed = _param(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(LlamaLayer(config, self.tp) for _ in range(config.num_layers))
        self.final_norm = _param(config.hidden_size)
        self.lm_head = _param(self.tp.vocab_local, config.hidden_size)
        self.scale = config.head_dim ** -0.5
        self.cos_sin: torch.Tensor | None = None

    # -- loading ----------------------------------------------------------------------------

    def _target(self, name: str, full: tuple[int, ...]) -> list[tuple[str, int, slice, int,
                                                                      slice]]:
        """Where an HF tensor goes: [(param path, dest dim, dest slice, src dim, src slice)].
        An empty list means the tensor is not used on this rank's model."""
        c, tp, d = self.config, self.tp, self.config.head_dim
        whole = slice(None)
        if name == "model.embed_tokens.weight":
            out = [("embed", 0, whole, 0, whole)]
            # tp == 1 shares the embedding as the head (after loading); tp > 1 shards a copy.
            if c.tie_word_embeddings and tp.size > 1:
                out += self._lm_head_target()
            return out
        if name == "lm_head.weight":
            return [] if c.tie_word_embeddings else self._lm_head_target()
        if name == "model.norm.weight":
            return [("final_norm", 0, whole, 0, whole)]
        parts = name.split(".")
        if len(parts) < 5 or parts[:2] != ["model", "layers"]:
            raise ModelFormatError(f"unexpected tensor {name!r} in a {c.arch} checkpoint")
        pre, leaf = f"layers.{parts[2]}.", ".".join(parts[3:])
        qs, kvs, inter = tp.num_heads * d, tp.num_kv_heads * d, tp.intermediate
        q_src = slice(tp.rank * qs, (tp.rank + 1) * qs)
        kv_src = slice(tp.kv_head_start * d, tp.kv_head_start * d + kvs)
        i_src = slice(tp.rank * inter, (tp.rank + 1) * inter)
        kind = leaf.rsplit(".", 1)[1]  # weight | bias
        qkv = "qkv_weight" if kind == "weight" else "qkv_bias"
        table: dict[str, tuple[str, int, slice, int, slice]] = {
            "input_layernorm.weight": ("input_norm", 0, whole, 0, whole),
            "post_attention_layernorm.weight": ("post_norm", 0, whole, 0, whole),
            f"self_attn.q_proj.{kind}": (qkv, 0, slice(0, qs), 0, q_src),
            f"self_attn.k_proj.{kind}": (qkv, 0, slice(qs, qs + kvs), 0, kv_src),
            f"self_attn.v_proj.{kind}": (qkv, 0, slice(qs + kvs, qs + 2 * kvs), 0, kv_src),
            "self_attn.o_proj.weight": ("o_weight", 1, whole, 1, q_src),
            "self_attn.q_norm.weight": ("q_norm", 0, whole, 0, whole),
            "self_attn.k_norm.weight": ("k_norm", 0, whole, 0, whole),
            "mlp.gate_proj.weight": ("gate_up_weight", 0, slice(0, inter), 0, i_src),
            "mlp.up_proj.weight": ("gate_up_weight", 0, slice(inter, 2 * inter), 0, i_src),
            "mlp.down_proj.weight": ("down_weight", 1, whole, 1, i_src),
        }
        if leaf not in table:
            raise ModelFormatError(f"unexpected tensor {name!r} in a {c.arch} checkpoint")
        pname, *rest = table[leaf]
        return [(pre + pname, *rest)]  # type: ignore[list-item]

    def _lm_head_target(self) -> list[tuple[str, int, slice, int, slice]]:
        tp, vocab = self.tp, self.config.vocab_size
        lo = min(tp.rank * tp.vocab_local, vocab)
        hi = min(lo + tp.vocab_local, vocab)
        return [("lm_head", 0, slice(0, hi - lo), 0, slice(lo, hi))]

    def _materialize(self, path: str) -> torch.Tensor:
        owner_path, _, pname = path.rpartition(".")
        owner = self.get_submodule(owner_path) if owner_path else self
        param = owner._parameters[pname]
        assert param is not None
        if param.is_meta:
            # Zeros, not empty: the padded rows of a vocab-parallel lm_head are never written.
            param = nn.Parameter(torch.zeros(param.shape, dtype=self.dtype, device=self.device),
                                 requires_grad=False)
            owner._parameters[pname] = param
        return param.data

    def load_weights(self, tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy HF-named full tensors into this rank's (sharded, fused) parameters. Raises
        WeightShapeError on a shape the config does not imply, ModelFormatError on a tensor
        that is missing or unknown."""
        expected = hf_tensor_shapes(self.config)
        seen: set[str] = set()
        for name, tensor in tensors:
            if name not in expected:
                if name == "lm_head.weight" and self.config.tie_word_embeddings:
                    continue  # some tied checkpoints store the head anyway
                raise ModelFormatError(
                    f"tensor {name!r} is not part of a {self.config.arch} model with this "
                    f"config (qkv_bias={self.config.qkv_bias}, qk_norm={self.config.qk_norm}); "
                    f"does config.json match the weights?")
            if tuple(tensor.shape) != expected[name]:
                raise WeightShapeError(
                    f"tensor {name!r} has shape {tuple(tensor.shape)} but the model config "
                    f"implies {expected[name]}; does config.json match the weights?")
            for path, ddim, dsl, sdim, ssl in self._target(name, expected[name]):
                dest = self._materialize(path)
                src = tensor.narrow(sdim, ssl.start or 0,
                                    (ssl.stop or tensor.shape[sdim]) - (ssl.start or 0)) \
                    if ssl != slice(None) else tensor
                view = dest if dsl == slice(None) else dest.narrow(
                    ddim, dsl.start, dsl.stop - dsl.start)
                view.copy_(src)
            seen.add(name)
        missing = sorted(set(expected) - seen)
        if missing:
            more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
            raise ModelFormatError(f"the checkpoint lacks {len(missing)} tensor(s): "
                                   f"{', '.join(missing[:5])}{more}")
        if self.config.tie_word_embeddings and self.tp.size == 1:
            self._parameters["lm_head"] = self._parameters["embed"]
        still_meta = [n for n, p in self.named_parameters() if p.is_meta]
        if still_meta:
            raise ModelFormatError(f"parameters never loaded: {', '.join(still_meta[:5])}")
        from tessera.hal.rope import cos_sin_cache

        c = self.config
        self.cos_sin = cos_sin_cache(c.head_dim, self.max_positions, c.rope_theta,
                                     c.rope_scaling, self.device, self.dtype)

    # -- forward ----------------------------------------------------------------------------

    def forward(self, inp: ForwardInputs, kv: KVArena) -> torch.Tensor:
        """float32 logits [S, vocab] for the tokens at inp.logits_indices."""
        op, eps = self.ops, self.config.rms_norm_eps
        h = op["embedding"](inp.input_ids, self.embed)
        residual: torch.Tensor | None = None
        for i, module in enumerate(self.layers):
            layer: LlamaLayer = module  # type: ignore[assignment]
            if residual is None:
                residual = h
                h = op["rms_norm"](h, layer.input_norm, eps)
            else:
                h, residual = op["fused_add_rms_norm"](h, residual, layer.input_norm, eps)
            h = self._attention(layer, h, inp, kv.k[i], kv.v[i])
            h, residual = op["fused_add_rms_norm"](h, residual, layer.post_norm, eps)
            h = self._mlp(layer, h)
        assert residual is not None
        # Only the sampled positions need the final norm and the (large) vocabulary matmul.
        idx = inp.logits_indices
        h, _ = op["fused_add_rms_norm"](h.index_select(0, idx), residual.index_select(0, idx),
                                        self.final_norm, eps)
        logits = op["linear"](h, self.lm_head, None)
        if self.tp.size > 1:
            assert self.communicator is not None
            logits = self.communicator.all_gather(logits, dim=-1)[:, : self.config.vocab_size]
        return logits.float()

    def _attention(self, layer: LlamaLayer, h: torch.Tensor, inp: ForwardInputs,
                   k_cache: torch.Tensor, v_cache: torch.Tensor) -> torch.Tensor:
        op, eps, d = self.ops, self.config.rms_norm_eps, self.config.head_dim
        hq, hk, t = self.tp.num_heads, self.tp.num_kv_heads, h.shape[0]
        qkv = op["linear"](h, layer.qkv_weight, layer.qkv_bias)
        q, k, v = qkv.split([hq * d, hk * d, hk * d], dim=-1)
        q, k, v = q.reshape(t, hq, d), k.reshape(t, hk, d), v.reshape(t, hk, d)
        if layer.q_norm is not None:
            q = op["rms_norm"](q.reshape(t * hq, d), layer.q_norm, eps).view(t, hq, d)
            k = op["rms_norm"](k.reshape(t * hk, d), layer.k_norm, eps).view(t, hk, d)
        q, k = op["rotary_embedding"](inp.positions, q, k, self.cos_sin)
        op["store_kv"](k_cache, v_cache, k, v, inp.out_slots)
        if inp.is_decode:
            o = op["attention_decode"](q, k_cache, v_cache, inp.req_to_token, inp.seq_lens,
                                       self.scale)
        else:
            o = op["attention_extend"](q, k_cache, v_cache, inp.req_to_token, inp.seq_lens,
                                       inp.extend_lens, inp.qo_indptr, self.scale,
                                       max_extend_len=inp.max_extend_len)
        out = op["linear"](o.reshape(t, hq * d), layer.o_weight, None)
        return self._reduce(out)

    def _mlp(self, layer: LlamaLayer, h: torch.Tensor) -> torch.Tensor:
        op = self.ops
        act = op["silu_and_mul"](op["linear"](h, layer.gate_up_weight, None))
        return self._reduce(op["linear"](act, layer.down_weight, None))

    def _reduce(self, x: torch.Tensor) -> torch.Tensor:
        if self.tp.size > 1:
            assert self.communicator is not None
            return self.communicator.all_reduce(x)
        return x
