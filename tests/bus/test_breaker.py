"""Circuit breaker state machine, on a fake clock."""

from __future__ import annotations

import pytest

from tessera.bus.breaker import BreakerState, CircuitBreaker, CircuitOpenError


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


def test_closed_to_open_after_n_failures(clock: Clock) -> None:
    b = CircuitBreaker("scheduler", failure_threshold=3, cooldown_s=5.0, clock=clock)
    for _ in range(2):
        b.check()
        b.record_failure()
        assert b.state is BreakerState.CLOSED
    b.check()
    b.record_failure("send timeout")
    assert b.state is BreakerState.OPEN


def test_a_success_resets_the_failure_count(clock: Clock) -> None:
    b = CircuitBreaker("s", failure_threshold=2, clock=clock)
    b.record_failure()
    b.record_success()
    b.record_failure()
    assert b.state is BreakerState.CLOSED


def test_open_fails_at_once_with_a_clear_error(clock: Clock) -> None:
    b = CircuitBreaker("scheduler", failure_threshold=1, cooldown_s=5.0, clock=clock)
    b.record_failure("send timeout")
    clock.now += 2.0
    with pytest.raises(CircuitOpenError) as info:
        b.check()
    assert "scheduler is unavailable or overloaded (send timeout)" in str(info.value)
    assert info.value.retry_after_s == pytest.approx(3.0)


def test_half_open_after_cooldown_then_closed_on_success(clock: Clock) -> None:
    b = CircuitBreaker("s", failure_threshold=2, cooldown_s=5.0, clock=clock)
    b.record_failure()
    b.record_failure()
    clock.now += 4.9
    assert b.state is BreakerState.OPEN
    clock.now += 0.1
    assert b.state is BreakerState.HALF_OPEN
    b.check()  # the one trial call
    with pytest.raises(CircuitOpenError):
        b.check()  # a second caller while the trial is in flight
    b.record_success()
    assert b.state is BreakerState.CLOSED
    b.check()
    b.check()


def test_half_open_failure_reopens_and_restarts_cooldown(clock: Clock) -> None:
    b = CircuitBreaker("s", failure_threshold=3, cooldown_s=5.0, clock=clock)
    for _ in range(3):
        b.record_failure()
    clock.now += 5.0
    b.check()
    b.record_failure()  # one failure in half-open is enough
    assert b.state is BreakerState.OPEN
    clock.now += 4.0
    with pytest.raises(CircuitOpenError):
        b.check()
    clock.now += 1.0
    assert b.state is BreakerState.HALF_OPEN


def test_trip_opens_at_once(clock: Clock) -> None:
    b = CircuitBreaker("worker", failure_threshold=10, clock=clock)
    b.trip("missed heartbeat")
    with pytest.raises(CircuitOpenError, match="missed heartbeat"):
        b.check()


def test_threshold_must_be_positive() -> None:
    with pytest.raises(ValueError):
        CircuitBreaker("s", failure_threshold=0)
