"""Speculative decoding, the worker's part: verify proposed tokens in the step's one forward.

A request verifying d proposals (ForwardBatch.draft_lens) has its input token and the d
proposals in the step; the forward computes logits after each of them (forward_inputs puts
d + 1 rows in logits_indices) and the sampler draws one token from each row, exactly as a
plain step would draw at that output position (the same filters; a seeded row the draw of
that position). The request keeps the proposals up to the first that differs from the draw
before it, and the draw after the last one kept:

    draws x_0 .. x_d, proposals p_1 .. p_d: accepted a = the largest a with x_j == p_(j+1)
    for every j < a; tokens kept: p_1 .. p_a, x_a (= x_0 .. x_a)

Greedy, this is the longest prefix of the proposals the model would have generated itself.
Sampling, it is the standard rejection rule for a proposal that is certain (a proposer's
distribution q with all its mass on p): accept p with probability min(1, P(p) / q(p)) = P(p),
else draw from the residual max(0, P - q) normalised, which is P without p; a draw x from P
does both at once (x == p with probability P(p); otherwise x is distributed as P without p).
So the output keeps the target model's distribution, whatever the proposer proposes. Both
proposers here propose with certainty (n-gram lookup, the draft model's argmax).

Everything runs on the device; the host gets the draws and the accepted counts with the
step's other copies, and keeps each request's draws 0 .. a (`VerifiedSample.fetch`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from tessera.bus.messages import ForwardBatch
from tessera.hal.platform import Platform
from tessera.worker_proc.forward_inputs import to_device
from tessera.worker_proc.sampler import DeviceSample, SampleResult


@dataclass
class VerifyPlan:
    """Where each sampling request's draws and proposals are, built on the host."""

    sel: np.ndarray  # [S'] the request (index into the batch) of each logits row
    offset_add: np.ndarray  # [S'] its position among the request's draws
    first: np.ndarray  # [S] first logits row of each sampling request
    drafts: np.ndarray  # [S] proposals each verifies
    draw_idx: torch.Tensor  # [S, D] logits row of draw j (padding: the request's first)
    proposal_idx: torch.Tensor  # [S, D] token index (in the step's input ids) of p_(j+1)
    valid: torch.Tensor  # [S, D] j < drafts
    first_dev: torch.Tensor  # [S]

    @property
    def rows(self) -> int:
        return int(self.sel.shape[0])


def plan_verify(batch: ForwardBatch, platform: Platform, device: torch.device
                ) -> VerifyPlan | None:
    """The plan of a step with proposals (None when it has none)."""
    if not batch.draft_lens.shape[0]:
        return None
    sample = np.asarray(batch.sample, dtype=bool)
    req = np.flatnonzero(sample)
    drafts = np.asarray(batch.draft_lens, dtype=np.int64)[sample]
    per = drafts + 1
    total = int(per.sum())
    first = np.cumsum(per) - per
    sel = np.repeat(req, per)
    offset_add = np.arange(total) - np.repeat(first, per)
    extend = np.asarray(batch.extend_lens, dtype=np.int64)
    ends = np.cumsum(extend)[sample]  # one past each sampling request's last token
    width = max(int(drafts.max(initial=0)), 1)
    j = np.arange(width)[None, :]
    valid = j < drafts[:, None]
    draw_idx = np.where(valid, first[:, None] + j, first[:, None])
    proposal_idx = np.where(valid, (ends - drafts)[:, None] + j, 0)
    return VerifyPlan(
        sel=sel, offset_add=offset_add, first=first, drafts=drafts,
        draw_idx=to_device(platform, draw_idx, torch.int64, device),
        proposal_idx=to_device(platform, proposal_idx, torch.int64, device),
        valid=to_device(platform, valid, torch.bool, device),
        first_dev=to_device(platform, first, torch.int64, device))


def accept(draws: torch.Tensor, input_ids: torch.Tensor, plan: VerifyPlan
           ) -> tuple[torch.Tensor, torch.Tensor]:
    """(tokens kept per sampling request [S], the last of them [S]) on the device.
    `input_ids`: the step's inputs with the proposals in place."""
    match = (draws[plan.draw_idx] == input_ids[plan.proposal_idx]) & plan.valid
    accepted = match.to(torch.int64).cumprod(dim=1).sum(dim=1)
    return accepted + 1, draws[plan.first_dev + accepted]


@dataclass
class VerifiedSample:
    """A verify step's draws (a DeviceSample over every logits row) and the counts kept:
    the same start_copy / ready / fetch as a DeviceSample, fetch returning only the tokens
    kept (SampleResult.counts per request)."""

    inner: DeviceSample
    counts: torch.Tensor  # int64 [S] on the device
    plan: VerifyPlan
    _host_counts: torch.Tensor | None = None
    _result: SampleResult | None = field(default=None, repr=False)

    @property
    def tokens(self) -> torch.Tensor:
        return self.inner.tokens

    def start_copy(self) -> None:
        self._host_counts = self.inner.platform.device_to_host(self.counts.to(torch.int32))
        self.inner.start_copy()  # records the event after every copy of the step

    def ready(self) -> bool:
        return self.inner.ready()

    def first_draws(self) -> np.ndarray:
        """Each request's first draw (its token when it verified nothing): grammar rows."""
        return self.inner.fetch().token_ids[self.plan.first]

    def fetch(self) -> SampleResult:
        if self._result is not None:
            return self._result
        full = self.inner.fetch()
        if self._host_counts is None:
            self.start_copy()
        assert self._host_counts is not None
        counts = self._host_counts.numpy().astype(np.int32)
        per = self.plan.drafts + 1
        within = np.arange(self.plan.rows) - np.repeat(self.plan.first, per)
        keep = within < np.repeat(counts, per)
        out = SampleResult(token_ids=full.token_ids[keep], logprobs=full.logprobs,
                           top_ids=full.top_ids, top_logprobs=full.top_logprobs,
                           tokens_device=full.tokens_device, counts=counts)
        if full.logprobs.shape[0]:
            out.logprobs = full.logprobs[keep]
        if full.top_ids.ndim == 2 and full.top_ids.shape[0]:
            out.top_ids, out.top_logprobs = full.top_ids[keep], full.top_logprobs[keep]
        self._result = out
        return out
