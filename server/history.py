"""Recent figures for the status page at /: one sample every few seconds, the last minutes kept.

Each sample is what happened since the previous one, read from the server's own Prometheus
metrics (tokens per second, requests finished, mean TTFT / ITL / E2E of the interval) and from
the scheduler's latest heartbeat (running, waiting, KV usage, cache hit rate). The page draws
them as they come; /status hands out the whole window.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import asdict, dataclass
from typing import Any

from prometheus_client import Counter, Histogram

from tessera.bus.messages import StatusReply
from tessera.server.metrics import ServerMetrics

INTERVAL_S = 2.0
WINDOW_S = 600.0


@dataclass(frozen=True)
class Sample:
    t: float  # unix seconds at the end of the interval
    output_tok_s: float
    prompt_tok_s: float
    requests_done: int  # generations that ended in the interval
    ttft_ms: float | None  # means over the requests / tokens of the interval
    itl_ms: float | None
    e2e_ms: float | None
    in_flight: int
    running: float | None  # the scheduler's, from its heartbeat
    waiting: float | None
    kv_usage_ratio: float | None
    cache_hit_rate: float | None


def _counter(c: Counter) -> float:
    return sum(s.value for m in c.collect() for s in m.samples if s.name.endswith("_total"))


def _sum_count(h: Histogram) -> tuple[float, float]:
    total = count = 0.0
    for m in h.collect():
        for s in m.samples:
            if s.name.endswith("_sum"):
                total += s.value
            elif s.name.endswith("_count"):
                count += s.value
    return total, count


def _mean_ms(now: tuple[float, float], before: tuple[float, float]) -> float | None:
    n = now[1] - before[1]
    return round((now[0] - before[0]) / n * 1000.0, 3) if n > 0 else None


def _scheduler_stats(status: StatusReply | None) -> dict[str, Any]:
    if status is None:
        return {}
    info = status.processes.get("scheduler")
    stats = info.get("stats") if isinstance(info, dict) else None
    return stats if isinstance(stats, dict) else {}


class History:
    def __init__(self, metrics: ServerMetrics, window_s: float = WINDOW_S,
                 interval_s: float = INTERVAL_S) -> None:
        self.metrics = metrics
        self.interval_s = interval_s
        self.samples_kept: deque[Sample] = deque(maxlen=max(1, int(window_s / interval_s)))
        self._last: dict[str, Any] | None = None

    def _read(self) -> dict[str, Any]:
        m = self.metrics
        return {"at": time.monotonic(), "out": _counter(m.generation_tokens),
                "prompt": _counter(m.prompt_tokens), "done": _counter(m.request_success),
                "ttft": _sum_count(m.ttft), "itl": _sum_count(m.itl), "e2e": _sum_count(m.e2e)}

    def sample(self, status: StatusReply | None, in_flight: int) -> Sample | None:
        """Close the interval since the last call (the first call only starts one)."""
        now = self._read()
        last, self._last = self._last, now
        if last is None:
            return None
        dt = max(now["at"] - last["at"], 1e-9)
        stats = _scheduler_stats(status)

        def stat(name: str) -> float | None:
            value = stats.get(name)
            return round(float(value), 4) if isinstance(value, int | float) else None

        s = Sample(t=round(time.time(), 3),
                   output_tok_s=round((now["out"] - last["out"]) / dt, 3),
                   prompt_tok_s=round((now["prompt"] - last["prompt"]) / dt, 3),
                   requests_done=int(now["done"] - last["done"]),
                   ttft_ms=_mean_ms(now["ttft"], last["ttft"]),
                   itl_ms=_mean_ms(now["itl"], last["itl"]),
                   e2e_ms=_mean_ms(now["e2e"], last["e2e"]),
                   in_flight=in_flight, running=stat("running"), waiting=stat("waiting"),
                   kv_usage_ratio=stat("kv_usage_ratio"), cache_hit_rate=stat("cache_hit_rate"))
        self.samples_kept.append(s)
        return s

    def samples(self) -> list[dict[str, Any]]:
        return [asdict(s) for s in self.samples_kept]
