import json
from pathlib import Path

from tessera.benchmarks import bench_scheduler


def test_bench_writes_a_labelled_c2_result(tmp_path: Path) -> None:
    out = tmp_path / "c2.json"
    assert bench_scheduler.main(["--steps", "20", "--prompt-len", "32", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["workload"] == "C2"
    assert "control-plane overhead alone" in result["what"]
    figures = result["figures"]
    assert set(figures) == {f"scheduler_ms_per_step_bs{bs}" for bs in (1, 64, 256)}
    assert all(v > 0 for v in figures.values())
    runs = {r["batch"]: r for r in result["runs"]}
    assert runs[256]["steps"] == 20
    assert result["commit"] and result["machine"]["cpu_count"] >= 1
