"""`tessera bench peer` and `tessera bench c1`: tessera against transformers `generate`.

    c1    C1: N requests (32) x T output tokens (64), greedy, EOS ignored. The peer runs them one
          at a time (all, or the first --peer-requests), then tessera runs all N at once through
          the offline API, in the same run; output tokens/s of each and the speed-up.
    peer  the HF baseline of B1 (batch 1, 512 prompt tokens, 128 output): decode ms/step and
          TTFT of transformers `generate` (also at --batch-sizes 16,64 like BENCHMARKS.md).

The peer runs first and is freed before the engine starts, so the two never share the device
(or, on a CPU, its cores).
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import time
from typing import Any

from tessera.benchmarks import plots
from tessera.benchmarks.bench_host import cpu_seconds
from tessera.benchmarks.common import default_results_dir, new_result, write_result
from tessera.benchmarks.datasets import parse_range, random_requests
from tessera.benchmarks.device_probe import torch_device
from tessera.benchmarks.engine_args import (
    add_engine_args,
    resolve_engine,
)
from tessera.benchmarks.hf_peer import PeerRun, generate, load_peer
from tessera.hal.host_threads import set_wait_policy


def intra_op_threads() -> int:
    import torch

    return int(torch.get_num_threads())


def _free(peer: Any) -> None:
    del peer
    gc.collect()
    try:
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    except ImportError:
        pass


def model_label(model: str) -> str:
    if model == "default":
        return "SmolLM2-135M-Instruct"
    return os.path.basename(model.rstrip("/"))


def _common(p: argparse.ArgumentParser, name: str) -> None:
    p.add_argument("--dataset-seed", type=int, default=0)
    p.add_argument("--out-dir", default=default_results_dir())
    p.add_argument("--name", default=name)
    add_engine_args(p)


def _c1_run(args: argparse.Namespace, kwargs: dict[str, Any], engine: Any, device: str,
            dtype: str, reqs: list[Any]) -> dict[str, Any]:
    """One C1 run: the peer one request at a time, then tessera with all at once."""
    peer_reqs = reqs[: args.peer_requests or len(reqs)]
    print(f"[bench] C1 peer: transformers generate, {len(peer_reqs)} requests one at a time",
          file=sys.stderr)
    peer = load_peer(engine.model, engine.load_format, dtype, device, engine.seed)
    generate(peer, [reqs[0].prompt_ids[:8]], 2)  # warm-up
    peer_runs: list[PeerRun] = []
    peer_cpu0 = time.process_time()  # the peer runs in this process, every thread counted
    for i, r in enumerate(peer_reqs):
        peer_runs.append(generate(peer, [r.prompt_ids], r.output_len))
        print(f"[bench]   peer {i + 1}/{len(peer_reqs)}: {peer_runs[-1].seconds:.2f} s",
              file=sys.stderr)
    peer_cpu_s = time.process_time() - peer_cpu0
    _free(peer)
    peer_tokens = sum(run.output_tokens for run in peer_runs)
    peer_tok_s = peer_tokens / sum(run.seconds for run in peer_runs)

    from tessera.bus.messages import SamplingParams
    from tessera.offline import LLM

    print(f"[bench] C1 tessera: {len(reqs)} requests at once", file=sys.stderr)
    params = SamplingParams(temperature=0.0, max_tokens=args.output_len, ignore_eos=True)
    with LLM(**kwargs) as llm:
        llm.generate([reqs[0].prompt_ids[:8]], SamplingParams(max_tokens=2, ignore_eos=True),
                     use_tqdm=False)
        cpu0 = engine_cpu_seconds(llm)
        t0 = time.perf_counter()
        outs = llm.generate([r.prompt_ids for r in reqs], params)
        wall = time.perf_counter() - t0
        cpu_s = engine_cpu_seconds(llm) - cpu0
    tokens = sum(o.completion_tokens for o in outs)
    tok_s = tokens / wall
    cpu_per_token, peer_cpu_per_token = cpu_s / tokens, peer_cpu_s / peer_tokens
    figures: dict[str, Any] = {
        "output_tok_per_s": tok_s,
        "peer_output_tok_per_s": peer_tok_s,
        "speedup_vs_peer": tok_s / peer_tok_s,
        "output_tokens": tokens,
        "duration_s": wall,
        "peer_output_tokens": peer_tokens,
        "peer_requests": len(peer_runs),
        "peer_decode_ms_per_step": statistics.median(r.decode_ms_per_step for r in peer_runs),
        # CPU seconds per output token (tessera: every engine process and this caller) hardly
        # move with the machine's load, where the tokens/s of a shared 2-core machine do
        "cpu_ms_per_token": cpu_per_token * 1e3,
        "peer_cpu_ms_per_token": peer_cpu_per_token * 1e3,
        "cpu_efficiency_vs_peer": peer_cpu_per_token / cpu_per_token,
        "load_average_1m_at_start": os.getloadavg()[0],
    }
    if engine.load_format != "dummy":  # same weights: greedy outputs should mostly agree
        same = [o.token_ids[:8] == run.token_ids[:8] for o, run in zip(outs, peer_runs,
                                                                        strict=False)]
        figures["greedy_prefix8_match"] = sum(same) / len(same) if same else None
    print(f"[bench] C1: tessera {tok_s:.1f} tok/s, transformers {peer_tok_s:.1f} tok/s: "
          f"{tok_s / peer_tok_s:.2f}x; CPU per token {cpu_per_token * 1e3:.1f} vs "
          f"{peer_cpu_per_token * 1e3:.1f} ms", file=sys.stderr)
    return figures


def engine_cpu_seconds(llm: Any) -> float:
    """CPU seconds so far of every engine process (all threads) and of this process (the
    caller's client)."""
    for attempt in range(3):  # a status call can time out on a busy machine
        try:
            processes = llm.status()
            break
        except Exception:  # noqa: BLE001 - retried, then raised
            if attempt == 2:
                raise
            time.sleep(1.0)
    total = time.process_time()
    for info in processes.values():
        pid = info.get("pid")
        if isinstance(pid, int) and pid > 0:
            try:
                total += cpu_seconds(pid)
            except OSError:
                pass  # gone since the status was taken
    return total


def main_c1(argv: list[str] | None = None) -> int:
    # The peer gets the OpenMP wait policy the engine's workers run with (hal/host_threads.py):
    # on a machine shared with other work, spinning threads cost it as much as the engine.
    wait_policy = set_wait_policy()  # before torch is imported
    p = argparse.ArgumentParser(prog="tessera bench c1", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--num-requests", type=int, default=32)
    p.add_argument("--output-len", type=int, default=64)
    p.add_argument("--prompt-len", default="32,256")
    p.add_argument("--peer-requests", type=int, help="run only the first K on the peer "
                   "(its tokens/s is a rate; default: all)")
    p.add_argument("--runs", type=int, default=1, help="repeat the whole comparison; the "
                   "figures are the run of median speed-up, every run is kept under 'runs'")
    _common(p, "c1_cpu" if torch_device() == "cpu" else "c1_gpu")
    args = p.parse_args(argv)
    kwargs, engine, device, dtype, mconf = resolve_engine(args)
    reqs = random_requests(args.num_requests, parse_range(args.prompt_len),
                           (args.output_len, args.output_len), mconf.vocab_size,
                           args.dataset_seed)
    runs = [_c1_run(args, kwargs, engine, device, dtype, reqs) for _ in range(args.runs)]
    ranked = sorted(runs, key=lambda f: f["speedup_vs_peer"])
    figures = dict(ranked[(len(ranked) - 1) // 2])  # the median run (the lower for even counts)
    speedups = [f["speedup_vs_peer"] for f in runs]
    figures["runs"] = runs
    figures["speedup_min"], figures["speedup_max"] = min(speedups), max(speedups)
    efficiency = [f["cpu_efficiency_vs_peer"] for f in runs]
    figures["cpu_efficiency_median"] = statistics.median(efficiency)
    figures["cpu_efficiency_min"], figures["cpu_efficiency_max"] = min(efficiency), max(efficiency)
    tok_s, peer_tok_s = figures["output_tok_per_s"], figures["peer_output_tok_per_s"]
    result = new_result("C1", {**vars(args), "engine": kwargs, "dtype": dtype,
                               "peer": "transformers generate, one request at a time",
                               "omp_wait_policy": wait_policy,
                               "intra_op_threads": intra_op_threads()})
    result["figures"] = figures
    png = plots.bars(["tessera (32 at once)", "transformers (one by one)"], [tok_s, peer_tok_s],
                     os.path.join(args.out_dir, f"{args.name}.png"),
                     f"C1: {model_label(engine.model)} on {result['device']}, "
                     f"{tok_s / peer_tok_s:.1f}x (median of {len(runs)})", "output tokens/s")
    result["plots"] = [os.path.basename(png)] if png else []
    path = write_result(result, args.out_dir, args.name)
    print(f"[bench] C1 over {len(runs)} run(s): median {figures['speedup_vs_peer']:.2f}x, "
          f"range {min(speedups):.2f}-{max(speedups):.2f}x; wrote {path}", file=sys.stderr)
    return 0


def main_peer(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="tessera bench peer", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--prompt-len", type=int, default=512)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--batch-sizes", default="1", help="e.g. 1,16,64")
    p.add_argument("--iters", type=int, default=3)
    _common(p, "b1_peer_transformers")
    args = p.parse_args(argv)
    kwargs, engine, device, dtype, mconf = resolve_engine(args)
    peer = load_peer(engine.model, engine.load_format, dtype, device, engine.seed)
    per_batch: dict[str, dict[str, float]] = {}
    for bs in [int(x) for x in args.batch_sizes.split(",")]:
        reqs = random_requests(bs, (args.prompt_len, args.prompt_len),
                               (args.output_len, args.output_len), mconf.vocab_size,
                               args.dataset_seed)
        prompts = [r.prompt_ids for r in reqs]
        generate(peer, prompts, 4)  # warm-up
        runs = [generate(peer, prompts, args.output_len) for _ in range(args.iters)]
        per_batch[str(bs)] = {
            "decode_ms_per_step": statistics.median(r.decode_ms_per_step for r in runs),
            "ttft_ms": statistics.median(r.ttft_s for r in runs) * 1000.0,
            "output_tok_per_s": statistics.median(r.output_tokens / r.seconds for r in runs),
        }
        print(f"[bench] transformers batch {bs}: {per_batch[str(bs)]}", file=sys.stderr)
    _free(peer)
    first = next(iter(per_batch.values()))
    result = new_result("B1", {**vars(args), "engine": kwargs, "dtype": dtype,
                               "peer": "transformers generate (eager)"})
    result["figures"] = {"decode_ms_per_step": first["decode_ms_per_step"],
                         "ttft_ms": first["ttft_ms"], "by_batch_size": per_batch}
    path = write_result(result, args.out_dir, args.name)
    print(f"[bench] wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main_c1())
