"""Circuit breaker: overload becomes a fast, clear error instead of an endless queue.

    closed --(failure_threshold failures in a row)--> open
    open --(cooldown_s elapsed)--> half_open: one trial call is let through
    half_open --success--> closed;  half_open --failure--> open (cool-down restarts)

While open, `check()` raises `CircuitOpenError` at once, with the seconds until the next trial
(the server turns it into HTTP 503 with Retry-After).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from enum import StrEnum

from tessera.codes import OVERLOADED, coded


class BreakerState(StrEnum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


class CircuitOpenError(RuntimeError):
    def __init__(self, name: str, retry_after_s: float, reason: str) -> None:
        self.retry_after_s = max(0.0, retry_after_s)
        super().__init__(
            f"{name} is unavailable or overloaded ({reason}); retry in {self.retry_after_s:.1f} s"
            + coded(OVERLOADED))


class CircuitBreaker:
    def __init__(self, name: str, failure_threshold: int = 5, cooldown_s: float = 5.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if failure_threshold < 1:
            raise ValueError("failure_threshold must be at least 1")
        self.name = name
        self.failure_threshold = failure_threshold
        self.cooldown_s = cooldown_s
        self._clock = clock
        self._lock = threading.Lock()
        self._state = BreakerState.CLOSED
        self._failures = 0
        self._opened_at = 0.0
        self._trial_in_flight = False
        self._reason = ""

    @property
    def state(self) -> BreakerState:
        with self._lock:
            self._maybe_half_open()
            return self._state

    def _maybe_half_open(self) -> None:
        if self._state is BreakerState.OPEN and \
                self._clock() - self._opened_at >= self.cooldown_s:
            self._state = BreakerState.HALF_OPEN
            self._trial_in_flight = False

    def check(self) -> None:
        """Raise CircuitOpenError unless a call may go ahead now."""
        with self._lock:
            self._maybe_half_open()
            if self._state is BreakerState.CLOSED:
                return
            if self._state is BreakerState.HALF_OPEN and not self._trial_in_flight:
                self._trial_in_flight = True
                return
            retry = self.cooldown_s - (self._clock() - self._opened_at)
            raise CircuitOpenError(self.name, retry if self._state is BreakerState.OPEN
                                   else self.cooldown_s, self._reason or "open")

    def record_success(self) -> None:
        with self._lock:
            self._failures = 0
            self._state = BreakerState.CLOSED
            self._trial_in_flight = False
            self._reason = ""

    def record_failure(self, reason: str = "timeout") -> None:
        with self._lock:
            self._failures += 1
            self._reason = reason
            if self._state is BreakerState.HALF_OPEN or self._failures >= self.failure_threshold:
                self._trip()

    def trip(self, reason: str) -> None:
        """Open at once (e.g. a missed heartbeat)."""
        with self._lock:
            self._reason = reason
            self._trip()

    def _trip(self) -> None:
        self._state = BreakerState.OPEN
        self._opened_at = self._clock()
        self._trial_in_flight = False
