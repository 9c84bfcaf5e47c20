"""bus/gc_pauses.py: every collection counted and timed, long ones traced, the start-up heap
frozen out of later passes."""

from __future__ import annotations

import gc
import json
from pathlib import Path
from typing import Any

import pytest

from tessera.bus import gc_pauses, trace


@pytest.fixture
def pauses() -> Any:
    """A counter of its own, removed after (the process-wide one stays untouched)."""
    counter = gc_pauses.GcPauses()
    gc.callbacks.append(counter)
    yield counter
    gc.callbacks.remove(counter)


def test_each_collection_is_counted_by_generation_and_timed(pauses: gc_pauses.GcPauses) -> None:
    gc.collect(0)
    gc.collect(2)
    stats = pauses.stats()
    assert stats["gc_collections{gen=0}"] >= 1 and stats["gc_collections{gen=2}"] >= 1
    assert stats["gc_pause_ms_total"] > 0
    assert 0 < stats["gc_pause_ms_max"] <= stats["gc_pause_ms_total"]


def traced_collect(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, min_ms: float,
                   generation: int) -> list[dict[str, Any]]:
    """The trace lines of one collection, pauses of `min_ms` or more traced."""
    monkeypatch.setattr(gc_pauses, "TRACE_MIN_MS", min_ms)
    trace.start(str(tmp_path), "unit")
    try:
        gc.collect(generation)
    finally:
        trace.stop()
    return [json.loads(line) for p in tmp_path.glob("*.jsonl")
            for line in p.read_text().splitlines()]


def test_a_long_pause_is_a_trace_line(pauses: gc_pauses.GcPauses, tmp_path: Path,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    lines = traced_collect(tmp_path, monkeypatch, 0.0, 2)
    assert any(e["e"] == "gc" and e["gen"] == 2 and e["ms"] >= 0 for e in lines)


def test_a_short_pause_is_counted_not_traced(pauses: gc_pauses.GcPauses, tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    assert traced_collect(tmp_path, monkeypatch, 1e9, 0) == []
    assert pauses.collections[0] >= 1


def test_freeze_takes_what_lives_now_out_of_later_passes(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gc_pauses, "_pauses", None)  # this test's own process-wide counter
    survivor = [object() for _ in range(1000)]
    try:
        gc_pauses.freeze()
        frozen = gc_pauses.stats()["gc_frozen_objects"]
        assert gc.get_freeze_count() >= len(survivor)
        # The figure is what freeze() moved; a frozen object that dies later (reference
        # counting still frees them, and another test's thread may drop one meanwhile) leaves
        # the permanent generation, so the live count can only have fallen since.
        assert len(survivor) <= gc.get_freeze_count() <= frozen
        # What is frozen is never garbage for a later pass; the collector itself still runs.
        assert gc.collect() >= 0 and gc.get_freeze_count() >= len(survivor)
    finally:
        gc.unfreeze()
        if gc_pauses._pauses is not None:
            gc.callbacks.remove(gc_pauses._pauses)
