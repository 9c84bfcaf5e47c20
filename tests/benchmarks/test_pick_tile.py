"""benchmarks/pick_tile.py: the fastest fp8 decode-attention tile over B2's batches, from the
tile bench's report, as HAL_CUDA_DECODE_FP8_TILE takes it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tessera.benchmarks.pick_tile import pick
from tessera.hal.cuda.decode_attention import parse_tile

ROOT = Path(__file__).resolve().parents[2]


def _report(times: dict[str, list[float]], diffs: dict[str, float] | None = None) -> dict:
    tiles = [[64, 2, 3, None], [32, 2, 3, 128], [128, 4, 2, None]]
    keys = ["bn64_w2_s3", "bn32_w2_s3_r128", "bn128_w4_s2"]
    cases = {}
    for case, us in times.items():
        cases[case] = {"fp8": {k: {"us": u, "GBps": 1, "max_diff": (diffs or {}).get(k, 0.0)}
                               for k, u in zip(keys, us, strict=True)}}
    return {"attention_regs": {"fp8_tiles": tiles, "cases": cases}}


def test_the_smallest_sum_over_the_cases_wins() -> None:
    times = {"b2_256": [200.0, 150.0, 260.0], "b2_128": [100.0, 90.0, 95.0],
             "b2_64": [60.0, 55.0, 40.0], "b2_32": [48.0, 44.0, 30.0]}
    assert pick(_report(times)) == "32,2,3,128"
    assert parse_tile(pick(_report(times)) or "") == (32, 2, 3, 128)
    # over the small batches alone the 128-key tile is the fastest: no maxnreg is printed
    assert pick(_report(times), ("b2_64", "b2_32")) == "128,4,2"


def test_a_failed_or_inexact_tile_is_no_candidate() -> None:
    times = {c: [100.0, 50.0, 80.0] for c in ("b2_256", "b2_128", "b2_64", "b2_32")}
    assert pick(_report(times, {"bn32_w2_s3_r128": 0.5})) == "128,4,2"
    report = _report(times)
    report["attention_regs"]["cases"]["b2_64"]["fp8"]["bn32_w2_s3_r128"] = {"error": "x"}
    assert pick(report) == "128,4,2"
    assert pick({}) is None
    assert pick(_report({"b2_256": [1.0, 1.0, 1.0]})) is None  # a case missing


def test_the_command_prints_the_tile_or_nothing(tmp_path: Path) -> None:
    times = {c: [100.0, 50.0, 80.0] for c in ("b2_256", "b2_128", "b2_64", "b2_32")}
    path = tmp_path / "gpu_run.json"
    path.write_text(json.dumps(_report(times)))
    script = str(ROOT / "benchmarks" / "pick_tile.py")
    got = subprocess.run([sys.executable, script, str(path)], capture_output=True, text=True,
                         timeout=60)
    assert got.returncode == 0 and got.stdout.strip() == "32,2,3,128"
    missing = subprocess.run([sys.executable, script, str(tmp_path / "none.json")],
                             capture_output=True, text=True, timeout=60)
    assert missing.returncode == 1 and missing.stdout == "" and "pick_tile" in missing.stderr
