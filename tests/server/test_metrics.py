"""/metrics scraped during load: counters and histograms move as the requests sent say they
should, and every family has the right Prometheus type. First behind a FakeEngine (exact
token counts, engine stats of every shape), then on the real engine (tiny dummy model)."""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.server.harness import ServerUnderTest

CHAT = "/v1/chat/completions"
LATENCY = ("time_to_first_token_seconds", "inter_token_latency_seconds",
           "time_per_output_token_seconds", "e2e_request_latency_seconds")


def scrape_url(url: str) -> tuple[dict[str, float], dict[str, str]]:
    with urllib.request.urlopen(url + "/metrics", timeout=10) as resp:
        text = resp.read().decode()
    samples, types = {}, {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ", 3)
            types[name.removesuffix("_total") if kind == "counter" else name] = kind
        elif line and not line.startswith("#"):
            key, value = line.rsplit(" ", 1)
            samples[key] = float(value)
    return samples, types


def get(samples: dict[str, float], name: str, **labels: str) -> float:
    inner = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))  # as exposed
    return samples.get(f"{name}{{{inner}}}" if labels else name, 0.0)


def check_histogram(samples: dict[str, float], name: str) -> None:
    """Cumulative buckets never decrease and the +Inf bucket is the count."""
    buckets = sorted(((float(k.split('le="')[1].split('"')[0]), v) for k, v in samples.items()
                      if k.startswith(name + "_bucket{") and "process" not in k))
    values = [v for _, v in buckets]
    assert values == sorted(values), name
    assert values[-1] == samples[name + "_count"], name


def during(load: Callable[[], Any], probe: Callable[[], None], n: int) -> list[Any]:
    """Run `n` copies of `load` in threads, calling `probe` while any runs."""
    results: list[Any] = [None] * n

    def run(i: int) -> None:
        results[i] = load()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads):
        probe()
        time.sleep(0.05)
    for t in threads:
        t.join()
    return results


def test_metrics_follow_the_load_and_are_typed(run_root: Path) -> None:
    srv = ServerUnderTest(token_delay_s=0.02)
    try:
        srv.engine.processes["scheduler"]["stats"].update({
            "steps": 40.0, "retracted_total": 2.0, "kv_usage_ratio": 0.25,
            "cache_hit_tokens": 30.0, "cache_query_tokens": 120.0,
            "queue_depth{channel=scheduler}": 3.0, "breaker_state{channel=worker0}": 0.5,
            "step_seconds_bucket{le=0.01}": 4.0, "step_seconds_bucket{le=0.1}": 9.0,
            "step_seconds_bucket{le=+Inf}": 10.0, "step_seconds_sum": 0.5,
            "step_seconds_count": 10.0})
        time.sleep(0.6)  # the status the server caches is at most 0.5 s old
        before, _ = scrape_url(srv.url)
        in_flight: list[float] = []

        def probe() -> None:
            in_flight.append(get(scrape_url(srv.url)[0], "tessera:num_requests_in_flight"))

        n, max_tokens = 6, 12

        def chat() -> dict[str, Any]:
            status, _, body = srv.request("POST", CHAT, {
                "messages": [{"role": "user", "content": "one two three"}],
                "max_tokens": max_tokens, "ignore_eos": True})
            assert status == 200
            return json.loads(body)["usage"]  # type: ignore[no-any-return]

        usages = during(chat, probe, n)
        after, types = scrape_url(srv.url)
    finally:
        srv.stop()

    def delta(name: str, **labels: str) -> float:
        return get(after, name, **labels) - get(before, name, **labels)

    assert max(in_flight) >= 1 and get(after, "tessera:num_requests_in_flight") == 0
    completion = sum(u["completion_tokens"] for u in usages)
    assert completion == n * max_tokens
    assert delta("tessera:generation_tokens_total") == completion
    assert delta("tessera:prompt_tokens_total") == sum(u["prompt_tokens"] for u in usages)
    assert delta("tessera:http_requests_total", route=CHAT, status="200") == n
    assert delta("tessera:request_success_total", finish_reason="length") == n
    for name in ("time_to_first_token_seconds", "e2e_request_latency_seconds",
                 "time_per_output_token_seconds"):
        assert delta(f"tessera:{name}_count") == n, name
    # one token per delta: every token but each request's first has a gap before it
    assert delta("tessera:inter_token_latency_seconds_count") == completion - n
    # at 20 ms per token, a request's tokens take (tokens - 1) x 20 ms after the first
    tpot_mean = delta("tessera:time_per_output_token_seconds_sum") / n
    assert 0.015 < tpot_mean < 0.5
    assert delta("tessera:time_to_first_token_seconds_sum") < \
        delta("tessera:e2e_request_latency_seconds_sum")
    for name in LATENCY:
        check_histogram(after, f"tessera:{name}")
        assert types[f"tessera:{name}"] == "histogram"
    for name in ("generation_tokens", "prompt_tokens", "http_requests", "request_success",
                 "scheduler_steps", "num_preemptions", "cache_hit_tokens", "process_restarts"):
        assert types[f"tessera:{name}"] == "counter", name
    for name in ("num_requests_in_flight", "num_requests_running", "kv_cache_usage_ratio",
                 "queue_depth", "breaker_state", "process_heartbeat_age_seconds",
                 "process_alive"):
        assert types[f"tessera:{name}"] == "gauge", name
    assert types["tessera:step_seconds"] == "histogram"
    assert get(after, "tessera:scheduler_steps_total", process="scheduler") == 40.0
    assert get(after, "tessera:num_preemptions_total", process="scheduler") == 2.0
    assert get(after, "tessera:kv_cache_usage_ratio", process="scheduler") == 0.25
    assert get(after, "tessera:queue_depth", process="scheduler", channel="scheduler") == 3.0
    assert get(after, "tessera:breaker_state", process="scheduler", channel="worker0") == 0.5
    assert get(after, "tessera:step_seconds_bucket", process="scheduler", le="0.1") == 9.0
    assert get(after, "tessera:step_seconds_count", process="scheduler") == 10.0


