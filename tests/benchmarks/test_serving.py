"""The serving benchmark against a fake streaming server: timings, tiers, B3/B4 result JSON."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tessera.benchmarks import serving
from tessera.benchmarks.common import missing_figures
from tessera.benchmarks.datasets import random_requests
from tessera.benchmarks.http_client import parse_prometheus, parse_sse_line
from tessera.benchmarks.serving_driver import run_tier, tier_stats

from .fake_openai import FakeOpenAI


@pytest.fixture
def fake() -> Iterator[FakeOpenAI]:
    server = FakeOpenAI(token_delay_s=0.002)
    yield server
    server.close()


def test_parse_sse_and_prometheus() -> None:
    assert parse_sse_line(b'data: {"a": 1}\n') == {"a": 1}
    assert parse_sse_line(b"data: [DONE]\n") is None
    assert parse_sse_line(b": keep-alive\n") is None
    metrics = parse_prometheus('# HELP x\nfoo_total 3\nbar{a="b"} 2.5\nbad line x\n')
    assert metrics == {"foo_total": 3.0, 'bar{a="b"}': 2.5}


def test_run_tier_times_every_request(fake: FakeOpenAI) -> None:
    reqs = random_requests(6, (8, 16), (3, 5), 1000, seed=1)
    metrics, wall = asyncio.run(run_tier(fake.url, reqs, concurrency=2))
    assert len(metrics) == 6 and all(m.ok for m in metrics)
    assert [m.output_tokens for m in metrics] == [r.output_len for r in reqs]
    assert all(len(m.itl_s) == m.output_tokens - 1 for m in metrics)
    assert all(m.ttft_s > 0 and m.e2e_s >= m.ttft_s for m in metrics)
    assert [b["prompt"] for b in fake.bodies] == [r.prompt_ids for r in reqs]
    assert all(b["ignore_eos"] and b["stream"] for b in fake.bodies)
    stats = tier_stats(metrics, wall, concurrency=2)
    assert stats["errors"] == 0 and stats["completed"] == 6
    assert stats["total_output_tokens"] == sum(r.output_len for r in reqs)
    assert stats["itl_p50_ms"] >= 1.0  # the fake waits 2 ms per token
    assert stats["ttft_p99_ms"] >= stats["ttft_p50_ms"]


def test_native_api_counts_tokens_without_text(fake: FakeOpenAI) -> None:
    reqs = random_requests(3, (8, 8), (4, 4), 1000, seed=2)
    metrics, wall = asyncio.run(run_tier(fake.url, reqs, concurrency=3, api="native"))
    assert all(m.ok and m.output_tokens == 4 and len(m.itl_s) == 3 for m in metrics)
    assert fake.bodies[0]["input_ids"] == reqs[0].prompt_ids
    assert fake.bodies[0]["sampling_params"]["ignore_eos"] is True


def test_errors_are_counted_not_raised() -> None:
    server = FakeOpenAI(fail_every=2)
    try:
        reqs = random_requests(4, (4, 4), (2, 2), 1000)
        metrics, wall = asyncio.run(run_tier(server.url, reqs, concurrency=4))
    finally:
        server.close()
    stats = tier_stats(metrics, wall, concurrency=4)
    assert stats["errors"] == 2
    assert "HTTP 503" in stats["error_samples"][0]


def test_b3_writes_tiers(fake: FakeOpenAI, tmp_path: Path) -> None:
    rc = serving.main(["--workload", "B3", "--base-url", fake.url, "--vocab-size", "1000",
                       "--concurrency", "1,4", "--prompt-len", "8,16", "--output-len", "2,4",
                       "--min-requests", "4", "--out-dir", str(tmp_path), "--name", "b3"])
    assert rc == 0
    result = json.loads((tmp_path / "b3.json").read_text())
    assert result["workload"] == "B3" and not missing_figures(result)
    assert [t["concurrency"] for t in result["figures"]["tiers"]] == [1, 4]
    assert result["figures"]["tiers"][1]["requests"] == 16
    for name in result.get("plots", []):
        assert (tmp_path / name).is_file()


def test_b4_hit_rate_and_speedup(tmp_path: Path) -> None:
    cached, uncached = FakeOpenAI(), FakeOpenAI(cache=False)
    try:
        rc = serving.main(["--workload", "B4", "--base-url", cached.url, "--no-cache-url",
                           uncached.url, "--vocab-size", "1000", "--groups", "2",
                           "--group-size", "3", "--prefix-len", "32", "--suffix-len", "8",
                           "--prefix-output-len", "2", "--concurrency", "1", "--warmup", "0",
                           "--out-dir", str(tmp_path), "--name", "b4"])
    finally:
        cached.close()
        uncached.close()
    assert rc == 0
    figures = json.loads((tmp_path / "b4.json").read_text())["figures"]
    # 4 of 6 requests reuse a 32-token prefix of a 40-token prompt
    assert figures["ideal_hit_rate"] == pytest.approx(4 * 32 / (6 * 40))
    assert figures["cache_hit_rate"] == pytest.approx(figures["ideal_hit_rate"])
    assert figures["no_cache"]["cache_hit_rate"] == 0
    assert figures["speedup_vs_no_cache"] > 0


def test_b8_compares_plain_and_schema_tiers_in_one_run(fake: FakeOpenAI, tmp_path: Path) -> None:
    from tessera.benchmarks.grammar_serving import SCHEMA

    doc = {"id": 1, "title": "t", "tags": [], "author": {"name": "a", "email": "e"},
           "status": "draft", "body": "b"}
    fake.document = json.dumps(doc)
    rc = serving.main(["--workload", "B8", "--base-url", fake.url, "--vocab-size", "1000",
                       "--concurrency", "4", "--prompt-len", "8,16", "--output-len", "60,80",
                       "--min-requests", "8", "--warmup", "2", "--out-dir", str(tmp_path),
                       "--name", "b8"])
    assert rc == 0
    result = json.loads((tmp_path / "b8.json").read_text())
    figures = result["figures"]
    assert result["workload"] == "B8" and missing_figures(result) == []
    plain, grammar = figures["plain"], figures["grammar"]
    assert figures["fraction_of_plain"] == pytest.approx(
        grammar["output_tok_per_s"] / plain["output_tok_per_s"])
    # two rounds a side: each side pools its rounds, both rounds' throughputs are kept
    assert figures["grammar_outcomes"] == {"finished_by_grammar": 32, "parsed_json": 32,
                                           "valid_json": 32, "cut_by_max_tokens": 0}
    assert figures["schema"] == SCHEMA and figures["errors"] == 0
    for side in (plain, grammar):
        assert len(side["rounds_output_tok_per_s"]) == 2
        assert side["requests"] == 32
    warm, measured = fake.bodies[:12], fake.bodies[12:]
    # 16 requests in the order plain, schema, schema, plain; the same lengths every round,
    # prompts of its own (the prefix cache must not serve a later round from an earlier one)
    assert len(measured) == 64
    assert [("response_format" in b) for b in measured[::16]] == [False, True, True, False]
    assert all(("response_format" in b) == ("response_format" in measured[16 * (i // 16)])
               for i, b in enumerate(measured))
    rounds = [measured[16 * r:16 * (r + 1)] for r in range(4)]
    shapes = [sorted((len(b["prompt"]), b["max_tokens"]) for b in r) for r in rounds]
    assert shapes[0] == shapes[1] == shapes[2] == shapes[3]
    prompts = [{str(b["prompt"]) for b in r} for r in rounds]
    assert all(len(p) == 16 for p in prompts)
    assert all(not prompts[i] & prompts[j] for i in range(4) for j in range(i + 1, 4))
    # the warm-up ran at the tier's concurrency with and without the schema
    # (2 short requests, then 4 at the tier's concurrency and lengths; plain, then with the
    # schema), none of them among the measured prompts
    assert [("response_format" in b) for b in warm] == [False] * 6 + [True] * 6
    assert [b["max_tokens"] <= 8 for b in warm] == ([True] * 2 + [False] * 4) * 2
    assert not {str(b["prompt"]) for b in warm} & {str(b["prompt"]) for b in measured}


def test_b8_outcomes_without_jsonschema_still_count_parsed_documents(monkeypatch) -> None:
    """The GPU machine has no jsonschema: B8 still says how many outputs were whole JSON
    documents with every required field."""
    import sys

    from tessera.benchmarks.grammar_serving import SCHEMA, json_outcomes
    from tessera.benchmarks.http_client import RequestMetrics

    monkeypatch.setitem(sys.modules, "jsonschema", None)  # import fails as if absent
    whole = json.dumps({k: "x" for k in SCHEMA["required"]})
    rows = []
    for text, reason in ((whole, "stop"), ('{"id": 1}', "stop"), ("{", "stop"),
                         ('{"id": ', "length")):
        rows.append(RequestMetrics(ok=True, prompt_len=1, text=text, finish_reason=reason))
    assert json_outcomes(rows) == {"finished_by_grammar": 3, "parsed_json": 1,
                                   "valid_json": None, "cut_by_max_tokens": 1}
