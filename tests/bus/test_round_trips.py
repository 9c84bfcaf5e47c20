"""RoundTrips: the worker's view of the scheduler's round trip, step m's arrival minus the
departure of the result that released it (step m - depth), counted only while steps stream."""

from __future__ import annotations

import pytest

from tessera.bus.stats import RoundTrips
from tessera.config import EngineConfig


@pytest.mark.parametrize("depth", [1, 2, 3])
def test_each_step_is_timed_from_the_result_that_released_it(depth: int) -> None:
    trips = RoundTrips(depth)
    now = 0.0
    for step in range(depth):  # the first steps need no result
        trips.arrived(step, now)
    # Steady state: the result of step k leaves at 10 k ms, step k + depth arrives 1.5 ms later.
    for k in range(20):
        trips.answered(k, k * 0.010)
        trips.arrived(k + depth, k * 0.010 + 0.0015)
    assert trips.count == 20
    assert trips.stats()["round_trip_ms_total"] == pytest.approx(20 * 1.5)


def test_an_idle_pause_before_a_new_request_is_not_a_round_trip() -> None:
    trips = RoundTrips(2)
    trips.arrived(0, 0.0)
    trips.arrived(1, 0.0)
    trips.answered(0, 0.004)
    trips.arrived(2, 0.005)  # released by step 0: 1 ms
    trips.answered(1, 0.008)
    trips.answered(2, 0.012)  # the request is done; the engine idles
    trips.arrived(3, 5.0)  # a new request, five seconds later: step 2 is answered already
    assert trips.count == 1 and trips.total_ms == pytest.approx(1.0)
    one = RoundTrips(1)  # one step in flight: every step arrives after the last answer
    one.answered(0, 0.0)
    one.arrived(1, 0.002)
    one.answered(1, 0.006)
    one.arrived(2, 3.0)  # an idle pause
    assert one.count == 1 and one.total_ms == pytest.approx(2.0)


def test_answers_of_steps_long_gone_are_forgotten() -> None:
    trips = RoundTrips(2)
    for k in range(1000):
        trips.answered(k, float(k))
    assert len(trips._sent) <= 4 * 2 + 8


@pytest.mark.parametrize("kwargs, depth", [
    ({}, 2), ({"overlap_steps": 3}, 3), ({"overlap": False}, 1),
    ({"pp_size": 2}, 3), ({"pp_size": 2, "pp_batches_in_flight": 2}, 2)])
def test_the_depth_is_what_the_scheduler_keeps_in_flight(kwargs: dict, depth: int) -> None:
    assert EngineConfig(model="default", **kwargs).steps_in_flight == depth
