"""Datasets, statistics, result JSON and roofline math of the benchmarks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tessera.benchmarks.common import (
    missing_figures,
    new_result,
    percentile,
    summarize,
    write_result,
)
from tessera.benchmarks.datasets import (
    ideal_hit_rate,
    parse_range,
    poisson_arrivals,
    random_requests,
    shared_prefix_requests,
)
from tessera.benchmarks.roofline import (
    Device,
    ModelCost,
    StepShape,
    roofline,
    roofline_from_totals,
    simulate_steps,
    step_cost,
)
from tessera.formats.dummy import read_config_file

CONFIGS = Path(__file__).resolve().parents[2] / "benchmarks" / "configs"


def test_random_requests_are_seeded_and_in_range() -> None:
    a = random_requests(50, (100, 1024), (100, 1024), 128256, seed=0)
    b = random_requests(50, (100, 1024), (100, 1024), 128256, seed=0)
    assert a == b
    assert a != random_requests(50, (100, 1024), (100, 1024), 128256, seed=1)
    assert all(100 <= r.prompt_len <= 1024 and 100 <= r.output_len <= 1024 for r in a)
    assert all(0 <= t < 128000 for r in a for t in r.prompt_ids)
    assert all(t < 500 for r in random_requests(5, (4, 4), (1, 1), 500) for t in r.prompt_ids)
    with pytest.raises(ValueError):
        random_requests(1, (10, 5), (1, 1), 1000)


def test_shared_prefix_groups_and_ideal_hit_rate() -> None:
    reqs = shared_prefix_requests(16, 32, 2048, 128, 64, 49152, seed=0)
    assert len(reqs) == 512 and all(r.prompt_len == 2176 for r in reqs)
    by_group: dict[int, list] = {}
    for r in reqs:
        by_group.setdefault(r.group, []).append(r)
    assert len(by_group) == 16
    for group in by_group.values():
        assert len({tuple(r.prompt_ids[:2048]) for r in group}) == 1
        assert len({tuple(r.prompt_ids[2048:]) for r in group}) == 32
        assert [r.cacheable_tokens for r in group] == [0] + [2048] * 31
    assert ideal_hit_rate(reqs) == pytest.approx(16 * 31 * 2048 / (512 * 2176))
    assert [r.group for r in reqs[:32]] != sorted(r.group for r in reqs[:32])  # interleaved


def test_poisson_arrivals_mean_gap() -> None:
    gaps = list(poisson_arrivals(4000, rate=10.0, seed=3))
    assert sum(gaps) / len(gaps) == pytest.approx(0.1, rel=0.1)
    assert set(poisson_arrivals(3, float("inf"))) == {0.0}
    assert parse_range("100,1024") == (100, 1024) and parse_range("64") == (64, 64)


def test_percentiles_match_numpy() -> None:
    np = pytest.importorskip("numpy")
    values = [5.0, 1.0, 9.0, 3.0, 7.0, 2.0]
    for q in (0, 50, 90, 99, 100):
        assert percentile(values, q) == pytest.approx(float(np.percentile(values, q)))
    s = summarize(values)
    assert s["mean"] == pytest.approx(27 / 6) and s["count"] == 6
    assert summarize([])["count"] == 0


def test_result_json_has_required_keys_and_refuses_holes(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HAL_CUDA_DECODE_FP8_TILE", "32,2,3,128")
    monkeypatch.setenv("NOT_A_PLUGIN_SWITCH", "1")
    result = new_result("B1", {"batch": 1}, device="cpu")
    for key in ("workload", "machine", "device", "commit", "versions", "config", "figures"):
        assert key in result
    # the plugins' A/B switches the run had, nothing else of the environment
    assert result["plugin_env"]["HAL_CUDA_DECODE_FP8_TILE"] == "32,2,3,128"
    assert all(k.startswith("HAL_") for k in result["plugin_env"])
    assert "torch" in result["versions"]
    assert missing_figures(result) == ["decode_ms_per_step", "ttft_ms"]
    with pytest.raises(ValueError, match="lacks figures"):
        write_result(result, str(tmp_path), "b1")
    result["figures"] = {"decode_ms_per_step": 4.0, "ttft_ms": float("nan")}
    data = json.loads(Path(write_result(result, str(tmp_path), "b1")).read_text())
    assert data["figures"] == {"decode_ms_per_step": 4.0, "ttft_ms": None}
    b3 = new_result("B3", {})
    b3["figures"] = {"tiers": [{"concurrency": 1}]}
    assert "tiers[0].itl_p99_ms" in missing_figures(b3)
    with pytest.raises(ValueError):
        new_result("B99", {})


def test_config_paths_are_made_portable() -> None:
    import tempfile

    from tessera.benchmarks.common import default_results_dir

    result = new_result("C1", {"out_dir": default_results_dir(), "engine": {
        "model": tempfile.gettempdir() + "/models/x"}, "n": 3, "rel": "a/b"})
    assert result["config"] == {"out_dir": "benchmarks/results",
                                "engine": {"model": "$TMPDIR/models/x"}, "n": 3, "rel": "a/b"}


def test_llama3_8b_roofline_matches_benchmarks_md() -> None:
    config = read_config_file(str(CONFIGS / "llama3-8b.json"))
    cost = ModelCost.of(config, "bfloat16")
    assert cost.weight_bytes / 1e9 == pytest.approx(16.06, abs=0.01)
    assert cost.kv_bytes_per_token == 2 * 32 * 8 * 128 * 2
    h200 = Device(bandwidth_gbps=4220, peak_tflops=794)
    one = roofline(cost, [StepShape((1,), (512,))], h200)
    # BENCHMARKS.md: 16.06 GB / 4.22 TB/s = 3.80 ms per step at batch 1 (+ 512 tokens of KV)
    assert one.bound_s * 1000 == pytest.approx(3.80 + 512 * 131072 / 4.22e12 * 1000, rel=0.01)
    assert 4 == read_config_file(str(CONFIGS / "llama3-8b-4layer.json")).num_layers


def test_mixtral_roofline_counts_the_experts_a_step_reads() -> None:
    config = read_config_file(str(CONFIGS / "mixtral-8x7b.json"))
    cost = ModelCost.of(config, "bfloat16")
    assert cost.is_moe and (cost.num_experts, cost.top_k) == (8, 2)
    # 46.7B parameters; a token's forward touches 12.9B of them (2 of 8 experts)
    assert (cost.weight_bytes + 8 * cost.expert_bytes) / 1e9 == pytest.approx(93.4, abs=0.1)
    assert cost.step_weight_bytes(1) / 1e9 == pytest.approx(25.76, abs=0.01)
    assert cost.experts_read(1) == 2 and cost.experts_read(2) == pytest.approx(3.5)
    assert cost.experts_read(256) == pytest.approx(8.0)  # a big batch reads every expert
    assert cost.matmul_params / 1e9 == pytest.approx(12.75, abs=0.01)
    h200 = Device(bandwidth_gbps=4220, peak_tflops=794)
    assert roofline(cost, [StepShape((1,), (1,))], h200).bound_s * 1000 == \
        pytest.approx(25.76 / 4.22, rel=0.01)
    with pytest.raises(ValueError, match="steps' shapes"):
        roofline_from_totals(cost, 10, 10, 10, 10, h200)


def test_b11_combines_its_parts() -> None:
    from tessera.benchmarks.b11 import combine
    from tessera.benchmarks.common import missing_figures

    b1 = {"figures": {"decode_ms_per_step": 8.0, "roofline_fraction": 0.76, "ttft_ms": 60.0,
                      "roofline_decode_ms_per_step": 6.1}}
    b2 = {"figures": {"output_tok_per_s": 3000.0, "roofline_bound_tok_per_s": 5000.0,
                      "roofline_fraction": 0.6}}
    kernel = {"figures": {"moe_gemm_fraction_of_dense": 0.7, "grouped_gemm_tflops": 400.0,
                          "dense_gemm_tflops": 570.0, "fused_moe_tflops": 300.0,
                          "fused_moe_fraction_of_dense": 0.55}}
    figures = combine(b1, b2, kernel)
    assert figures["decode_ms_per_step"] == 8.0 and figures["b2_roofline_fraction"] == 0.6
    assert not missing_figures({"workload": "B11", "figures": figures})
    assert "grouped_gemm_hbm_fraction" not in figures  # a kernel part without the HBM view
    kernel["figures"].update(grouped_gemm_hbm_fraction=0.85, compute_bound_fraction_of_dense=0.8,
                             decode1_fused_moe_hbm_fraction=0.7, sweep=[])
    figures = combine(b1, b2, kernel)
    assert figures["grouped_gemm_hbm_fraction"] == 0.85
    assert figures["compute_bound_fraction_of_dense"] == 0.8
    assert figures["decode1_fused_moe_hbm_fraction"] == 0.7 and "sweep" not in figures


def test_b5_ratios_of_its_parts() -> None:
    from tessera.benchmarks.b5 import combine
    from tessera.benchmarks.common import missing_figures

    def part(**figures: float) -> dict:
        return {"figures": figures}

    parts = {"tp1": {"b1": part(decode_ms_per_step=4.0), "b2": part(output_tok_per_s=8000.0)},
             "tp2": {"b1": part(decode_ms_per_step=2.2), "b2": part(output_tok_per_s=15000.0)},
             "pp2": {"b1": part(decode_ms_per_step=4.4), "b2": None}}
    figures = combine(parts)
    assert figures["tp2_b1_ratio"] == pytest.approx(0.55)
    assert figures["tp2_b2_ratio"] == pytest.approx(1.875)
    assert figures["pp2_b1_ratio"] == pytest.approx(1.1)
    assert figures["pp2_b2_ratio"] is None  # its B2 failed: no figure made up
    assert figures["tp2"]["b2_output_tok_per_s"] == 15000.0
    assert not missing_figures({"workload": "B5", "figures": figures})


def test_roofline_sums_the_devices_that_work_at_once() -> None:
    from tessera.benchmarks.roofline import parallel_devices

    h200 = Device(bandwidth_gbps=4220, peak_tflops=794)
    assert h200.times(2) == Device(bandwidth_gbps=8440, peak_tflops=1588)
    assert parallel_devices(2, 1, stages_overlap=False) == 2
    # one request: the stages take turns; a batch in flight per stage: all work
    assert parallel_devices(1, 2, stages_overlap=False) == 1
    assert parallel_devices(2, 2, stages_overlap=True) == 4
    config = read_config_file(str(CONFIGS / "llama3-8b.json"))
    cost = ModelCost.of(config, "bfloat16")
    step = [StepShape((1,), (512,))]
    one = roofline(cost, step, h200).bound_s
    assert roofline(cost, step, h200.times(2)).bound_s == pytest.approx(one / 2)


def test_pipeline_batches_read_the_weights_each() -> None:
    from tessera.benchmarks.roofline import micro_batches

    steps = [StepShape((1, 1, 1), (10, 20, 30)), StepShape((5,), (5,))]
    split = micro_batches(steps, 2)
    assert split == [StepShape((1, 1), (10, 30)), StepShape((1,), (20,)),
                     StepShape((5,), (5,))]
    assert micro_batches(steps, 0) == steps
    config = read_config_file(str(CONFIGS / "llama3-8b.json"))
    cost = ModelCost.of(config, "bfloat16")
    h200 = Device(bandwidth_gbps=4220, peak_tflops=794)
    # two half-batches read the weights twice: the bound grows by one weight read
    whole, halves = (roofline(cost, s, h200).memory_s for s in (steps[:1], split[:2]))
    assert halves - whole == pytest.approx(cost.weight_bytes / 4220e9)


def test_step_cost_counts_causal_attention() -> None:
    cost = ModelCost(weight_bytes=100.0, matmul_params=10.0, kv_bytes_per_token=2.0,
                     attn_flops_per_position=1.0)
    nbytes, flops = step_cost(cost, StepShape((3, 1), (5, 9)))
    assert nbytes == 100 + (5 + 9) * 2
    # request 0: 3 new tokens after 2 cached attend to 3, 4, 5 positions; request 1: 9
    assert flops == 2 * 10 * 4 + (3 + 4 + 5) + 9


def test_simulated_schedule_covers_every_token() -> None:
    prompts, outputs = [30, 50, 20], [4, 2, 3]
    for mixed in (True, False):
        steps = simulate_steps(prompts, outputs, max_running=2, chunk_size=40, mixed=mixed)
        assert sum(sum(s.extend_lens) for s in steps) == sum(prompts) + sum(outputs) - 3
        assert max(len(s.extend_lens) for s in steps) <= 2
        # the first step prefills request 0 whole and the first 10 tokens of request 1
        assert steps[0] == StepShape((30, 10), (30, 10))
    mixed = simulate_steps(prompts, outputs, max_running=2, chunk_size=40)
    # step 2: request 0 decodes while request 1's prefill continues
    assert mixed[1] == StepShape((1, 40), (31, 50))
    limited = simulate_steps(prompts, outputs, max_running=3, chunk_size=0, kv_capacity=60)
    assert all(sum(s.seq_lens) <= 60 for s in limited)
    big = simulate_steps([100] * 8, [10] * 8, max_running=8)
    assert len(big) == 1 + 9  # one prefill step for all, then 9 decode steps
    assert simulate_steps([100], [5], max_running=1, kv_capacity=50) == []
