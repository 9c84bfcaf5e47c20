"""benchmarks/bench_hop.py end to end on this machine: every receiving mode delivers every
message (a mode that lost one would time out) and reports its hop."""

from __future__ import annotations

import json
from pathlib import Path

from tessera.benchmarks import bench_hop


def test_every_mode_delivers_every_message_and_reports_its_hop(tmp_path: Path) -> None:
    out = tmp_path / "hop.json"
    assert bench_hop.main(["--out", str(out), "--messages", "30", "--gap-ms", "1",
                           "--tokens", "64"]) == 0
    result = json.loads(out.read_text())
    assert set(result["figures"]) == set(bench_hop.MODES)
    for mode, fig in result["figures"].items():
        hop = fig["hop_us"]
        assert 0 < hop["p50"] <= hop["p90"] and hop["mean"] > 0, mode
    assert result["config"] == {"messages": 30, "tokens": 64, "gap_ms": 1.0, "transport": "ipc"}
