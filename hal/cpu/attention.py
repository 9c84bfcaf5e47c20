"""Reference attention over the paged KV cache (semantics: hal/ops.py).

Written for clarity: it is the oracle the conformance suite holds every plugin to (the cpu
plugin serves with batched_attention.py, checked against this). Decode gathers each row's KV
through `req_to_token` up to the longest sequence and masks the tail; extend goes request by
request. Math runs in float32.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def attention_extend(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                     req_to_token: torch.Tensor, seq_lens: torch.Tensor,
                     extend_lens: torch.Tensor, qo_indptr: torch.Tensor,
                     scale: float, max_extend_len: int | None = None, *,
                     sliding_window: int = 0, logit_cap: float = 0.0, k_scale: float = 1.0,
                     v_scale: float = 1.0) -> torch.Tensor:
    del max_extend_len  # the reference reads the lengths on the host anyway
    out = torch.empty_like(q)
    seq_list = seq_lens.tolist()
    ext_list = extend_lens.tolist()
    starts = qo_indptr.tolist()
    out[starts[-1] if starts else 0:] = 0  # padding rows after the last request
    for b, (seq_len, ext_len) in enumerate(zip(seq_list, ext_list, strict=True)):
        if ext_len == 0:
            continue
        start = starts[b]
        slots = req_to_token[b, :seq_len].long()
        k = read_cache(k_cache, slots, k_scale)  # [S, Hk, D]
        v = read_cache(v_cache, slots, v_scale)
        prefix = seq_len - ext_len
        qb = q[start:start + ext_len].float()
        out[start:start + ext_len] = causal_attention(qb, k, v, prefix, scale, sliding_window,
                                                      logit_cap).to(q.dtype)
    return out


def attention_decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                     req_to_token: torch.Tensor, seq_lens: torch.Tensor,
                     scale: float, *, sliding_window: int = 0,
                     logit_cap: float = 0.0, k_scale: float = 1.0,
                     v_scale: float = 1.0) -> torch.Tensor:
    batch = q.shape[0]
    if batch == 0:
        return torch.empty_like(q)
    max_len = max(int(seq_lens.max()), 1)
    # Slots past a row's length may hold anything; clamp so the gather stays in bounds, the
    # mask hides them.
    slots = req_to_token[:, :max_len].long().clamp(0, k_cache.shape[0] - 1)
    k = read_cache(k_cache, slots, k_scale)  # [B, L, Hk, D]
    v = read_cache(v_cache, slots, v_scale)
    pos = torch.arange(max_len, device=q.device)[None, :]
    lens = seq_lens[:, None].long()
    valid = pos < lens  # [B, L]
    if sliding_window > 0:
        valid &= pos >= lens - sliding_window  # the query sits at position len - 1
    hq, hk, dim = q.shape[1], k.shape[2], q.shape[2]
    # GQA without copying KV: query head h uses KV head h // group, so viewing the queries as
    # [B, Hk, group, D] lines each KV head up with its group, which SDPA treats as the query
    # length. The mask [B, 1, 1, L] broadcasts over heads and group.
    qg = q.float().view(batch, hk, hq // hk, dim)
    out = masked_attention(qg, k.permute(0, 2, 1, 3), v.permute(0, 2, 1, 3),
                           valid[:, None, None, :], scale, logit_cap)
    out = out.reshape(batch, hq, dim)
    # A row of length 0 (padding) attends to nothing: define its output as zeros, not NaN.
    out = torch.where((seq_lens > 0)[:, None, None], out, torch.zeros_like(out))
    return out.to(q.dtype)


def read_cache(cache: torch.Tensor, slots: torch.Tensor, scale: float) -> torch.Tensor:
    """The cached values at `slots` in float32: what the cache holds times its scale (an fp8
    cache stores k / k_scale)."""
    values = cache[slots].float()
    return values if scale == 1.0 else values * scale


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, prefix: int,
                     scale: float, sliding_window: int = 0,
                     logit_cap: float = 0.0) -> torch.Tensor:
    """q [E, Hq, D] at positions prefix .. prefix + E - 1 over k/v [S, Hk, D] -> [E, Hq, D].

    4-D inputs with enable_gqa reach PyTorch's fused CPU kernel (3-D ones fall back to the
    unfused math path, several times slower); without a prefix the plain causal flag applies.
    """
    ext, seq = q.shape[0], k.shape[0]
    qh, kh, vh = (t.transpose(0, 1)[None] for t in (q, k, v))  # [1, H, len, D]
    if prefix == 0 and sliding_window <= 0 and logit_cap <= 0:
        out = F.scaled_dot_product_attention(qh, kh, vh, is_causal=True, scale=scale,
                                             enable_gqa=True)
        return out[0].transpose(0, 1)
    # query i sits at position prefix + i and sees keys 0 .. prefix + i (the last
    # sliding_window of them with a window)
    rows = torch.arange(ext, device=q.device)[:, None] + prefix
    cols = torch.arange(seq, device=q.device)[None, :]
    mask = cols <= rows  # [E, S]
    if sliding_window > 0:
        mask &= cols > rows - sliding_window
    return masked_attention(qh, kh, vh, mask[None, None], scale, logit_cap)[0].transpose(0, 1)


def masked_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor,
               scale: float, logit_cap: float) -> torch.Tensor:
    """softmax(cap(q k^T * scale) masked) v over [B, H, len, D] inputs, GQA by head groups.
    Soft-capping (cap * tanh(s / cap), Gemma 2) needs the scores, which SDPA does not
    expose: then the scores are computed explicitly, as transformers' eager attention does."""
    if logit_cap <= 0:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale,
                                              enable_gqa=True)
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    scores = torch.matmul(q, k.transpose(-1, -2)) * scale
    scores = torch.tanh(scores / logit_cap) * logit_cap
    scores = scores.masked_fill(~mask, float("-inf"))
    return torch.matmul(torch.softmax(scores, dim=-1), v)
