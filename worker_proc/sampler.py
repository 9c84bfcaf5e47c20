"""Sampling glue around the HAL `sample` op: penalties, forbidden tokens, logprobs.

Order, as vLLM does it: logprobs are taken from the raw logits (what the model said, before
any processing); then the repetition penalty (Hugging Face's rule, on prompt + output
tokens), frequency and presence penalties (OpenAI's rule, on output tokens only), forbidden
tokens (-inf), the logit_bias (added), the grammar's token mask (the HAL op
`apply_token_mask`), and finally temperature / top-k / top-p / min-p and the draw inside
`sample`.
Everything is vectorized over the S sampling rows; nothing loops per token.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from tessera.bus.messages import ForwardBatch
from tessera.hal.ops import SamplingTensors
from tessera.hal.platform import Event, Platform
from tessera.worker_proc.forward_inputs import to_device
from tessera.worker_proc.grammar.runtime import TokenMask


@dataclass
class SampleResult:
    token_ids: np.ndarray  # int32 [S]
    logprobs: np.ndarray  # float32 [S] or empty
    top_ids: np.ndarray  # int32 [S, N] or empty
    top_logprobs: np.ndarray  # float32 [S, N] or empty
    tokens_device: torch.Tensor  # int64 [S], on the device (kept for the next step's inputs)
    # speculative decoding: tokens of each request (token_ids holds them request by request;
    # empty: one each)
    counts: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))


@dataclass
class DeviceSample:
    """A step's sampled tokens (and logprobs) still on the device.

    `start_copy` queues the copies to host memory behind the step's kernels and records an
    event; `ready` asks whether they are done without waiting; `fetch` waits and returns host
    arrays. A worker can so queue step n+1 before it waits for step n.
    """

    platform: Platform
    tokens: torch.Tensor  # int64 [S]
    want: np.ndarray  # top-N logprobs asked per row (-1: none)
    token_logprobs: torch.Tensor | None = None
    top_values: torch.Tensor | None = None
    top_indices: torch.Tensor | None = None
    _host: list[torch.Tensor | None] | None = None
    _event: Event | None = None
    _result: SampleResult | None = None

    def start_copy(self) -> None:
        to_host = self.platform.device_to_host
        self._host = [None if t is None else to_host(t) for t in (
            self.tokens.to(torch.int32), self.token_logprobs, self.top_values,
            self.top_indices)]
        self._event = self.platform.create_event()
        self._event.record()

    def ready(self) -> bool:
        return self._event is None or self._event.query()

    def fetch(self) -> SampleResult:
        """The host arrays (waits for the device); computed once, then returned again."""
        if self._result is not None:
            return self._result
        if self._host is None:
            self.start_copy()
        assert self._host is not None and self._event is not None
        self._event.synchronize()
        tokens, token_lp, top_vals, top_ids_t = self._host
        assert tokens is not None
        out = SampleResult(
            token_ids=tokens.numpy(), logprobs=np.zeros(0, np.float32),
            top_ids=np.zeros((0,), np.int32), top_logprobs=np.zeros((0,), np.float32),
            tokens_device=self.tokens)
        if token_lp is not None:
            out.logprobs = token_lp.numpy()
        if top_vals is not None and top_ids_t is not None:
            top_lp, top_ids = top_vals.numpy().copy(), top_ids_t.numpy().copy()
            n = top_lp.shape[1]
            fewer = np.arange(n)[None, :] >= np.maximum(self.want, 0)[:, None]
            top_ids[fewer] = -1  # this row asked for fewer alternatives
            top_lp[fewer] = -np.inf
            out.top_ids, out.top_logprobs = top_ids, top_lp
        self._result = out
        return out


def _csr_gather(offsets: np.ndarray, values: np.ndarray, sel: np.ndarray
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For the CSR rows `sel`: (row index in sel, value, position within its row) of every
    element, concatenated."""
    if offsets.size == 0 or sel.size == 0:
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty, empty
    starts, ends = offsets[sel].astype(np.int64), offsets[sel + 1].astype(np.int64)
    lens = ends - starts
    total = int(lens.sum())
    row = np.repeat(np.arange(sel.size), lens)
    first = np.repeat(np.cumsum(lens) - lens, lens)
    within = np.arange(total) - first
    return row, values[starts[row] + within].astype(np.int64), within


