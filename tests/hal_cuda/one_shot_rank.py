"""One rank of the two-GPU one-shot all-reduce check (run by test_nccl_gpu.py as a script):
after `configure`, all-reduces up to the one-shot limit take the peer-memory path; their sums
must equal NCCL's bit for bit (two ranks: each sum is one rounding of a + b either way),
eagerly and replayed from a captured CUDA graph, in bf16 and fp32; a tensor over the limit
goes through NCCL.

    python3 one_shot_rank.py RANK WORLD INIT_METHOD OUT_JSON
"""

from __future__ import annotations

import json
import sys

import torch

HIDDEN = 4096
TOKENS = (1, 8, 64, 256)  # decode batches to a prefill chunk: 8 KiB to 2 MiB in bf16


def main(argv: list[str]) -> int:
    rank, world, init, out_path = int(argv[0]), int(argv[1]), argv[2], argv[3]
    from tessera.hal.cuda import CudaPlatform

    platform = CudaPlatform()
    dev = platform.device(rank)
    torch.cuda.set_device(dev)
    comm = platform.create_communicator(rank, world, init)
    report: dict[str, object] = {}
    for dtype in (torch.bfloat16, torch.float32):
        name = str(dtype).removeprefix("torch.")
        chosen = comm.configure(one_shot_max_bytes=4 << 20, dtype=dtype)
        limit = comm.one_shot_max_bytes  # type: ignore[attr-defined]
        gen = torch.Generator(device=dev).manual_seed(1234 + rank)
        eager_equal = []
        for tokens in TOKENS:
            x = torch.randn((tokens, HIDDEN), generator=gen, device=dev).to(dtype)
            want = comm.nccl_all_reduce(x.clone())  # type: ignore[attr-defined]
            got = comm.all_reduce(x)
            eager_equal.append(bool(torch.equal(got, want)) and got.data_ptr() == x.data_ptr())
        # Gathers of a decode step's vocabulary shards (the LM head): one-shot below the limit
        gather_equal = []
        for rows in (1, 8):
            part = torch.randn((rows, 64128), generator=gen, device=dev).to(dtype)
            want = comm.nccl_all_gather(part)  # type: ignore[attr-defined]
            gather_equal.append(bool(torch.equal(comm.all_gather(part), want)))
            along_last = torch.cat(want.chunk(world, dim=0), dim=-1)
            gather_equal.append(bool(torch.equal(comm.all_gather(part, dim=-1), along_last)))
        # Captured: the decode graphs replay the all-reduce with new inputs every step.
        static_in = torch.zeros((8, HIDDEN), dtype=dtype, device=dev)
        runner = platform.create_graph_runner()
        assert runner is not None
        static_out = runner.capture(("one_shot", name), lambda s=static_in: comm.all_reduce(s * 2))
        static_part = torch.zeros((1, 64128), dtype=dtype, device=dev)
        gathered = runner.capture(("gather", name),
                                  lambda p=static_part: comm.all_gather(p * 2, dim=-1))
        replay_equal = []
        for _ in range(3):
            src = torch.randn((8, HIDDEN), generator=gen, device=dev).to(dtype)
            part = torch.randn((1, 64128), generator=gen, device=dev).to(dtype)
            static_in.copy_(src)
            static_part.copy_(part)
            runner.replay(("one_shot", name))
            runner.replay(("gather", name))
            want = comm.nccl_all_reduce(src * 2)  # type: ignore[attr-defined]
            want_gather = comm.nccl_all_gather(part * 2)  # type: ignore[attr-defined]
            torch.cuda.synchronize()
            replay_equal.append(bool(torch.equal(static_out, want)) and bool(torch.equal(
                gathered, torch.cat(want_gather.chunk(world, dim=0), dim=-1))))
        runner.reset()
        big = torch.full((limit // x.element_size() + HIDDEN,), rank + 1.0, dtype=dtype,
                         device=dev) if limit else torch.ones(1, dtype=dtype, device=dev)
        big_ok = bool((comm.all_reduce(big) == (3.0 if limit else world)).all())
        torch.cuda.synchronize()
        report[name] = {"chosen": chosen, "limit": limit, "eager_equal": eager_equal,
                        "gather_equal": gather_equal,
                        "replay_equal": replay_equal, "over_limit_ok": big_ok}
    comm.barrier()
    comm.destroy()
    with open(out_path, "w") as f:
        json.dump(report, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
