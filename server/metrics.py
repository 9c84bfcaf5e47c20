"""Prometheus metrics, named as the field names them (`tessera:` like `vllm:`), typed right.

Served by the HTTP server itself (it sees every request):
    tessera:time_to_first_token_seconds     histogram  arrival -> first output
    tessera:inter_token_latency_seconds     histogram  gap between output tokens (ITL)
    tessera:time_per_output_token_seconds   histogram  per request: (E2E - TTFT) / (tokens - 1)
    tessera:e2e_request_latency_seconds     histogram  arrival -> last output
    tessera:prompt_tokens / generation_tokens / request_success{finish_reason}   counters
    tessera:http_requests{route,status}, tessera:http_errors{status,type}        counters
    tessera:num_requests_in_flight          gauge      HTTP generation requests being served
    tessera:startup_ready_seconds, tessera:startup_phase_seconds{phase}          gauges

From the engine's processes (their heartbeat stats, via the supervisor's StatusReply, refreshed
on each scrape), every one with a `process` label:
    tessera:num_requests_running / waiting, tessera:kv_cache_usage_ratio, tessera:cache_hit_rate
    tessera:cache_hit_tokens / cache_query_tokens, tessera:num_preemptions     counters
    tessera:step_seconds                    histogram  the worker's time per step
    tessera:queue_depth{channel}, tessera:breaker_state{channel} (0 closed, .5 half, 1 open)
    tessera:process_heartbeat_age_seconds, tessera:process_alive, tessera:process_restarts
    tessera:<process kind>_<stat>           any other stat: a counter when it only grows
                                            (COUNTER_STATS, or a name ending in _total), else
                                            a gauge
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
)
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from tessera.bus.messages import StatusReply
from tessera.bus.stats import parse_stat

# No `<counter>_created` gauges beside every counter: dashboards never use them.
disable_created_metrics()

PREFIX = "tessera:"
_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
                    120.0, 300.0)
_TOKEN_BUCKETS = (0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.04, 0.05, 0.075,
                  0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.5, 5.0)

# Heartbeat stats with a name of the field's habit (kind, stat) -> (name, type, help).
NAMED_STATS: dict[tuple[str, str], tuple[str, str, str]] = {
    ("scheduler", "running"): ("num_requests_running", "gauge", "requests being decoded"),
    ("scheduler", "waiting"): ("num_requests_waiting", "gauge", "requests waiting to start"),
    ("scheduler", "kv_usage_ratio"): ("kv_cache_usage_ratio", "gauge",
                                      "share of KV pages held by running requests (0-1)"),
    ("scheduler", "cache_hit_rate"): ("cache_hit_rate", "gauge",
                                      "prompt tokens found in the prefix cache, since start"),
    ("scheduler", "cache_hit_tokens"): ("cache_hit_tokens", "counter",
                                        "prompt tokens found in the prefix cache"),
    ("scheduler", "cache_query_tokens"): ("cache_query_tokens", "counter",
                                          "prompt tokens looked up in the prefix cache"),
    ("scheduler", "retracted_total"): ("num_preemptions", "counter",
                                       "requests retracted (preempted) to free KV pages"),
    ("scheduler", "step_seconds"): ("step_seconds", "histogram",
                                    "the worker's time per step (scheduler's view)"),
    ("*", "queue_depth"): ("queue_depth", "gauge",
                           "messages received on a channel, not yet taken by the process"),
    ("*", "breaker_state"): ("breaker_state", "gauge",
                             "circuit breaker of a channel: 0 closed, 0.5 half-open, 1 open"),
}
# Stats that only grow (counters) although their names do not end in _total.
COUNTER_STATS = frozenset({
    "steps", "tokens", "failed_steps", "dropped_messages", "cpu_s", "accepted", "rejected",
    "unavailable", "aborts", "outputs_sent", "messages_sent", "rows_dropped", "clients_gone",
    "batches_sent", "detokenizer_messages_sent", "send_failures", "bus_messages_received",
    "loop_wakeups", "sse_events", "sse_writes", "forward_ms_total",
})


def _name(*parts: str) -> str:
    return PREFIX + re.sub(r"[^a-zA-Z0-9_]", "_", "_".join(parts)).lower()


def stat_metric(kind: str, stat: str) -> tuple[str, str, str]:
    """(metric name as exposed, type, help) of the heartbeat stat `stat` of a `kind` process.
    A counter's exposed name ends in _total."""
    named = NAMED_STATS.get((kind, stat)) or NAMED_STATS.get(("*", stat))
    if named is not None:
        name, kind_of, help_ = named
        base = PREFIX + name
    else:
        counter = stat in COUNTER_STATS or stat.endswith("_total")
        kind_of = "counter" if counter else "gauge"
        base = _name(kind, stat.removesuffix("_total") if counter else stat)
        help_ = f"{kind} heartbeat stat {stat}"
    exposed = base + "_total" if kind_of == "counter" else base
    return exposed, kind_of, help_


def _histograms(stats: dict[str, Any]) -> tuple[dict[str, dict[str, Any]], set[str]]:
    """name -> {"buckets": [(le, count)], "sum", "count"}, and the stat keys they used."""
    found: dict[str, dict[str, Any]] = {}
    used: set[str] = set()
    for key, value in stats.items():
        name, labels = parse_stat(key)
        if name.endswith("_bucket") and "le" in labels:
            base = name.removesuffix("_bucket")
            found.setdefault(base, {"buckets": []})["buckets"].append((labels["le"], value))
            used.add(key)
    for base, hist in found.items():
        hist["sum"] = float(stats.get(f"{base}_sum", 0.0))
        hist["count"] = float(stats.get(f"{base}_count", 0.0))
        used |= {f"{base}_sum", f"{base}_count"}
        hist["buckets"].sort(key=lambda b: float("inf") if b[0] == "+Inf" else float(b[0]))
    return found, used


