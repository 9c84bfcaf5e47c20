"""`tessera bench host` end to end: every engine process but the worker, whose place the fake
takes, its steps timed by the simulator's model at the cuda graphs' padded sizes. The fake
worker reports those sizes as the real one reports its graphs', so with --fill-padded-steps
(the default) the scheduler's prefill steps run with their padding filled by prompt tokens,
and with --no-fill-padded-steps they carry the padding; each tier is replayed through the
simulator with the same flags."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tessera.benchmarks import bench_host
from tessera.benchmarks.step_trace import summarize


def host_run(tmp_path: Path, name: str, server_args: str) -> tuple[dict[str, Any], list[dict]]:
    """Four users, two requests each, of long prompts (chunked beside the others' decodes)."""
    traces = tmp_path / f"trace_{name}"
    assert bench_host.main([
        "--cost-model", "tokens", "--padded", "--concurrency", "4",
        "--requests-per-concurrency", "2", "--prompt-len", "1500,2000", "--output-len", "30,60",
        "--server-args", f"{server_args} --trace-messages-dir {traces}",
        "--out-dir", str(tmp_path), "--name", name]) == 0
    result = json.loads((tmp_path / f"{name}.json").read_text())
    mixed = [r for r in summarize(str(traces))["rows"] if r["kind"] == "mixed"]
    return result["figures"]["tiers"][0], mixed


def test_filled_prefill_steps_carry_prompt_tokens_where_the_padding_was(tmp_path) -> None:
    filled_tier, filled = host_run(tmp_path, "filled", "--fill-padded-steps")
    plain_tier, plain = host_run(tmp_path, "plain", "--no-fill-padded-steps")
    for tier in (filled_tier, plain_tier):
        assert tier["errors"] == 0 and tier["sim_output_tok_per_s"] > 0, tier
        assert tier["fraction_of_sim"] > 0.5, tier
    # Unfilled, the protected chunk (256 beside 2-3 decodes) runs as the 320-token
    # graph: ~60 tokens of padding a step. With it the chunk takes the padding's place.
    def padding(rows: list[dict]) -> float:
        return sum(r["padded"] - r["tokens"] for r in rows) / len(rows)

    def unpadded(rows: list[dict]) -> float:
        return sum(r["padded"] == r["tokens"] for r in rows) / len(rows)

    assert padding(plain) > 30 and unpadded(plain) < 0.25, plain
    assert padding(filled) < 8 and unpadded(filled) > 0.75, filled
    # the simulator replays each tier with the engine's flags: the filled one prefills more
    assert filled_tier["sim_ttft_p50_ms"] < plain_tier["sim_ttft_p50_ms"]


def test_the_replay_takes_the_engines_batching_flags() -> None:
    assert bench_host.engine_batching([]) == {}
    assert bench_host.engine_batching(["--no-fill-padded-steps", "--max-mixed-step-ratio", "2",
                                       "--trace-messages-dir", "/x"]) == \
        {"fill_padded_steps": False, "max_mixed_step_ratio": 2.0}
    assert bench_host.engine_batching(["--fill-padded-steps"]) == {}  # the default
    # --overlap-steps stays the simulator's (the cuda plugin's three steps in flight)
    assert bench_host.engine_batching(["--overlap-steps", "2"]) == {}
