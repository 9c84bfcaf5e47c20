"""`python -m tessera.benchmarks.sched_sim`: B3's concurrency tiers replayed through the
real scheduler on a simulated clock, the device replaced by a cost model of its steps.

The scheduler (`scheduler_proc.Scheduler`, the same object the scheduler process drives) is
given B3's requests as its clients would send them: those `serving.py` draws
(`datasets.random_requests`: `requests_per_concurrency` x c requests, seed + c), at most c in
flight, the next sent `client_gap_ms` after one finishes. Each step it
plans is "run" for the time the cost model gives it, the clock moves on by that much, and the
step's tokens are stamped with the clock: ITL, TTFT and output tokens per second come out as
B3 reports them, with nothing but the scheduling policy and the cost model in them. What it is
for: comparing scheduling policies (the prefill budget, the mixed-step ratio) over the whole
tier in seconds on a CPU, before a GPU run measures the one chosen. What it is not: a
measurement. The cost model (CostModel, `--cost`) is the H200's at the Llama-3-8B shape
(`step_profile_h200/`): "tokens" charges a step by its tokens (decodes and prompt tokens
together: nearly flat while the weights' reads bound it, 15-23 us a token beyond), its
decodes' context and a fixed cost of a mixed step; "flat", the first model, a prompt token a
flat 17.6 us beside the decode step of the streams. Three steps are in flight, as the cuda
plugin's overlap keeps them. No host time, no jitter: the simulated tail is the policy's, a
real run's is longer. Neither model predicted call 71: the prefill backlog rule
(--prefill-backlog-steps 16) gained 2.3% ("flat") and 3.2% ("tokens") of c=128's tokens/s in
the model and lost 1.5% on the device, whose decodes a step rose by 3 where the model's rose
by 6-8 and whose time to first token fell to ~330 ms where the model's fell to 110-114. The
model's steps grew about as the device's did (4.4% and 6.3% against 5.0%). A policy the model
favours still needs the device's word.

`--workload b2` replays B2 instead: `tessera bench offline`'s 256 requests, all sent at once,
under the offline engine's defaults (`run_b2`; `LLM_DEFAULTS`: whole chunks beside running
decodes). With --padded it read 10621 output tok/s, the same with --no-fill-padded-steps (a
whole chunk leaves no padding to fill); with serving's protection of decodes (--set
max_mixed_step_ratio=1.8) 10321. The "flat" model: 11201 and 10651. An H200's B2 read
10741-10779 at 8bc9200; at b45623a serving's ratio cost it 6-12% (9178 and 9782 against
10447), more than either model says.

`--padded` charges each step at the size the cuda plugin's graphs run it at (a step that
prefills at its mixed graph's token bucket, a decode step at its batch's graph) and gives the
scheduler those sizes, as the worker's WorkerReady does; the scheduler then fills the prefill
steps' padding with prompt tokens, as the engine does by default (c=128: +3.4% tokens/s, TTFT
p50 556 -> 121 ms; H100s measured +1.4-5.2%, docs/performance.md); `--set
fill_padded_steps=false` keeps the measured budget alone.
"""

from __future__ import annotations

import argparse
import dataclasses
import heapq
import json
import sys
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tessera.benchmarks.common import percentile
from tessera.benchmarks.datasets import BenchRequest, random_requests
from tessera.bus.messages import DetokInfo, SampledTokens, SamplingParams, TokenizedRequest
from tessera.scheduler_proc.config import SchedulerConfig
from tessera.scheduler_proc.scheduler import Scheduler
from tessera.worker_proc.capture_plan import capture_batch_sizes, padded_batch_size, token_buckets

# The H200 at the Llama-3-8B shape, bf16, the device's time of a step by its tokens (the step
# profile at 37121f2, `step_profile_h200/step_profile.json`): the linears, norms and the rest
# of M tokens (decodes and prompt tokens together) through the measured points, one token
# 3.95 ms (the weights' reads), 128 tokens 5.4, 256 6.98 (the decode steps of 128 and 256
# streams less their attention, a 128-token prefill 5.53), 512 11.3 and 2048 46.0 (prefills
# of 512 and 2048 tokens): flat while the weights' reads bound the step, 15-23 us a token
# beyond; decode attention 35.5 ns a token of context (5.45 ms of the 256-stream step over
# 256 x 600 tokens); a step that also prefills 1.0 ms more (the profile's mixed steps of 32
# decodes beside 16-512 prompt tokens against that sum: 0.9-2.3 ms, 0.1 beside 128 decodes).
VOCAB_SIZE = 128256  # Llama-3's, as B3's requests are drawn for it
TOKENS_MS = ((1, 3.95), (128, 5.4), (256, 6.98), (512, 11.3), (2048, 46.0))
ATTN_NS_PER_TOKEN = 35.5
MIXED_MS = 1.0
# The first model (5840fa0): the decode step by its streams, a prompt token a flat 17.6 us
# (the profile's 128 decodes beside 512 prompt tokens against the 128-stream decode step).
# It predicted that larger chunks cost their tokens' worth and no more; call 71 said otherwise
# (`--cost flat` keeps it for comparison).
BASE_MS = ((1, 3.95), (128, 5.28), (256, 6.98))
PREFILL_US_PER_TOKEN = 17.6


