"""A plugin's op table as torch.library custom ops: `torch.ops.tessera_<plugin>.<op>`.

Opt-in, for code that traces or compiles a model (torch.compile, FakeTensor / meta-device
shape propagation, torch.export): each op becomes one opaque graph node with its fake
(shape-only) implementation taken from the contract in hal/ops.py, written once here for every
plugin. Eager calls through the dispatcher cost some tens of microseconds more than calling
`platform.op(name)` directly, so the eager worker keeps using the plain table.

    ops = library_ops(platform)          # registers once per process and plugin
    out = ops["rms_norm"](x, w, 1e-6)    # == torch.ops.tessera_cpu.rms_norm(x, w, 1e-6)

`sample` takes the SamplingTensors fields flattened (a dataclass is no schema type); the
returned callable accepts a SamplingTensors as the table's op does.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor
from torch.library import custom_op

from tessera.hal.ops import SamplingTensors
from tessera.hal.platform import Platform

_REGISTERED: dict[str, dict[str, Callable[..., Any]]] = {}


def namespace(platform: Platform) -> str:
    return "tessera_" + re.sub(r"\W", "_", platform.name)


def library_ops(platform: Platform) -> dict[str, Callable[..., Any]]:
    """op name -> the torch.ops callable for this plugin (registered on first use)."""
    ns = namespace(platform)
    if ns not in _REGISTERED:
        _REGISTERED[ns] = _register(ns, platform.op)
    return _REGISTERED[ns]


def _fresh(out: Tensor, *inputs: Tensor | None) -> Tensor:
    """A custom op's output may not alias an input; copy in the rare case an impl returns one."""
    ptr = out.untyped_storage().data_ptr()
    if out.numel() and any(i is not None and i.numel() and
                           i.untyped_storage().data_ptr() == ptr for i in inputs):
        return out.clone()
    return out


