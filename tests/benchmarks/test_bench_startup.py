"""`tessera bench startup` (B10) end to end on a tiny shape on the cpu plugin: a dummy-weight
`tessera serve` started by the benchmark, then the same shape written as a safetensors folder
and started from it; the B10 JSON holds ready_s and the phases, which add up to it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tessera.benchmarks.common import missing_figures

TINY = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "intermediate_size": 128, "vocab_size": 512, "rms_norm_eps": 1e-5,
        "max_position_embeddings": 1024, "bos_token_id": 1, "eos_token_id": 2}


@pytest.mark.integration
@pytest.mark.slow
def test_bench_startup_writes_b10_for_dummy_and_real_weights(run_root: Path,
                                                            tmp_path: Path) -> None:
    from tessera.benchmarks import startup

    config = tmp_path / "tiny.json"
    config.write_text(json.dumps(TINY))
    weights = tmp_path / "weights"
    rc = startup.main(["--model", str(config), "--load-format", "dummy", "--runs", "1",
                       "--real-weights", "--weights-dir", str(weights), "--out-dir",
                       str(tmp_path), "--name", "b10", "--", "--hal", "cpu",
                       "--max-total-tokens", "2048", "--max-running-requests", "4"])
    assert rc == 0
    result = json.loads((tmp_path / "b10.json").read_text())
    assert result["workload"] == "B10" and not missing_figures(result)
    f = result["figures"]
    assert f["ready_s"] > 0 and f["ready_wall_s"] >= f["ready_s"] * 0.5
    assert {"processes_up", "weights", "warmup"} <= set(f["phases"])
    assert sum(f["phases"].values()) == pytest.approx(f["ready_s"], rel=0.02, abs=0.05)
    real = f["real"]
    assert "skipped" not in real, real
    assert f["real_ready_s"] > 0 and f["real_phases"]["weights"] > 0
    assert real["shards"] >= 1
    assert not weights.exists()  # deleted after the run unless --keep-weights


@pytest.mark.integration
@pytest.mark.slow
def test_a_failed_real_weights_start_keeps_the_dummy_figures(run_root: Path,
                                                             tmp_path: Path) -> None:
    from tessera.benchmarks import startup

    config = tmp_path / "tiny.json"
    config.write_text(json.dumps(TINY))
    blocker = tmp_path / "a-file"  # not a folder: the weights cannot be written there
    blocker.write_text("")
    rc = startup.main(["--model", str(config), "--load-format", "dummy", "--runs", "1",
                       "--real-weights", "--weights-dir", str(blocker), "--out-dir",
                       str(tmp_path), "--name", "b10", "--", "--hal", "cpu",
                       "--max-total-tokens", "2048", "--max-running-requests", "4"])
    assert rc == 0
    f = json.loads((tmp_path / "b10.json").read_text())["figures"]
    assert f["ready_s"] > 0 and "FileExistsError" in f["real"]["failed"]
    assert "real_ready_s" not in f
