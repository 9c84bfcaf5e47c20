"""C2: scheduler CPU time per decode step: the control-plane overhead alone.

Drives `Scheduler` in-process with a worker that answers at once (no model, no sockets, no
encoding): what is measured is only the scheduler's own work per step, i.e. planning the batch
(page allocation, page-table writes, ForwardBatch arrays) plus applying the result (token
bookkeeping, finish checks, the TokenBatch for the detokenizer). Batches of 1, 64 and 256
long-running decodes, in the default overlap mode and with prefix caching on.

    python benchmarks/bench_scheduler.py [--out benchmarks/results/c2_scheduler_cpu.json]
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import numpy as np

from tessera.benchmarks.common import default_results_dir, new_result, write_result
from tessera.bus.codec import encode
from tessera.bus.messages import DetokInfo, SampledTokens, SamplingParams, TokenizedRequest
from tessera.scheduler_proc.config import SchedulerConfig
from tessera.scheduler_proc.scheduler import Scheduler

TARGET_MS_BS256 = 1.0


def measure(batch: int, steps: int, prompt_len: int, overlap: bool, seed: int = 0) -> dict:
    page_size = 16
    ctx = prompt_len + steps + 64
    cfg = SchedulerConfig(num_slots=page_size * (batch * (ctx // page_size + 2) + 8),
                          page_size=page_size, max_context_len=ctx,
                          max_running_requests=max(batch, 1), chunked_prefill_size=8192,
                          # the fake worker reports no step times: no step-time target
                          step_target_ms=0.0, eos_token_ids=(0,), overlap=overlap)
    sched = Scheduler(cfg)
    rng = np.random.default_rng(seed)
    sp = SamplingParams(temperature=0.7, max_tokens=steps + 32, ignore_eos=True)
    for i in range(batch):
        ids = rng.integers(1, 32000, size=prompt_len).astype(np.int32)
        assert sched.add_request(TokenizedRequest(rid=f"r{i}", input_ids=ids, sampling=sp,
                                                  detok=DetokInfo(reply_to=""))) is None
    pending: list = []
    answered = 0
    sched_cpu = 0.0  # thread CPU inside the scheduler's own calls only
    encode_cpu = 0.0  # + encoding ForwardBatch and TokenBatch for the wire (reported apart)
    tokens = rng.integers(1, 32000, size=batch).astype(np.int32)

    def step() -> None:
        nonlocal answered, sched_cpu, encode_cpu
        while True:
            t0 = time.thread_time()
            fb = sched.next_batch()
            sched_cpu += time.thread_time() - t0
            if fb is None:
                break
            t0 = time.thread_time()
            encode(fb)
            encode_cpu += time.thread_time() - t0
            # The "worker": answers at once (its time is not counted).
            pending.append(SampledTokens(step=fb.step,
                                         token_ids=tokens[:int(fb.sample.sum())]))
        res = pending.pop(0)
        t0 = time.thread_time()
        out = sched.on_result(res)
        sched_cpu += time.thread_time() - t0
        t0 = time.thread_time()
        if out is not None:
            encode(out)
        encode_cpu += time.thread_time() - t0
        answered += 1

    while len(sched.running) < batch or sched.st.kv_len[sched.running.active_rows()].min() < prompt_len:
        step()  # prefill everything first: the figure is about decode steps
    for _ in range(20):
        step()  # warm up
    cpu0, enc0, wall0, n0 = sched_cpu, encode_cpu, time.perf_counter(), answered
    for _ in range(steps):
        step()
    cpu = sched_cpu - cpu0
    enc = encode_cpu - enc0
    wall = time.perf_counter() - wall0
    n = answered - n0
    assert len(sched.running) == batch, "a request left during the measured decode steps"
    return {"batch": batch, "steps": n, "cpu_ms_per_step": cpu / n * 1e3,
            "encode_ms_per_step": enc / n * 1e3,
            "loop_wall_ms_per_step": wall / n * 1e3, "ema_ms_per_step": sched.cpu_ms_ema}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=os.path.join(default_results_dir(),
                                                      "c2_scheduler_cpu.json"))
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--no-overlap", action="store_true")
    args = parser.parse_args(argv)
    runs = {bs: measure(bs, args.steps, args.prompt_len, overlap=not args.no_overlap)
            for bs in (1, 64, 256)}
    config = {"steps": args.steps, "prompt_len": args.prompt_len, "page_size": 16,
              "overlap": not args.no_overlap, "radix_cache": True,
              "worker": "in-process, answers at once (no model, no sockets)"}
    result = new_result("C2", config, device="cpu (control plane only)")
    result["what"] = ("scheduler CPU time per decode step, control-plane overhead alone: "
                      "in-process Scheduler, a worker that answers at once, no model, no "
                      "sockets; message encoding reported apart")
    result["figures"] = {f"scheduler_ms_per_step_bs{bs}": round(r["cpu_ms_per_step"], 4)
                         for bs, r in runs.items()}
    result["figures_with_encoding"] = {
        f"scheduler_plus_encode_ms_per_step_bs{bs}":
            round(r["cpu_ms_per_step"] + r["encode_ms_per_step"], 4) for bs, r in runs.items()}
    result["target"] = {"scheduler_ms_per_step_bs256": TARGET_MS_BS256}
    result["meets_target"] = runs[256]["cpu_ms_per_step"] <= TARGET_MS_BS256
    result["runs"] = list(runs.values())
    out = Path(args.out)
    path = write_result(result, str(out.parent), out.name.removesuffix(".json"))
    for bs, r in runs.items():
        print(f"batch {bs:4d}: {r['cpu_ms_per_step']:.3f} ms scheduler CPU per decode step "
              f"(control plane alone); +{r['encode_ms_per_step']:.3f} ms to encode its "
              f"messages")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
