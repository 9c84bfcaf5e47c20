"""Prompt logprobs (scoring a prompt: OpenAI's echo + logprobs): for each position the
scheduler names in ForwardBatch.prompt_targets, the logprob of the prompt token that follows
it, from the raw logits, with the top-N alternatives.

The positions' logits are computed with the step's sampled rows (the LM head runs on both:
`with_score_rows`), then split off before sampling; their copies to the host are queued
before the step's sampled tokens', so the step's one event covers them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from tessera.bus.messages import ForwardBatch
from tessera.hal.platform import Platform
from tessera.worker_proc.forward_inputs import ForwardInputs, to_device


@dataclass
class PromptScores:
    logprobs: torch.Tensor  # float32 [P]
    top_values: torch.Tensor | None = None  # float32 [P, N]
    top_ids: torch.Tensor | None = None  # int32 [P, N]
    embeddings: torch.Tensor | None = None  # float32 [E, hidden] (worker_proc/pooling.py)
    _host: list[torch.Tensor | None] | None = None

    def start_copy(self, platform: Platform) -> None:
        """Queue the copies to the host (the step's event, recorded after, covers them)."""
        self._host = [None if t is None else platform.device_to_host(t)
                      for t in (self.logprobs, self.top_values, self.top_ids, self.embeddings)]

    def fetch(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(logprobs [P], top ids [P, N], top logprobs [P, N]); call after the step's event."""
        assert self._host is not None, "start_copy first"
        lps, values, ids, _ = self._host
        assert lps is not None
        if values is None or ids is None:
            p = lps.shape[0]
            return (lps.numpy(), np.zeros((p, 0), np.int32), np.zeros((p, 0), np.float32))
        return lps.numpy(), ids.numpy(), values.numpy()

    def fetch_embeddings(self) -> np.ndarray:
        assert self._host is not None, "start_copy first"
        assert self._host[3] is not None
        return self._host[3].numpy()


@dataclass
class ScoreRows:
    """Which rows of the step's logits are prompt positions, and their targets."""

    first: int  # logits rows [first:] are the positions'
    targets: torch.Tensor  # int64 [P] on the device
    top_n: int


def with_score_rows(batch: ForwardBatch, inputs: ForwardInputs, platform: Platform,
                    device: torch.device) -> ScoreRows | None:
    """Add the scored positions to the rows the LM head computes (after the sampled ones)."""
    targets = np.asarray(batch.prompt_targets)
    if not targets.shape[0]:
        return None
    positions = np.flatnonzero(targets >= 0)
    if not positions.shape[0]:
        return None
    first = int(inputs.logits_indices.shape[0])
    inputs.logits_indices = torch.cat([inputs.logits_indices,
                                       to_device(platform, positions, torch.int64, device)])
    inputs.is_decode = False  # decode graphs compute only the sampled rows' logits
    top_n = int(np.asarray(batch.prompt_top_n).max()) if batch.prompt_top_n.shape[0] else 0
    return ScoreRows(first, to_device(platform, targets[positions], torch.int64, device),
                     max(top_n, 0))


def score(logits: torch.Tensor, rows: ScoreRows) -> PromptScores:
    """The prompt positions' logprobs from their raw logits (float32 [P, V])."""
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    out = PromptScores(logprobs.gather(1, rows.targets[:, None])[:, 0])
    if rows.top_n > 0:
        top = logprobs.topk(rows.top_n, dim=-1)
        out.top_values, out.top_ids = top.values, top.indices.to(torch.int32)
    return out
