"""`tessera bench WHAT [flags]`: the benchmark suite (BENCHMARKS.md).

    serving   B3 (HTTP tiers) and B4 (prefix cache vs --disable-radix-cache)
    offline   B2 through the offline API, with the roofline bound of the run
    latency   B1: batch-1 decode ms/step and TTFT
    spec      B9: batch 1 with speculative decoding (ngram) beside plain, copy and random prompts
    startup   B10: `tessera serve` to ready, by phase (and from a real-size safetensors folder)
    b5        B5: B1 and B2 at TP=1, TP=2 and PP=2, and their ratios (two devices)
    b7        B7: B4's workload on --dp-size 2 replicas behind the router against one replica
    b11       B11: the Mixtral-8x7B shape's B1 and B2, and the MoE kernel figure (one GPU)
    moe-kernel  B11's grouped GEMM against a dense GEMM of the same FLOPs (one GPU)
    quant     B12: B1 and B2 with quantized weights (fp8, int4, ...) beside the unquantized
              model, KL of their next-token distributions, and the fp8 KV cache
    c1        C1: tessera vs transformers generate one at a time, same run
    peer      the transformers baseline of B1 (decode ms/step, TTFT; several batch sizes)
    scheduler C2: scheduler CPU time per decode step (bench_scheduler.py)
    bus       messages/s and latency through the bus (bench_bus.py)
    host      the host path's CPU per streamed token, fake worker (bench_host.py)
"""

from __future__ import annotations

import importlib
import signal
import sys

BENCHES: dict[str, tuple[str, str]] = {
    "serving": ("tessera.benchmarks.serving", "main"),
    "offline": ("tessera.benchmarks.offline", "main"),
    "latency": ("tessera.benchmarks.latency", "main"),
    "spec": ("tessera.benchmarks.speculative", "main"),
    "startup": ("tessera.benchmarks.startup", "main"),
    "b5": ("tessera.benchmarks.b5", "main"),
    "b7": ("tessera.benchmarks.b7", "main"),
    "b11": ("tessera.benchmarks.b11", "main"),
    "moe-kernel": ("tessera.benchmarks.moe_kernel", "main"),
    "quant": ("tessera.benchmarks.quant", "main"),
    "c1": ("tessera.benchmarks.peer", "main_c1"),
    "peer": ("tessera.benchmarks.peer", "main_peer"),
    "scheduler": ("tessera.benchmarks.bench_scheduler", "main"),
    "bus": ("tessera.benchmarks.bench_bus", "main"),
    "host": ("tessera.benchmarks.bench_host", "main"),
}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__.strip())
        return 0
    name, rest = argv[0], argv[1:]
    if name not in BENCHES:
        print(f"tessera bench: unknown benchmark {name!r}\n\n{__doc__.strip()}", file=sys.stderr)
        return 2
    module, func = BENCHES[name]
    # A time limit (`timeout`) ends a benchmark with SIGTERM: exit through Python so the
    # engines and servers it started (each in a session of its own) are stopped on the way
    # out instead of being left holding the device.
    previous = signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        return int(getattr(importlib.import_module(module), func)(rest) or 0)
    finally:
        signal.signal(signal.SIGTERM, previous)


def _exit_on_sigterm(signum: int, frame: object) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a second SIGTERM ends it at once
    raise SystemExit(128 + signum)


if __name__ == "__main__":
    sys.exit(main())
