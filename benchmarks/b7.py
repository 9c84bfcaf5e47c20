"""`tessera bench b7`: B7, data-parallel replicas. B4's workload (16 groups x 32 requests
sharing a 2048-token prefix, 128-token suffixes, 64 output tokens, all sent at once up to
--concurrency) against one replica, then against `tessera serve --dp-size 2` (two replicas
behind the SGLang Model Gateway, cache-aware), in one run, one server at a time:

    dp2_throughput_ratio    one replica's time / the replicas' time for the same requests
    dp2_hit_rate_fraction   the replicas' prefix-cache hit rate / one replica's (what routing
                            kept of the cache hits)

Prompts are sent as text (the gateway routes on text and takes no token-id prompt on
/v1/completions): a --load-format dummy shape, whose vocabulary spells token i as "t{i}".
Hit rates come from each response's usage (cached prompt tokens), as in B4; the replicas' own
counters (their /metrics, on --replica-metrics-port) are recorded beside them with how the
prompt tokens were spread over the replicas. On a GPU machine replica i takes device i
(`--base-device-id`); on the CPU both share the host.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import shlex
import sys
import tempfile
import time
import urllib.request
from typing import Any

from tessera.benchmarks.common import new_result, write_result
from tessera.benchmarks.datasets import ideal_hit_rate, random_requests, shared_prefix_requests
from tessera.benchmarks.server_launch import ServerProcess, free_port
from tessera.benchmarks.serving import (
    add_args,
    resolve_model,
    run_b4_once,
    server_argv,
    vocab_size,
)
from tessera.benchmarks.serving_driver import run_tier

GATEWAY_READY_S = 120.0


def _log(name: str) -> str:
    path = os.path.join(tempfile.gettempdir(), "tessera-bench-logs",
                        f"b7-{name}-{os.getpid()}.log")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    print(f"[bench] {name} log: {path}", file=sys.stderr)
    return path


def _get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return json.loads(resp.read())


def wait_gateway(url: str, replicas: int) -> None:
    """The gateway answers /health before it has taken the replicas: wait for them."""
    deadline = time.monotonic() + GATEWAY_READY_S
    while time.monotonic() < deadline:
        try:
            workers = _get_json(url + "/workers").get("workers", [])
            if sum(1 for w in workers if w.get("is_healthy")) >= replicas:
                return
        except (OSError, ValueError):
            pass
        time.sleep(0.5)
    raise RuntimeError(f"the router did not take {replicas} replicas in {GATEWAY_READY_S:g} s")


def replica_figures(metrics_url: str) -> dict[str, Any]:
    from tessera.bus.replica_metrics import read_replica, read_settled, router_hit_rate

    listed = _get_json(metrics_url + "/replicas")
    loads = read_settled(lambda: [read_replica(int(r["replica"]), str(r["url"]))
                                  for r in listed])
    return {"router_cache_hit_rate": router_hit_rate(loads),
            "per_replica": [{"replica": r.index, "cache_hit_rate": r.cache_hit_rate,
                             "cache_query_tokens": r.cache_query_tokens} for r in loads]}


def dummy_text(ids: list[int]) -> str:
    """The prompt as text: the SGLang Model Gateway takes no token-id prompt on
    /v1/completions, and routes on text. The dummy model's word-level vocabulary reads token
    i as "t{i}" (benchmarks/dummy_model.py), so the text is the same ids again, and prompts
    that share ids share text."""
    return " ".join(f"t{i}" for i in ids)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="tessera bench b7", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_args(p)
    p.add_argument("--dp-size", type=int, default=2)
    p.add_argument("--dp-args", default="",
                   help="more `tessera serve` flags for the replicas' server only (one "
                        "string: the router's thresholds, --router-policy)")
    args = p.parse_args(argv)
    args.workload = "B4"  # the requests and the measuring are B4's
    if args.concurrency is None:
        args.concurrency = "128"
    resolve_model(args)
    vocab = vocab_size(args)
    config = {k: v for k, v in vars(args).items() if k not in ("api_key", "workload")}
    config["vocab_size"] = vocab
    result = new_result("B7", config)
    if args.load_format != "dummy" or args.api != "completions":
        p.error("B7 runs a --load-format dummy shape through /v1/completions: the router "
                "routes on prompt text, and only the dummy vocabulary spells ids as text "
                "exactly")
    reqs = [dataclasses.replace(r, prompt_text=dummy_text(r.prompt_ids))
            for r in shared_prefix_requests(args.groups, args.group_size, args.prefix_len,
                                            args.suffix_len, args.prefix_output_len, vocab,
                                            args.seed)]

    warm = [dataclasses.replace(r, prompt_text=dummy_text(r.prompt_ids))
            for r in random_requests(args.warmup, (16, 32), (4, 8), vocab, seed=args.seed + 9)]

    def measure(url: str, model: str) -> dict[str, Any]:
        # The gateway wants the model named in every request.
        if warm:
            asyncio.run(run_tier(url, warm, concurrency=len(warm), model=model,
                                 api_key=args.api_key))
        return run_b4_once(args, url, reqs, model=model)

    with ServerProcess(server_argv(args), log_path=_log("single")) as single_server:
        single_server.wait_ready()
        model = _get_json(single_server.url + "/v1/models")["data"][0]["id"]
        single = measure(single_server.url, model)
    metrics_port = free_port()
    dp_args = server_argv(args, *shlex.split(args.dp_args), "--dp-size", str(args.dp_size),
                          "--replica-metrics-port", str(metrics_port))
    with ServerProcess(dp_args, log_path=_log("replicas")) as dp_server:
        dp_server.wait_ready()
        wait_gateway(dp_server.url, args.dp_size)
        replicas = measure(dp_server.url, model)
        time.sleep(1.2)  # the last steps' heartbeats reach the replicas' /metrics
        replicas["replicas"] = replica_figures(f"http://127.0.0.1:{metrics_port}")
    ratio = single["duration_s"] / replicas["duration_s"] if replicas["duration_s"] else None
    hit, dp_hit = single["cache_hit_rate"], replicas["cache_hit_rate"]
    fraction = dp_hit / hit if hit and dp_hit is not None else None
    result["figures"] = {
        "dp2_throughput_ratio": ratio, "dp2_hit_rate_fraction": fraction,
        "ideal_hit_rate": ideal_hit_rate(reqs), "dp_size": args.dp_size,
        "errors": single["errors"] + replicas["errors"],
        "single": single, "replicas": replicas}
    print(f"[bench] B7: {args.dp_size} replicas {replicas['duration_s']:.1f} s vs one "
          f"{single['duration_s']:.1f} s: ratio {ratio}; hit rate {dp_hit} vs {hit}: "
          f"fraction {fraction}", file=sys.stderr)
    path = write_result(result, args.out_dir, args.name or "b7_serving")
    print(f"[bench] wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
