"""Start-up time as a figure: from `tessera serve` to ready, split into phases.

Each process reports in its Ready info `setup_started` (wall clock, when its own code began
after the interpreter and imports) and `phases` ({name: seconds} of its set-up: a worker's
`weights`, `kv_arena`, `graph_capture`; the server's `warmup`). The supervisor knows when it
spawned each process and when its Ready came. `startup_report` turns that into

    ready_s        launch of `tessera serve` -> every process ready
    phases         processes_up   spawning processes, interpreters and imports, the light
                                  processes' own set-up: everything on the critical path that
                                  is not one of the phases below
                   weights, kv_arena, graph_capture, ...   the slowest worker rank's set-up
                   warmup         the server's first generation
                   other          before the first process was spawned (checks, clean-up)
                                  and gaps between stages
    stages         per stage, the seconds from its first spawn to its last Ready

The phases add up to ready_s. Stages run one after another, so the critical path is each
stage's slowest process; inside a stage the worker ranks (and the light processes started
beside them) overlap, so only the slowest worker's phases count.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

# Phases a worker reports, in the order they happen; the report keeps this order.
WORKER_PHASES = ("platform", "weights", "kv_arena", "graph_capture")


@dataclass(frozen=True)
class ProcessTimes:
    name: str
    stage: int
    spawned: float  # wall clock
    ready: float
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def phases(self) -> dict[str, float]:
        found = self.info.get("phases")
        if not isinstance(found, dict):
            return {}
        return {str(k): float(v) for k, v in found.items() if isinstance(v, int | float)}


@dataclass(frozen=True)
class StartupReport:
    ready_s: float
    phases: dict[str, float]
    stages: dict[str, float]
    detail: dict[str, float]  # finer figures (graph capture of decode vs mixed steps, ...)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def line(self) -> str:
        parts = ", ".join(f"{name.replace('_', ' ')} {s:.1f} s"
                          for name, s in self.phases.items())
        return f"ready in {self.ready_s:.1f} s ({parts})"


def startup_report(launched: float, processes: Iterable[ProcessTimes]) -> StartupReport:
    procs = list(processes)
    if not procs:
        return StartupReport(0.0, {}, {}, {})
    ready_at = max(p.ready for p in procs)
    stages: dict[int, list[ProcessTimes]] = {}
    for p in procs:
        stages.setdefault(p.stage, []).append(p)
    spans = {s: max(p.ready for p in ps) - min(p.spawned for p in ps)
             for s, ps in sorted(stages.items())}
    phases: dict[str, float] = {}
    detail: dict[str, float] = {}
    workers = [p for p in procs if p.name.startswith("worker")]
    if workers:
        slowest = max(workers, key=lambda p: p.ready)
        for name, seconds in slowest.phases.items():
            if name in WORKER_PHASES:
                phases[name] = seconds
            else:
                detail[name] = seconds
    server = next((p for p in procs if p.name == "server"), None)
    if server is not None and "warmup" in server.phases:
        phases["warmup"] = server.phases["warmup"]
    on_path = sum(spans.values())
    ordered = {"processes_up": max(0.0, on_path - sum(phases.values())), **phases,
               "other": max(0.0, (ready_at - launched) - on_path)}
    return StartupReport(ready_s=ready_at - launched,
                         phases={k: round(v, 3) for k, v in ordered.items()},
                         stages={str(s): round(v, 3) for s, v in spans.items()},
                         detail={k: round(v, 3) for k, v in detail.items()})
