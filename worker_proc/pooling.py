"""Embeddings: pooled final hidden states of the chunks ForwardBatch.embed names.

EMBED_LAST gives the chunk's last token's final hidden state (the prompt's, in its last
chunk); EMBED_MEAN the sum over the chunk's tokens (the scheduler adds the chunks up and
divides by the prompt's length). Float32, not normalized (the server normalizes).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from tessera.bus.messages import ForwardBatch
from tessera.hal.platform import Platform
from tessera.worker_proc.forward_inputs import to_device


def wants_pooling(batch: ForwardBatch) -> bool:
    return bool(batch.embed.shape[0]) and bool((np.asarray(batch.embed) > 0).any())


def pool_hidden(model: Any, h: torch.Tensor, residual: torch.Tensor | None,
                batch: ForwardBatch, platform: Platform, device: torch.device) -> torch.Tensor:
    """float32 [E, hidden]: one row per request with embed > 0, in batch order."""
    modes = np.asarray(batch.embed)
    extend = np.asarray(batch.extend_lens, dtype=np.int64)
    ends = np.cumsum(extend)
    starts = ends - extend
    chosen = np.flatnonzero(modes > 0)
    last = modes[chosen] == ForwardBatch.EMBED_LAST
    first = np.where(last, ends[chosen] - 1, starts[chosen])  # positions pooled per request
    count = np.where(last, 1, extend[chosen])
    segment = np.repeat(np.arange(chosen.shape[0]), count)
    within = np.arange(int(count.sum())) - np.repeat(np.cumsum(count) - count, count)
    positions = first[segment] + within
    normed = model.normed(h, residual, to_device(platform, positions, torch.int64, device)).float()
    out = torch.zeros((chosen.shape[0], normed.shape[1]), dtype=torch.float32, device=device)
    out.index_add_(0, to_device(platform, segment, torch.int64, device), normed)
    return out
