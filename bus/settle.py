"""Figures that arrive late: counters reach /metrics and status replies through heartbeats and
cached status, so a read right after the last answer can lag the work it counts."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


def read_settled(read: Callable[[], T], quiet_s: float, timeout_s: float,
                 key: Callable[[T], Any] = lambda value: value,
                 ready: Callable[[T], bool] = lambda value: True,
                 what: str = "the figures") -> T:
    """`read()` once two reads `quiet_s` apart agree (compared by `key`) and the second is
    `ready`. Raises TimeoutError if that never happens within `timeout_s`: figures read then
    would be wrong, not late."""
    deadline = time.monotonic() + timeout_s
    last = read()
    while True:
        time.sleep(quiet_s)
        now = read()
        if ready(now) and key(now) == key(last):
            return now
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} did not settle in {timeout_s:g} s: {key(now)}")
        last = now