def apply_penalties(platform: Platform, logits: torch.Tensor, batch: ForwardBatch,
                    sel: np.ndarray) -> None:
    """In place on logits [S, V]: repetition, frequency and presence penalties of the
    requests `sel` (indices into the batch)."""
    rep = np.asarray(batch.repetition_penalty, dtype=np.float32)[sel]
    freq = np.asarray(batch.frequency_penalty, dtype=np.float32)[sel]
    pres = np.asarray(batch.presence_penalty, dtype=np.float32)[sel]
    if (rep == 1.0).all() and (freq == 0.0).all() and (pres == 0.0).all():
        return
    row, tok, within = _csr_gather(np.asarray(batch.hist_offsets), np.asarray(batch.hist_ids),
                                   sel)
    if row.size == 0:
        return
    s, vocab = logits.shape
    dev = logits.device
    keep = (tok >= 0) & (tok < vocab)
    row, tok, within = row[keep], tok[keep], within[keep]
    flat = to_device(platform, row * vocab + tok, torch.int64, dev)
    if (rep != 1.0).any():
        seen = torch.zeros(s * vocab, dtype=torch.bool, device=dev)
        seen[flat] = True
        seen = seen.view(s, vocab)
        penalty = to_device(platform, rep, torch.float32, dev)[:, None]
        penalized = torch.where(logits < 0, logits * penalty, logits / penalty)
        logits.copy_(torch.where(seen, penalized, logits))
    if (freq != 0.0).any() or (pres != 0.0).any():
        prompt_lens = np.asarray(batch.hist_prompt_lens, dtype=np.int64)[sel]
        is_output = within >= prompt_lens[row]
        counts = torch.zeros(s * vocab, dtype=torch.float32, device=dev)
        counts.index_add_(0, flat[to_device(platform, is_output, torch.bool, dev)],
                          torch.ones(int(is_output.sum()), device=dev))
        counts = counts.view(s, vocab)
        logits -= to_device(platform, freq, torch.float32, dev)[:, None] * counts
        logits -= to_device(platform, pres, torch.float32, dev)[:, None] * (counts > 0).float()


def apply_blocks(platform: Platform, logits: torch.Tensor, batch: ForwardBatch,
                 sel: np.ndarray) -> None:
    """In place: forbid this step's block ids (e.g. EOS while output_len < min_tokens)."""
    row, tok, _ = _csr_gather(np.asarray(batch.block_offsets), np.asarray(batch.block_ids), sel)
    keep = (tok >= 0) & (tok < logits.shape[1])
    if keep.any():
        rows_t = to_device(platform, row[keep], torch.int64, logits.device)
        toks_t = to_device(platform, tok[keep], torch.int64, logits.device)
        logits[rows_t, toks_t] = float("-inf")


def apply_bias(platform: Platform, logits: torch.Tensor, batch: ForwardBatch,
               sel: np.ndarray) -> None:
    """In place: add each request's logit_bias (OpenAI: -100 bans a token, 100 forces it)."""
    if not np.asarray(batch.bias_offsets).shape[0]:
        return
    row, tok, within = _csr_gather(np.asarray(batch.bias_offsets), np.asarray(batch.bias_ids),
                                   sel)
    keep = (tok >= 0) & (tok < logits.shape[1])
    if not keep.any():
        return
    starts = np.asarray(batch.bias_offsets, dtype=np.int64)[sel][row]
    values = np.asarray(batch.bias_values, dtype=np.float32)[(starts + within)[keep]]
    dev = logits.device
    logits.index_put_((to_device(platform, row[keep], torch.int64, dev),
                       to_device(platform, tok[keep], torch.int64, dev)),
                      to_device(platform, values, torch.float32, dev), accumulate=True)


def edits_logits(batch: ForwardBatch, sel: np.ndarray) -> bool:
    """Whether apply_penalties, apply_blocks or apply_bias would change any row of `sel`."""
    rep = np.asarray(batch.repetition_penalty, dtype=np.float32)[sel]
    freq = np.asarray(batch.frequency_penalty, dtype=np.float32)[sel]
    pres = np.asarray(batch.presence_penalty, dtype=np.float32)[sel]
    if not ((rep == 1.0).all() and (freq == 0.0).all() and (pres == 0.0).all()):
        return True
    return bool(np.asarray(batch.block_ids).size or np.asarray(batch.bias_ids).size)