def _interp(points: tuple[tuple[int, float], ...], x: float) -> float:
    xs = [b for b, _ in points]
    ys = [ms for _, ms in points]
    slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2])
    return float(np.interp(x, xs, ys, left=ys[0], right=ys[-1] + (x - xs[-1]) * slope))


@dataclass(frozen=True)
class CostModel:
    """"tokens" (the default): linear(M tokens) + context x attention + MIXED_MS when the
    step prefills. "flat": base(decodes) + context x attention + 17.6 us a prompt token."""
    kind: str = "tokens"
    tokens_ms: tuple[tuple[int, float], ...] = TOKENS_MS
    base_ms: tuple[tuple[int, float], ...] = BASE_MS
    attn_ns_per_token: float = ATTN_NS_PER_TOKEN
    mixed_ms: float = MIXED_MS
    prefill_us_per_token: float = PREFILL_US_PER_TOKEN
    # The sizes the device runs steps at, padded (its captured graphs): a step that prefills
    # at the smallest of step_sizes that holds its tokens, a decode step at the smallest of
    # decode_sizes that holds its streams; beyond the largest (or none given) at its own.
    step_sizes: tuple[int, ...] = ()
    decode_sizes: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.kind not in ("tokens", "flat"):
            raise ValueError(f"cost model {self.kind!r}: tokens or flat")

    def base(self, streams: int) -> float:
        """flat: the decode step of this many streams, less its attention."""
        return _interp(self.base_ms, streams)

    def linear(self, tokens: int) -> float:
        """tokens: a step of this many tokens, less its attention."""
        return _interp(self.tokens_ms, tokens)

    def step_ms(self, seq_lens: np.ndarray, extend_lens: np.ndarray) -> float:
        """A step of these rows: decodes (one token each), prefill chunks (more)."""
        decode = extend_lens == 1
        return self.composed_ms(int(decode.sum()), int(extend_lens[~decode].sum()),
                                int(seq_lens[decode].sum()))

    def composed_ms(self, decodes: int, prefill: int, context: int) -> float:
        """A step of `decodes` streams over `context` tokens of theirs and `prefill` prompt
        tokens (what a step trace's row records)."""
        attention = context * self.attn_ns_per_token * 1e-6
        if self.kind == "flat":
            return (self.base(max(1, decodes)) + attention
                    + prefill * self.prefill_us_per_token * 1e-3)
        tokens = self.padded_size(decodes + prefill, prefills=bool(prefill))
        return (self.linear(max(1, tokens)) + attention
                + (self.mixed_ms if prefill else 0.0))

    def padded_size(self, tokens: int, prefills: bool) -> int:
        """The tokens a step of `tokens` runs as: the smallest size that holds it (of
        step_sizes for a step that prefills, of decode_sizes for a decode step), or its own."""
        sized = padded_batch_size(tokens, self.step_sizes if prefills else self.decode_sizes)
        return tokens if sized is None else sized

    def padded(self) -> CostModel:
        """This model on the cuda plugin's default graphs: mixed steps of up to 1024 tokens
        (--graph-max-tokens) at token_buckets' sizes, decode batches of up to 256 at
        capture_batch_sizes'."""
        return dataclasses.replace(self, step_sizes=tuple(token_buckets(1024)),
                                   decode_sizes=tuple(capture_batch_sizes(256)))


@dataclass
class _Req:
    prompt: np.ndarray
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


