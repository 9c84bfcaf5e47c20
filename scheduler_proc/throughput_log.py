"""The scheduler's periodic line at info level: what the engine did since the last one.

    throughput: generation 812.4 tok/s, prompt 2210.0 tok/s, 41 steps/s; running 32,
    waiting 4; KV usage 37.5%; cache hit 62.0% (of prompt tokens since start)

Quiet while nothing runs or waits and nothing was done since the last line, so an idle
engine's log stays empty.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

log = logging.getLogger("tessera.scheduler_proc.throughput")


class ThroughputLog:
    def __init__(self, interval_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.interval_s = interval_s
        self.clock = clock
        self._last_at = clock()
        self._last: dict[str, float] = {}

    def maybe_log(self, stats: Callable[[], dict[str, float]]) -> str | None:
        """Log (and return) the line when one is due."""
        if self.interval_s <= 0:
            return None
        now = self.clock()
        elapsed = now - self._last_at
        if elapsed < self.interval_s:
            return None
        s = stats()
        prev, self._last, self._last_at = self._last, s, now

        def rate(key: str) -> float:
            return (s.get(key, 0.0) - prev.get(key, 0.0)) / elapsed

        steps = rate("steps")
        if steps == 0 and not s.get("running") and not s.get("waiting"):
            return None
        line = (f"throughput: generation {rate('decode_tokens_total'):.1f} tok/s, prompt "
                f"{rate('prefill_tokens_total'):.1f} tok/s, {steps:.1f} steps/s; running "
                f"{s.get('running', 0):.0f}, waiting {s.get('waiting', 0):.0f}; KV usage "
                f"{100 * s.get('kv_usage_ratio', 0.0):.1f}%; cache hit "
                f"{100 * s.get('cache_hit_rate', 0.0):.1f}% (of prompt tokens since start)")
        log.info("%s", line)
        return line