def _register(ns: str, op: Callable[[str], Callable[..., Any]]) -> dict[str, Callable[..., Any]]:
    # Each function's annotations are its schema; its body defers to the plugin's table.
    @custom_op(f"{ns}::embedding", mutates_args=())
    def embedding(ids: Tensor, weight: Tensor) -> Tensor:
        return _fresh(op("embedding")(ids, weight), weight)

    @embedding.register_fake
    def _(ids: Tensor, weight: Tensor) -> Tensor:
        return weight.new_empty((ids.shape[0], weight.shape[1]))

    @custom_op(f"{ns}::rms_norm", mutates_args=())
    def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
        return _fresh(op("rms_norm")(x, weight, eps), x)

    @rms_norm.register_fake
    def _(x: Tensor, weight: Tensor, eps: float) -> Tensor:
        return torch.empty_like(x)

    @custom_op(f"{ns}::fused_add_rms_norm", mutates_args=())
    def fused_add_rms_norm(x: Tensor, residual: Tensor, weight: Tensor,
                           eps: float) -> tuple[Tensor, Tensor]:
        out, res = op("fused_add_rms_norm")(x, residual, weight, eps)
        return _fresh(out, x, residual), _fresh(res, x, residual)

    @fused_add_rms_norm.register_fake
    def _(x: Tensor, residual: Tensor, weight: Tensor, eps: float) -> tuple[Tensor, Tensor]:
        return torch.empty_like(x), torch.empty_like(x)

    @custom_op(f"{ns}::rotary_embedding", mutates_args=())
    def rotary_embedding(positions: Tensor, q: Tensor, k: Tensor,
                         cos_sin: Tensor) -> tuple[Tensor, Tensor]:
        q_out, k_out = op("rotary_embedding")(positions, q, k, cos_sin)
        return _fresh(q_out, q, k), _fresh(k_out, q, k)

    @rotary_embedding.register_fake
    def _(positions: Tensor, q: Tensor, k: Tensor, cos_sin: Tensor) -> tuple[Tensor, Tensor]:
        return torch.empty_like(q), torch.empty_like(k)

    @custom_op(f"{ns}::silu_and_mul", mutates_args=())
    def silu_and_mul(x: Tensor) -> Tensor:
        return _fresh(op("silu_and_mul")(x), x)

    @silu_and_mul.register_fake
    def _(x: Tensor) -> Tensor:
        return x.new_empty((*x.shape[:-1], x.shape[-1] // 2))

    @custom_op(f"{ns}::gelu_tanh_and_mul", mutates_args=())
    def gelu_tanh_and_mul(x: Tensor) -> Tensor:
        return _fresh(op("gelu_tanh_and_mul")(x), x)

    @gelu_tanh_and_mul.register_fake
    def _(x: Tensor) -> Tensor:
        return x.new_empty((*x.shape[:-1], x.shape[-1] // 2))

    @custom_op(f"{ns}::fused_moe", mutates_args=())
    def fused_moe(x: Tensor, w13: Tensor, w2: Tensor, topk_weights: Tensor, topk_ids: Tensor,
                  activation: str = "silu") -> Tensor:
        return _fresh(op("fused_moe")(x, w13, w2, topk_weights, topk_ids, activation=activation),
                      x)

    @fused_moe.register_fake
    def _(x: Tensor, w13: Tensor, w2: Tensor, topk_weights: Tensor, topk_ids: Tensor,
          activation: str = "silu") -> Tensor:
        return torch.empty_like(x)

    @custom_op(f"{ns}::linear", mutates_args=())
    def linear(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
        return _fresh(op("linear")(x, weight, bias), x, weight, bias)

    @linear.register_fake
    def _(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
        return x.new_empty((*x.shape[:-1], weight.shape[0]))

    @custom_op(f"{ns}::store_kv", mutates_args=("k_cache", "v_cache"))
    def store_kv(k_cache: Tensor, v_cache: Tensor, k: Tensor, v: Tensor, slots: Tensor) -> None:
        op("store_kv")(k_cache, v_cache, k, v, slots)

    @store_kv.register_fake
    def _(k_cache: Tensor, v_cache: Tensor, k: Tensor, v: Tensor, slots: Tensor) -> None:
        return None

    @custom_op(f"{ns}::attention_extend", mutates_args=())
    def attention_extend(q: Tensor, k_cache: Tensor, v_cache: Tensor, req_to_token: Tensor,
                         seq_lens: Tensor, extend_lens: Tensor, qo_indptr: Tensor,
                         scale: float) -> Tensor:
        return _fresh(op("attention_extend")(q, k_cache, v_cache, req_to_token, seq_lens,
                                             extend_lens, qo_indptr, scale), q)

    @attention_extend.register_fake
    def _(q: Tensor, k_cache: Tensor, v_cache: Tensor, req_to_token: Tensor, seq_lens: Tensor,
          extend_lens: Tensor, qo_indptr: Tensor, scale: float) -> Tensor:
        return torch.empty_like(q)

    @custom_op(f"{ns}::attention_decode", mutates_args=())
    def attention_decode(q: Tensor, k_cache: Tensor, v_cache: Tensor, req_to_token: Tensor,
                         seq_lens: Tensor, scale: float) -> Tensor:
        return _fresh(op("attention_decode")(q, k_cache, v_cache, req_to_token, seq_lens,
                                             scale), q)

    @attention_decode.register_fake
    def _(q: Tensor, k_cache: Tensor, v_cache: Tensor, req_to_token: Tensor, seq_lens: Tensor,
          scale: float) -> Tensor:
        return torch.empty_like(q)

    @custom_op(f"{ns}::sample", mutates_args=())
    def sample(logits: Tensor, temperature: Tensor, top_p: Tensor, top_k: Tensor, min_p: Tensor,
               seeds: Tensor, offsets: Tensor, all_greedy: bool) -> Tensor:
        params = SamplingTensors(temperature, top_p, top_k, min_p, seeds, offsets, all_greedy)
        return _fresh(op("sample")(logits, params), logits)

    @sample.register_fake
    def _(logits: Tensor, temperature: Tensor, top_p: Tensor, top_k: Tensor, min_p: Tensor,
          seeds: Tensor, offsets: Tensor, all_greedy: bool) -> Tensor:
        return logits.new_empty((logits.shape[0],), dtype=torch.int64)

    @custom_op(f"{ns}::apply_token_mask", mutates_args=("logits",))
    def apply_token_mask(logits: Tensor, bitmask: Tensor, rows: Tensor) -> None:
        op("apply_token_mask")(logits, bitmask, rows)

    @apply_token_mask.register_fake
    def _(logits: Tensor, bitmask: Tensor, rows: Tensor) -> None:
        return None

    def sample_with_params(logits: Tensor, params: SamplingTensors) -> Tensor:
        return sample(logits, params.temperature, params.top_p, params.top_k, params.min_p,
                      params.seeds, params.offsets, params.all_greedy)

    return {
        "embedding": embedding, "rms_norm": rms_norm, "fused_add_rms_norm": fused_add_rms_norm,
        "rotary_embedding": rotary_embedding, "silu_and_mul": silu_and_mul, "linear": linear,
        "store_kv": store_kv, "attention_extend": attention_extend,
        "attention_decode": attention_decode, "sample": sample_with_params,
        "apply_token_mask": apply_token_mask, "gelu_tanh_and_mul": gelu_tanh_and_mul,
        "fused_moe": fused_moe,
    }
