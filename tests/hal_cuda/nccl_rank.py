"""One rank of the two-GPU NCCL check (run by test_nccl_gpu.py as a script):
collectives eagerly, then an all_reduce captured in a CUDA graph and replayed on new inputs.

    python3 nccl_rank.py RANK WORLD INIT_METHOD OUT_JSON
"""

from __future__ import annotations

import json
import sys

import torch


def main(argv: list[str]) -> int:
    rank, world, init, out_path = int(argv[0]), int(argv[1]), argv[2], argv[3]
    from tessera.hal.cuda import CudaPlatform

    platform = CudaPlatform()
    dev = platform.device(rank)
    torch.cuda.set_device(dev)
    comm = platform.create_communicator(rank, world, init)
    eager = comm.all_reduce(torch.full((4, 8), rank + 1.0, device=dev))
    gathered = comm.all_gather(torch.full((2, 3), float(rank), device=dev), dim=1)
    scattered = comm.reduce_scatter(torch.arange(8.0, device=dev).view(2, 4) + rank, dim=1)

    static_in = torch.zeros((4, 8), device=dev)

    def step() -> torch.Tensor:
        t = static_in * 2
        return comm.all_reduce(t)

    runner = platform.create_graph_runner()
    assert runner is not None
    static_out = runner.capture("all_reduce", step)
    replays = []
    for i in range(3):
        static_in.fill_(rank + 10.0 * i)
        runner.replay("all_reduce")
        torch.cuda.synchronize()
        replays.append(static_out.cpu().unique().tolist())
    comm.barrier()
    runner.reset()
    comm.destroy()
    with open(out_path, "w") as f:
        json.dump({"eager": eager.cpu().unique().tolist(), "gathered": gathered.cpu().tolist(),
                   "scattered": scattered.cpu().tolist(), "replays": replays}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
