"""Double buffer: nothing lost or reordered per producer; bounded with explicit rejection."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time

import pytest

from tessera.bus.double_buffer import DoubleBuffer


def test_concurrent_producers_lose_and_reorder_nothing() -> None:
    producers, per_producer = 4, 20_000
    buf: DoubleBuffer[tuple[int, int]] = DoubleBuffer(capacity=1_000_000)
    start = threading.Barrier(producers + 1)

    def produce(p: int) -> None:
        start.wait()
        for i in range(per_producer):
            assert buf.put((p, i))

    threads = [threading.Thread(target=produce, args=(p,)) for p in range(producers)]
    for t in threads:
        t.start()
    start.wait()
    received: list[tuple[int, int]] = []
    swaps = 0
    while len(received) < producers * per_producer:
        batch = buf.swap(timeout=1.0)
        assert batch, "producers stalled"
        received += batch
        swaps += 1
    for t in threads:
        t.join()
    assert swaps > 1  # the consumer really raced the producers
    assert len(received) == producers * per_producer and buf.swap(0.0) == []
    for p in range(producers):
        assert [i for q, i in received if q == p] == list(range(per_producer))
    assert buf.accepted == producers * per_producer and buf.rejected == 0


def test_full_buffer_rejects_explicitly_and_recovers_after_a_swap() -> None:
    buf: DoubleBuffer[int] = DoubleBuffer(capacity=3)
    assert [buf.put(i) for i in range(5)] == [True, True, True, False, False]
    assert len(buf) == 3 and buf.rejected == 2 and buf.accepted == 3
    assert buf.swap() == [0, 1, 2]
    assert buf.put(9) and buf.swap() == [9]


def test_bounded_under_concurrent_pressure() -> None:
    capacity = 100
    buf: DoubleBuffer[int] = DoubleBuffer(capacity=capacity)
    results: list[bool] = []
    lock = threading.Lock()

    def produce() -> None:
        local = [buf.put(i) for i in range(1_000)]
        with lock:
            results.extend(local)

    threads = [threading.Thread(target=produce) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(buf) == capacity and results.count(True) == capacity
    assert buf.rejected == 4_000 - capacity


def test_swap_waits_for_the_first_item_and_times_out() -> None:
    buf: DoubleBuffer[str] = DoubleBuffer(capacity=10)
    t0 = time.monotonic()
    assert buf.swap(timeout=0.1) == []
    assert time.monotonic() - t0 >= 0.09
    threading.Timer(0.05, buf.put, args=("late",)).start()
    assert buf.swap(timeout=5.0) == ["late"]


def test_wake_releases_a_waiting_swap() -> None:
    buf: DoubleBuffer[int] = DoubleBuffer(capacity=10)
    threading.Timer(0.05, buf.wake).start()
    t0 = time.monotonic()
    assert buf.swap(timeout=30.0) == []
    assert time.monotonic() - t0 < 5.0  # released by wake(), long before its timeout
    t0 = time.monotonic()
    assert buf.swap(timeout=0.2) == []
    assert time.monotonic() - t0 >= 0.19  # one wake releases one wait, not every later one


def test_capacity_must_be_positive() -> None:
    with pytest.raises(ValueError, match="capacity must be positive"):
        DoubleBuffer(capacity=0)


# A signal handler that wakes the buffer, firing every 0.5 ms while the main thread puts and
# swaps: it lands inside put()/swap() with the lock held thousands of times a second. With a
# non-reentrant lock the handler waits for itself (a SIGTERM that never stops the process).
_HAMMER = textwrap.dedent("""
    import signal, time
    from tessera.bus.double_buffer import DoubleBuffer
    buf = DoubleBuffer(8)
    signal.signal(signal.SIGALRM, lambda signum, frame: buf.wake())
    signal.setitimer(signal.ITIMER_REAL, 5e-4, 5e-4)
    end, n = time.monotonic() + 1.0, 0
    while time.monotonic() < end:
        buf.put(n)
        buf.swap(0.001)
        n += len(buf) + 1
    signal.setitimer(signal.ITIMER_REAL, 0)
    print("done", n)
""")


def test_wake_from_a_signal_handler_that_interrupts_put_or_swap() -> None:
    proc = subprocess.run([sys.executable, "-c", _HAMMER], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0 and proc.stdout.startswith("done"), proc.stderr[-2000:]
