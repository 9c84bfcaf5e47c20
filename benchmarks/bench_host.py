"""`tessera bench host`: the host path's CPU under streaming load, per streamed token and per step.

Every engine process is the real one (HTTP server, tokenizer, scheduler, detokenizer,
supervisor) except the worker, a fake whose "device" takes `--step-ms` per step while it
sleeps (`fake_worker.py`; 6 ms is the H200's batch-32 decode step). A B3-shaped load (OpenAI
completions, streamed, token-id prompts) runs at each `--concurrency`; around each tier the
benchmark reads every process's CPU time (/proc) and the counters its heartbeats carry, and
reports per tier:

    cpu_us_per_token[process]     CPU of each process per streamed token (server: the figure
                                  the serving issue asks for)
    cpu_ms_per_step[process]      the same per scheduler step
    messages_per_step[hop]        bus messages per step on each hop back to the HTTP client:
                                  scheduler -> detokenizer, detokenizer -> server, what the
                                  server's receiver thread took, loop wake-ups it caused, SSE
                                  events and the socket writes that carried them
    itl / ttft / tok/s            as B3 measures them; against the fake step time they show
                                  how much the host path adds

The load generator runs in this process on the same machine; its own CPU is reported apart.

With `--cost-model tokens` (or `flat`) the fake device takes what the scheduling simulator's
model of the H200 gives each step (`sched_sim.CostModel`), three steps in flight as the cuda
plugin keeps them, and each tier is also replayed through the simulator over the very
requests it sent (`sim_*` figures, `fraction_of_sim`): the same scheduling and device costs
with no host path at all, so the fraction is what the real processes between the device and
the clients lose. `--padded` charges the steps at the cuda graphs' padded sizes, which the
fake worker reports to the scheduler as the real one does; the replay takes the batching
flags of `--server-args` (`--fill-padded-steps`, the ratios) as the engine does.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from typing import Any

from tessera.benchmarks.common import default_results_dir, new_result, write_result
from tessera.benchmarks.datasets import parse_range, random_requests
from tessera.benchmarks.engine_args import host_path
from tessera.benchmarks.fake_worker import add_device_args, device_argv
from tessera.benchmarks.server_launch import ServerProcess
from tessera.benchmarks.serving_driver import run_tier, tier_stats
from tessera.bus.run_paths import RUN_PREFIX

HOST_PROCESSES = ("server", "tokenizer0", "scheduler", "detokenizer")
# counter -> (process, heartbeat stat): messages on each hop back to the HTTP client
HOPS: dict[str, tuple[str, str]] = {
    "scheduler_to_detokenizer": ("scheduler", "detokenizer_messages_sent"),
    "detokenizer_to_clients": ("detokenizer", "messages_sent"),
    "server_bus_messages_received": ("server", "bus_messages_received"),
    "server_loop_wakeups": ("server", "loop_wakeups"),
    "sse_events": ("server", "sse_events"),
    "sse_writes": ("server", "sse_writes"),
}
_TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """user + system CPU of a process (all its threads) so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK  # utime, stime (fields 14, 15)


class Snapshot:
    """Every process's CPU seconds and heartbeat stats at one moment."""

    def __init__(self, status: Any) -> None:
        self.cpu: dict[str, float] = {}
        self.stats: dict[str, dict[str, float]] = {}
        for name, info in status.processes.items():
            self.stats[name] = dict(info.get("stats") or {})
            pid = info.get("pid")
            if isinstance(pid, int) and pid > 0:
                try:
                    self.cpu[name] = cpu_seconds(pid)
                except OSError:
                    pass
        self.own_cpu = time.process_time()

    def stat(self, process: str, name: str) -> float:
        return float(self.stats.get(process, {}).get(name, 0.0))


def snapshot(client: Any, settle_s: float) -> Snapshot:
    time.sleep(settle_s)  # heartbeats carry the counters: let one more arrive
    return Snapshot(client.status())


