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
