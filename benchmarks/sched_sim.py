"""`python -m tessera.benchmarks.sched_sim`: B3's concurrency tiers replayed through the
real scheduler on a simulated clock, the device replaced by a cost model of its steps.

The scheduler (`scheduler_proc.Scheduler`, the same object the scheduler process drives) is
given B3's requests as its clients would send them: the same lengths as `serving.py` draws
(prompts and outputs uniform in their ranges, `requests_per_concurrency` x c requests,
seed + c), at most c in flight, the next sent `client_gap_ms` after one finishes. Each step it
plans is "run" for the time the cost model gives it, the clock moves on by that much, and the
step's tokens are stamped with the clock: ITL, TTFT and output tokens per second come out as
B3 reports them, with nothing but the scheduling policy and the cost model in them. What it is
for: comparing scheduling policies (the prefill budget, the mixed-step ratio) over the whole
tier in seconds on a CPU, before a GPU run measures the one chosen. What it is not: a
measurement. The cost model's defaults are the H200's at the Llama-3-8B shape
(`step_profile_h200/`, call 64's profile): a decode step of b streams over C tokens of
context in all takes base(b) + C x ATTN_NS_PER_TOKEN, base linear between the measured
points; a prefill token PREFILL_US_PER_TOKEN more (a mixed step's marginal cost). No
host time, no jitter: the simulated tail is the policy's, a real run's is longer. Nor do
its steps cost what an H200's do under B3: at c=128 it runs 10.9 ms a step where the device
took 12.9, and it predicted that the prefill backlog rule (--prefill-backlog-steps 16) would
gain 2.9% of tokens/s where call 71 measured 1.5% fewer (its time to first token and its
decodes a step moved as predicted): the longer mixed steps cost more than a flat marginal
cost a prompt token says. A policy the model favours still needs the device's word.
"""

from __future__ import annotations

import argparse
import heapq
import json
import random
import sys
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tessera.bus.messages import DetokInfo, SampledTokens, SamplingParams, TokenizedRequest
from tessera.scheduler_proc.config import SchedulerConfig
from tessera.scheduler_proc.scheduler import Scheduler

# The H200 at the Llama-3-8B shape, bf16 (docs/performance.md: the step profile and B2's
# decode steps): one stream 3.95 ms of weights and launches, 128 streams at 600 tokens 8.01
# ms, 256 at 600 tokens 12.43 ms, attention 5.45 ms of that over 153600 tokens of context.
BASE_MS = ((1, 3.95), (128, 5.28), (256, 6.98))
ATTN_NS_PER_TOKEN = 35.5
PREFILL_US_PER_TOKEN = 17.6


@dataclass(frozen=True)
class CostModel:
    base_ms: tuple[tuple[int, float], ...] = BASE_MS
    attn_ns_per_token: float = ATTN_NS_PER_TOKEN
    prefill_us_per_token: float = PREFILL_US_PER_TOKEN

    def base(self, streams: int) -> float:
        xs = [b for b, _ in self.base_ms]
        ys = [ms for _, ms in self.base_ms]
        return float(np.interp(streams, xs, ys, left=ys[0],
                               right=ys[-1] + (streams - xs[-1]) * (ys[-1] - ys[-2])
                               / (xs[-1] - xs[-2])))

    def step_ms(self, seq_lens: np.ndarray, extend_lens: np.ndarray) -> float:
        """A step of these rows: decodes (one token each), prefill chunks (more)."""
        decode = extend_lens == 1
        prefill = int(extend_lens[~decode].sum())
        context = int(seq_lens[decode].sum())
        streams = max(1, int(decode.sum()))
        return (self.base(streams) + context * self.attn_ns_per_token * 1e-6
                + prefill * self.prefill_us_per_token * 1e-3)


@dataclass
class _Req:
    prompt: int
    output: int
    sent: float = 0.0
    times: list[float] = field(default_factory=list)


def warm_up(sched: Scheduler, cost: CostModel, context: int = 600) -> None:
    """Teach the scheduler's step costs what it would have measured before the tier: a
    decode step of every batch class (2^k streams at `context` tokens each) and the prefill
    token's marginal cost."""
    for k in range(10):
        streams = 1 << k
        for _ in range(8):
            sched.step_cost.observe(streams, 0, cost.step_ms(
                np.full(streams, context), np.ones(streams, dtype=np.int64)))
    for _ in range(8):
        lens = np.ones(129, dtype=np.int64)
        lens[-1] = 512
        sched.step_cost.observe(128, 512, cost.step_ms(np.full(129, context), lens))


def _pct(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q)) if values else 0.0


