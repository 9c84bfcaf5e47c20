"""`tessera.benchmarks.step_trace`: a run's steps laid out from the worker's trace lines, each
with the interval it took, its host launch and the collector pauses inside it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tessera.benchmarks.step_trace import main, step_rows, summarize

MS = 1_000_000


def ev(t_ms: float, p: str, e: str, m: str = "ForwardBatch", **kw: Any) -> dict[str, Any]:
    return {"t": int(t_ms * MS), "p": p, "e": e, "c": "", "m": m, **kw}


def run_events() -> list[dict[str, Any]]:
    """Three steps: a prefill of 100 tokens, a mixed step, a decode step held by a 30 ms pause
    of the scheduler's collector; a second worker rank's lines must not count."""
    out = []
    for step, (sent, launch, launched, ready, tokens, requests, decodes) in enumerate([
            (0, 1, 3, 10, 100, 1, 0), (9, 10, 12, 25, 65, 2, 1), (24, 55, 56, 60, 2, 2, 2)]):
        out += [ev(sent, "scheduler", "send", step=step),
                ev(launch, "worker0", "launch", step=step, tokens=tokens, requests=requests,
                   decodes=decodes),
                ev(launched, "worker0", "launched", step=step),
                ev(ready, "worker0", "ready", step=step),
                ev(ready + 100, "worker1", "ready", step=step)]
    out.append(ev(50, "scheduler", "gc", "gc", gen=2, ms=30.0))
    out.append(ev(5, "detokenizer", "gc", "gc", gen=0, ms=1.5))
    return sorted(out, key=lambda e: e["t"])


def test_each_step_gets_its_interval_launch_wait_and_pauses() -> None:
    rows = step_rows(run_events())
    assert [r["step"] for r in rows] == [0, 1, 2]
    assert [r["kind"] for r in rows] == ["prefill", "mixed", "decode"]
    assert [r["interval_ms"] for r in rows] == pytest.approx([9.0, 15.0, 35.0])
    assert [r["launch_ms"] for r in rows] == pytest.approx([2.0, 2.0, 1.0])
    assert [r["queued_ms"] for r in rows] == pytest.approx([1.0, 1.0, 31.0])
    assert rows[0]["gc"] == [{"process": "detokenizer", "gen": 0, "ms": 1.5}]
    assert "gc" not in rows[1]
    assert rows[2]["gc_ms"] == pytest.approx(30.0)


def test_steps_before_the_start_are_left_out() -> None:
    rows = step_rows(run_events(), since_ns=5 * MS)
    assert [r["step"] for r in rows] == [1, 2]
    assert rows[0]["interval_ms"] == pytest.approx(15.0)  # from its own launch: no step before


def test_the_summary_splits_by_kind_and_lists_the_slowest(tmp_path: Path) -> None:
    (tmp_path / "a.jsonl").write_text("\n".join(json.dumps(e) for e in run_events()) + "\n")
    out = summarize(str(tmp_path), top=2)
    assert out["steps"] == 3 and out["interval_ms_total"] == pytest.approx(59.0)
    assert out["kinds"]["decode"]["steps"] == 1
    assert out["kinds"]["mixed"]["interval_ms_max"] == pytest.approx(15.0)
    assert [r["step"] for r in out["slowest"]] == [2, 1]
    assert out["gc_ms_traced"] == {"scheduler": 30.0, "detokenizer": 1.5}
    assert out["gc_ms_in_steps"] == pytest.approx(31.5)
    assert main([str(tmp_path), "--out", str(tmp_path / "s.json")]) == 0
    assert len(json.loads((tmp_path / "s.json").read_text())["rows"]) == 3


def test_a_trace_without_steps_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "a.jsonl").write_text(json.dumps(ev(1, "scheduler", "send")) + "\n")
    assert main([str(tmp_path)]) == 1