def run_tier(concurrency: int, *, requests_per_concurrency: int = 4,
             prompt_len: tuple[int, int] = (256, 1024), output_len: tuple[int, int] = (64, 512),
             seed: int = 0, client_gap_ms: float = 2.0, cost: CostModel | None = None,
             num_slots: int = 16 * 50_000, warm: bool = True,
             requests: list[BenchRequest] | None = None,
             **batching: Any) -> dict[str, float]:
    """One B3 tier through the scheduler: its figures (ms, tok/s) and step counts.
    `batching`: SchedulerConfig fields (the engine's batching flags) to set. `warm`: the
    scheduler starts knowing the device's costs (warm_up), as a server does after its
    warm-up requests and the tiers before. `requests`: these instead of serving.py's draw
    (`bench host --cost-model` replays the ones it sent)."""
    cost = cost or CostModel()
    # the requests serving.py draws for this tier (lengths and token ids alike)
    drawn = requests if requests is not None else random_requests(
        requests_per_concurrency * concurrency, prompt_len, output_len, VOCAB_SIZE,
        seed=seed + concurrency)
    n = len(drawn)
    reqs = [_Req(np.asarray(r.prompt_ids, dtype=np.int32), r.output_len) for r in drawn]
    config = dict(num_slots=num_slots, page_size=16, max_context_len=8192,
                  max_running_requests=256, chunked_prefill_size=2048, eos_token_ids=(0,),
                  overlap=True, overlap_steps=3,  # the cuda plugin's
                  step_token_sizes=cost.step_sizes)  # what the simulated worker reports
    config.update(batching)
    sched = Scheduler(SchedulerConfig(**config))  # type: ignore[arg-type]
    if warm:
        warm_up(sched, cost)
    clock = 0.0
    arrivals: list[tuple[float, int]] = [(0.0, i) for i in range(min(concurrency, n))]
    next_req = len(arrivals)
    by_rid: dict[str, int] = {}
    steps = decodes = prefill = 0
    in_flight: deque[tuple[Any, float, float]] = deque()
    device_free = 0.0
    while arrivals or sched.has_work() or in_flight:
        while arrivals and arrivals[0][0] <= clock:
            t, i = heapq.heappop(arrivals)
            new = reqs[i]
            new.sent = t
            by_rid[f"r{i}"] = i
            problem = sched.add_request(TokenizedRequest(
                rid=f"r{i}", input_ids=new.prompt,
                sampling=SamplingParams(max_tokens=new.output, ignore_eos=True),
                detok=DetokInfo(reply_to="sim")))
            if problem is not None:
                raise RuntimeError(f"the scheduler refused a request: {problem.message}")
        # Plan while the pipeline has room (steps_in_flight: 3 with the cuda plugin's
        # overlap); the device runs them one after another; the oldest's result comes back
        # at its end, and the scheduler plans the next with what it knows then.
        while (fb := sched.next_batch()) is not None:
            ms = cost.step_ms(fb.seq_lens, fb.extend_lens)
            ext = fb.extend_lens
            steps += 1
            decodes += int((ext == 1).sum())
            prefill += int(ext[ext > 1].sum())
            device_free = max(device_free, clock) + ms / 1000.0
            in_flight.append((fb, ms, device_free))
        if not in_flight:
            if not arrivals:
                raise RuntimeError("work left and no step planned: the scheduler is stuck")
            clock = arrivals[0][0]
            continue
        fb, ms, done = in_flight.popleft()
        clock = max(clock, done)
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
            "ttft_p50_ms": percentile(ttft, 50), "ttft_p90_ms": percentile(ttft, 90),
            "itl_p50_ms": percentile(itl, 50), "itl_p90_ms": percentile(itl, 90),
            "itl_p99_ms": percentile(itl, 99), "itl_max_ms": max(itl) if itl else 0.0,
            "steps": steps,
            "learned_prefill_ms_per_token": sched.step_cost.prefill_ms_per_token,
            "decode_tokens_per_step": decodes / max(1, steps),
            "prefill_tokens_per_step": prefill / max(1, steps)}


def run_b2(*, num_requests: int = 256, prompt_len: tuple[int, int] = (100, 1024),
           output_len: tuple[int, int] = (100, 1024), dataset_seed: int = 0,
           cost: CostModel | None = None, **batching: Any) -> dict[str, Any]:
    """B2 through the scheduler: the requests `tessera bench offline` draws (its defaults:
    256, prompts and outputs uniform in [100, 1024], dataset seed 0, Llama-3's vocabulary),
    all sent at once, with the offline engine's batching defaults under `batching`; output
    tokens/s over the batch's simulated wall time."""
    from tessera.offline import llm_engine_args

    drawn = random_requests(num_requests, prompt_len, output_len, VOCAB_SIZE, dataset_seed)
    out = run_tier(num_requests, requests_per_concurrency=1, cost=cost, requests=drawn,
                   **llm_engine_args(batching))
    return {**out, "workload": "B2"}


def _value(text: str) -> object:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tessera.benchmarks.sched_sim",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--workload", choices=["b3", "b2"], default="b3",
                   help="b3: the tiers of --concurrency (the default); b2: the offline batch "
                   "(run_b2)")
    p.add_argument("--concurrency", default="32,128")
    p.add_argument("--requests-per-concurrency", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--cost", choices=["tokens", "flat"], default="tokens",
                   help="the device's cost model (see CostModel)")
    p.add_argument("--padded", action="store_true",
                   help="steps run padded to the cuda plugin's graph sizes (CostModel.padded)")
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
    cost = CostModel(args.cost).padded() if args.padded else CostModel(args.cost)
    if args.workload == "b2":
        tiers = [run_b2(cost=cost, **batching)]
    else:
        tiers = [run_tier(int(c), requests_per_concurrency=args.requests_per_concurrency,
                          seed=args.seed, cost=cost, **batching)
                 for c in args.concurrency.split(",")]
    for t in tiers:
        print(json.dumps({k: round(v, 2) if isinstance(v, float) else v for k, v in t.items()}))
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"batching": batching, "tiers": tiers}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