TINY = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "intermediate_size": 128, "vocab_size": 512, "max_position_embeddings": 1024,
        "eos_token_id": 2}


@pytest.mark.integration
def test_real_engine_metrics_under_load(tmp_path: Path, run_root: Path) -> None:
    from tessera.benchmarks.server_launch import ServerProcess

    model = tmp_path / "tiny.json"
    model.write_text(json.dumps(TINY))
    args = ["--model", str(model), "--load-format", "dummy", "--hal", "cpu",
            "--max-total-tokens", "2048", "--max-running-requests", "4",
            "--heartbeat-interval-s", "0.1", "--served-model-name", "tiny"]
    # long enough (about 160 steps a wave) that heartbeats carry the queue while it is full
    n, max_tokens = 8, 160
    with ServerProcess(args, log_path=str(tmp_path / "serve.log")) as server:
        server.wait_ready(180)
        time.sleep(0.5)
        before, _ = scrape_url(server.url)
        seen: list[dict[str, float]] = []

        def probe() -> None:
            seen.append(scrape_url(server.url)[0])

        def complete() -> dict[str, Any]:
            req = urllib.request.Request(
                server.url + "/v1/completions", method="POST",
                headers={"Content-Type": "application/json"},
                data=json.dumps({"model": "tiny", "prompt": list(range(3, 40)),
                                 "max_tokens": max_tokens, "ignore_eos": True}).encode())
            with urllib.request.urlopen(req, timeout=120) as resp:
                return json.loads(resp.read())["usage"]  # type: ignore[no-any-return]

        usages = during(complete, probe, n)
        time.sleep(0.5)  # the last heartbeats reach the supervisor
        after, types = scrape_url(server.url)

    def delta(name: str, **labels: str) -> float:
        return get(after, name, **labels) - get(before, name, **labels)

    assert sum(u["completion_tokens"] for u in usages) == n * max_tokens
    assert delta("tessera:generation_tokens_total") == n * max_tokens
    assert delta("tessera:request_success_total", finish_reason="length") == n
    assert delta("tessera:time_to_first_token_seconds_count") == n
    sched = {"process": "scheduler"}
    # 8 requests, 4 at a time: some waited while others ran
    assert max(get(s, "tessera:num_requests_running", **sched) for s in seen) >= 1
    assert max(get(s, "tessera:num_requests_running", **sched) for s in seen) <= 4
    assert max(get(s, "tessera:num_requests_waiting", **sched) for s in seen) >= 1
    usage = [get(s, "tessera:kv_cache_usage_ratio", **sched) for s in seen]
    assert all(0.0 <= u <= 1.0 for u in usage) and max(usage) > 0
    assert get(after, "tessera:kv_cache_usage_ratio", **sched) == 0.0  # all finished
    steps = delta("tessera:scheduler_steps_total", **sched)
    assert steps >= max_tokens * 2  # two waves of 4
    assert delta("tessera:step_seconds_count", **sched) >= steps - 2  # last beats may lag
    check_histogram(after, "tessera:e2e_request_latency_seconds")
    for process in ("worker0", "scheduler", "detokenizer", "tokenizer0", "server"):
        assert 0 <= get(after, "tessera:process_heartbeat_age_seconds", process=process) < 5
    assert get(after, "tessera:breaker_state", process="tokenizer0", channel="scheduler") == 0
    assert get(after, "tessera:queue_depth", process="scheduler", channel="scheduler") >= 0
    assert types["tessera:step_seconds"] == "histogram"
    assert types["tessera:scheduler_decode_tokens"] == "counter"
    assert get(after, "tessera:startup_ready_seconds") > 0
    assert get(after, "tessera:startup_phase_seconds", phase="weights") > 0


