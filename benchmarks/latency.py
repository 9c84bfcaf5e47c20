"""`tessera bench latency`: B1, one request at a time through the offline API, streamed.

    batch 1, 512 prompt tokens, 128 output tokens (ignore_eos), greedy
    decode ms/step = (time of the last token - time of the first) / (tokens - 1)
    TTFT = time from sending the request to its first token, as the caller sees it

Each figure is the median over `--iters` measured requests (after `--warmup` unmeasured ones).
The roofline of a batch-1 decode step at this context (weights + KV, against the measured or
given bandwidth per device) is reported beside it: with --tp-size N over N devices' summed
bandwidth; pipeline stages take turns on one request, so --pp-size adds none.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from contextlib import nullcontext
from typing import Any

from tessera.benchmarks.common import default_results_dir, new_result, write_result
from tessera.benchmarks.datasets import random_requests
from tessera.benchmarks.device_probe import probe
from tessera.benchmarks.engine_args import (
    add_engine_args,
    host_path,
    resolve_engine,
    worker_stats,
)
from tessera.benchmarks.roofline import ModelCost, StepShape, parallel_devices, roofline


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--prompt-len", type=int, default=512)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--dataset-seed", type=int, default=0)
    p.add_argument("--bandwidth-gbps", type=float)
    p.add_argument("--peak-tflops", type=float)
    p.add_argument("--no-roofline", action="store_true", help="skip the device measurement")
    p.add_argument("--out-dir", default=default_results_dir())
    p.add_argument("--name", default="b1_latency")


def decode_roofline_ms(cost: ModelCost, prompt_len: int, output_len: int, bandwidth_gbps: float,
                       peak_tflops: float) -> float:
    """Mean bound of the batch-1 decode steps of one request, in ms."""
    from tessera.benchmarks.roofline import Device

    steps = [StepShape((1,), (prompt_len + i + 1,)) for i in range(1, output_len)]
    res = roofline(cost, steps, Device(bandwidth_gbps, peak_tflops))
    return res.bound_s / max(1, len(steps)) * 1000.0


def main(argv: list[str] | None = None, llm: Any = None) -> int:
    """`llm`: an engine already started with these engine flags (tessera bench b5 runs B1 and
    B2 on one), used and left running; else one is started for this run and stopped."""
    p = argparse.ArgumentParser(prog="tessera bench latency", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_args(p)
    add_engine_args(p)
    args = p.parse_args(argv)
    kwargs, engine, dev_name, dtype, mconf = resolve_engine(args)
    device = None
    if not args.no_roofline:
        device, source = probe(dev_name, dtype, args.bandwidth_gbps, args.peak_tflops)
    reqs = random_requests(args.warmup + args.iters, (args.prompt_len, args.prompt_len),
                           (args.output_len, args.output_len), mconf.vocab_size,
                           args.dataset_seed)

    from tessera.bus.messages import SamplingParams
    from tessera.offline import LLM

    params = SamplingParams(temperature=0.0, max_tokens=args.output_len, ignore_eos=True)
    decode_ms: list[float] = []
    ttft_ms: list[float] = []
    workers_before: dict[str, dict[str, float]] = {}
    with nullcontext(llm) if llm is not None else LLM(**kwargs) as llm:
        for i, req in enumerate(reqs):
            if i == args.warmup:  # the workers' counters from here on: the measured requests
                time.sleep(2 * engine.heartbeat_interval_s)
                workers_before = worker_stats(llm)
            (out,) = llm.generate([req.prompt_ids], params, stream=True, use_tqdm=False)
            if i < args.warmup:
                continue
            times = out.token_times
            if len(times) >= 2:
                decode_ms.append((times[-1] - times[0]) / (len(times) - 1) * 1000.0)
            if out.ttft_s is not None:
                ttft_ms.append(out.ttft_s * 1000.0)
            print(f"[bench] B1 iter {i - args.warmup}: decode {decode_ms[-1]:.2f} ms/step, "
                  f"TTFT {ttft_ms[-1]:.1f} ms, {len(times)} tokens", file=sys.stderr)
        time.sleep(2 * engine.heartbeat_interval_s)  # a fresh heartbeat carries the counters
        workers = worker_stats(llm)
    figures: dict[str, Any] = {
        "decode_ms_per_step": statistics.median(decode_ms) if decode_ms else float("nan"),
        "ttft_ms": statistics.median(ttft_ms) if ttft_ms else float("nan"),
        "decode_ms_per_step_all": decode_ms,
        "ttft_ms_all": ttft_ms,
        # What each worker ran on: the TP all-reduce's one-shot limit (0: the collective
        # library for every all-reduce), its steps and forward time, and over the measured
        # requests its host path (launch work and round trip per step).
        "workers": {name: {**{k: stats.get(k, 0.0) for k in
                              ("steps", "forward_ms_avg", "all_reduce_one_shot_bytes")},
                           **host_path(workers_before.get(name, {}), stats)}
                    for name, stats in workers.items()},
    }
    if engine.trace_messages_dir:
        from tessera.benchmarks.message_trace import summarize

        # Where each measured request's time to its first token went, hop by hop (the
        # median over the measured requests, the warm-up ones left out).
        traced = summarize(engine.trace_messages_dir, skip=args.warmup)
        figures["first_token_path_ms"] = {stage: stat["median"]
                                          for stage, stat in traced["stages_ms"].items()}
        figures["first_token_path_requests"] = len(traced["per_request"])
    if device is not None:
        devices = parallel_devices(engine.tp_size, engine.pp_size, stages_overlap=False)
        used = device.times(devices)
        bound = decode_roofline_ms(ModelCost.of(mconf, dtype), args.prompt_len, args.output_len,
                                   used.bandwidth_gbps, used.peak_tflops)
        figures.update({"roofline_decode_ms_per_step": bound,
                        "roofline_fraction": bound / figures["decode_ms_per_step"],
                        "bandwidth_gbps": device.bandwidth_gbps,
                        "peak_tflops": device.peak_tflops, "device_source": source,
                        "roofline_devices": devices})
    result = new_result("B1", {**vars(args), "engine": kwargs, "dtype": dtype})
    result["figures"] = figures
    print(f"[bench] B1: {figures['decode_ms_per_step']:.2f} ms/step, TTFT "
          f"{figures['ttft_ms']:.1f} ms", file=sys.stderr)
    path = write_result(result, args.out_dir, args.name)
    print(f"[bench] wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
