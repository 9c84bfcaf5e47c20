"""Which waiting sequence runs next, and which running one gives way when memory runs out.

FCFS: arrival order. Priority: higher `priority` first, arrival order among equals. A retracted
sequence keeps its place (its original arrival), so it comes back before younger requests.
Removal (abort) is lazy: a heap entry whose `queued` stamp is out of date is skipped.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable

from tessera.scheduler_proc.request import SeqState, Sequence


class WaitingQueue:
    def __init__(self, by_priority: bool) -> None:
        self.by_priority = by_priority
        self._heap: list[tuple[tuple[int, int, int], int, Sequence]] = []
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def push(self, seq: Sequence) -> None:
        seq.state = SeqState.WAITING
        seq.queued += 1
        heapq.heappush(self._heap, (seq.sort_key(self.by_priority), seq.queued, seq))
        self._count += 1

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
        return heapq.heappop(self._heap)[2]

    def discard(self, seq: Sequence) -> None:
        """Forget a waiting sequence (its heap entry becomes stale)."""
        if seq.state is SeqState.WAITING:
            seq.queued += 1
            self._count -= 1

    def sequences(self) -> Iterable[Sequence]:
        return [s for _, q, s in self._heap if s.state is SeqState.WAITING and q == s.queued]


def retraction_victim(running: Iterable[Sequence], by_priority: bool) -> Sequence | None:
    """The sequence to retract first: lowest priority, then youngest."""
    return max(running, key=lambda s: s.sort_key(by_priority), default=None)
