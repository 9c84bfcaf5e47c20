"""trace_timeline: one step of a step-profile chrome trace, its numbers and its picture."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from tessera.benchmarks import trace_timeline


def _x(name: str, cat: str, ts: float, dur: float, tid: int = 1) -> dict:
    return {"ph": "X", "name": name, "cat": cat, "ts": ts, "dur": dur, "pid": 1, "tid": tid}


def synthetic_trace() -> dict:
    """Step 1 launches 1000-1300 us (inputs, forward, sample), then waits until 4000 us; the
    device runs a GEMM 1200-2200, attention 2250-2750 and a norm 2760-2800."""
    events = [
        _x("step 0: launch", "user_annotation", 0, 300), _x("step 0: finish", "user_annotation",
                                                            300, 600),
        _x("step 1: launch", "user_annotation", 1000, 300),
        _x("inputs", "user_annotation", 1000, 80), _x("forward", "user_annotation", 1080, 150),
        _x("sample", "user_annotation", 1230, 60),
        _x("cudaGraphLaunch", "cuda_runtime", 1100, 40),
        _x("cudaLaunchKernel", "cuda_runtime", 1240, 5),
        _x("step 1: finish", "user_annotation", 1300, 2700),
        _x("nvjet_sm90_tst_128x80", "kernel", 1200, 1000, tid=7),
        _x("_decode_stage1", "kernel", 2250, 500, tid=7),
        _x("_rms_norm_kernel", "kernel", 2760, 40, tid=7),
        _x("nvjet_sm90_tst_128x80", "kernel", 9000, 1000, tid=7),  # another step's
    ]
    return {"traceEvents": events}


def test_the_step_window_and_its_device_time(tmp_path: Path) -> None:
    s = trace_timeline.summarize(synthetic_trace(), step=1)
    assert s["span_us"] == 3000 and s["launch_us"] == 300
    assert s["kernels"] == 3 and s["host_launch_calls"] == 2
    assert s["device_busy_us"] == pytest.approx(1540)
    assert s["device_first_us"] == pytest.approx(200)
    assert s["device_idle_gaps_over_5us"] == 2 and s["device_idle_us"] == pytest.approx(60)
    assert s["device_us_by_kind"] == {"linear": 1000, "attention": 500, "norm": 40}
    assert s["phases_us"] == {"inputs": 80, "forward": 150, "sample": 60}


def test_main_writes_the_picture_and_its_numbers(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    trace = tmp_path / "trace_x.json"
    trace.write_text(json.dumps(synthetic_trace()))
    assert trace_timeline.main([str(trace), str(tmp_path / "step.png")]) == 0
    assert (tmp_path / "step.png").stat().st_size > 1000
    figures = json.loads((tmp_path / "step.json").read_text())
    assert figures["picture"] == "step.png" and figures["span_us"] == 3000
    packed = tmp_path / "trace_x.json.gz"  # as committed beside its picture
    packed.write_bytes(gzip.compress(trace.read_bytes()))
    assert trace_timeline.main([str(packed), str(tmp_path / "again.png"), "--step", "0"]) == 0
    assert json.loads((tmp_path / "again.json").read_text())["span_us"] == 900


def test_a_trace_without_the_step_says_what_it_has() -> None:
    with pytest.raises(ValueError, match="step 0: launch"):
        trace_timeline.summarize(synthetic_trace(), step=2)
