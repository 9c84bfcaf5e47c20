"""Drive one tier of HTTP load: a fixed concurrency and/or a Poisson arrival rate, every
request streamed and timed, then the tier's statistics.

    metrics, wall_s = asyncio.run(run_tier(url, requests, concurrency=32))
    stats = tier_stats(metrics, wall_s, concurrency=32)
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from tessera.benchmarks.common import summarize
from tessera.benchmarks.datasets import BenchRequest, poisson_arrivals
from tessera.benchmarks.http_client import API_PATHS, RequestMetrics, send_request


async def run_tier(base_url: str, requests: list[BenchRequest], *, concurrency: int | None,
                   rate: float = float("inf"), model: str | None = None,
                   api_key: str | None = None, ignore_eos: bool = True, seed: int = 0,
                   timeout_s: float = 3600.0, api: str = "completions",
                   extra_body: dict[str, Any] | None = None,
                   ) -> tuple[list[RequestMetrics], float]:
    """Send `requests` with at most `concurrency` in flight (None: no limit), arrivals spaced
    by a Poisson process of `rate` requests/s. Returns per-request metrics (in request order)
    and the tier's wall time."""
    import aiohttp

    url = base_url.rstrip("/") + API_PATHS[api]
    limit = asyncio.Semaphore(concurrency) if concurrency else None
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    connector = aiohttp.TCPConnector(limit=0)  # the semaphore is the only limit
    results: list[RequestMetrics | None] = [None] * len(requests)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        t0 = time.perf_counter()

        async def send(i: int) -> RequestMetrics:
            return await send_request(session, url, requests[i], model=model, api_key=api_key,
                                      ignore_eos=ignore_eos, t_origin=t0, api=api,
                                      extra_body=extra_body)

        async def one(i: int) -> None:
            if limit is None:
                results[i] = await send(i)
                return
            async with limit:
                results[i] = await send(i)

        tasks = []
        for i, gap in enumerate(poisson_arrivals(len(requests), rate, seed)):
            if gap > 0:
                await asyncio.sleep(gap)
            tasks.append(asyncio.create_task(one(i)))
        await asyncio.gather(*tasks)
        wall = time.perf_counter() - t0
    return [r for r in results if r is not None], wall


def _ms(values: list[float]) -> dict[str, float]:
    return {k: (v * 1000.0 if k != "count" else v) for k, v in summarize(values).items()}


def tier_stats(metrics: list[RequestMetrics], wall_s: float, *, concurrency: int | None,
               rate: float = float("inf")) -> dict[str, Any]:
    """Latency summaries (ms: mean, p50, p90, p99), throughput and errors of one tier, with
    the flat names the B3 result needs (ttft_p50_ms, itl_p99_ms, ...)."""
    ok = [m for m in metrics if m.ok]
    ttft = [m.ttft_s for m in ok]
    itl = [x for m in ok for x in m.itl_s]
    tpot = [t for m in ok if (t := m.tpot_s) is not None]
    e2e = [m.e2e_s for m in ok]
    out_tokens = sum(m.output_tokens for m in ok)
    in_tokens = sum(m.prompt_len for m in ok)
    stats: dict[str, Any] = {
        "concurrency": concurrency if concurrency else len(metrics),
        "request_rate": None if rate == float("inf") else rate,
        "requests": len(metrics),
        "completed": len(ok),
        "errors": len(metrics) - len(ok),
        "duration_s": wall_s,
        "request_throughput": len(ok) / wall_s if wall_s > 0 else 0.0,
        "input_tok_per_s": in_tokens / wall_s if wall_s > 0 else 0.0,
        "output_tok_per_s": out_tokens / wall_s if wall_s > 0 else 0.0,
        "total_output_tokens": out_tokens,
        "total_input_tokens": in_tokens,
        "ttft_ms": _ms(ttft),
        "itl_ms": _ms(itl),
        "tpot_ms": _ms(tpot),
        "e2e_ms": _ms(e2e),
    }
    for name in ("ttft", "itl", "tpot", "e2e"):
        for q in ("p50", "p90", "p99", "mean"):
            stats[f"{name}_{q}_ms"] = stats[f"{name}_ms"][q]
    errors = sorted({m.error for m in metrics if not m.ok})
    if errors:
        stats["error_samples"] = errors[:5]
    return stats