def run_tier(concurrency: int, *, requests_per_concurrency: int = 4,
             prompt_len: tuple[int, int] = (256, 1024), output_len: tuple[int, int] = (64, 512),
             seed: int = 0, client_gap_ms: float = 2.0, cost: CostModel | None = None,
             num_slots: int = 16 * 50_000, warm: bool = True,
             **batching: Any) -> dict[str, float]:
    """One B3 tier through the scheduler: its figures (ms, tok/s) and step counts.
    `batching`: SchedulerConfig fields (the engine's batching flags) to set. `warm`: the
    scheduler starts knowing the device's costs (warm_up), as a server does after its
    warm-up requests and the tiers before."""
    cost = cost or CostModel()
    n = requests_per_concurrency * concurrency
    rng = random.Random(seed + concurrency)  # the lengths serving.py draws for this tier
    reqs = []
    for _ in range(n):
        p = rng.randint(*prompt_len)
        reqs.append(_Req(p, rng.randint(*output_len)))
    config = dict(num_slots=num_slots, page_size=16, max_context_len=8192,
                  max_running_requests=256, chunked_prefill_size=2048, eos_token_ids=(0,),
                  overlap=False)
    config.update(batching)
    sched = Scheduler(SchedulerConfig(**config))  # type: ignore[arg-type]
    if warm:
        warm_up(sched, cost)
    ids = np.random.default_rng(seed).integers(1000, 100_000, size=prompt_len[1] * n,
                                               dtype=np.int32)
    clock = 0.0
    arrivals: list[tuple[float, int]] = [(0.0, i) for i in range(min(concurrency, n))]
    next_req = len(arrivals)
    by_rid: dict[str, int] = {}
    steps = decodes = prefill = 0
    while arrivals or sched.has_work():
        while arrivals and arrivals[0][0] <= clock:
            t, i = heapq.heappop(arrivals)
            new = reqs[i]
            new.sent = t
            off = i * prompt_len[1]
            by_rid[f"r{i}"] = i
            problem = sched.add_request(TokenizedRequest(
                rid=f"r{i}", input_ids=ids[off:off + new.prompt],
                sampling=SamplingParams(max_tokens=new.output, ignore_eos=True),
                detok=DetokInfo(reply_to="sim")))
            if problem is not None:
                raise RuntimeError(f"the scheduler refused a request: {problem.message}")
        fb = sched.next_batch()
        if fb is None:
            if not arrivals:
                raise RuntimeError("work left and no step planned: the scheduler is stuck")
            clock = arrivals[0][0]
            continue
        ms = cost.step_ms(fb.seq_lens, fb.extend_lens)
        ext = fb.extend_lens
        steps += 1
        decodes += int((ext == 1).sum())
        prefill += int(ext[ext > 1].sum())
        clock += ms / 1000.0
        sampled = int(np.count_nonzero(fb.sample))
        out = sched.on_result(SampledTokens(step=fb.step, token_ids=np.full(sampled, 7,
                                                                             dtype=np.int32),
                                            forward_ms=ms))
        for tb in (out, sched.take_output()):
            if tb is None:
                continue
            for j, rid in enumerate(tb.rids):
                req = reqs[by_rid[rid]]
                req.times.extend([clock] * int(tb.counts[j]))
                if tb.finish[j] is not None and next_req < n:
                    heapq.heappush(arrivals, (clock + client_gap_ms / 1000.0, next_req))
                    next_req += 1
    short = [i for i, r in enumerate(reqs) if len(r.times) != r.output]
    if short:
        raise RuntimeError(f"{len(short)} requests did not get their tokens (r{short[0]}: "
                           f"{len(reqs[short[0]].times)} of {reqs[short[0]].output})")
    ttft = [(r.times[0] - r.sent) * 1000 for r in reqs]
    itl = [(b - a) * 1000 for r in reqs for a, b in zip(r.times[:-1], r.times[1:], strict=True)]
    start = min(r.sent for r in reqs)
    wall = max(r.times[-1] for r in reqs) - start
    out_tokens = sum(len(r.times) for r in reqs)
    return {"concurrency": concurrency, "requests": n, "output_tok_per_s": out_tokens / wall,
            "duration_s": wall, "total_output_tokens": out_tokens,
            "ttft_p50_ms": _pct(ttft, 50), "ttft_p90_ms": _pct(ttft, 90),
            "itl_p50_ms": _pct(itl, 50), "itl_p90_ms": _pct(itl, 90),
            "itl_p99_ms": _pct(itl, 99), "itl_max_ms": max(itl) if itl else 0.0,
            "steps": steps, "decode_tokens_per_step": decodes / max(1, steps),
            "prefill_tokens_per_step": prefill / max(1, steps)}


def _value(text: str) -> object:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tessera.benchmarks.sched_sim",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--concurrency", default="32,128")
    p.add_argument("--requests-per-concurrency", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                   help="a batching flag for the scheduler (max_mixed_step_ratio=2.5, ...)")
    p.add_argument("--out", help="write the tiers as JSON here")
    args = p.parse_args(argv)
    batching: dict[str, Any] = {}
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep:
            p.error(f"--set {item!r}: expected FIELD=VALUE")
        batching[key.strip()] = _value(value.strip())
    tiers = [run_tier(int(c), requests_per_concurrency=args.requests_per_concurrency,
                      seed=args.seed, **batching) for c in args.concurrency.split(",")]
    for t in tiers:
        print(json.dumps({k: round(v, 2) if isinstance(v, float) else v for k, v in t.items()}))
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"batching": batching, "tiers": tiers}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
