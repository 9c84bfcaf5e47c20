"""`tessera bench offline`: B2 through the offline API, against the roofline of the run.

    256 requests, prompt and output lengths uniform in [100, 1024], seed 0, ignore_eos, all
    sent at once; output tokens/s over the wall time of the batch.

The roofline bound is computed for the steps the run made: from the scheduler's step counters
when it exports them (forward_tokens_total, kv_tokens_read_total, attended_positions_total),
else by replaying its policy over this workload (`roofline.simulate_steps`, with the engine's
max running requests, chunk size and KV capacity; with pipeline stages each step dealt into
the batches in flight, `roofline.micro_batches`, since each reads the weights). Bandwidth and matmul peak are measured
before the engine starts (`device_probe`) unless given, per device; the bound sums them over
the --tp-size x --pp-size devices (every stage works on a batch of its own).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from contextlib import nullcontext
from typing import Any

from tessera.benchmarks import plots
from tessera.benchmarks.common import default_results_dir, new_result, write_result
from tessera.benchmarks.datasets import BenchRequest, parse_range, random_requests
from tessera.benchmarks.device_probe import probe
from tessera.benchmarks.engine_args import (
    add_engine_args,
    gc_pauses,
    host_path,
    process_stats,
    resolve_engine,
    scheduler_stats,
    worker_stats,
)
from tessera.benchmarks.roofline import (
    Device,
    ModelCost,
    RooflineResult,
    micro_batches,
    parallel_devices,
    roofline,
    roofline_from_totals,
    simulate_steps,
)

COUNTERS = ("forward_tokens_total", "kv_tokens_read_total", "attended_positions_total")


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--num-requests", type=int, default=256)
    p.add_argument("--prompt-len", default="100,1024")
    p.add_argument("--output-len", default="100,1024")
    p.add_argument("--dataset-seed", type=int, default=0)
    p.add_argument("--bandwidth-gbps", type=float, help="skip the copy measurement")
    p.add_argument("--peak-tflops", type=float, help="skip the matmul measurement")
    p.add_argument("--out-dir", default=default_results_dir())
    p.add_argument("--name", default="b2_offline")
    p.add_argument("--no-progress", action="store_true")


def run_bound(cost: ModelCost, device: Device, reqs: list[BenchRequest], before: dict[str, float],
              after: dict[str, float], engine: Any, kv_capacity: int | None
              ) -> tuple[RooflineResult, str, int]:
    """(bound, where its steps came from, steps simulated or counted)."""
    delta = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in ("steps", *COUNTERS)}
    # A Mixture-of-Experts step reads the experts its tokens chose: its bound needs each
    # step's token count, which only the replayed schedule has.
    if not cost.is_moe and all(k in after for k in COUNTERS) and delta["steps"] > 0:
        res = roofline_from_totals(cost, int(delta["steps"]), int(delta[COUNTERS[0]]),
                                   int(delta[COUNTERS[1]]), int(delta[COUNTERS[2]]), device)
        return res, "scheduler counters", int(delta["steps"])
    steps = micro_batches(
        simulate_steps([r.prompt_len for r in reqs], [r.output_len for r in reqs],
                       engine.max_running_requests, engine.chunked_prefill_size, kv_capacity),
        engine.pipeline_batches)
    return roofline(cost, steps, device), "replayed schedule", len(steps)


def _per_step(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    steps = after.get("steps", 0.0) - before.get("steps", 0.0)
    total = after.get("forward_ms_total", 0.0) - before.get("forward_ms_total", 0.0)
    return {"steps": steps, "forward_ms_per_step": total / steps if steps else 0.0,
            "all_reduce_one_shot_bytes": after.get("all_reduce_one_shot_bytes", 0.0),
            # launches that compiled or waited for the allocator (the worker logs each)
            "slow_launches": after.get("slow_launches", 0.0) - before.get("slow_launches", 0.0),
            # kernels compiled (or loaded from Triton's disk cache) during the measured run
            "kernel_compiles": after.get("kernel_compiles", 0.0)
            - before.get("kernel_compiles", 0.0),
            "launch_ms_max": after.get("launch_ms_max", 0.0),
            **host_path(before, after)}



def main(argv: list[str] | None = None, llm: Any = None) -> int:
    """`llm`: an engine already started with these engine flags (tessera bench b5 runs B1 and
    B2 on one), used and left running; else one is started for this run and stopped."""
    p = argparse.ArgumentParser(prog="tessera bench offline", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_args(p)
    add_engine_args(p)
    args = p.parse_args(argv)
    kwargs, engine, dev_name, dtype, mconf = resolve_engine(args)
    # Measured before the engine takes the device's memory.
    device, source = probe(dev_name, dtype, args.bandwidth_gbps, args.peak_tflops)
    print(f"[bench] device: {device.bandwidth_gbps:.0f} GB/s, {device.peak_tflops:.1f} TFLOP/s "
          f"({source})", file=sys.stderr)
    reqs = random_requests(args.num_requests, parse_range(args.prompt_len),
                           parse_range(args.output_len), mconf.vocab_size, args.dataset_seed)

    from tessera.bus.messages import SamplingParams
    from tessera.offline import LLM

    params = [SamplingParams(temperature=0.0, max_tokens=r.output_len, ignore_eos=True)
              for r in reqs]
    with nullcontext(llm) if llm is not None else LLM(**kwargs) as llm:
        # Warm-up: first-use costs stay out of the figure. Kernels compile on first use, and
        # the plugin measures launch tiles once per batch-size bucket (the fused MoE's, the
        # quantized GEMMs'), so steps of the run's larger sizes go first too, on prompts of
        # their own (nothing the radix cache could reuse in the run).
        warm = SamplingParams(max_tokens=4, ignore_eos=True)
        llm.generate([reqs[0].prompt_ids[:16]], warm, use_tqdm=False)
        longest = max(len(r.prompt_ids) for r in reqs)
        for i, (n, count) in enumerate(((min(longest, 200), 1), (longest, 1), (longest, 8))):
            extra = random_requests(count, (n, n), (4, 4), mconf.vocab_size,
                                    args.dataset_seed + 1 + i)
            llm.generate([r.prompt_ids for r in extra], warm, use_tqdm=False)
        # The counters before the run come from heartbeats sent after the warm-up's last
        # step, as those after it do: a heartbeat from inside the warm-up would count its
        # last steps (and what they compiled) into the run.
        time.sleep(2 * engine.heartbeat_interval_s)
        before = scheduler_stats(llm)
        workers_before = worker_stats(llm)
        processes_before = process_stats(llm)
        t0 = time.perf_counter()
        t0_ns = time.time_ns()
        outs = llm.generate([r.prompt_ids for r in reqs], params,
                            use_tqdm=not args.no_progress)
        wall = time.perf_counter() - t0
        time.sleep(2 * engine.heartbeat_interval_s)  # let a fresh heartbeat carry the counters
        after = scheduler_stats(llm)
        workers = worker_stats(llm)
        processes = process_stats(llm)
    out_tokens = sum(o.completion_tokens for o in outs)
    in_tokens = sum(r.prompt_len for r in reqs)
    kv_capacity = None
    if after.get("kv_pages_total"):
        kv_capacity = int(after["kv_pages_total"]) * engine.page_size
    cost = ModelCost.of(mconf, dtype)
    devices = parallel_devices(engine.tp_size, engine.pp_size, stages_overlap=True)
    bound, steps_source, steps = run_bound(cost, device.times(devices), reqs, before, after,
                                           engine, kv_capacity)
    tok_s = out_tokens / wall
    bound_tok_s = bound.tok_per_s(out_tokens)
    print(f"[bench] B2: {tok_s:.1f} output tok/s; roofline bound {bound_tok_s:.1f} tok/s "
          f"({tok_s / bound_tok_s:.1%})", file=sys.stderr)

    result = new_result("B2", {**vars(args), "engine": kwargs, "dtype": dtype})
    result["figures"] = {
        "output_tok_per_s": tok_s,
        "roofline_bound_tok_per_s": bound_tok_s,
        "roofline_fraction": tok_s / bound_tok_s,
        "total_tok_per_s": (out_tokens + in_tokens) / wall,
        "duration_s": wall,
        "output_tokens": out_tokens,
        "expected_output_tokens": sum(r.output_len for r in reqs),
        "input_tokens": in_tokens,
        "roofline": {
            "bound_s": bound.bound_s, "memory_s": bound.memory_s, "compute_s": bound.compute_s,
            "steps": steps, "steps_source": steps_source,
            "engine_steps": after.get("steps", 0.0) - before.get("steps", 0.0),
            "bytes_read": bound.bytes_read, "flops": bound.flops,
            "weight_bytes": cost.weight_bytes, "kv_bytes_per_token": cost.kv_bytes_per_token,
            "bandwidth_gbps": device.bandwidth_gbps, "peak_tflops": device.peak_tflops,
            "bandwidth_source": source["bandwidth"], "peak_source": source["peak"],
            "kv_capacity_tokens": kv_capacity, "devices": devices,
        },
        "scheduler_stats": after,
        # Per worker over the run: steps and forward milliseconds per step (device and host
        # time of a step as the worker sees it), to see where a layout's time goes.
        "worker_steps": {name: _per_step(workers_before.get(name, {}), stats)
                         for name, stats in workers.items()},
        # Each process's garbage-collector passes over the run: a pause stops its loop.
        "gc_pauses": gc_pauses(processes_before, processes),
    }
    if engine.trace_messages_dir:  # every measured step, laid out (benchmarks/step_trace.py)
        from tessera.benchmarks.step_trace import summarize

        traced = summarize(engine.trace_messages_dir, since_ns=t0_ns)
        rows = traced.pop("rows")
        result["figures"]["step_trace"] = traced
        with open(os.path.join(args.out_dir, f"{args.name}_steps.json"), "w") as f:
            json.dump(rows, f)
    png = plots.bars(["tessera", "roofline bound"], [tok_s, bound_tok_s],
                     os.path.join(args.out_dir, f"{args.name}.png"),
                     f"B2 on {result['device']}: {tok_s / bound_tok_s:.0%} of the bound",
                     "output tokens/s")
    result["plots"] = [os.path.basename(png)] if png else []
    path = write_result(result, args.out_dir, args.name)
    print(f"[bench] wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
