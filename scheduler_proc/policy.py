"""Which waiting sequence runs next, and which running one gives way when memory runs out.

FCFS: arrival order. Priority: higher `priority` first, arrival order among equals; a waiting
sequence that does not fit takes the memory (or the row) of running ones of lower priority
(`preemption_victim`). LPM (longest prefix match first, as SGLang schedules): the sequence with
the most prompt tokens already in the radix cache first, arrival order among equals, so that a
shared prefix is used while it is cached instead of being evicted and computed again. The
match lengths change as the cache does: the planner re-ranks the queue before each admission
(`rank`); with more than `LPM_MAX_WAITING` waiting, ranking costs more than it saves and the
queue stays in arrival order (SGLang does the same).

A retracted sequence keeps its place (its original arrival), so it comes back before younger
requests. Removal (abort) is lazy: a heap entry whose `queued` stamp is out of date is skipped.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable

import numpy as np

from tessera.scheduler_proc.request import SeqState, Sequence

LPM_MAX_WAITING = 128


class WaitingQueue:
    def __init__(self, by_priority: bool, by_prefix: bool = False) -> None:
        self.by_priority = by_priority
        self.by_prefix = by_prefix  # lpm: `rank` orders by cached prefix length
        self._heap: list[tuple[tuple[int, int, int], int, Sequence]] = []
        self._count = 0
        self._tokens = 0  # tokens of the waiting sequences (what their prefill computes, at most)
        self._pushes = 0
        self._ranked: tuple[int, int] | None = None  # (cache version, pushes) of the ranking

    def __len__(self) -> int:
        return self._count

    @property
    def tokens(self) -> int:
        """The waiting sequences' tokens in all: their prefill's work before any cached prefix
        (the prefill backlog's estimate)."""
        return self._tokens

    def _key(self, seq: Sequence) -> tuple[int, int, int]:
        if self.by_prefix:
            return (-seq.prefix_hint, seq.req.order, seq.index)
        return seq.sort_key(self.by_priority)

    def push(self, seq: Sequence) -> None:
        seq.state = SeqState.WAITING
        seq.queued += 1
        heapq.heappush(self._heap, (self._key(seq), seq.queued, seq))
        self._count += 1
        self._tokens += int(seq.tokens.shape[0])
        self._pushes += 1

    def rank(self, matched_tokens: Callable[[np.ndarray], int], cache_version: int) -> None:
        """lpm: order the queue by the cached prefix of each sequence now (`matched_tokens`
        of its tokens); arrival order beyond LPM_MAX_WAITING. Skipped while neither the cache
        (`cache_version`) nor the queue's arrivals changed since the last ranking (taking
        sequences out keeps the others in order). No-op for other policies."""
        if not self.by_prefix or not self._count:
            return
        if self._ranked == (cache_version, self._pushes):
            return
        self._ranked = (cache_version, self._pushes)
        seqs = self.sequences()
        rank = len(seqs) <= LPM_MAX_WAITING
        for seq in seqs:
            seq.prefix_hint = matched_tokens(seq.tokens) if rank else 0
        self._heap = [(self._key(s), s.queued, s) for s in seqs]
        heapq.heapify(self._heap)

    def _clean_top(self) -> None:
        heap = self._heap
        while heap and (heap[0][2].state is not SeqState.WAITING or heap[0][1] != heap[0][2].queued):
            heapq.heappop(heap)

    def peek(self) -> Sequence | None:
        self._clean_top()
        return self._heap[0][2] if self._heap else None

    def pop(self) -> Sequence:
        self._clean_top()
        self._count -= 1
        seq = heapq.heappop(self._heap)[2]
        self._tokens -= int(seq.tokens.shape[0])
        return seq

    def discard(self, seq: Sequence) -> None:
        """Forget a waiting sequence (its heap entry becomes stale)."""
        if seq.state is SeqState.WAITING:
            seq.queued += 1
            self._count -= 1
            self._tokens -= int(seq.tokens.shape[0])

    def sequences(self) -> list[Sequence]:
        return [s for _, q, s in self._heap if s.state is SeqState.WAITING and q == s.queued]


def retraction_victim(running: Iterable[Sequence], by_priority: bool) -> Sequence | None:
    """The sequence to retract first: lowest priority, then youngest."""
    return max(running, key=lambda s: s.sort_key(by_priority), default=None)


def preemption_victim(waiting: Sequence, running: Iterable[Sequence]) -> Sequence | None:
    """Priority policy: the running sequence a waiting one that does not fit may take the
    place of: the lowest priority, youngest among equals, and only one of strictly lower
    priority than the waiting sequence (equals never pre-empt each other, which would
    thrash)."""
    victim = retraction_victim(running, by_priority=True)
    if victim is None or victim.req.priority >= waiting.req.priority:
        return None
    return victim
