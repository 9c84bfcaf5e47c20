"""Reference `apply_token_mask` (semantics: hal/ops.py): unpack the 32 bits of every mask word
and send the forbidden tokens' logits to -inf, for the named rows only."""

from __future__ import annotations

import torch


def unpack_bitmask(bitmask: torch.Tensor, vocab: int) -> torch.Tensor:
    """bool [G, vocab]: True where the token is allowed (bit v % 32 of word v // 32)."""
    shifts = torch.arange(32, dtype=torch.int32, device=bitmask.device)
    bits = (bitmask.to(torch.int32)[:, :, None] >> shifts) & 1  # arithmetic shift: & 1 is exact
    allowed = bits.reshape(bitmask.shape[0], -1).bool()
    if allowed.shape[1] >= vocab:
        return allowed[:, :vocab]
    pad = torch.zeros((bitmask.shape[0], vocab - allowed.shape[1]), dtype=torch.bool,
                      device=bitmask.device)
    return torch.cat([allowed, pad], dim=1)


def apply_token_mask(logits: torch.Tensor, bitmask: torch.Tensor, rows: torch.Tensor) -> None:
    if rows.numel() == 0:
        return
    rows = rows.to(device=logits.device, dtype=torch.int64)
    allowed = unpack_bitmask(bitmask.to(logits.device), logits.shape[1])
    logits[rows] = torch.where(allowed, logits[rows],
                               torch.tensor(float("-inf"), dtype=logits.dtype,
                                            device=logits.device))
