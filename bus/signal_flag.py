"""A stop flag that a signal handler may set.

A Python signal handler runs in the main thread between two bytecodes, wherever that thread
is: inside `threading.Event.wait()` or `.set()` it may hold the event's (non-reentrant) lock,
and a handler that calls `.set()` then waits for itself forever. This flag takes no lock:
setting is one attribute store, waiting polls it in short sleeps.
"""

from __future__ import annotations

import time

POLL_S = 0.05


class SignalFlag:
    def __init__(self) -> None:
        self._set = False

    def set(self) -> None:
        self._set = True

    def is_set(self) -> bool:
        return self._set

    def wait(self, timeout: float) -> bool:
        """Sleep until the flag is set or `timeout` seconds pass; True if it is set."""
        deadline = time.monotonic() + timeout
        while not self._set:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            time.sleep(min(POLL_S, left))
        return self._set
