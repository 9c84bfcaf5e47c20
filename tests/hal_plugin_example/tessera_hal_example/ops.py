"""This plugin's own kernels: written independently of the reference, so that the
conformance suite has something real to judge."""

from __future__ import annotations

import torch


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return torch.nn.functional.rms_norm(x.float(), (x.shape[-1],), weight.float(), eps
                                        ).to(x.dtype)


def fused_add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                       eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    residual_out = torch.add(x, residual)
    return rms_norm(residual_out, weight, eps), residual_out


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    gate, up = x.float().chunk(2, dim=-1)
    return (gate * torch.sigmoid(gate) * up).to(x.dtype)


def store_kv(k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
             slots: torch.Tensor) -> None:
    k_cache[slots.long()] = k
    v_cache[slots.long()] = v


def attention_decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                     req_to_token: torch.Tensor, seq_lens: torch.Tensor,
                     scale: float) -> torch.Tensor:
    """Every column of the page-table rows, masked past each row's length: no device value is
    read on the host, so a decode step can be captured."""
    batch, width = req_to_token.shape
    hq, dim = q.shape[1], q.shape[2]
    hk = k_cache.shape[1]
    slots = req_to_token.long().clamp(0, k_cache.shape[0] - 1)
    k = k_cache[slots].float()  # [B, W, Hk, D]
    v = v_cache[slots].float()
    qg = q.float().view(batch, hk, hq // hk, dim)  # query head h reads KV head h // group
    scores = torch.einsum("bhgd,bwhd->bhgw", qg, k) * scale
    valid = torch.arange(width, device=q.device)[None, :] < seq_lens[:, None].long()
    scores = scores.masked_fill(~valid[:, None, None, :], float("-inf"))
    out = torch.einsum("bhgw,bwhd->bhgd", torch.softmax(scores, dim=-1), v)
    out = out.reshape(batch, hq, dim)
    # A row of length 0 (padding) attends to nothing: zeros, not the NaN of an empty softmax.
    return torch.where((seq_lens > 0)[:, None, None], out, 0.0).to(q.dtype)
