"""docs/grafana-dashboard.json is an importable dashboard whose every query names a metric
/metrics exposes, with the type the query assumes (rate() of a counter, quantiles of a
histogram's buckets, a gauge as it is); the page's history turns metrics into per-interval
figures."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

from tests.server.harness import ServerUnderTest
from tests.server.test_metrics import CHAT, scrape_url

DASHBOARD = Path(__file__).parents[2] / "docs" / "grafana-dashboard.json"


def _queries() -> list[str]:
    dash = json.loads(DASHBOARD.read_text())
    assert dash["uid"] and dash["panels"]
    ids = [p["id"] for p in dash["panels"]]
    assert len(set(ids)) == len(ids)
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    for var in dash["templating"]["list"]:
        if var["type"] == "query":
            exprs.append(var["definition"])
    return exprs


def test_every_dashboard_query_names_an_exposed_metric_of_its_type(run_root: Path) -> None:
    srv = ServerUnderTest(token_delay_s=0.0)
    try:
        srv.engine.processes["scheduler"]["stats"].update({
            "running": 1.0, "waiting": 0.0, "retracted_total": 0.0, "kv_usage_ratio": 0.1,
            "cache_hit_rate": 0.5, "cache_hit_tokens": 3.0, "cache_query_tokens": 6.0,
            "queue_depth{channel=scheduler}": 0.0, "breaker_state{channel=worker0}": 0.0,
            "step_seconds_bucket{le=+Inf}": 1.0, "step_seconds_sum": 0.01,
            "step_seconds_count": 1.0, "spec_draft_tokens_total": 4.0,
            "spec_accepted_tokens_total": 2.0})
        srv.engine.startup = {"ready_s": 2.0, "phases": {"weights": 1.5, "warmup": 0.5}}
        time.sleep(0.6)  # the status the server caches is at most 0.5 s old
        status, _, _ = srv.request("POST", CHAT, {
            "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3})
        assert status == 200
        _, types = scrape_url(srv.url)
    finally:
        srv.stop()
    names = {n for q in _queries() for n in re.findall(r"tessera:[a-z0-9_]+", q)}
    assert len(names) > 15
    for name in sorted(names):
        if name.endswith("_bucket"):
            assert types.get(name.removesuffix("_bucket")) == "histogram", name
        elif name.endswith("_total"):
            assert types.get(name.removesuffix("_total")) == "counter", name
        else:
            assert types.get(name) == "gauge", name
    # rate() only over counters and buckets
    for q in _queries():
        for inner in re.findall(r"(?:rate|increase)\((tessera:[a-z0-9_]+)", q):
            assert inner.endswith(("_total", "_bucket")), q


def test_history_samples_what_happened_in_each_interval() -> None:
    from tessera.bus.messages import StatusReply
    from tessera.server.history import History
    from tessera.server.metrics import ServerMetrics

    metrics = ServerMetrics()
    history = History(metrics, window_s=6.0, interval_s=2.0)  # keeps 3 samples
    assert history.sample(None, 0) is None  # the first call starts the first interval
    metrics.generation_tokens.inc(40)
    metrics.prompt_tokens.inc(10)
    metrics.ttft.observe(0.1)
    metrics.ttft.observe(0.3)
    metrics.request_success.labels("stop").inc()
    status = StatusReply(nonce=0, ready=True, processes={"scheduler": {
        "alive": True, "stats": {"running": 2.0, "waiting": 1.0, "kv_usage_ratio": 0.25,
                                 "cache_hit_rate": 0.5}}}, startup={})
    time.sleep(0.05)
    s = history.sample(status, 2)
    assert s is not None
    assert s.requests_done == 1 and s.ttft_ms is not None and abs(s.ttft_ms - 200.0) < 1e-6
    assert s.itl_ms is None  # nothing observed in the interval
    assert s.output_tok_s > 0 and abs(s.output_tok_s / s.prompt_tok_s - 4.0) < 1e-3  # rounded
    assert (s.running, s.waiting, s.kv_usage_ratio, s.cache_hit_rate) == (2.0, 1.0, 0.25, 0.5)
    assert s.in_flight == 2
    quiet = history.sample(None, 0)  # nothing new: zero rates, no means, no engine stats
    assert quiet is not None and quiet.output_tok_s == 0 and quiet.ttft_ms is None
    assert quiet.running is None
    for _ in range(3):
        history.sample(None, 0)
    assert len(history.samples()) == 3 and history.samples()[-1]["requests_done"] == 0
