"""The cyclic garbage collector's pauses in an engine process, counted, and its start-up heap
frozen out of them.

A collection of the oldest generation visits every object the process tracks. After start-up
that is the whole model's modules, the kernel caches and the request tables: tens of
milliseconds for one pass, and it stops the loop that sends a step or reads one back, whatever
the device is doing. Two things keep that visible and rare:

- `install()` times every collection (`gc.callbacks`) and reports, in the process's heartbeat
  stats, the collections of each generation and their pause, total and longest
  (`gc_collections{gen=2}`, `gc_pause_ms_total`, `gc_pause_ms_max`); with message tracing on
  (`bus/trace.py`) each pause of a millisecond or more is also a trace line, so a slow step can
  be laid beside the pause that held it.
- `freeze()` moves everything alive at the end of start-up into the permanent generation, out
  of every later collection (what `gc.freeze()` is for: objects that live as long as the
  process). Garbage they become later is still freed by reference counting; only cycles among
  them would wait for the process to end.
"""

from __future__ import annotations

import gc
import time
from typing import Any

from tessera.bus import trace
from tessera.bus.stats import labeled

TRACE_MIN_MS = 1.0  # shorter pauses are counted, not traced


class GcPauses:
    def __init__(self) -> None:
        self.collections = [0, 0, 0]
        self.pause_ms_total = 0.0
        self.pause_ms_max = 0.0
        self.frozen = 0
        self._start = 0.0

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._start = time.perf_counter()
            return
        ms = (time.perf_counter() - self._start) * 1000.0
        gen = int(info.get("generation", 2))
        self.collections[min(max(gen, 0), 2)] += 1
        self.pause_ms_total += ms
        self.pause_ms_max = max(self.pause_ms_max, ms)
        if ms >= TRACE_MIN_MS and trace.active():
            trace.note("gc", "gc", gen=gen, ms=round(ms, 3),
                       collected=int(info.get("collected", 0)))

    def stats(self) -> dict[str, float]:
        out = {labeled("gc_collections", gen=str(g)): float(n)
               for g, n in enumerate(self.collections)}
        out["gc_pause_ms_total"] = self.pause_ms_total
        out["gc_pause_ms_max"] = self.pause_ms_max
        out["gc_frozen_objects"] = float(self.frozen)
        return out


_pauses: GcPauses | None = None


def install() -> GcPauses:
    """Time this process's collections from now on (once per process)."""
    global _pauses
    if _pauses is None:
        _pauses = GcPauses()
        gc.callbacks.append(_pauses)
    return _pauses


def freeze() -> None:
    """After start-up: collect once, then keep everything alive now out of later passes."""
    pauses = install()
    gc.collect()
    gc.freeze()
    pauses.frozen = gc.get_freeze_count()


def stats() -> dict[str, float]:
    return _pauses.stats() if _pauses is not None else {}
