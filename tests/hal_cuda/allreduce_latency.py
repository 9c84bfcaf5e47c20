"""What one tensor-parallel all-reduce costs inside a CUDA graph on two GPUs, NCCL against the
one-shot path (hal/cuda/one_shot.py), at the sizes a TP=2 Llama-3-8B step all-reduces
(hidden 4096, bf16, 1 to 256 tokens): a graph of 64 all-reduces back to back (a decode step
has 64) replayed, microseconds per all-reduce.

    python3 tests/hal_cuda/allreduce_latency.py OUT_JSON      # starts both ranks itself
    python3 tests/hal_cuda/allreduce_latency.py OUT_JSON --cpu  # dry run: cpu plugin, gloo,
                                                                # eager, fp32, few tokens

Rank 0 writes OUT_JSON: {"nccl": {tokens: us}, "one_shot": {tokens: us}, "chosen": ...}.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

import torch

from tessera.child_env import child_env

HIDDEN = 4096
TOKENS = (1, 8, 32, 128, 256)
PER_GRAPH = 64
REPLAYS = 20


def eager_per_all_reduce_us(comm: object, tokens: int) -> float:
    """The dry run's stand-in (no graphs on the cpu plugin): the same chain, eagerly."""
    import time

    x = torch.randn((tokens, HIDDEN))
    start = time.perf_counter()
    for _ in range(PER_GRAPH):
        comm.all_reduce(x)  # type: ignore[attr-defined]
    return (time.perf_counter() - start) * 1e6 / PER_GRAPH


def per_all_reduce_us(comm: object, platform: object, tokens: int, key: str) -> float:
    x = torch.randn((tokens, HIDDEN), device="cuda").to(torch.bfloat16)

    def chain() -> torch.Tensor:
        # In place: the values double each time, well inside bf16's range after 64.
        for _ in range(PER_GRAPH):
            comm.all_reduce(x)  # type: ignore[attr-defined]
        return x

    runner = platform.create_graph_runner()  # type: ignore[attr-defined]
    runner.capture(key, chain)
    for _ in range(3):
        runner.replay(key)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(REPLAYS):
        runner.replay(key)
    end.record()
    torch.cuda.synchronize()
    runner.reset()
    return start.elapsed_time(end) * 1000.0 / (REPLAYS * PER_GRAPH)


def rank_main(rank: int, init: str, out: str, cpu: bool) -> int:
    if cpu:
        from tessera.hal.cpu import CpuPlatform

        platform = CpuPlatform()
    else:
        from tessera.hal.cuda import CudaPlatform

        platform = CudaPlatform()
        torch.cuda.set_device(platform.device(rank))
    comm = platform.create_communicator(rank, 2, init)
    report: dict[str, object] = {"dry_run_cpu": cpu} if cpu else {}
    for mode, limit in (("nccl", 0), ("one_shot", 4 << 20)):
        chosen = comm.configure(one_shot_max_bytes=limit,
                                dtype=torch.float32 if cpu else torch.bfloat16)
        report[f"{mode}_chosen"] = chosen
        report[mode] = {str(t): eager_per_all_reduce_us(comm, t) if cpu else
                        per_all_reduce_us(comm, platform, t, f"{mode}-{t}")
                        for t in (TOKENS[:2] if cpu else TOKENS)}
    comm.barrier()
    comm.destroy()
    if rank == 0:
        with open(out, "w") as f:
            json.dump(report, f, indent=1)
    return 0


def main(argv: list[str]) -> int:
    cpu = "--cpu" in argv
    argv = [a for a in argv if a != "--cpu"]
    if len(argv) == 4 and argv[0] == "--rank":
        return rank_main(int(argv[1]), argv[2], argv[3], cpu)
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    out = os.path.abspath(argv[0])
    with tempfile.TemporaryDirectory() as tmp:
        init = f"file://{tmp}/store"
        procs = [subprocess.Popen([sys.executable, __file__, "--rank", str(r), init, out,
                                   *(["--cpu"] if cpu else [])], env=child_env())
                 for r in range(2)]
        codes = [p.wait(timeout=300) for p in procs]
    if any(codes):
        print(f"ranks ended with {codes}", file=sys.stderr)
        return 1
    with open(out) as f:
        print(f.read())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
