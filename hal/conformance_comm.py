"""One rank of the conformance suite's two-process communicator test.

Run as a subprocess (never forked from pytest): loads the plugin by name, runs every
collective, writes the results as JSON. Usage: main([plugin, rank, world_size, init_method,
out_path]).
"""

from __future__ import annotations

import json
import time

import torch


def main(argv: list[str]) -> int:
    plugin, rank_s, world_s, init_method, out_path = argv
    rank, world = int(rank_s), int(world_s)
    from tessera.hal.registry import load_platform

    platform = load_platform(plugin)
    dev = platform.device(rank)
    comm = platform.create_communicator(rank, world, init_method)
    try:
        results = {
            "all_reduce": comm.all_reduce(torch.full((2, 3), rank + 1.0, device=dev)),
            "all_gather_dim0": comm.all_gather(
                torch.tensor([[0.0, 1.0]], device=dev) + 10 * rank, dim=0),
            "all_gather_dim1": comm.all_gather(
                torch.tensor([[0.0, 1.0]], device=dev) + 10 * rank, dim=1),
            "reduce_scatter": comm.reduce_scatter(
                torch.arange(4.0, device=dev) + 10 * rank, dim=0),
        }
        buf = torch.zeros(3, device=dev)
        if rank == 0:
            comm.send(torch.tensor([1.0, 2.0, 3.0], device=dev), 1)
            results["recv"] = comm.recv(buf, 1)
        else:
            got = comm.recv(buf, 0)
            comm.send(got + 1, 0)
            results["recv"] = got
        # Queued transfers: both receives are posted before either send, and each send is
        # kept until done.
        if rank == 0:
            sends = [comm.isend(torch.tensor([5.0, 6.0], device=dev) + i, 1) for i in range(2)]
            deadline = time.monotonic() + 60.0
            while not all(t.done() for t in sends) and time.monotonic() < deadline:
                time.sleep(0.001)
            results["irecv"] = torch.tensor([float(all(t.done() for t in sends))])
        else:
            posted = [comm.irecv((2,), torch.float32, dev, 0) for _ in range(2)]
            got_all = [t.wait() for t in posted]
            results["irecv"] = torch.cat([g for g in got_all if g is not None])
        comm.barrier()
        # Groups split off the world: alone, and both together (listed in any order).
        alone = comm.split([[0], [1]])
        results["split_alone"] = alone.all_reduce(torch.full((2,), rank + 1.0, device=dev))
        swapped = comm.split([[1, 0]])
        results["split_rank"] = torch.tensor([float(swapped.rank), float(swapped.world_size)])
        results["split_all_reduce"] = swapped.all_reduce(
            torch.full((2,), rank + 1.0, device=dev))
        got = torch.zeros(2, device=dev)
        if swapped.rank == 1:  # group ranks ascend with world ranks: 1 sends to 0
            swapped.send(torch.tensor([7.0, 8.0], device=dev), 0)
        else:
            swapped.recv(got, 1)
        results["split_recv"] = got
        comm.barrier()
    finally:
        comm.destroy()
    with open(out_path, "w") as f:
        json.dump({k: v.cpu().tolist() for k, v in results.items()}, f)
    return 0
