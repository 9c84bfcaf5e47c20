"""The fused-ops A/B (`benchmarks/run_gpu.sh fusion`): its comparison of two B1 results, and
the part itself rehearsed on the cpu plugin (DRY=1), where the switch changes nothing but the
commands, engines and files are the GPU run's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tessera.benchmarks.fusion_ab import compare

ROOT = Path(__file__).resolve().parents[2]


def _b1(decode: float, ttft: float, commit: str = "abc1234") -> dict:
    return {"workload": "B1", "commit": commit, "device": "NVIDIA H200",
            "figures": {"decode_ms_per_step": decode, "ttft_ms": ttft,
                        "decode_ms_per_step_all": [decode, decode + 0.01]}}


def test_compare_reports_what_the_fusions_saved() -> None:
    ab = compare(_b1(4.33, 18.5), _b1(4.25, 18.0))
    assert ab.decode_ms_saved == pytest.approx(0.08)
    assert ab.ttft_ms_saved == pytest.approx(0.5)
    assert ab.decode_ratio == pytest.approx(4.25 / 4.33)
    assert ab.unfused["decode_ms_per_step_all"] == [4.33, 4.34] and ab.commit == "abc1234"


def test_compare_refuses_runs_of_different_commits_or_incomplete_results() -> None:
    with pytest.raises(ValueError, match="different commits"):
        compare(_b1(4.3, 18.0), _b1(4.2, 18.0, commit="def5678"))
    broken = _b1(4.3, 18.0)
    del broken["figures"]["ttft_ms"]
    with pytest.raises(ValueError, match="unfused"):
        compare(broken, _b1(4.2, 18.0))


@pytest.mark.integration
@pytest.mark.slow
def test_run_gpu_fusion_part_writes_both_runs_and_their_comparison(tmp_path: Path) -> None:
    env = {**os.environ, "DRY": "1", "PYTHON": sys.executable, "OUT": str(tmp_path)}
    proc = subprocess.run(["bash", str(ROOT / "benchmarks" / "run_gpu.sh"), "fusion"], env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ab = json.loads((tmp_path / "b1_fusion_dry.json").read_text())
    for name in ("unfused", "fused"):
        run = json.loads((tmp_path / f"b1_{name}_dry.json").read_text())
        assert ab[name]["decode_ms_per_step"] == run["figures"]["decode_ms_per_step"] > 0
    assert "passed" in (tmp_path / "fusion_dry.log").read_text()
    kernels = json.loads((tmp_path / "fused_kernels_dry.json").read_text())
    assert kernels["rotary_store_kv"]["fused_us"] > 0
