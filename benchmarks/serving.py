"""`tessera bench serving`: the HTTP workloads.

    B3  random prompts [256,1024] / outputs [64,512], streamed, one tier per concurrency
        (1, 32, 128): TTFT, ITL, TPOT, E2E (mean, p50, p90, p99), throughput, errors.
    B4  16 groups x 32 requests sharing a 2048-token prefix + 128-token suffix, 64 outputs, run
        against a server with the radix cache and one with --disable-radix-cache: cache hit rate
        (vs the ideal) and speed-up.
    B8  B3's c=32 tier plain and with a JSON schema on every request, one server, one run:
        fraction_of_plain (grammar_serving.py).

The server is either given (`--base-url`, for B4 also `--no-cache-url`) or started here with
`tessera serve --model M --load-format F <--server-args>`.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from typing import Any

from tessera.benchmarks import plots
from tessera.benchmarks.common import default_results_dir, new_result, write_result
from tessera.benchmarks.datasets import (
    BenchRequest,
    ideal_hit_rate,
    parse_range,
    random_requests,
    shared_prefix_requests,
)
from tessera.benchmarks.http_client import fetch_text, parse_prometheus
from tessera.benchmarks.server_launch import ServerProcess
from tessera.benchmarks.serving_driver import run_tier, tier_stats

BREAKDOWN_SETTLE_S = 1.2  # > the default heartbeat interval, so the counters are current


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--workload", choices=["B3", "B4", "B8"], default="B3")
    p.add_argument("--base-url", help="a running server (default: start one here)")
    p.add_argument("--no-cache-url", help="B4: a running server with --disable-radix-cache")
    p.add_argument("--model", default="default")
    p.add_argument("--load-format", default="auto")
    p.add_argument("--server-args", default="", help="more `tessera serve` flags, one string")
    p.add_argument("--api-key", default=os.environ.get("TESSERA_API_KEY"))
    p.add_argument("--vocab-size", type=int, help="token ids are drawn below this "
                   "(default: the model's vocabulary)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--api", choices=["completions", "native"], default="completions",
                   help="OpenAI /v1/completions (default) or SGLang-style /generate, which "
                   "streams token ids (use it for a model without a tokenizer)")
    p.add_argument("--request-rate", type=float, default=float("inf"),
                   help="Poisson arrivals, requests/s (default inf: all at once)")
    # B3
    p.add_argument("--concurrency", help="B3: tiers (default 1,32,128); B4: requests in "
                   "flight (default 128)")
    p.add_argument("--prompt-len", default="256,1024")
    p.add_argument("--output-len", default="64,512")
    p.add_argument("--requests-per-concurrency", type=int, default=4,
                   help="B3: requests in a tier = max(--min-requests, this x concurrency)")
    p.add_argument("--min-requests", type=int, default=8)
    # B4
    p.add_argument("--groups", type=int, default=16)
    p.add_argument("--group-size", type=int, default=32)
    p.add_argument("--prefix-len", type=int, default=2048)
    p.add_argument("--suffix-len", type=int, default=128)
    p.add_argument("--prefix-output-len", type=int, default=64)
    p.add_argument("--warmup", type=int, default=2, help="unmeasured requests first")
    p.add_argument("--out-dir", default=default_results_dir())
    p.add_argument("--name", help="result file name without .json")


def resolve_model(args: argparse.Namespace) -> None:
    """A shape config under --load-format dummy becomes a model folder with a tokenizer."""
    from tessera.benchmarks.dummy_model import resolve_dummy_model

    args.model = resolve_dummy_model(args.model, args.load_format,
                                     byte_level=args.workload == "B8")


def vocab_size(args: argparse.Namespace) -> int:
    if args.vocab_size:
        return int(args.vocab_size)
    try:
        from tessera.formats import open_model

        return open_model(args.model, args.load_format).config.vocab_size
    except Exception as exc:  # the model may live only on the server's machine
        print(f"[bench] cannot read the model's vocabulary ({exc}); drawing ids below 32000",
              file=sys.stderr)
        return 32000


def server_argv(args: argparse.Namespace, *extra: str) -> list[str]:
    import shlex

    return ["--model", args.model, "--load-format", args.load_format,
            *shlex.split(args.server_args), *extra]


async def _metrics(url: str, api_key: str | None) -> dict[str, float]:
    import aiohttp

    async with aiohttp.ClientSession() as session:
        text = await fetch_text(session, url.rstrip("/") + "/metrics", api_key)
    return parse_prometheus(text) if text else {}


def counter_deltas(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """Changes of the cache / token counters the server exports over one run."""
    keys = [k for k in after if any(w in k.lower() for w in ("cache", "hit", "token"))]
    return {k: after[k] - before.get(k, 0.0) for k in keys if after[k] != before.get(k, 0.0)}


def hit_rate_from_counters(deltas: dict[str, float]) -> float | None:
    """cached / prompt tokens from /metrics counters, when the server exports both."""
    cached = [v for k, v in deltas.items() if "cached" in k.lower() or "hit_tokens" in k.lower()]
    prompt = [v for k, v in deltas.items() if ("prompt_tokens" in k.lower()
                                               or "query_tokens" in k.lower())
              and "cached" not in k.lower()]
    if cached and prompt and prompt[0] > 0:
        return cached[0] / prompt[0]
    return None


def _gauge(metrics: dict[str, float], kind: str, stat: str) -> dict[str, float]:
    """process -> value of the heartbeat stat `stat` of every process of `kind`."""
    from tessera.server.metrics import stat_metric

    prefix = stat_metric(kind, stat)[0] + "{"
    return {key[len(prefix):].split('"')[1]: value for key, value in metrics.items()
            if key.startswith(prefix)}


def step_breakdown(before: dict[str, float], after: dict[str, float],
                   wall_s: float) -> dict[str, Any] | None:
    """Per scheduler step over one tier, from the engine's heartbeat stats in /metrics: the
    worker's busy and idle time, decode and prefill tokens, and each process's CPU. None when
    the server does not export them."""
    def delta(kind: str, stat: str) -> dict[str, float]:
        new, old = _gauge(after, kind, stat), _gauge(before, kind, stat)
        return {p: v - old.get(p, 0.0) for p, v in new.items()}

    steps = sum(delta("scheduler", "steps").values())
    if steps <= 0:
        return None
    busy_ms = sum(delta("worker", "forward_ms_total").values()) / max(
        1, len(_gauge(after, "worker", "forward_ms_total")))  # ranks run the same steps
    cpu = {}
    for kind in ("server", "tokenizer", "scheduler", "detokenizer", "worker"):
        cpu.update({p: v * 1e3 / steps for p, v in delta(kind, "cpu_s").items()})
    step_ms = wall_s * 1e3 / steps
    return {
        "steps": steps,
        "wall_ms_per_step": step_ms,
        "worker_busy_ms_per_step": busy_ms / steps,
        "worker_idle_ms_per_step": max(0.0, step_ms - busy_ms / steps),
        "decode_tokens_per_step": sum(delta("scheduler", "decode_tokens_total").values()) / steps,
        "prefill_tokens_per_step": sum(delta("scheduler", "prefill_tokens_total").values())
        / steps,
        "cpu_ms_per_step": dict(sorted(cpu.items())),
        "note": "heartbeat stats (refreshed every --heartbeat-interval-s): counts at the tier's "
                "edges may be off by one heartbeat",
    }


def _warmup(url: str, args: argparse.Namespace, vocab: int) -> None:
    if args.warmup <= 0:
        return
    reqs = random_requests(args.warmup, (16, 32), (4, 8), vocab, seed=args.seed + 999)
    asyncio.run(run_tier(url, reqs, concurrency=args.warmup, api_key=args.api_key,
                         api=args.api))


def run_b3(args: argparse.Namespace, url: str, vocab: int) -> dict[str, Any]:
    tiers = []
    series: dict[str, list[float]] = {}
    for c in [int(x) for x in args.concurrency.split(",")]:
        n = max(args.min_requests, args.requests_per_concurrency * c)
        reqs = random_requests(n, parse_range(args.prompt_len), parse_range(args.output_len),
                               vocab, seed=args.seed + c)
        before = asyncio.run(_metrics(url, args.api_key))
        metrics, wall = asyncio.run(run_tier(url, reqs, concurrency=c, rate=args.request_rate,
                                             api_key=args.api_key, seed=args.seed,
                                             api=args.api))
        time.sleep(BREAKDOWN_SETTLE_S)  # the last steps' heartbeats reach /metrics
        after = asyncio.run(_metrics(url, args.api_key))
        stats = tier_stats(metrics, wall, concurrency=c, rate=args.request_rate)
        stats["step_breakdown"] = step_breakdown(before, after, wall)
        print(f"[bench] c={c}: {stats['output_tok_per_s']:.1f} out tok/s, TTFT p50 "
              f"{stats['ttft_p50_ms']:.1f} ms, ITL p50 {stats['itl_p50_ms']:.2f} ms p99 "
              f"{stats['itl_p99_ms']:.2f} ms, errors {stats['errors']}", file=sys.stderr)
        tiers.append(stats)
        series[f"TTFT c={c}"] = [m.ttft_s * 1000 for m in metrics if m.ok]
        series[f"ITL c={c}"] = [x * 1000 for m in metrics if m.ok for x in m.itl_s]
    return {"tiers": tiers, "_series": series}


def run_b4_once(args: argparse.Namespace, url: str, reqs: list[BenchRequest],
                model: str | None = None) -> dict[str, Any]:
    c = int(args.concurrency.split(",")[0])
    before = asyncio.run(_metrics(url, args.api_key))
    metrics, wall = asyncio.run(run_tier(url, reqs, concurrency=c, rate=args.request_rate,
                                         model=model, api_key=args.api_key, seed=args.seed,
                                         api=args.api))
    after = asyncio.run(_metrics(url, args.api_key))
    stats = tier_stats(metrics, wall, concurrency=c, rate=args.request_rate)
    reported = [m.cached_tokens for m in metrics if m.ok and m.cached_tokens is not None]
    prompt = sum(m.prompt_len for m in metrics if m.ok)
    deltas = counter_deltas(before, after)
    if reported and prompt:
        stats["cache_hit_rate"] = sum(reported) / prompt
        stats["cache_hit_source"] = "usage.prompt_tokens_details.cached_tokens"
    else:
        stats["cache_hit_rate"] = hit_rate_from_counters(deltas)
        stats["cache_hit_source"] = "/metrics" if stats["cache_hit_rate"] is not None else None
    stats["metrics_deltas"] = deltas
    return stats


def b4_figures(with_cache: dict[str, Any], no_cache: dict[str, Any],
               ideal: float) -> dict[str, Any]:
    speedup = no_cache["duration_s"] / with_cache["duration_s"] if with_cache["duration_s"] \
        else float("nan")
    hit = with_cache["cache_hit_rate"]
    print(f"[bench] B4: hit rate {hit} (ideal {ideal:.3f}), {with_cache['duration_s']:.1f} s "
          f"vs {no_cache['duration_s']:.1f} s without cache: {speedup:.2f}x", file=sys.stderr)
    return {"cache_hit_rate": hit, "ideal_hit_rate": ideal,
            "hit_rate_fraction_of_ideal": hit / ideal if hit is not None and ideal else None,
            "speedup_vs_no_cache": speedup, "with_cache": with_cache, "no_cache": no_cache,
            "errors": with_cache["errors"] + no_cache["errors"]}


def _with_server(args: argparse.Namespace, url: str | None, extra: list[str],
                 fn: Any) -> Any:
    if url:
        return fn(url)
    import tempfile

    # The server's log stays out of the results folder (and out of git).
    log = os.path.join(tempfile.gettempdir(), "tessera-bench-logs",
                       f"serve-{os.getpid()}-{len(extra)}.log")
    os.makedirs(os.path.dirname(log), exist_ok=True)
    print(f"[bench] server log: {log}", file=sys.stderr)
    with ServerProcess(server_argv(args, *extra), log_path=log) as server:
        server.wait_ready()
        return fn(server.url)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="tessera bench serving", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_args(p)
    args = p.parse_args(argv)
    if args.concurrency is None:
        args.concurrency = {"B3": "1,32,128", "B8": "32"}.get(args.workload, "128")
    if not args.base_url:
        resolve_model(args)
    vocab = vocab_size(args)
    config = {k: v for k, v in vars(args).items() if k not in ("api_key",)}
    config["vocab_size"] = vocab
    result = new_result(args.workload, config)
    name = args.name or f"{args.workload.lower()}_serving"
    if args.workload == "B3":
        def b3(url: str) -> dict[str, Any]:
            _warmup(url, args, vocab)
            return run_b3(args, url, vocab)
        figures = _with_server(args, args.base_url, [], b3)
        series = figures.pop("_series")
        result["figures"] = figures
        tiers = figures["tiers"]
        result["plots"] = [x for x in (
            plots.latency_cdfs(series, os.path.join(args.out_dir, f"{name}_latency_cdf.png"),
                               "B3: TTFT and ITL"),
            plots.throughput_vs_concurrency(
                [t["concurrency"] for t in tiers], [t["output_tok_per_s"] for t in tiers],
                [t["itl_p99_ms"] for t in tiers],
                os.path.join(args.out_dir, f"{name}_throughput.png"),
                "B3: throughput and ITL p99 against concurrency")) if x]
    elif args.workload == "B8":
        from tessera.benchmarks.grammar_serving import run_b8

        def b8(url: str) -> dict[str, Any]:
            return run_b8(args, url, vocab)
        figures = _with_server(args, args.base_url, [], b8)
        result["figures"] = figures
        result["plots"] = [x for x in (plots.bars(
            ["plain", "json_schema"], [figures["plain"]["output_tok_per_s"],
                                       figures["grammar"]["output_tok_per_s"]],
            os.path.join(args.out_dir, f"{name}_throughput.png"),
            f"B8: c={args.concurrency}, fraction of plain {figures['fraction_of_plain']:.3f}",
            "output tok/s"),) if x]
    else:
        reqs = shared_prefix_requests(args.groups, args.group_size, args.prefix_len,
                                      args.suffix_len, args.prefix_output_len, vocab, args.seed)

        def measure(url: str) -> dict[str, Any]:
            _warmup(url, args, vocab)
            return run_b4_once(args, url, reqs)

        # One server at a time: two engines would not both fit on one GPU.
        with_cache = _with_server(args, args.base_url, [], measure)
        no_cache = _with_server(args, args.no_cache_url, ["--disable-radix-cache"], measure)
        cache_figs = b4_figures(with_cache, no_cache, ideal_hit_rate(reqs))
        result["figures"] = cache_figs
        result["plots"] = [x for x in (plots.bars(
            ["radix cache", "no cache"],
            [cache_figs["with_cache"]["duration_s"], cache_figs["no_cache"]["duration_s"]],
            os.path.join(args.out_dir, f"{name}_speedup.png"), "B4: shared-prefix workload",
            "seconds"),) if x]
    result["plots"] = [os.path.basename(x) for x in result["plots"]]
    path = write_result(result, args.out_dir, name)
    print(f"[bench] wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
