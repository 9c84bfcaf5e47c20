"""The cpu plugin's serving attention: the semantics of hal/ops.py (and the results of the
reference in attention.py, which the conformance suite holds it to), at less cost per step.

Where a CPU step's attention time goes is copying: the paged KV of every request is gathered
into a dense block per layer, padded to the longest request of the block. So:

- Decodes (one query per request) are batched in groups of similar length: rows sorted by
  length, a new group starting where a length falls below GROUP_RATIO of the group's longest,
  so that no group pads much, while a batch of similar lengths stays one group. Each group's
  KV is gathered with one `index_select` per tensor (a flat slot list; several times cheaper
  than advanced indexing with a 2-D index) and attended in one SDPA call.
- A mixed step's one-token extends take that same batched path instead of one SDPA call per
  request; only the requests extending by more than one token (prefill chunks) go one by
  one, where the matmuls of their many queries dominate anyway.
"""

from __future__ import annotations

import torch

from tessera.hal.cpu.attention import causal_attention, masked_attention

# A row whose length is below this fraction of its group's longest starts a new group. Lower
# wastes more on padding; higher makes more, smaller groups (each costs a few ops per layer).
GROUP_RATIO = 0.75


def length_groups(lens: list[int]) -> list[list[int]]:
    """Indices of the rows of length > 0, longest first, cut into groups of similar length."""
    order = sorted((b for b, n in enumerate(lens) if n > 0), key=lambda b: -lens[b])
    groups: list[list[int]] = []
    longest = 0
    for b in order:
        if not groups or lens[b] < GROUP_RATIO * longest:
            groups.append([])
            longest = lens[b]
        groups[-1].append(b)
    return groups


def gather(cache: torch.Tensor, slots: torch.Tensor, scale: float) -> torch.Tensor:
    """cache[slots] in float32 times the cache's scale (an fp8 cache holds k / k_scale)."""
    values = cache.index_select(0, slots).float()
    return values if scale == 1.0 else values.mul_(scale)


def attention_decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                     req_to_token: torch.Tensor, seq_lens: torch.Tensor,
                     scale: float, *, sliding_window: int = 0,
                     logit_cap: float = 0.0, k_scale: float = 1.0,
                     v_scale: float = 1.0) -> torch.Tensor:
    lens = seq_lens.tolist()
    groups = length_groups(lens)
    window = (sliding_window, logit_cap, k_scale, v_scale)
    if len(groups) == 1 and len(groups[0]) == q.shape[0]:  # every row, one group
        return _decode_group(q, k_cache, v_cache, req_to_token, seq_lens, lens[groups[0][0]],
                             scale, *window)
    out = torch.zeros_like(q)  # rows of length 0 (padding) attend to nothing: zeros
    for group in groups:
        rows = torch.tensor(group, dtype=torch.long, device=q.device)
        out[rows] = _decode_group(q[rows], k_cache, v_cache, req_to_token[rows],
                                  seq_lens[rows], lens[group[0]], scale, *window)
    return out


def _decode_group(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                  req_to_token: torch.Tensor, seq_lens: torch.Tensor, max_len: int,
                  scale: float, sliding_window: int = 0, logit_cap: float = 0.0,
                  k_scale: float = 1.0, v_scale: float = 1.0) -> torch.Tensor:
    """Rows of length 1..max_len: KV gathered to [B, max_len], the tail masked (and, with a
    sliding window, the head: only the last sliding_window positions of each row count)."""
    batch, hq, dim = q.shape
    hk = k_cache.shape[1]
    # Slots past a row's length may hold anything; clamp so the gather stays in bounds, the
    # mask hides them.
    slots = req_to_token[:, :max_len].reshape(-1).long().clamp_(0, k_cache.shape[0] - 1)
    k = gather(k_cache, slots, k_scale).view(batch, max_len, hk, dim)
    v = gather(v_cache, slots, v_scale).view(batch, max_len, hk, dim)
    pos = torch.arange(max_len, device=q.device)[None, :]
    valid = pos < seq_lens[:, None]  # [B, L]
    if sliding_window > 0:
        valid &= pos >= seq_lens[:, None] - sliding_window
    # GQA without copying KV: query head h uses KV head h // group, so viewing the queries as
    # [B, Hk, group, D] lines each KV head up with its group, which SDPA treats as the query
    # length. The mask [B, 1, 1, L] broadcasts over heads and group.
    qg = q.float().view(batch, hk, hq // hk, dim)
    out = masked_attention(qg, k.transpose(1, 2), v.transpose(1, 2), valid[:, None, None, :],
                           scale, logit_cap)
    return out.reshape(batch, hq, dim).to(q.dtype)


def attention_extend(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                     req_to_token: torch.Tensor, seq_lens: torch.Tensor,
                     extend_lens: torch.Tensor, qo_indptr: torch.Tensor,
                     scale: float, max_extend_len: int | None = None, *,
                     sliding_window: int = 0, logit_cap: float = 0.0, k_scale: float = 1.0,
                     v_scale: float = 1.0) -> torch.Tensor:
    del max_extend_len  # the lengths are on the host anyway
    seq_list = seq_lens.tolist()
    ext_list = extend_lens.tolist()
    starts = qo_indptr.tolist()
    out = torch.empty_like(q)
    out[starts[-1] if starts else 0:] = 0  # padding rows after the last request
    ones = [b for b, n in enumerate(ext_list) if n == 1]
    if ones:
        rows = torch.tensor(ones, dtype=torch.long, device=q.device)
        tokens = torch.tensor([starts[b] for b in ones], dtype=torch.long, device=q.device)
        out[tokens] = attention_decode(q[tokens], k_cache, v_cache, req_to_token[rows],
                                       seq_lens[rows], scale, sliding_window=sliding_window,
                                       logit_cap=logit_cap, k_scale=k_scale, v_scale=v_scale)
    for b, (seq_len, ext_len) in enumerate(zip(seq_list, ext_list, strict=True)):
        if ext_len <= 1:
            continue
        start = starts[b]
        slots = req_to_token[b, :seq_len].long()
        k = gather(k_cache, slots, k_scale)  # [S, Hk, D]
        v = gather(v_cache, slots, v_scale)
        qb = q[start:start + ext_len].float()
        out[start:start + ext_len] = causal_attention(qb, k, v, seq_len - ext_len, scale,
                                                      sliding_window, logit_cap).to(q.dtype)
    return out
