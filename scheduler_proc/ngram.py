"""Prompt lookup: the continuation of the latest earlier occurrence of a sequence's last tokens.

One `NgramIndex` per running sequence maps every n-gram of its known tokens (n in
[min_n, max_n]) to the position right after its latest occurrence. It is filled lazily, from
the tokens the scheduler already keeps (`RowState.tokens`), when a proposal is asked for: a
prompt costs one vectorized pass, a decode step a few dictionary entries. A lookup tries the
longest suffix first.

Keys are 64-bit polynomial hashes of the n tokens (n folded in). A collision only makes a bad
proposal, which verification rejects: the output never depends on what is proposed.

The proposal copies the tokens that followed the match. When the match is recent (the
sequence repeats with period p = length - position), the copy runs into the proposal
itself, which continues the period: "a b a b" proposes "a b a b ...".
"""

from __future__ import annotations

import numpy as np

_MULT = np.uint64(0x9E3779B97F4A7C15)
_LEN_SALT = np.uint64(0xD6E8FEB86659FD93)


def _hashes(tokens: np.ndarray, n: int, ends: range) -> np.ndarray:
    """uint64 hash of tokens[e - n:e] for every e in `ends` (each e >= n)."""
    lo, hi = ends.start, ends.stop
    h = np.full(hi - lo, n, dtype=np.uint64)
    with np.errstate(over="ignore"):
        h *= _LEN_SALT
        for i in range(n):
            col = tokens[lo - n + i:hi - n + i].astype(np.uint64) + np.uint64(1)
            h = h * _MULT + col
    return h


class NgramIndex:
    def __init__(self, min_n: int, max_n: int) -> None:
        self.sizes = range(max_n, min_n - 1, -1)  # longest first
        self.min_n = min_n
        self.latest: dict[int, int] = {}  # n-gram hash -> position after its latest occurrence
        self.indexed = 0  # continuations indexed: positions e < indexed are in `latest`

    def catch_up(self, tokens: np.ndarray, length: int) -> None:
        """Index every n-gram of tokens[:length] that has a known token after it."""
        start = self.indexed
        stop = length  # an n-gram ending at e is followed by tokens[e], known when e < length
        if stop <= start:
            return
        for n in reversed(self.sizes):  # shorter first: the same dict holds every size
            lo = max(start, n)
            if lo < stop:
                keys = _hashes(tokens, n, range(lo, stop))
                self.latest.update(zip(keys.tolist(), range(lo, stop), strict=True))
        self.indexed = stop

    def match(self, tokens: np.ndarray, length: int) -> int:
        """Position right after the latest earlier occurrence of the longest suffix of
        tokens[:length] (min_n..max_n tokens) that occurred before, or -1. Call catch_up
        first."""
        for n in self.sizes:
            if length <= n:
                continue
            key = int(_hashes(tokens, n, range(length, length + 1))[0])
            pos = self.latest.get(key, -1)
            if pos >= 0:
                return pos
        return -1


def continuation(tokens: np.ndarray, length: int, pos: int, count: int) -> np.ndarray:
    """`count` tokens copied from tokens[pos:], continuing periodically past `length`."""
    period = length - pos
    if count <= period:
        return tokens[pos:pos + count].copy()
    reps = -(-count // period)
    return np.tile(tokens[pos:length], reps)[:count]