def tier_figures(before: Snapshot, after: Snapshot, stats: dict[str, Any]) -> dict[str, Any]:
    tokens = max(1, int(stats["total_output_tokens"]))
    steps = max(1.0, after.stat("scheduler", "steps") - before.stat("scheduler", "steps"))
    cpu = {name: after.cpu[name] - before.cpu[name] for name in after.cpu if name in before.cpu}
    host = {name: cpu.get(name, 0.0) for name in HOST_PROCESSES}
    return {
        "concurrency": stats["concurrency"],
        "requests": stats["requests"],
        "errors": stats["errors"],
        "output_tokens": tokens,
        "steps": steps,
        "tokens_per_step": tokens / steps,
        "output_tok_per_s": stats["output_tok_per_s"],
        "itl_p50_ms": stats["itl_p50_ms"],
        "itl_p99_ms": stats["itl_p99_ms"],
        "ttft_p50_ms": stats["ttft_p50_ms"],
        "server_cpu_us_per_token": host["server"] / tokens * 1e6,
        "host_cpu_us_per_token": sum(host.values()) / tokens * 1e6,
        "cpu_us_per_token": {k: v / tokens * 1e6 for k, v in sorted(cpu.items())},
        "cpu_ms_per_step": {k: v / steps * 1e3 for k, v in sorted(cpu.items())},
        "cpu_s": dict(sorted(cpu.items())),
        "load_generator_cpu_s": after.own_cpu - before.own_cpu,
        # from a step's result leaving the worker to the next step in its hands, where it
        # waited for it: what the device idles for once this exceeds its step (two in flight)
        "worker_round_trip_ms": host_path(before.stats.get("worker0", {}),
                                          after.stats.get("worker0", {}))["round_trip_ms"],
        "messages_per_step": {
            hop: (after.stat(p, s) - before.stat(p, s)) / steps for hop, (p, s) in HOPS.items()},
        "error_samples": stats.get("error_samples", []),
    }


SIM_OVERLAP_STEPS = 3
SIM_FIGURES = ("output_tok_per_s", "ttft_p50_ms", "itl_p50_ms", "itl_p99_ms", "steps",
               "decode_tokens_per_step", "prefill_tokens_per_step")


def engine_batching(server_args: list[str]) -> dict[str, Any]:
    """The batching flags among `server_args` (the engine's), as SchedulerConfig fields:
    what the simulator's scheduler is given so that it schedules as the engine's does.
    --overlap-steps stays the simulator's (the cuda plugin's 3, as bench host runs it)."""
    import dataclasses

    from tessera.config import BatchingConfig, Env, ServerConfig

    parser = argparse.ArgumentParser(add_help=False)
    ServerConfig.add_cli_args(parser)
    given = ServerConfig.from_cli(parser.parse_args(server_args), Env(None, None, None, None,
                                                                      None))
    default = ServerConfig()
    return {f.name: getattr(given, f.name) for f in dataclasses.fields(BatchingConfig)
            if f.name != "overlap_steps" and getattr(given, f.name) != getattr(default, f.name)}