class Sampler:
    def __init__(self, platform: Platform, device: torch.device,
                 mask_op: Callable[..., Any] | None = None) -> None:
        self.platform = platform
        self.sample_op: Callable[..., Any] = platform.op("sample")
        self.mask_op = mask_op  # the HAL's apply_token_mask, where grammars are served
        self.device = device

    def __call__(self, logits: torch.Tensor, batch: ForwardBatch) -> SampleResult:
        """logits [S, V] for the requests with sample == 1, in batch order: float32, or the
        model's dtype (converted here unless every row only takes its argmax)."""
        return self.sample(logits, batch).fetch()

    def sample(self, logits: torch.Tensor, batch: ForwardBatch,
               token_mask: TokenMask | None = None, rows: np.ndarray | None = None,
               offset_add: np.ndarray | None = None) -> DeviceSample:
        """Sample on the device; nothing waits for the device here (see DeviceSample).
        `token_mask`: the grammars' allowed tokens for some of the rows. `rows`: the request
        (index into the batch) of each row of logits, when not one per sampling request
        (speculative decoding: a request verifying d proposals has d + 1 rows), and
        `offset_add` how many tokens before it that row's token comes (its seeded draw is
        the one of that output position)."""
        sel = np.flatnonzero(np.asarray(batch.sample)) if rows is None else rows
        want = np.asarray(batch.logprobs, dtype=np.int64)[sel]
        params = self._params(batch, sel, offset_add)
        if logits.dtype != torch.float32 and not (
                params.all_greedy and token_mask is None and not (want >= 0).any()
                and not edits_logits(batch, sel)):
            logits = logits.float()  # filters, penalties, masks and logprobs work in float32
        raw_logprobs = torch.log_softmax(logits, dim=-1) if (want >= 0).any() else None
        if logits.shape[0]:  # penalties edit the logits in place: they are this step's own
            apply_penalties(self.platform, logits, batch, sel)
            apply_blocks(self.platform, logits, batch, sel)
            apply_bias(self.platform, logits, batch, sel)
        if token_mask is not None:
            assert self.mask_op is not None, "a token mask without apply_token_mask"
            self.mask_op(logits, token_mask.bitmask, token_mask.rows)
        tokens = self.sample_op(logits, params).to(torch.int64)
        out = DeviceSample(platform=self.platform, tokens=tokens, want=want)
        if raw_logprobs is not None:
            out.token_logprobs = raw_logprobs.gather(1, tokens[:, None])[:, 0]
            n = int(want.max())
            if n > 0:
                top = raw_logprobs.topk(n, dim=-1)
                out.top_values, out.top_indices = top.values, top.indices.to(torch.int32)
        return out

    def _params(self, batch: ForwardBatch, sel: np.ndarray,
                offset_add: np.ndarray | None = None) -> SamplingTensors:
        temperature = np.asarray(batch.temperature, np.float32)[sel]
        top_k = np.asarray(batch.top_k, np.int32)[sel]
        top_p = np.asarray(batch.top_p, np.float32)[sel]
        min_p = np.asarray(batch.min_p, np.float32)[sel]
        seeds = np.asarray(batch.seeds, np.int64)[sel]
        offsets = np.asarray(batch.output_lens, np.int64)[sel]
        if offset_add is not None:
            offsets = offsets + offset_add.astype(np.int64)
        # One call for the six: the plugin may send them in one copy (as a step's inputs).
        temperature_d, top_p_d, top_k_d, min_p_d, seeds_d, offsets_d = \
            self.platform.host_to_device_many(
                [torch.from_numpy(np.ascontiguousarray(a))
                 for a in (temperature, top_p, top_k, min_p, seeds, offsets)], self.device)
        return SamplingTensors(
            temperature=temperature_d, top_p=top_p_d, top_k=top_k_d, min_p=min_p_d,
            seeds=seeds_d, offsets=offsets_d,
            all_greedy=bool(((temperature == 0) | (top_k == 1)).all()),
            # which filters are in use, known here: the plugin need not read them back
            any_top_k=bool((top_k > 0).any()), any_top_p=bool((top_p < 1.0).any()),
            any_min_p=bool((min_p > 0.0).any()), max_top_k=int(top_k.max(initial=0)),
        )
