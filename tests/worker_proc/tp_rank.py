"""One TP rank for test_tensor_parallel: `python -m tests.worker_proc.tp_rank MODEL RANK
WORLD INIT OUT PROMPTS_JSON [EP_SIZE [QUANTIZATION]]`. Writes its tokens (and logits) as JSON
to OUT."""

from __future__ import annotations

import json
import sys

from tessera.config import EngineConfig
from tessera.hal.registry import load_platform
from tessera.worker_proc.model_runner import ModelRunner
from tests.worker_proc.driver import MiniScheduler


def main(model: str, rank: int, world: int, init: str, out: str, prompts_json: str,
         ep_size: int = 1, quantization: str = "auto") -> None:
    import torch

    torch.set_num_threads(1)
    prompts = json.loads(prompts_json)
    config = EngineConfig(model=model, hal="cpu", dtype="float32", page_size=4,
                          max_running_requests=16, context_length=128, max_total_tokens=1024,
                          tp_size=world, ep_size=ep_size, quantization=quantization)
    platform = load_platform("cpu")
    comm = platform.create_communicator(rank, world, init)
    runner = ModelRunner(config, rank, platform, comm)
    sched = MiniScheduler(runner, chunk_size=12)
    logits = sched.prefill_logits(prompts)
    reqs = sched.generate(prompts, 12, [dict(temperature=1.0) for _ in prompts])  # unseeded
    greedy = sched.generate(prompts, 12)
    with open(out, "w") as f:
        json.dump({"logits": logits.tolist(), "sampled": [r.out for r in reqs],
                   "greedy": [r.out for r in greedy]}, f)
    comm.destroy()


if __name__ == "__main__":
    a = sys.argv[1:]
    main(a[0], int(a[1]), int(a[2]), a[3], a[4], a[5], int(a[6]) if len(a) > 6 else 1,
         a[7] if len(a) > 7 else "auto")
