"""The cuda plugin's fused ops against the kernels they replace, at Llama-3-8B's one-token
shapes in bf16, timed inside CUDA graphs (gpu_bench.graph_time_us), the down projection's
weights rotated through copies so that L2 does not hold them. Finer than the B1 A/B (a few
microseconds a layer, where B1's step varies by ~15 us).

    python3 tests/hal_cuda/fused_bench.py OUT.json          # on the GPU, ~20 s
    python3 tests/hal_cuda/fused_bench.py OUT.json --cpu    # dry run: tiny shapes, Triton's
                                                            # interpreter (TRITON_INTERPRET=1)

OUT.json: rotary_store_kv {unfused_us, fused_us, saved_us}. (The SiLU-prologue down GEMV
measured here at 9806725 lost at every configuration and was removed: hal/cuda/gemv.py.)
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

Timer = Callable[[Callable[[], Any], int], float]


def _cpu_timer(fn: Callable[[], Any], reps: int) -> float:
    fn()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - t0) * 1e6 / reps


def rotary_store(dev: torch.device, dt: torch.dtype, timer: Timer, hq: int, hk: int, d: int
                 ) -> dict[str, Any]:
    from tessera.hal.cuda import elementwise
    from tessera.hal.rope import cos_sin_cache

    table = cos_sin_cache(d, 8192, 500000.0, None, dev, dt)
    qkv = torch.randn((1, (hq + 2 * hk) * d), device=dev, dtype=dt)
    q = qkv[:, :hq * d].view(1, hq, d)
    k = qkv[:, hq * d:(hq + hk) * d].view(1, hk, d)
    v = qkv[:, (hq + hk) * d:].view(1, hk, d)
    kc, vc = (torch.zeros((4096, hk, d), device=dev, dtype=dt) for _ in range(2))
    pos = torch.tensor([4000], device=dev)
    slot = torch.tensor([123], device=dev, dtype=torch.int32)

    def unfused() -> None:
        q_rot, k_rot = elementwise.rotary_embedding(pos, q, k, table)
        elementwise.store_kv(kc, vc, k_rot, v, slot)

    def fused() -> None:
        elementwise.rotary_store_kv(pos, q, k, v, table, kc, vc, slot)

    res = {"unfused_us": timer(unfused, 20), "fused_us": timer(fused, 20)}
    res["saved_us"] = res["unfused_us"] - res["fused_us"]
    return res


def main(argv: list[str]) -> int:
    out = Path(argv[0])
    cpu = "--cpu" in argv
    if cpu:
        dev, dt, timer = torch.device("cpu"), torch.float32, _cpu_timer
        report: dict[str, Any] = {
            "device": "cpu (dry run)",
            "rotary_store_kv": rotary_store(dev, dt, timer, 4, 2, 32)}
    else:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from gpu_bench import graph_time_us

        def timer(fn: Callable[[], Any], reps: int) -> float:
            return graph_time_us(fn, reps=reps)

        dev, dt = torch.device("cuda"), torch.bfloat16
        report = {
            "device": torch.cuda.get_device_name(),
            "rotary_store_kv": rotary_store(dev, dt, timer, 32, 8, 128)}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1) + "\n")
    print(f"[fused_bench] {json.dumps(report)[:1500]}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
