"""`tessera bench moe-kernel` (B11's kernel part) end to end on the tiny Mixtral shape, its
kernels in Triton's interpreter (its own process: the interpreter is chosen when triton is
imported): every figure written, and the HBM view's arithmetic from the routing it drew."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "benchmarks" / "configs" / "tiny-mixtral.json"


@pytest.mark.slow
@pytest.mark.integration
def test_moe_kernel_writes_the_dense_hbm_compute_and_decode_figures(tmp_path: Path) -> None:
    pytest.importorskip("triton")
    env = {**os.environ, "TRITON_INTERPRET": "1", "TRITON_CACHE_DIR": str(tmp_path / "tc")}
    proc = subprocess.run(
        [sys.executable, "-m", "tessera", "bench", "moe-kernel", "--model", str(TINY),
         "--tokens", "16", "--iters", "1", "--warmup", "0", "--compute-tokens", "40",
         "--decode-tokens", "1,3", "--bandwidth-gbps", "100", "--sweep",
         "--out-dir", str(tmp_path), "--name", "k"],
        env=env, capture_output=True, text=True, timeout=600, cwd=str(ROOT))
    assert proc.returncode == 0, proc.stderr[-3000:]
    f = json.loads((tmp_path / "k.json").read_text())["figures"]
    config = json.loads(TINY.read_text())
    hidden, inter = config["hidden_size"], config["intermediate_size"]
    for name in ("moe_gemm_fraction_of_dense", "grouped_gemm_tflops", "dense_gemm_tflops",
                 "fused_moe_fraction_of_dense", "compute_bound_fraction_of_dense",
                 "compute_grouped_gemm_tflops", "compute_dense_gemm_tflops",
                 "untuned_grouped_gemm_ms", "decode1_fused_moe_ms", "decode3_fused_moe_ms"):
        assert f[name] > 0, name
    assert f["fused_moe_rel_err_first32"] < 1e-5
    # fp32 in the interpreter: 4 bytes a weight, of the experts the 16 tokens reached
    assert 2 <= f["active_experts"] <= config["num_local_experts"]
    assert f["grouped_gemm_weight_bytes"] == f["active_experts"] * 2 * inter * hidden * 4
    assert f["fused_moe_weight_bytes"] == f["active_experts"] * 3 * inter * hidden * 4
    gbps = f["grouped_gemm_weight_bytes"] / f["grouped_gemm_ms"] / 1e6
    assert f["grouped_gemm_gbps"] == pytest.approx(gbps)
    assert f["grouped_gemm_hbm_fraction"] == pytest.approx(gbps / 100)
    assert f["bandwidth_source"] == "given" and f["compute_tokens"] == 40
    # the untuned tile where nothing is measured (the interpreter): the heuristic's
    assert f["tiles"] == {"gate_up": [16, 32, 64, 4, 3], "down": [16, 32, 64, 4, 3]}
    assert [d["tokens"] for d in f["decode"]] == [1, 3]
    for d in f["decode"]:
        assert d["active_experts"] <= 2 * d["tokens"]
        assert d["weight_bytes"] == d["active_experts"] * 3 * inter * hidden * 4
        for rows in (d["gate_up_candidates"], d["down_candidates"]):
            assert len(rows) >= 8 and all(r["ms"] > 0 and r["gbps"] > 0 for r in rows)
    assert len(f["sweep"]) >= 8 and all("fraction_of_dense" in r for r in f["sweep"])