def simulated(reqs: list[Any], concurrency: int, cost_model: str,
              tier: dict[str, Any], padded: bool = False,
              batching: dict[str, Any] | None = None) -> dict[str, Any]:
    """The tier's requests through the scheduler on the simulated clock, with the fake
    device's costs (padded as its steps were) and the engine's batching flags, and no host
    path: what the measured tier would be if the processes between the device and the
    clients cost nothing."""
    from tessera.benchmarks.sched_sim import CostModel
    from tessera.benchmarks.sched_sim import run_tier as sim_tier

    cost = CostModel(cost_model).padded() if padded else CostModel(cost_model)
    sim = sim_tier(concurrency, requests=reqs, cost=cost, **(batching or {}))
    out: dict[str, Any] = {f"sim_{k}": sim[k] for k in SIM_FIGURES}
    out["fraction_of_sim"] = tier["output_tok_per_s"] / sim["output_tok_per_s"]
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="tessera bench host", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="default", help="whose tokenizer the engine uses")
    add_device_args(p)  # with --cost-model, each tier also replayed through the simulator
    p.add_argument("--concurrency", default="32,128")
    p.add_argument("--prompt-len", default="256,1024")
    p.add_argument("--output-len", default="64,512")
    p.add_argument("--requests-per-concurrency", type=int, default=2)
    p.add_argument("--server-args", default="", help="more engine flags, one string")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out-dir", default=default_results_dir())
    p.add_argument("--name", default="host_path_cpu")
    p.add_argument("--log", help="append the engine's log to this file")
    args = p.parse_args(argv)
    fake_args = device_argv(p, args)
    batching = engine_batching(args.server_args.split())

    from tessera.client import Client
    from tessera.formats.tokenizer import load_tokenizer

    vocab = load_tokenizer(args.model).vocab_size
    root = os.environ.get("TESSERA_RUN_ROOT") or tempfile.gettempdir()
    run_dir = os.path.join(root, f"{RUN_PREFIX}host-{os.getpid()}")
    engine_args = ["--model", args.model, "--run-dir", run_dir, "--heartbeat-interval-s", "0.1",
                   *fake_args,
                   # the cuda plugin's three steps in flight, as the simulator has them
                   *(["--overlap-steps", str(SIM_OVERLAP_STEPS)] if args.cost_model != "none"
                     else []),
                   *args.server_args.split()]
    tiers: list[dict[str, Any]] = []
    with ServerProcess(engine_args, module="tessera.benchmarks.fake_engine",
                       log_path=args.log) as server:
        url = server.wait_ready(300)
        client = Client(run_dir, process_name="bench-host")
        try:
            for i, conc in enumerate(int(c) for c in args.concurrency.split(",")):
                n = max(8, args.requests_per_concurrency * conc)
                reqs = random_requests(n, parse_range(args.prompt_len),
                                       parse_range(args.output_len), vocab, args.seed + i)
                asyncio.run(run_tier(url, reqs[:2], concurrency=2))  # warm-up
                before = snapshot(client, 0.4)
                metrics, wall = asyncio.run(run_tier(url, reqs, concurrency=conc))
                after = snapshot(client, 0.4)
                tier = tier_figures(before, after, tier_stats(metrics, wall, concurrency=conc))
                if args.cost_model != "none":
                    tier.update(simulated(reqs, conc, args.cost_model, tier, args.padded,
                                          batching))
                tiers.append(tier)
                print(f"[bench] c={conc}: server {tier['server_cpu_us_per_token']:.0f} us CPU "
                      f"per token, host {tier['host_cpu_us_per_token']:.0f} us; "
                      f"{tier['output_tok_per_s']:.0f} tok/s, ITL p50 {tier['itl_p50_ms']:.1f} "
                      f"p99 {tier['itl_p99_ms']:.1f} ms, worker round trip "
                      f"{tier['worker_round_trip_ms']:.2f} ms; messages per step "
                      f"{tier['messages_per_step']}", file=sys.stderr)
                if "fraction_of_sim" in tier:
                    print(f"[bench] c={conc}: simulated without the host path "
                          f"{tier['sim_output_tok_per_s']:.0f} tok/s, ITL p99 "
                          f"{tier['sim_itl_p99_ms']:.1f} ms, TTFT p50 "
                          f"{tier['sim_ttft_p50_ms']:.0f} ms: measured "
                          f"{tier['fraction_of_sim']:.1%} of it", file=sys.stderr)
        finally:
            client.close()
    worker = "fake (sleeps step_ms per step)" if args.cost_model == "none" else \
        f"fake (sleeps what sched_sim's {args.cost_model!r} cost model gives each step)"
    result = new_result("HOST", {**vars(args), "worker": worker},
                        device="cpu (host path only)")
    result["figures"] = {"tiers": tiers}
    path = write_result(result, args.out_dir, args.name)
    print(f"[bench] wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
