"""The stop flag a signal handler sets: waiting ends when it is set, and setting takes no lock
(a handler that interrupts wait() in the same thread returns)."""

from __future__ import annotations

import signal
import time

from tessera.bus.signal_flag import SignalFlag


def test_a_handler_that_interrupts_wait_ends_the_wait() -> None:
    flag = SignalFlag()
    previous = signal.signal(signal.SIGALRM, lambda signum, frame: flag.set())
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.2)
        start = time.monotonic()
        assert flag.wait(30.0) and flag.is_set()
        assert time.monotonic() - start < 10.0  # the wait ended at the signal, not its timeout
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def test_wait_times_out_unset() -> None:
    flag = SignalFlag()
    assert not flag.wait(0.05) and not flag.is_set()
