"""The double-buffered inbox of a process.

A receiver thread appends to the back buffer; once per iteration the process loop swaps the
buffers and handles the whole front buffer as one batch. The lock is held only for the swap
(a pointer exchange), never while the loop works, so receiving never waits on processing.
The back buffer is bounded: when it is full, `put` refuses the item and says so, and the
caller turns that into an explicit "overloaded" answer instead of growing without limit.
"""

from __future__ import annotations

import threading
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class DoubleBuffer(Generic[T]):
    def __init__(self, capacity: int) -> None:
        if capacity <= 0:
            raise ValueError(f"capacity must be positive, got {capacity}")
        self.capacity = capacity
        self._back: list[T] = []
        # Reentrant: wake() runs in a SIGTERM handler, which interrupts the main thread
        # wherever it is -- possibly inside put() or swap() with this lock held. A plain lock
        # would then wait for itself forever and the process would be killed at the end of
        # the supervisor's grace period instead of stopping.
        self._cond = threading.Condition(threading.RLock())
        self.accepted = 0
        self.rejected = 0
        self._woken = False
        # The inboxes whose receiver threads fill it (bus/channel.py): a loop that waits on
        # their sockets itself borrows every one of them.
        self.inboxes: list[Any] = []

    def put(self, item: T) -> bool:
        """Append to the back buffer; False (and counted) when it is full."""
        with self._cond:
            if len(self._back) >= self.capacity:
                self.rejected += 1
                return False
            self._back.append(item)
            self.accepted += 1
            self._cond.notify()
            return True

    def swap(self, timeout: float | None = 0.0) -> list[T]:
        """Take everything received so far, in arrival order (per producer and overall).

        Waits up to `timeout` seconds for at least one item (None: forever, 0: not at all).
        """
        with self._cond:
            if not self._back and timeout != 0.0:
                self._cond.wait_for(lambda: bool(self._back) or self._woken, timeout)
            self._woken = False
            front, self._back = self._back, []
            return front

    def take(self) -> list[T]:
        """Everything received so far, without waiting and without consuming a wake()."""
        with self._cond:
            front, self._back = self._back, []
            return front

    def take_wake(self) -> bool:
        """Whether wake() was called since the last swap or take_wake (and forget it): for a
        loop that waits elsewhere than in swap()."""
        with self._cond:
            woken, self._woken = self._woken, False
            return woken

    def wake(self) -> None:
        """Make a swap() that is waiting return now, empty-handed if need be (for shutdown).
        Safe in a signal handler of a thread that is inside put() or swap()."""
        with self._cond:
            self._woken = True
            self._cond.notify_all()

    def __len__(self) -> int:
        with self._cond:
            return len(self._back)
