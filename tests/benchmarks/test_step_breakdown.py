"""B3's per-step breakdown from the server's /metrics: the heartbeat stats of every process,
exported as counters, turned into busy/idle time, tokens and CPU per scheduler step."""

from __future__ import annotations

import pytest
from prometheus_client import generate_latest

from tessera.benchmarks.http_client import parse_prometheus
from tessera.benchmarks.serving import step_breakdown
from tessera.bus.messages import StatusReply
from tessera.server.metrics import ServerMetrics


def scrape(steps: float, busy_ms: float, prefill: float, decode: float,
           cpu: dict[str, float]) -> dict[str, float]:
    """What /metrics says when the processes' last heartbeats carried these numbers."""
    stats = {
        "scheduler": {"steps": steps, "prefill_tokens_total": prefill,
                      "decode_tokens_total": decode},
        "worker0": {"forward_ms_total": busy_ms, "steps": steps},
        "detokenizer": {}, "tokenizer0": {}, "server": {},
    }
    metrics = ServerMetrics()
    metrics.engine.status = StatusReply(nonce=1, ready=True, processes={
        name: {"alive": True, "pid": 1, "age_s": 0.1,
               "stats": {**values, "cpu_s": cpu[name]}} for name, values in stats.items()})
    return parse_prometheus(generate_latest(metrics.registry).decode())


def test_breakdown_per_step() -> None:
    cpu0 = {"scheduler": 1.0, "worker0": 5.0, "detokenizer": 0.5, "tokenizer0": 0.1,
            "server": 2.0}
    cpu1 = {"scheduler": 1.2, "worker0": 6.0, "detokenizer": 0.6, "tokenizer0": 0.1,
            "server": 2.5}
    before = scrape(100, 600.0, 1000, 3200, cpu0)
    after = scrape(300, 1800.0, 11000, 9600, cpu1)
    got = step_breakdown(before, after, wall_s=1.6)
    assert got is not None
    assert got["steps"] == 200
    assert got["wall_ms_per_step"] == pytest.approx(8.0)
    assert got["worker_busy_ms_per_step"] == pytest.approx(6.0)
    assert got["worker_idle_ms_per_step"] == pytest.approx(2.0)
    assert got["prefill_tokens_per_step"] == pytest.approx(50.0)
    assert got["decode_tokens_per_step"] == pytest.approx(32.0)
    assert got["cpu_ms_per_step"] == pytest.approx({
        "detokenizer": 0.5, "scheduler": 1.0, "server": 2.5, "tokenizer0": 0.0,
        "worker0": 5.0})


def test_no_breakdown_without_the_counters() -> None:
    assert step_breakdown({}, {}, 1.0) is None
