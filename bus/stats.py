"""Heartbeat stats with labels and histograms, in the flat {name: float} a Heartbeat carries.

    "queue_depth{channel=scheduler}"            a stat with a label
    "step_seconds_bucket{le=0.01}" ... "step_seconds_sum", "step_seconds_count"
                                                a histogram (cumulative buckets, as Prometheus)

The server's /metrics (server/metrics.py) turns them back into labelled families and histograms.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Sequence

from tessera.bus.breaker import BreakerState

_LABELED = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)\{(.*)\}$")

# Seconds: a decode step of a small model on a GPU (1 ms) up to a long CPU prefill (tens of s).
STEP_BUCKETS = (0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075, 0.1, 0.25,
                0.5, 1.0, 2.5, 5.0, 10.0, 30.0)

BREAKER_VALUE = {BreakerState.CLOSED: 0.0, BreakerState.HALF_OPEN: 0.5, BreakerState.OPEN: 1.0}


def labeled(name: str, **labels: str) -> str:
    inner = ",".join(f"{k}={v}" for k, v in labels.items())
    return f"{name}{{{inner}}}"


def parse_stat(key: str) -> tuple[str, dict[str, str]]:
    """("queue_depth", {"channel": "scheduler"}) from "queue_depth{channel=scheduler}"."""
    match = _LABELED.match(key)
    if match is None:
        return key, {}
    labels = {}
    for part in match.group(2).split(","):
        k, _, v = part.partition("=")
        if k:
            labels[k.strip()] = v.strip()
    return match.group(1), labels


class RoundTrips:
    """The host round trip a worker sees: from the result of step m - depth leaving it to
    step m in its hands (the scheduler sends step m once that result is in, so this is its
    turn and two bus hops). With `depth` steps in flight the device idles once this, the
    worker's launch and its fetch of a result exceed depth - 1 device steps. Counted while
    steps stream (step m - 1 still unanswered when m arrives), or within IDLE_S of the
    release (one step in flight answers every step before the next), so the pause of an idle
    engine before a new request is not."""

    IDLE_S = 0.05

    def __init__(self, depth: int) -> None:
        self.depth = max(1, depth)
        self.total_ms = 0.0
        self.count = 0
        self._sent: dict[int, float] = {}
        self._last_answered = -1

    def answered(self, step: int, now: float) -> None:
        """Step `step`'s result left at `now` (perf_counter seconds)."""
        self._sent[step] = now
        self._last_answered = max(self._last_answered, step)
        if len(self._sent) > 4 * self.depth + 8:  # answers of steps long gone
            for old in [s for s in self._sent if s < step - 2 * self.depth]:
                del self._sent[old]

    def arrived(self, step: int, now: float) -> None:
        """Step `step` came into the worker's hands at `now`."""
        released = self._sent.pop(step - self.depth, None)
        if released is not None and (step - 1 > self._last_answered
                                     or now - released < self.IDLE_S):
            self.total_ms += (now - released) * 1000.0
            self.count += 1

    def stats(self) -> dict[str, float]:
        return {"round_trip_ms_total": self.total_ms, "round_trips": float(self.count)}


class StatHistogram:
    """Cumulative bucket counts of observed values, reported as heartbeat stats."""

    def __init__(self, name: str, buckets: Sequence[float] = STEP_BUCKETS) -> None:
        self.name = name
        self.bounds = tuple(sorted(buckets))
        self.counts = [0] * (len(self.bounds) + 1)  # the last one: above every bound
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.sum += value
        self.count += 1

    def stats(self) -> dict[str, float]:
        out: dict[str, float] = {}
        running = 0
        for bound, n in zip(self.bounds, self.counts, strict=False):
            running += n
            out[labeled(f"{self.name}_bucket", le=repr(float(bound)))] = float(running)
        out[labeled(f"{self.name}_bucket", le="+Inf")] = float(self.count)
        out[f"{self.name}_sum"] = self.sum
        out[f"{self.name}_count"] = float(self.count)
        return out
