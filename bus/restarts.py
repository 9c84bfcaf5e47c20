"""When a process dies or hangs: restart it (and the processes that must restart with it), or
stop the engine after too many failures.

    policy = RestartPolicy(max_restarts=5, window_s=300, backoff_s=1)
    plan = RestartBook(policy)
    delay = plan.record("core", now)       # seconds to wait before starting it again
    if delay is None: stop everything       # a crash loop

Processes restart by group: the worker ranks and the scheduler are one group ("core": a new
scheduler writes a new page table and the workers' KV arena is its data, so neither survives
without the other), every other process is a group of its own. The delay doubles with each
failure of the group within the window (backoff_s, 2 x, 4 x ..., at most max_backoff_s); the
failure that would be the (max_restarts + 1)-th within the window stops the engine instead.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field


@dataclass(frozen=True)
class RestartPolicy:
    max_restarts: int = 5
    window_s: float = 300.0
    backoff_s: float = 1.0
    max_backoff_s: float = 30.0


@dataclass
class RestartBook:
    policy: RestartPolicy
    _failures: dict[str, deque[float]] = field(default_factory=dict)
    total: dict[str, int] = field(default_factory=dict)  # restarts per group, ever

    def recent(self, group: str, now: float) -> int:
        times = self._failures.setdefault(group, deque())
        while times and now - times[0] > self.policy.window_s:
            times.popleft()
        return len(times)

    def record(self, group: str, now: float) -> float | None:
        """Note a failure of `group`; the delay before restarting it, or None when it has
        failed more than max_restarts times within the window (stop the engine)."""
        count = self.recent(group, now)
        if count >= self.policy.max_restarts:
            return None
        self._failures[group].append(now)
        self.total[group] = self.total.get(group, 0) + 1
        return min(self.policy.max_backoff_s, self.policy.backoff_s * 2 ** count)
