"""B5 end to end on the cpu plugin (gloo), a tiny random Llama and tiny workloads: B1 and B2
at TP=1, TP=2 and PP=2 in one command, every part's result and the ratios written, each
part's roofline over the devices it used."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from tessera.benchmarks.common import missing_figures

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TINY = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
        "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 16, "intermediate_size": 128, "vocab_size": 256, "hidden_act": "silu",
        "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "max_position_embeddings": 512,
        "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": 2}


def test_b5_writes_every_part_and_the_ratios(run_root: Path, tmp_path: Path) -> None:
    from tessera.benchmarks import b5

    model = tmp_path / "tiny-llama.json"
    model.write_text(json.dumps(TINY))
    out = tmp_path / "results"
    rc = b5.main(["--model", str(model), "--suffix", "cpu", "--out-dir", str(out),
                  "--bandwidth-gbps", "10", "--peak-tflops", "0.1", "--num-requests", "4",
                  "--iters", "1", "--warmup", "0",
                  "--b1-flags", "--prompt-len 24 --output-len 6",
                  "--b2-flags", "--prompt-len 8,32 --output-len 4,12",
                  "--hal", "cpu", "--dtype", "float32", "--max-total-tokens", "2048",
                  "--max-running-requests", "8", "--intra-op-threads", "1",
                  "--profile-dir", str(tmp_path / "prof"), "--profile-steps", "3:2"])
    assert rc == 0
    # each layout's workers profiled their own steps 3-4, in a folder of the layout
    for layout, ranks in (("tp1", 1), ("tp2", 2), ("pp2", 2)):
        assert sorted(p.name for p in (tmp_path / "prof" / layout).glob("*.kernels.json")) \
            == [f"worker{r}.steps3-4.kernels.json" for r in range(ranks)]
    result = json.loads((out / "b5_cpu.json").read_text())
    assert result["workload"] == "B5" and not missing_figures(result)
    assert result["errors"] == {} and result["fallbacks"] == []
    figures = result["figures"]
    for name in ("tp2_b1_ratio", "tp2_b2_ratio", "pp2_b2_ratio", "pp2_b1_ratio"):
        assert figures[name] > 0, name
    for layout, devices_b1, devices_b2 in (("tp1", 1, 1), ("tp2", 2, 2), ("pp2", 1, 2)):
        b1 = json.loads((out / f"b5_{layout}_b1_cpu.json").read_text())
        b2 = json.loads((out / f"b5_{layout}_b2_cpu.json").read_text())
        assert b1["config"]["engine"].get("tp_size", 1) == (2 if layout == "tp2" else 1)
        assert b1["figures"]["roofline_devices"] == devices_b1
        # gloo has no one-shot path: every worker says so (cuda's say their limit)
        assert [w["all_reduce_one_shot_bytes"] for w in b1["figures"]["workers"].values()] \
            == [0.0] * (1 if layout == "tp1" else 2)
        assert b2["figures"]["roofline"]["devices"] == devices_b2
        assert b2["figures"]["output_tokens"] == b2["figures"]["expected_output_tokens"]
        workers = b2["figures"]["worker_steps"]
        assert sorted(workers) == (["worker0"] if layout == "tp1" else ["worker0", "worker1"])
        assert all(w["steps"] > 0 and w["forward_ms_per_step"] > 0 for w in workers.values())
        assert figures[layout]["b1_decode_ms_per_step"] == b1["figures"]["decode_ms_per_step"]
    assert figures["tp2_b2_ratio"] == pytest.approx(
        figures["tp2"]["b2_output_tok_per_s"] / figures["tp1"]["b2_output_tok_per_s"])


def test_a_layout_past_its_time_is_an_error_and_leaves_nothing_running(
        run_root: Path, tmp_path: Path) -> None:
    """A hung layout must not take the others' time on the two-GPU machine: past
    --layout-timeout-s its engine is stopped (here: still starting) and its parts recorded
    as failed; no figure is made up."""
    from tessera.benchmarks import b5

    model = tmp_path / "tiny-llama.json"
    model.write_text(json.dumps(TINY))
    out = tmp_path / "results"
    rc = b5.main(["--model", str(model), "--suffix", "cpu", "--out-dir", str(out),
                  "--layouts", "tp1", "--layout-timeout-s", "1", "--bandwidth-gbps", "10",
                  "--peak-tflops", "0.1", "--hal", "cpu", "--intra-op-threads", "1"])
    assert rc == 1
    result = json.loads((out / "b5_cpu.json").read_text())
    assert set(result["errors"]) == {"tp1 b1", "tp1 b2"}
    assert all("--layout-timeout-s" in why for why in result["errors"].values())
    assert result["figures"]["tp2_b1_ratio"] is None
    time.sleep(1.0)  # the engine's processes exit after the supervisor's SIGTERM
    assert processes_naming(str(run_root)) == []


def processes_naming(text: str) -> list[int]:
    """Pids of live processes whose command line holds `text` (the engine's processes carry
    their run directory, under the test's run root)."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                if text.encode() in f.read():
                    pids.append(int(entry))
        except OSError:
            continue
    return pids