class EngineStatusCollector(Collector):
    """Families from the latest StatusReply the server has seen (refreshed on each scrape)."""

    def __init__(self) -> None:
        self.status: StatusReply | None = None

    def collect(self) -> Iterator[Metric]:
        status = self.status
        if status is None:
            return
        ready = GaugeMetricFamily(PREFIX + "engine_ready", "1 once every process is ready")
        ready.add_metric([], 1.0 if status.ready else 0.0)
        yield ready
        yield from self._startup(status.startup)
        alive = GaugeMetricFamily(PREFIX + "process_alive", "1 while a process heartbeats",
                                  labels=["process"])
        age = GaugeMetricFamily(PREFIX + "process_heartbeat_age_seconds",
                                "seconds since a process's last heartbeat", labels=["process"])
        restarts = CounterMetricFamily(PREFIX + "process_restarts",
                                       "times the supervisor restarted a process",
                                       labels=["process"])
        families: dict[str, Metric] = {}
        for process, info in sorted(status.processes.items()):
            if not isinstance(info, dict):
                continue
            alive.add_metric([process], 1.0 if info.get("alive") else 0.0)
            if isinstance(info.get("age_s"), int | float) and info["age_s"] >= 0:
                age.add_metric([process], float(info["age_s"]))
            if isinstance(info.get("restarts"), int):
                restarts.add_metric([process], float(info["restarts"]))
            kind = re.sub(r"\d+$", "", process) or process
            stats = {k: v for k, v in (info.get("stats") or {}).items()
                     if isinstance(v, int | float) and not isinstance(v, bool)}
            hists, used = _histograms(stats)
            for base, hist in hists.items():
                name, _, help_ = stat_metric(kind, base)
                family = families.get(name)
                if family is None:
                    family = families[name] = HistogramMetricFamily(name, help_,
                                                                    labels=["process"])
                assert isinstance(family, HistogramMetricFamily)
                family.add_metric([process], [(le, v) for le, v in hist["buckets"]],
                                  sum_value=hist["sum"])
            grouped: dict[tuple[str, tuple[str, ...]], list[tuple[list[str], float]]] = \
                defaultdict(list)
            for key, value in stats.items():
                if key in used:
                    continue
                stat, labels = parse_stat(key)
                names = tuple(sorted(labels))
                grouped[(stat, names)].append(([labels[n] for n in names], float(value)))
            for (stat, names), samples in grouped.items():
                name, kind_of, help_ = stat_metric(kind, stat)
                family = families.get(name)
                if family is None:
                    cls = CounterMetricFamily if kind_of == "counter" else GaugeMetricFamily
                    family = families[name] = cls(name.removesuffix("_total")
                                                  if kind_of == "counter" else name, help_,
                                                  labels=["process", *names])
                assert isinstance(family, CounterMetricFamily | GaugeMetricFamily)
                for values, value in samples:
                    family.add_metric([process, *values], value)
        yield alive
        yield age
        yield restarts
        yield from families.values()

    @staticmethod
    def _startup(startup: dict[str, Any]) -> Iterator[Metric]:
        if not startup:
            return
        ready = GaugeMetricFamily(PREFIX + "startup_ready_seconds",
                                  "`tessera serve` launch to every process ready")
        ready.add_metric([], float(startup.get("ready_s", 0.0)))
        yield ready
        phases = GaugeMetricFamily(PREFIX + "startup_phase_seconds",
                                   "start-up time by phase (they add up to ready_seconds)",
                                   labels=["phase"])
        for phase, seconds in (startup.get("phases") or {}).items():
            phases.add_metric([phase], float(seconds))
        yield phases


class ServerMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(PREFIX + "http_requests", "HTTP requests by route and status",
                                ["route", "status"], registry=r)
        self.errors = Counter(PREFIX + "http_errors", "HTTP error answers by status and type",
                              ["status", "type"], registry=r)
        self.in_flight = Gauge(PREFIX + "num_requests_in_flight",
                               "HTTP generation requests being served", registry=r)
        self.ttft = Histogram(PREFIX + "time_to_first_token_seconds",
                              "request arrival to first output", buckets=_LATENCY_BUCKETS,
                              registry=r)
        self.itl = Histogram(PREFIX + "inter_token_latency_seconds",
                             "time between two output tokens of a request",
                             buckets=_TOKEN_BUCKETS, registry=r)
        self.tpot = Histogram(PREFIX + "time_per_output_token_seconds",
                              "per request: (E2E - TTFT) / (output tokens - 1)",
                              buckets=_TOKEN_BUCKETS, registry=r)
        self.e2e = Histogram(PREFIX + "e2e_request_latency_seconds",
                             "request arrival to last output", buckets=_LATENCY_BUCKETS,
                             registry=r)
        self.prompt_tokens = Counter(PREFIX + "prompt_tokens", "prompt tokens processed",
                                     registry=r)
        self.generation_tokens = Counter(PREFIX + "generation_tokens", "tokens generated",
                                         registry=r)
        self.tokens_per_step = Histogram(
            PREFIX + "request_tokens_per_step", "completion tokens per engine step of each "
            "finished choice: its mean acceptance length under speculative decoding (1 "
            "without)", buckets=(1.0, 1.25, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0, 12.0, 17.0),
            registry=r)
        self.request_success = Counter(PREFIX + "request_success",
                                       "generations that ended, by finish reason",
                                       ["finish_reason"], registry=r)
        self.rate_limited = Counter(PREFIX + "rate_limited_requests",
                                    "generations refused (429) by their API key's rate limits",
                                    ["key"], registry=r)
        self.engine = EngineStatusCollector()
        r.register(self.engine)
