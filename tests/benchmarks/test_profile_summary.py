"""The profile summary: device-busy time as the union of kernel intervals, time by kernel
kind, and two ranks' overlap, from worker profiles written as the worker writes them."""

from __future__ import annotations

import json
from pathlib import Path

from tessera.benchmarks.profile_summary import kind_of, summarize


def write_profile(folder: Path, rank: int, kernels: list[tuple[str, float, float]]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    prefix = folder / f"worker{rank}.steps10-11"
    Path(f"{prefix}.kernels.json").write_text(json.dumps(
        {"wall_s": 0.01, "device_us": 0.0, "rank": rank, "steps": 2, "first_step": 10,
         "ops": []}))
    events = [{"ph": "X", "cat": "kernel", "name": n, "ts": t, "dur": d} for n, t, d in kernels]
    events.append({"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0.0, "dur": 1e6})
    Path(f"{prefix}.trace.json").write_text(json.dumps({"traceEvents": events}))


def test_busy_time_kinds_and_overlap(tmp_path: Path) -> None:
    # rank 0: a GEMV 100-300 overlapping a norm 200-400 (busy 300), NCCL 1000-1100
    write_profile(tmp_path / "pp2", 0, [("gemv_kernel", 100, 200), ("rms_norm_kernel", 200, 200),
                                        ("ncclDevKernel_SendRecv", 1000, 100)])
    # rank 1: attention 350-650 (overlaps rank 0 for 50 us), a copy 1050-1150 (50 us)
    write_profile(tmp_path / "pp2", 1, [("decode_stage1_kernel", 350, 300),
                                        ("Memcpy DtoD", 1050, 100)])
    got = summarize(str(tmp_path))["pp2"]["steps10-11"]
    r0, r1 = got["ranks"]["0"], got["ranks"]["1"]
    assert r0["device_busy_ms"] == 0.4 and r0["device_busy_ms_per_step"] == 0.2
    assert r0["device_ms_by_kind_per_step"] == {"norm": 0.1, "linear": 0.1, "collective": 0.05}
    assert r1["device_ms_by_kind_per_step"] == {"attention": 0.15, "copy": 0.05}
    assert r0["top_kernels"][0] == {"name": "gemv_kernel", "ms_per_step": 0.1,
                                    "launches_per_step": 0.5}
    assert got["both_busy_ms"] == {"0&1": 0.1}


def test_kinds() -> None:
    assert kind_of("ncclDevKernel_AllReduce_Sum_bf16_RING_LL") == "collective"
    assert kind_of("one_shot_all_reduce_kernel") == "collective"
    assert kind_of("_gemv_bf16_kernel") == "linear"
    assert kind_of("nvjet_tst_128x64") == "linear"
    assert kind_of("_fused_add_rms_norm") == "norm"
    assert kind_of("something_else") == "other"
