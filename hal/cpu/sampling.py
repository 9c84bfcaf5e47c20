"""Reference sampler (semantics: hal/ops.py `sample`).

Filtering: probabilities at the request's temperature, then top-k, then top-p on the
renormalised top-k survivors, then min-p relative to the most likely token (a ratio, so the
renormalisation does not change it). The most likely token always survives.

Speed matters because the cpu worker serves with this: a full sort of a 49k vocabulary costs
tens of milliseconds per step, so top-k / top-p look at the `torch.topk` candidates only,
widening the window (x4) until every top-p row's nucleus ends inside it; min-p needs no sort.

The draw is by inverse CDF, one uniform number per row: the token whose cumulative mass
interval holds u * total. Seeded rows take u from their own generator, seeded from
(seed, offset) alone, so a seeded request sees the same stream whatever else shares the batch.
Unseeded rows share the global generator (torch.manual_seed).
"""

from __future__ import annotations

import torch

from tessera.hal.ops import SamplingTensors

_MASK64 = (1 << 64) - 1
_FIRST_WINDOW = 64


def stream_seed(seed: int, offset: int) -> int:
    """A 63-bit generator seed from (seed, offset): splitmix64 of a golden-ratio combination,
    so neighbouring offsets of one seed give unrelated streams."""
    x = (seed * 0x9E3779B97F4A7C15 + offset + 1) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return (x ^ (x >> 31)) >> 1


def filtered_probs(logits: torch.Tensor, params: SamplingTensors) -> torch.Tensor:
    """[B, V] unnormalised probabilities after temperature, top-k, top-p and min-p; zero for
    filtered tokens. Rows with temperature 0 are treated as temperature 1 (the caller takes
    argmax for them)."""
    dev = logits.device
    temperature = params.temperature.float().to(dev)
    temperature = torch.where(temperature > 0, temperature, torch.ones_like(temperature))
    probs = (logits.float() / temperature[:, None]).softmax(dim=-1)
    vocab = probs.shape[-1]
    top_k = params.top_k.long().to(dev)
    k_on = (top_k > 0) & (top_k < vocab)
    top_p = params.top_p.float().to(dev)
    p_on = top_p < 1
    if bool((k_on | p_on).any()):
        probs = _top_k_top_p(probs, torch.where(k_on, top_k, vocab), k_on, top_p, p_on)
    min_p = params.min_p.float().to(dev)
    if bool((min_p > 0).any()):
        threshold = min_p[:, None] * probs.max(dim=-1, keepdim=True).values
        probs = torch.where(probs >= threshold, probs, torch.zeros_like(probs))
    return probs


def _top_k_top_p(probs: torch.Tensor, k_eff: torch.Tensor, k_on: torch.Tensor,
                 top_p: torch.Tensor, p_on: torch.Tensor) -> torch.Tensor:
    vocab = probs.shape[-1]
    # The window must hold every top-k row's k tokens; top-p rows may widen it further.
    window = min(vocab, max(_FIRST_WINDOW, int(k_eff[k_on].max()) if bool(k_on.any()) else 0))
    while True:
        values, index = probs.topk(window, dim=-1)  # sorted, most likely first
        keep = torch.arange(window, device=probs.device)[None, :] < k_eff[:, None]
        kept = values * keep
        # top-k rows renormalise over their k survivors; the others keep the full softmax's 1
        total = torch.where(k_on, kept.sum(dim=-1), torch.ones_like(top_p))
        cum = kept.cumsum(dim=-1) / total[:, None]
        # A top-p row is settled once its nucleus ends inside the window.
        settled = ~p_on | (cum[:, -1] >= top_p) | (k_eff <= window)
        if window == vocab or bool(settled.all()):
            break
        window = min(vocab, window * 4)
    before = cum - kept / total[:, None]
    keep &= ~p_on[:, None] | (before < top_p[:, None])
    keep[:, 0] = True
    filtered = torch.zeros_like(probs).scatter_(1, index, values * keep)
    return torch.where((k_on | p_on)[:, None], filtered, probs)


def sample(logits: torch.Tensor, params: SamplingTensors) -> torch.Tensor:
    greedy_tokens = logits.argmax(dim=-1)
    if logits.shape[0] == 0 or params.all_greedy:
        return greedy_tokens
    temperature = params.temperature.to(logits.device)
    is_greedy = (temperature <= 0) | (params.top_k.to(logits.device) == 1)
    if bool(is_greedy.all()):
        return greedy_tokens

    probs = filtered_probs(logits, params)
    cdf = probs.double().cumsum(dim=-1)
    u = torch.rand(len(probs), dtype=torch.float64, device=logits.device)
    for row, (seed, offset) in enumerate(zip(params.seeds.tolist(), params.offsets.tolist(),
                                             strict=True)):
        if seed >= 0:
            gen = torch.Generator(device=logits.device)
            gen.manual_seed(stream_seed(int(seed), int(offset)))
            u[row] = torch.rand(1, dtype=torch.float64, device=logits.device, generator=gen)[0]
    target = u[:, None] * cdf[:, -1:]
    # the first token whose cumulative mass exceeds the target: its own mass is positive
    sampled = torch.searchsorted(cdf, target, right=True).squeeze(1).clamp(max=cdf.shape[1] - 1)
    # u * total can round up to total itself; then take the last token with positive mass
    # rather than a filtered one.
    unlucky = probs.gather(1, sampled[:, None]).squeeze(1) <= 0
    if bool(unlucky.any()):
        last_positive = (probs > 0).long().cumsum(dim=-1).argmax(dim=-1)
        sampled = torch.where(unlucky, last_positive, sampled)
    return torch.where(is_greedy, greedy_tokens, sampled)
