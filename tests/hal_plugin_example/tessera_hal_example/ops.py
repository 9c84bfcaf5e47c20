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


def attention_extend(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                     req_to_token: torch.Tensor, seq_lens: torch.Tensor,
                     extend_lens: torch.Tensor, qo_indptr: torch.Tensor, scale: float,
                     max_extend_len: int | None = None, *, sliding_window: int = 0,
                     logit_cap: float = 0.0) -> torch.Tensor:
    """Each query token attends over every column of its request's page-table row, masked to
    the positions it may see: no device value is read on the host, so a step can be captured
    (the worker captures prefill and mixed steps too). O(T x L) memory: an example, not a
    kernel."""
    del max_extend_len  # the launch depends on the shapes only
    tokens, width = q.shape[0], req_to_token.shape[1]
    batch = seq_lens.shape[0]
    hq, dim = q.shape[1], q.shape[2]
    hk = k_cache.shape[1]
    if tokens == 0 or batch == 0:
        return torch.zeros_like(q)
    t = torch.arange(tokens, device=q.device)
    owner = torch.searchsorted(qo_indptr[1:].long(), t, right=True)  # == batch: padding
    real = owner < batch
    req = owner.clamp(max=batch - 1)
    seq = seq_lens.long()[req]
    position = seq - extend_lens.long()[req] + (t - qo_indptr.long()[req])
    slots = req_to_token[req].long().clamp(0, k_cache.shape[0] - 1)  # [T, L]
    k = k_cache[slots].float()  # [T, L, Hk, D]
    v = v_cache[slots].float()
    qg = q.float().view(tokens, hk, hq // hk, dim)  # query head h reads KV head h // group
    scores = _cap(torch.einsum("thgd,tlhd->thgl", qg, k) * scale, logit_cap)
    column = torch.arange(width, device=q.device)[None, :]
    visible = (column <= position[:, None]) & (column < seq[:, None]) & real[:, None]
    if sliding_window > 0:
        visible &= column > position[:, None] - sliding_window
    scores = scores.masked_fill(~visible[:, None, None, :], float("-inf"))
    out = torch.einsum("thgl,tlhd->thgd", torch.softmax(scores, dim=-1), v)
    out = out.reshape(tokens, hq, dim)
    # Padding tokens see nothing: zeros, not the NaN of an empty softmax.
    return torch.where(visible.any(dim=1)[:, None, None], out, 0.0).to(q.dtype)


def attention_decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                     req_to_token: torch.Tensor, seq_lens: torch.Tensor, scale: float, *,
                     sliding_window: int = 0, logit_cap: float = 0.0) -> torch.Tensor:
    """Every column of the page-table rows, masked past each row's length: no device value is
    read on the host, so a decode step can be captured."""
    batch, width = req_to_token.shape
    hq, dim = q.shape[1], q.shape[2]
    hk = k_cache.shape[1]
    slots = req_to_token.long().clamp(0, k_cache.shape[0] - 1)
    k = k_cache[slots].float()  # [B, W, Hk, D]
    v = v_cache[slots].float()
    qg = q.float().view(batch, hk, hq // hk, dim)  # query head h reads KV head h // group
    scores = _cap(torch.einsum("bhgd,bwhd->bhgw", qg, k) * scale, logit_cap)
    column = torch.arange(width, device=q.device)[None, :]
    valid = column < seq_lens[:, None].long()
    if sliding_window > 0:  # the query sits at position seq_len - 1
        valid &= column >= seq_lens[:, None].long() - sliding_window
    scores = scores.masked_fill(~valid[:, None, None, :], float("-inf"))
    out = torch.einsum("bhgw,bwhd->bhgd", torch.softmax(scores, dim=-1), v)
    out = out.reshape(batch, hq, dim)
    # A row of length 0 (padding) attends to nothing: zeros, not the NaN of an empty softmax.
    return torch.where((seq_lens > 0)[:, None, None], out, 0.0).to(q.dtype)


def _cap(scores: torch.Tensor, logit_cap: float) -> torch.Tensor:
    """Soft-capped scores (Gemma 2): logit_cap * tanh(s / logit_cap); 0 leaves them."""
    return scores if logit_cap <= 0 else torch.tanh(scores / logit_cap) * logit_cap
