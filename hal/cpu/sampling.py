"""Reference sampler (semantics: hal/ops.py `sample`).

Filtering is vectorised over the batch on logits sorted once: top-k, then top-p on the
renormalised survivors, then min-p relative to the most likely token. The draw is an
exponential race (Gumbel-max in disguise): token = argmax(p_i / E_i) with E_i ~ Exp(1), which
picks i with probability p_i and needs no normalisation or cumulative search.

Seeded rows get their own generator, seeded from (seed, offset) alone, so the noise a request
sees does not depend on which other requests share the batch. Unseeded rows share the global
generator (torch.manual_seed).
"""

from __future__ import annotations

import torch

from tessera.hal.ops import SamplingTensors

_MASK64 = (1 << 64) - 1


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
    vocab = logits.shape[-1]
    temperature = params.temperature.float().to(logits.device)
    temperature = torch.where(temperature > 0, temperature, torch.ones_like(temperature))
    scaled = logits.float() / temperature[:, None]
    if not _any_filter(params, vocab):
        return scaled.softmax(dim=-1)  # nothing to cut: skip the sort over the vocabulary
    sorted_logits, order = scaled.sort(dim=-1, descending=True, stable=True)
    probs = sorted_logits.softmax(dim=-1)
    pos = torch.arange(vocab, device=logits.device)[None, :]

    top_k = params.top_k.long().to(logits.device)
    top_k = torch.where(top_k > 0, top_k.clamp(max=vocab), torch.full_like(top_k, vocab))
    keep = pos < top_k[:, None]
    probs = probs * keep
    probs = probs / probs.sum(dim=-1, keepdim=True)

    # top-p: keep a token while the mass strictly before it is below top_p.
    before = probs.cumsum(dim=-1) - probs
    keep &= before < params.top_p.float().to(logits.device)[:, None]
    # min-p: relative to the best token, so the renormalisation above does not matter.
    keep &= probs >= params.min_p.float().to(logits.device)[:, None] * probs[:, :1]
    keep[:, 0] = True  # the most likely token always survives
    kept = probs * keep
    return torch.zeros_like(kept).scatter_(1, order, kept)


def _any_filter(params: SamplingTensors, vocab: int) -> bool:
    top_k = params.top_k
    return bool(((top_k > 0) & (top_k < vocab)).any() or (params.top_p < 1).any()
                or (params.min_p > 0).any())


def sample(logits: torch.Tensor, params: SamplingTensors) -> torch.Tensor:
    greedy_tokens = logits.argmax(dim=-1)
    if logits.shape[0] == 0 or params.all_greedy:
        return greedy_tokens
    temperature = params.temperature.to(logits.device)
    is_greedy = (temperature <= 0) | (params.top_k.to(logits.device) == 1)
    if bool(is_greedy.all()):
        return greedy_tokens

    probs = filtered_probs(logits, params)
    noise = torch.empty_like(probs).exponential_()
    seeds = params.seeds.tolist()
    offsets = params.offsets.tolist()
    for row, (seed, offset) in enumerate(zip(seeds, offsets, strict=True)):
        if seed >= 0:
            gen = torch.Generator(device=logits.device)
            gen.manual_seed(stream_seed(int(seed), int(offset)))
            noise[row].exponential_(generator=gen)
    # Exp(1) can round to 0; a 0 would turn a filtered token's 0/0 into NaN, which argmax
    # prefers.
    noise.clamp_(min=torch.finfo(noise.dtype).tiny)
    sampled = (probs / noise).argmax(dim=-1)
    return torch.where(is_greedy, greedy_tokens, sampled)
