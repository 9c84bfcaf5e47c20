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
                     scale: float) -> torch.Tensor:
    out = torch.empty_like(q)
    seq_list = seq_lens.tolist()
    ext_list = extend_lens.tolist()
    starts = qo_indptr.tolist()
    for b, (seq_len, ext_len) in enumerate(zip(seq_list, ext_list, strict=True)):
        if ext_len == 0:
            continue
        start = starts[b]
        slots = req_to_token[b, :seq_len].long()
        k = k_cache[slots].float()  # [S, Hk, D]
        v = v_cache[slots].float()
        prefix = seq_len - ext_len
        # query i sits at position prefix + i and sees keys 0 .. prefix + i
        rows = torch.arange(ext_len, device=q.device)[:, None] + prefix
        mask = torch.arange(seq_len, device=q.device)[None, :] <= rows  # [E, S]
        qb = q[start:start + ext_len].float()
        out[start:start + ext_len] = _sdpa(qb, k, v, mask, scale).to(q.dtype)
    return out


def attention_decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                     req_to_token: torch.Tensor, seq_lens: torch.Tensor,
                     scale: float) -> torch.Tensor:
    batch = q.shape[0]
    if batch == 0:
        return torch.empty_like(q)
    max_len = max(int(seq_lens.max()), 1)
    # Slots past a row's length may hold anything; clamp so the gather stays in bounds, the
    # mask hides them.
    slots = req_to_token[:, :max_len].long().clamp(0, k_cache.shape[0] - 1)
    k = k_cache[slots].float()  # [B, L, Hk, D]
    v = v_cache[slots].float()
    valid = torch.arange(max_len, device=q.device)[None, :] < seq_lens[:, None].long()  # [B, L]
    hq, hk = q.shape[1], k.shape[2]
    # [B, H, 1, D] queries against [B, H, L, D] keys; the mask broadcasts over heads.
    qh = q.float().unsqueeze(2)
    kh = k.permute(0, 2, 1, 3).repeat_interleave(hq // hk, dim=1)
    vh = v.permute(0, 2, 1, 3).repeat_interleave(hq // hk, dim=1)
    out = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=valid[:, None, None, :],
                                         scale=scale)
    out = out.squeeze(2)
    # A row of length 0 (padding) attends to nothing: define its output as zeros, not NaN.
    out = torch.where((seq_lens > 0)[:, None, None], out, torch.zeros_like(out))
    return out.to(q.dtype)


def _sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor,
          scale: float) -> torch.Tensor:
    """q [E, Hq, D], k/v [S, Hk, D], mask [E, S] -> [E, Hq, D], GQA by repeating KV heads."""
    hq, hk = q.shape[1], k.shape[1]
    qh = q.transpose(0, 1)  # [Hq, E, D]
    kh = k.transpose(0, 1).repeat_interleave(hq // hk, dim=0)  # [Hq, S, D]
    vh = v.transpose(0, 1).repeat_interleave(hq // hk, dim=0)
    out = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask[None], scale=scale)
    return out.transpose(0, 1)
