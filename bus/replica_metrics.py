"""/metrics of `tessera serve --dp-size N`: every replica's load and the cache hit rate the
routing reached, plus the router's own metrics.

    tessera:replica_up{replica}                    1 when the replica's /health answers 200
    tessera:replica_requests_running{replica}      requests it decodes
    tessera:replica_requests_waiting{replica}      requests queued in it
    tessera:replica_cache_hit_rate{replica}        its prompt tokens found in its prefix cache
    tessera:replica_cache_hit_tokens_total{replica}, ..._cache_query_tokens_total{replica}
    tessera:router_cache_hit_rate                  the same over all replicas: how well the
                                                   router sent each prompt where its prefix is
    tessera:replica_restarts_total{replica}
    smg_*                                          the gateway's own metrics, as it gives them
                                                   (requests per worker, worker health, ...)

The router's hit rate is measured where the prefixes are, in the replicas' caches: one replica
alone reaches the workload's own hit rate, and routing can only lose some of it (a prefix
sent to a replica that does not hold it is computed again). The gateway keeps no such figure.
"""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

from tessera.bus import settle

FETCH_TIMEOUT_S = 2.0
# A replica's counters reach its /metrics through the scheduler's heartbeat (0.5 s) and the
# server's cached engine status (0.5 s): a read right after the last answer can lag by both,
# more on a loaded machine. Counters that stay the same this long, with nothing running or
# waiting, are the final ones.
SETTLE_QUIET_S = 2.0
SETTLE_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class ReplicaLoad:
    """One replica's figures, read from its own /metrics (zeros when it does not answer)."""

    index: int
    url: str
    up: bool
    running: float = 0.0
    waiting: float = 0.0
    cache_hit_tokens: float = 0.0
    cache_query_tokens: float = 0.0
    restarts: int = 0

    @property
    def cache_hit_rate(self) -> float:
        return self.cache_hit_tokens / self.cache_query_tokens if self.cache_query_tokens \
            else 0.0


def fetch(url: str, timeout: float = FETCH_TIMEOUT_S) -> tuple[int, str]:
    """(HTTP status, body) of a GET; status 0 when nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status, resp.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as exc:
        return exc.code, ""
    except (OSError, ValueError):
        return 0, ""


_SAMPLES = {"tessera:num_requests_running": "running",
            "tessera:num_requests_waiting": "waiting",
            "tessera:cache_hit_tokens_total": "cache_hit_tokens",
            "tessera:cache_query_tokens_total": "cache_query_tokens"}


def parse_replica(index: int, url: str, text: str, up: bool, restarts: int = 0) -> ReplicaLoad:
    """The figures of one replica's /metrics text (the scheduler's samples)."""
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            field = _SAMPLES.get(sample.name)
            if field is not None:
                values[field] = values.get(field, 0.0) + float(sample.value)
    return ReplicaLoad(index=index, url=url, up=up, restarts=restarts, **values)


def read_replica(index: int, url: str, restarts: int = 0) -> ReplicaLoad:
    health, _ = fetch(url + "/health")
    status, text = fetch(url + "/metrics")
    if status != 200:
        return ReplicaLoad(index=index, url=url, up=False, restarts=restarts)
    return parse_replica(index, url, text, health == 200, restarts)


def _counters(loads: list[ReplicaLoad]) -> list[tuple[bool, float, float, float, float]]:
    return [(r.up, r.running, r.waiting, r.cache_hit_tokens, r.cache_query_tokens)
            for r in loads]


def read_settled(read: Callable[[], list[ReplicaLoad]], quiet_s: float = SETTLE_QUIET_S,
                 timeout_s: float = SETTLE_TIMEOUT_S) -> list[ReplicaLoad]:
    """The replicas' figures once the work sent to them is all counted: two reads `quiet_s`
    apart that agree, every replica up and idle. Raises TimeoutError if they never settle
    (a replica down or still busy)."""
    return settle.read_settled(
        read, quiet_s, timeout_s, key=_counters, what="the replicas' figures",
        ready=lambda loads: all(r.up and r.running == 0 and r.waiting == 0 for r in loads))


def router_hit_rate(loads: list[ReplicaLoad]) -> float:
    queried = sum(r.cache_query_tokens for r in loads)
    return sum(r.cache_hit_tokens for r in loads) / queried if queried else 0.0


def render(loads: list[ReplicaLoad], gateway_text: str = "") -> str:
    """Prometheus text exposition of the replicas' figures, then the gateway's metrics."""
    lines: list[str] = []

    def family(name: str, kind: str, help_: str, values: list[tuple[str, float]]) -> None:
        base = name.removesuffix("_total") if kind == "counter" else name
        lines.append(f"# HELP {base} {help_}")
        lines.append(f"# TYPE {base} {kind}")
        lines.extend(f"{name}{labels} {value!r}" for labels, value in values)

    def per_replica(attr: str) -> list[tuple[str, float]]:
        return [(f'{{replica="{r.index}"}}', float(getattr(r, attr))) for r in loads]

    family("tessera:replica_up", "gauge", "1 when the replica answers /health with 200",
           per_replica("up"))
    family("tessera:replica_requests_running", "gauge", "requests the replica decodes",
           per_replica("running"))
    family("tessera:replica_requests_waiting", "gauge", "requests queued in the replica",
           per_replica("waiting"))
    family("tessera:replica_cache_hit_rate", "gauge",
           "prompt tokens found in the replica's prefix cache, since its start",
           per_replica("cache_hit_rate"))
    family("tessera:replica_cache_hit_tokens_total", "counter",
           "prompt tokens found in the replica's prefix cache", per_replica("cache_hit_tokens"))
    family("tessera:replica_cache_query_tokens_total", "counter",
           "prompt tokens looked up in the replica's prefix cache",
           per_replica("cache_query_tokens"))
    family("tessera:replica_restarts_total", "counter", "times the replica was started again",
           per_replica("restarts"))
    family("tessera:router_cache_hit_rate", "gauge",
           "prompt tokens found in the prefix cache of the replica they were routed to, over "
           "all replicas", [("", router_hit_rate(loads))])
    text = "\n".join(lines) + "\n"
    if gateway_text:
        text += gateway_text if gateway_text.endswith("\n") else gateway_text + "\n"
    return text
