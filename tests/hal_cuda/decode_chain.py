"""A Llama-3-8B decode layer of one request as the cuda plugin's ops compose it, for the PDL
test (test_kernels_gpu.py) and pdl_bench.py: fused add + norm, qkv, rotary + KV store, split
attention and merge, o, norm, gate_up, SiLU, down."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

HQ, HK, D = 32, 8, 128


def decode_layers(op: Callable[[str], Any], linear: Callable[[torch.Tensor, Any], torch.Tensor],
                  mats: list[dict[str, Any]], norm_w: torch.Tensor, table: torch.Tensor,
                  kv: Any, x: torch.Tensor, position: torch.Tensor, slot: torch.Tensor,
                  rtt: torch.Tensor, seq_len: torch.Tensor
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """(h, residual) after the layers of `mats` (each qkv, o, gate_up, down) on one token."""
    h, res = x, torch.zeros_like(x)
    for i, m in enumerate(mats):
        normed, res = op("fused_add_rms_norm")(h, res, norm_w, 1e-5)
        qkv = linear(normed, m["qkv"]).view(1, HQ + 2 * HK, D)
        q = op("rotary_store_kv")(position, qkv[:, :HQ], qkv[:, HQ:HQ + HK], qkv[:, HQ + HK:],
                                  table, kv.k[i], kv.v[i], slot)
        attn = op("attention_decode")(q, kv.k[i], kv.v[i], rtt, seq_len, D ** -0.5)
        h = linear(attn.reshape(1, HQ * D), m["o"])
        normed, res = op("fused_add_rms_norm")(h, res, norm_w, 1e-5)
        h = linear(op("silu_and_mul")(linear(normed, m["gate_up"])), m["down"])
    return h, res
