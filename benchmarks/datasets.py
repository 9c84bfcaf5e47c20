"""Benchmark workloads as lists of requests made of token ids (so that a model without a
tokenizer, e.g. `--load-format dummy`, is measured the same way as a real one).

    random         prompt and output lengths uniform in [lo, hi], random token ids, seeded
    shared-prefix  G groups x R requests: a group's requests share a P-token prefix, each has its
                   own S-token suffix; order shuffled (seeded) so that groups interleave
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass

# Token ids are drawn above the first few ids (special tokens of most vocabularies) and below
# Llama-3's 128000 (where its special tokens start).
_FIRST_ID = 100
_LAST_ID = 127_999


@dataclass(frozen=True)
class BenchRequest:
    prompt_ids: list[int]
    output_len: int
    group: int = -1  # shared-prefix group; -1 for none
    cacheable_tokens: int = 0  # prompt tokens an ideal prefix cache serves (shared-prefix)
    # Sent instead of the ids when set: a router that routes on text (B7) takes no id list.
    prompt_text: str | None = None

    @property
    def prompt_len(self) -> int:
        return len(self.prompt_ids)


def _id_range(vocab_size: int) -> tuple[int, int]:
    hi = min(vocab_size - 1, _LAST_ID)
    lo = min(_FIRST_ID, hi // 2)
    return lo, hi


def random_requests(num_requests: int, prompt_len: tuple[int, int], output_len: tuple[int, int],
                    vocab_size: int, seed: int = 0) -> list[BenchRequest]:
    """Prompt and output lengths uniform in the inclusive ranges given."""
    _check_range("prompt_len", prompt_len)
    _check_range("output_len", output_len)
    rng = random.Random(seed)
    lo, hi = _id_range(vocab_size)
    out = []
    for _ in range(num_requests):
        n_in = rng.randint(*prompt_len)
        n_out = rng.randint(*output_len)
        out.append(BenchRequest([rng.randint(lo, hi) for _ in range(n_in)], n_out))
    return out


def fresh_prompts(reqs: list[BenchRequest], vocab_size: int, seed: int) -> list[BenchRequest]:
    """The same requests (prompt and output lengths) with new random prompt tokens: a round
    that repeats a workload without the prefix cache holding its prompts from the last one."""
    rng = random.Random(seed)
    lo, hi = _id_range(vocab_size)
    return [BenchRequest([rng.randint(lo, hi) for _ in r.prompt_ids], r.output_len)
            for r in reqs]


def shared_prefix_requests(num_groups: int, requests_per_group: int, prefix_len: int,
                           suffix_len: int, output_len: int, vocab_size: int, seed: int = 0,
                           shuffle: bool = True) -> list[BenchRequest]:
    """B4: every group's requests share one prefix. `cacheable_tokens` of a request is its
    prefix length except for the first request of its group (in the order sent), which must
    compute the prefix; their sum over the prompt tokens is the ideal hit rate."""
    if min(num_groups, requests_per_group, output_len) < 1 or min(prefix_len, suffix_len) < 0:
        raise ValueError("shared-prefix needs groups, requests per group and output length >= 1 "
                         "and non-negative prefix and suffix lengths")
    rng = random.Random(seed)
    lo, hi = _id_range(vocab_size)
    prefixes = [[rng.randint(lo, hi) for _ in range(prefix_len)] for _ in range(num_groups)]
    pairs = [(g, [rng.randint(lo, hi) for _ in range(suffix_len)])
             for g in range(num_groups) for _ in range(requests_per_group)]
    if shuffle:
        rng.shuffle(pairs)
    seen: set[int] = set()
    out = []
    for g, suffix in pairs:
        cacheable = prefix_len if g in seen else 0
        seen.add(g)
        out.append(BenchRequest(prefixes[g] + suffix, output_len, group=g,
                                cacheable_tokens=cacheable))
    return out


def ideal_hit_rate(requests: list[BenchRequest]) -> float:
    """Fraction of prompt tokens a perfect prefix cache would serve from the cache."""
    total = sum(r.prompt_len for r in requests)
    return sum(r.cacheable_tokens for r in requests) / total if total else 0.0


def poisson_arrivals(num_requests: int, rate: float, seed: int = 0) -> Iterator[float]:
    """Seconds to wait before each request: exponential gaps of mean 1/rate (rate in
    requests/s); rate = inf sends everything at once."""
    rng = random.Random(seed + 1)
    for _ in range(num_requests):
        yield 0.0 if rate == float("inf") else rng.expovariate(rate)


def _check_range(name: str, span: tuple[int, int]) -> None:
    if span[0] < 1 or span[1] < span[0]:
        raise ValueError(f"{name} range must satisfy 1 <= lo <= hi, got {span}")


def parse_range(text: str) -> tuple[int, int]:
    """'100,1024' or '100-1024' or '64' -> (lo, hi) (CLI helper)."""
    for sep in (",", ":", "-"):
        if sep in text:
            a, b = text.split(sep, 1)
            return int(a), int(b)
    return int(text), int(text)
