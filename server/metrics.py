"""Prometheus metrics: the server's own counters and histograms, plus every engine process's
heartbeat stats (from the supervisor's StatusReply) as gauges.

An engine stat `running` of process `scheduler` becomes `tessera_scheduler_running
{process="scheduler"}`; ranks share a family (`tessera_worker_forward_ms{process="worker1"}`).
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from tessera.bus.messages import StatusReply

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
                    120.0, 300.0)


def _metric_name(*parts: str) -> str:
    return re.sub(r"[^a-zA-Z0-9_]", "_", "_".join(parts)).lower()


class EngineStatusCollector(Collector):
    """Gauges from the latest StatusReply the server has seen (refreshed on each scrape)."""

    def __init__(self) -> None:
        self.status: StatusReply | None = None

    def collect(self) -> Iterator[Metric]:
        status = self.status
        if status is None:
            return
        ready = GaugeMetricFamily("tessera_engine_ready", "1 once every process is ready")
        ready.add_metric([], 1.0 if status.ready else 0.0)
        yield ready
        alive = GaugeMetricFamily("tessera_process_alive", "1 while a process heartbeats",
                                  labels=["process"])
        age = GaugeMetricFamily("tessera_process_heartbeat_age_seconds",
                                "seconds since a process's last heartbeat", labels=["process"])
        restarts = GaugeMetricFamily("tessera_process_restarts",
                                     "times the supervisor restarted a process",
                                     labels=["process"])
        stats: dict[str, GaugeMetricFamily] = {}
        for process, info in sorted(status.processes.items()):
            if not isinstance(info, dict):
                continue
            alive.add_metric([process], 1.0 if info.get("alive") else 0.0)
            if isinstance(info.get("age_s"), int | float):
                age.add_metric([process], float(info["age_s"]))
            if isinstance(info.get("restarts"), int):
                restarts.add_metric([process], float(info["restarts"]))
            kind = re.sub(r"\d+$", "", process) or process
            for stat, value in (info.get("stats") or {}).items():
                if isinstance(value, bool) or not isinstance(value, int | float):
                    continue
                name = _metric_name("tessera", kind, str(stat))
                family = stats.get(name)
                if family is None:
                    family = stats[name] = GaugeMetricFamily(
                        name, f"{kind} heartbeat stat {stat}", labels=["process"])
                family.add_metric([process], float(value))
        yield alive
        yield age
        yield restarts
        yield from stats.values()


class ServerMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("tessera_http_requests", "HTTP requests by route and status",
                                ["route", "status"], registry=r)
        self.errors = Counter("tessera_http_errors", "HTTP error answers by status and type",
                              ["status", "type"], registry=r)
        self.in_flight = Gauge("tessera_generation_requests_in_flight",
                               "generation requests being served", registry=r)
        self.ttft = Histogram("tessera_time_to_first_token_seconds",
                              "request arrival to first output", buckets=_LATENCY_BUCKETS,
                              registry=r)
        self.e2e = Histogram("tessera_e2e_request_latency_seconds",
                             "request arrival to last output", buckets=_LATENCY_BUCKETS,
                             registry=r)
        self.prompt_tokens = Counter("tessera_prompt_tokens", "prompt tokens processed",
                                     registry=r)
        self.generation_tokens = Counter("tessera_generation_tokens", "tokens generated",
                                         registry=r)
        self.tokens_per_step = Histogram(
            "tessera_request_tokens_per_step", "completion tokens per engine step of each "
            "finished choice: its mean acceptance length under speculative decoding (1 "
            "without)", buckets=(1.0, 1.25, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0, 12.0, 17.0),
            registry=r)
        self.rate_limited = Counter("tessera_rate_limited_requests",
                                    "generations refused (429) by their API key's rate limits",
                                    ["key"], registry=r)
        self.engine = EngineStatusCollector()
        r.register(self.engine)
