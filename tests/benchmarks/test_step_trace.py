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


def test_idle_is_the_launch_ending_after_the_last_output() -> None:
    # step 1's launch ended 2 ms after step 0's output, step 2's 31 ms after step 1's (the
    # scheduler's pause held it): the device had nothing queued for that long
    rows = step_rows(run_events())
    assert [r["idle_ms"] for r in rows] == pytest.approx([0.0, 2.0, 31.0])
    # step 1 was sent at 9, before step 0's output (10): its 2 ms were the worker's; step 2
    # was sent at 24, before step 1's output (25), its launch at 55: all 31 ms after sending
    assert [r["idle_after_sent_ms"] for r in rows] == pytest.approx([0.0, 2.0, 31.0])


def test_idle_before_the_scheduler_sent_the_step_is_not_the_workers() -> None:
    events = [ev(0, "scheduler", "send", step=0),
              ev(0, "worker0", "launch", step=0, tokens=4, requests=4, decodes=4),
              ev(1, "worker0", "launched", step=0), ev(5, "worker0", "ready", step=0),
              ev(40, "scheduler", "send", step=1),  # no work until 40
              ev(41, "worker0", "launch", step=1, tokens=4, requests=4, decodes=4),
              ev(42, "worker0", "launched", step=1), ev(47, "worker0", "ready", step=1)]
    rows = step_rows(events)
    assert rows[1]["idle_ms"] == pytest.approx(37.0)
    assert rows[1]["idle_after_sent_ms"] == pytest.approx(2.0)


def test_a_step_queued_before_the_last_output_left_the_device_no_idle() -> None:
    events = [ev(0, "worker0", "launch", step=0, tokens=4, requests=4, decodes=4),
              ev(1, "worker0", "launched", step=0),
              ev(2, "worker0", "launch", step=1, tokens=4, requests=4, decodes=4),
              ev(3, "worker0", "launched", step=1),
              ev(8, "worker0", "ready", step=0), ev(14, "worker0", "ready", step=1)]
    rows = step_rows(events)
    assert [r["idle_ms"] for r in rows] == [0.0, 0.0]
    assert [r["interval_ms"] for r in rows] == pytest.approx([8.0, 6.0])


def test_the_cost_model_charges_each_traced_composition(tmp_path: Path) -> None:
    from tessera.benchmarks.sched_sim import CostModel

    events = [ev(0, "worker0", "launch", step=0, tokens=128 + 512, requests=129,
                 decodes=128, context=128 * 600),
              ev(1, "worker0", "launched", step=0, padded=768),
              ev(20, "worker0", "ready", step=0),
              ev(19, "worker0", "launch", step=1, tokens=2, requests=2, decodes=2),
              ev(20, "worker0", "launched", step=1), ev(26, "worker0", "ready", step=1)]
    (tmp_path / "a.jsonl").write_text("\n".join(json.dumps(e) for e in events) + "\n")
    out = summarize(str(tmp_path), cost_model="tokens")
    cost = CostModel("tokens")
    mixed = cost.composed_ms(128, 512, 128 * 600)
    assert out["rows"][0]["model_ms"] == pytest.approx(mixed)
    # the mixed step: the linears of 640 tokens, 128 x 600 tokens of attention, the mixed
    # step's own cost
    assert mixed == pytest.approx(cost.linear(640) + 128 * 600 * 35.5e-6 + 1.0)
    assert out["kinds"]["mixed"]["model_ms_total"] == pytest.approx(mixed)
    # its graph ran 768 tokens: the 128 padding rows cost the linears, not attention
    assert out["rows"][0]["padded"] == 768
    assert out["rows"][0]["model_padded_ms"] == pytest.approx(
        cost.linear(768) + 128 * 600 * 35.5e-6 + 1.0)
    assert out["kinds"]["mixed"]["padding_tokens_mean"] == 128
    # a row without the context (an older trace) is not modelled
    assert out["rows"][1]["model_ms"] is None and "model_ms_total" not in out["kinds"]["decode"]
    assert out["kinds"]["mixed"]["decodes_mean"] == 128
    assert out["kinds"]["mixed"]["prefill_tokens_mean"] == 512
    assert main([str(tmp_path), "--cost-model", "flat"]) == 0


def test_composed_cost_is_the_rows_cost() -> None:
    import numpy as np

    from tessera.benchmarks.sched_sim import CostModel

    seq = np.array([700, 300, 512, 900])
    ext = np.array([1, 1, 512, 1])
    for kind in ("tokens", "flat"):
        cost = CostModel(kind)
        assert cost.step_ms(seq, ext) == pytest.approx(cost.composed_ms(3, 512, 1900))


def test_a_decode_graphs_padding_rows_are_decodes_of_no_context() -> None:
    from tessera.benchmarks.sched_sim import CostModel
    from tessera.benchmarks.step_trace import model_ms

    cost = CostModel("flat")
    row = {"tokens": 88, "decodes": 88, "context": 88 * 800, "padded": 96}
    assert model_ms(row, cost) == pytest.approx(cost.composed_ms(88, 0, 88 * 800))
    assert model_ms(row, cost, padded=True) == pytest.approx(cost.composed_ms(96, 0, 88 * 800))
    assert model_ms({**row, "padded": None}, cost, padded=True) == model_ms(row, cost)