@pytest.mark.integration
def test_speculation_reports_each_requests_acceptance_length(tmp_path: Path,
                                                             run_root: Path) -> None:
    """With --speculative-algorithm ngram, a prompt that repeats a segment: /generate's
    meta_info has the steps behind the tokens, and /metrics the tokens-per-step histogram and
    the scheduler's speculation counters."""
    from tessera.benchmarks.server_launch import ServerProcess

    model = tmp_path / "tiny.json"
    model.write_text(json.dumps(TINY))
    args = ["--model", str(model), "--load-format", "dummy", "--hal", "cpu",
            "--max-total-tokens", "2048", "--max-running-requests", "4",
            "--heartbeat-interval-s", "0.1", "--speculative-algorithm", "ngram",
            "--speculative-num-draft-tokens", "4"]
    # the tiny random model falls into loops: prompt lookup finds its continuation
    prompt = list(range(3, 19)) * 4
    with ServerProcess(args, log_path=str(tmp_path / "serve.log")) as server:
        server.wait_ready(180)
        req = urllib.request.Request(
            server.url + "/generate", method="POST", headers={"Content-Type": "application/json"},
            data=json.dumps({"input_ids": prompt, "sampling_params": {
                "max_new_tokens": 48, "temperature": 0, "ignore_eos": True}}).encode())
        with urllib.request.urlopen(req, timeout=120) as resp:
            meta = json.loads(resp.read())["meta_info"]
        time.sleep(0.5)  # the scheduler's next heartbeat carries its counters
        after, types = scrape_url(server.url)
    assert meta["completion_tokens"] == 48
    assert 0 < meta["decode_steps"] < 48  # more than one token in some steps
    assert types["tessera:request_tokens_per_step"] == "histogram"
    assert get(after, "tessera:request_tokens_per_step_count") == 1
    assert get(after, "tessera:request_tokens_per_step_sum") == pytest.approx(
        48 / meta["decode_steps"])
    sched = {"process": "scheduler"}
    accepted = get(after, "tessera:scheduler_spec_accepted_tokens_total", **sched)
    assert accepted == 48 - meta["decode_steps"]  # each step: its own token + the accepted
    assert get(after, "tessera:scheduler_spec_draft_tokens_total", **sched) >= accepted
