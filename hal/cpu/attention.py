"""Reference attention over the paged KV cache (semantics: hal/ops.py).

Written for clarity first, but the cpu worker serves real models with it, so decode is
vectorised across the batch: each row's KV is gathered through `req_to_token` up to the
longest sequence and the tail is masked. Extend loops over requests (prefill is rarer and its
per-request cost is dominated by the matmuls anyway). Math runs in float32.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def attention_extend(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                     req_to_token: torch.Tensor, seq_lens: torch.Tensor,
                     extend_lens: torch.Tensor, qo_indptr: torch.Tensor,
                     scale: float, max_extend_len: int | None = None, *, k_scale: float = 1.0,
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
        k = _read(k_cache, slots, k_scale)  # [S, Hk, D]
        v = _read(v_cache, slots, v_scale)
        prefix = seq_len - ext_len
        qb = q[start:start + ext_len].float()
        out[start:start + ext_len] = _causal_sdpa(qb, k, v, prefix, scale).to(q.dtype)
    return out


def attention_decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                     req_to_token: torch.Tensor, seq_lens: torch.Tensor,
                     scale: float, *, k_scale: float = 1.0, v_scale: float = 1.0
                     ) -> torch.Tensor:
    batch = q.shape[0]
    if batch == 0:
        return torch.empty_like(q)
    max_len = max(int(seq_lens.max()), 1)
    # Slots past a row's length may hold anything; clamp so the gather stays in bounds, the
    # mask hides them.
    slots = req_to_token[:, :max_len].long().clamp(0, k_cache.shape[0] - 1)
    k = _read(k_cache, slots, k_scale)  # [B, L, Hk, D]
    v = _read(v_cache, slots, v_scale)
    valid = torch.arange(max_len, device=q.device)[None, :] < seq_lens[:, None].long()  # [B, L]
    hq, hk, dim = q.shape[1], k.shape[2], q.shape[2]
    # GQA without copying KV: query head h uses KV head h // group, so viewing the queries as
    # [B, Hk, group, D] lines each KV head up with its group, which SDPA treats as the query
    # length. The mask [B, 1, 1, L] broadcasts over heads and group.
    qg = q.float().view(batch, hk, hq // hk, dim)
    out = F.scaled_dot_product_attention(qg, k.permute(0, 2, 1, 3), v.permute(0, 2, 1, 3),
                                         attn_mask=valid[:, None, None, :], scale=scale)
    out = out.reshape(batch, hq, dim)
    # A row of length 0 (padding) attends to nothing: define its output as zeros, not NaN.
    out = torch.where((seq_lens > 0)[:, None, None], out, torch.zeros_like(out))
    return out.to(q.dtype)


def _read(cache: torch.Tensor, slots: torch.Tensor, scale: float) -> torch.Tensor:
    """The cached values at `slots` in float32: what the cache holds times its scale (an fp8
    cache stores k / k_scale)."""
    values = cache[slots].float()
    return values if scale == 1.0 else values * scale


def _causal_sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, prefix: int,
                 scale: float) -> torch.Tensor:
    """q [E, Hq, D] at positions prefix .. prefix + E - 1 over k/v [S, Hk, D] -> [E, Hq, D].

    4-D inputs with enable_gqa reach PyTorch's fused CPU kernel (3-D ones fall back to the
    unfused math path, several times slower); without a prefix the plain causal flag applies.
    """
    ext, seq = q.shape[0], k.shape[0]
    qh, kh, vh = (t.transpose(0, 1)[None] for t in (q, k, v))  # [1, H, len, D]
    if prefix == 0:
        out = F.scaled_dot_product_attention(qh, kh, vh, is_causal=True, scale=scale,
                                             enable_gqa=True)
    else:
        # query i sits at position prefix + i and sees keys 0 .. prefix + i
        rows = torch.arange(ext, device=q.device)[:, None] + prefix
        mask = torch.arange(seq, device=q.device)[None, :] <= rows  # [E, S]
        out = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask[None, None],
                                             scale=scale, enable_gqa=True)
    return out[0].transpose(0, 1)
