"""The --dp-size /metrics: each replica's figures read from its own exposition (the scheduler's
samples), and the routed hit rate over all of them, exposed in a form Prometheus parses."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tessera.bus.replica_metrics import (
    ReplicaLoad,
    parse_replica,
    read_settled,
    render,
    router_hit_rate,
)

REPLICA = """\
# TYPE tessera:num_requests_running gauge
tessera:num_requests_running{process="scheduler"} 3.0
# TYPE tessera:num_requests_waiting gauge
tessera:num_requests_waiting{process="scheduler"} 5.0
# TYPE tessera:cache_hit_tokens counter
tessera:cache_hit_tokens_total{process="scheduler"} 900.0
# TYPE tessera:cache_query_tokens counter
tessera:cache_query_tokens_total{process="scheduler"} 1000.0
# TYPE tessera:prompt_tokens counter
tessera:prompt_tokens_total 1000.0
"""


def test_parse_and_render() -> None:
    one = parse_replica(0, "http://127.0.0.1:1", REPLICA, up=True, restarts=2)
    assert (one.running, one.waiting, one.cache_hit_rate) == (3.0, 5.0, 0.9)
    other = ReplicaLoad(1, "http://127.0.0.1:2", up=False, cache_hit_tokens=100.0,
                        cache_query_tokens=1000.0)
    assert router_hit_rate([one, other]) == 0.5  # tokens, not the mean of the rates
    text = render([one, other], gateway_text='smg_worker_health{worker="x"} 1\n')
    samples = {(s.name, s.labels.get("replica")): s.value
               for f in text_string_to_metric_families(text) for s in f.samples}
    assert samples[("tessera:replica_requests_waiting", "0")] == 5.0
    assert samples[("tessera:replica_up", "1")] == 0.0
    assert samples[("tessera:replica_restarts_total", "0")] == 2.0
    assert samples[("tessera:router_cache_hit_rate", None)] == 0.5
    assert samples[("smg_worker_health", None)] == 1.0


def _load(hits: float, queried: float, running: float = 0.0, up: bool = True) -> list[ReplicaLoad]:
    return [ReplicaLoad(0, "http://127.0.0.1:1", up=up, running=running,
                        cache_hit_tokens=hits, cache_query_tokens=queried)]


def test_read_settled_waits_for_the_late_counters() -> None:
    # The counters arrive late and in pieces: a read that stops at the first figures would
    # report 100 of the 400 queried tokens.
    reads = iter([_load(0, 100, running=1), _load(50, 300), _load(90, 400), _load(90, 400),
                  _load(90, 400)])
    calls = []

    def read() -> list[ReplicaLoad]:
        calls.append(1)
        return next(reads)

    (final,) = read_settled(read, quiet_s=0.0)
    assert (final.cache_hit_tokens, final.cache_query_tokens) == (90, 400)
    assert len(calls) == 4  # the first two equal reads, no more


def test_read_settled_refuses_a_replica_that_stays_down() -> None:
    with pytest.raises(TimeoutError, match="did not settle"):
        read_settled(lambda: _load(0, 0, up=False), quiet_s=0.01, timeout_s=0.05)


def test_the_gateway_gets_the_routing_thresholds_and_accepts_them() -> None:
    """--router-cache-threshold and the two balance thresholds reach the gateway's command
    line, which its own parser (sglang-router's RouterArgs, as bus/gateway.py uses it)
    reads back; out-of-range values are refused before anything starts."""
    import argparse

    import pytest

    from tessera.bus.replicas import Replica, gateway_argv
    from tessera.config import ServerConfig

    config = ServerConfig(dp_size=2, router_cache_threshold=0.25,
                          router_balance_abs_threshold=8, router_balance_rel_threshold=1.1)
    replicas = [Replica(index=i, port=9000 + i, argv=[]) for i in range(2)]
    argv = gateway_argv(config, replicas, 9100)
    router_args = pytest.importorskip("sglang_router.router_args")
    parser = argparse.ArgumentParser()
    router_args.RouterArgs.add_cli_args(parser, use_router_prefix=False)
    parsed = router_args.RouterArgs.from_cli_args(parser.parse_args(argv[3:]),
                                                  use_router_prefix=False)
    assert (parsed.cache_threshold, parsed.balance_abs_threshold,
            parsed.balance_rel_threshold) == (0.25, 8, 1.1)
    for bad in (dict(router_cache_threshold=1.5), dict(router_balance_abs_threshold=-1),
                dict(router_balance_rel_threshold=0.9)):
        with pytest.raises(ValueError, match="router_"):
            ServerConfig(**bad)
