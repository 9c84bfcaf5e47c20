"""Quantized linears on the GPU at the Llama-3-8B shapes: time, weight bandwidth and error of
bf16 (cuBLAS / the tuned GEMV), fp8 and int4 (group 128) at batch 1, 16, 64 and 256, each timed
inside CUDA graphs over rotating weight copies (so L2 does not hold them). Not a pytest module.

    python3 tests/hal_cuda/gpu_quant_bench.py OUT.json

The per-layer sum of the four linears x 32 (+ the bf16 LM head) is the step's linear time: the
number to hold against B12's targets (fp8 <= 2.3 ms, int4 <= 1.5 ms at batch 1).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any

import torch
from gpu_bench import graph_time_us

SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096),
          "down": (4096, 14336)}
BATCHES = (1, 16, 64, 256)


def _timed(call: Callable[[Any], torch.Tensor], weights: list[Any]) -> float:
    t = [0]

    def run() -> torch.Tensor:
        t[0] += 1
        return call(weights[t[0] % len(weights)])
    return graph_time_us(run, reps=len(weights) * 4)


def main(out_path: str) -> int:

    from tessera.hal.cuda import CudaPlatform
    from tessera.hal.quant import quant_linear_reference, quantize

    platform = CudaPlatform()
    dev, dt = torch.device("cuda"), torch.bfloat16
    linear = platform.op("linear")
    res: dict[str, Any] = {"device": torch.cuda.get_device_name()}
    for batch in BATCHES:
        per: dict[str, Any] = {}
        totals = {"bf16": 0.0, "fp8": 0.0, "int4": 0.0}
        for name, (n_out, n_in) in SHAPES.items():
            dense = [torch.randn((n_out, n_in), device=dev, dtype=dt) * 0.02 for _ in range(3)]
            x = torch.randn((batch, n_in), device=dev, dtype=dt)
            row: dict[str, Any] = {}
            us = _timed(lambda w, x=x: linear(x, w, None), dense)
            row["bf16"] = {"us": us, "TBps": n_out * n_in * 2 / (us * 1e-6) / 1e12}
            totals["bf16"] += us
            for scheme in ("fp8", "int4"):
                kernel = platform.linear_kernel(scheme)
                packed = [kernel.prepare(quantize(w, scheme)) for w in dense]
                out = kernel(x, packed[0]).float()
                ref = quant_linear_reference(x.float(), packed[0])
                err = float((out - ref).norm() / ref.norm())
                us = _timed(lambda w, x=x, k=kernel: k(x, w), packed)
                row[scheme] = {"us": us, "TBps": packed[0].nbytes / (us * 1e-6) / 1e12,
                               "rel_err_vs_definition": err, "bytes": packed[0].nbytes}
                totals[scheme] += us
                del packed
            per[name] = row
            del dense
            print(f"b{batch} {name}: " + ", ".join(
                f"{k} {v['us']:.1f} us ({v['TBps']:.2f} TB/s)" for k, v in row.items()),
                file=sys.stderr, flush=True)
        lm_head = torch.randn((128256, 4096), device=dev, dtype=dt) * 0.02
        x = torch.randn((batch, 4096), device=dev, dtype=dt)
        head_us = _timed(lambda w, x=x: linear(x, w, None), [lm_head, lm_head.clone()])
        per["step_linears_ms"] = {k: (32 * v + head_us) / 1e3 for k, v in totals.items()}
        per["lm_head_bf16_us"] = head_us
        res[f"b{batch}"] = per
        print(f"b{batch}: 32 layers of linears + bf16 lm_head, ms: {per['step_linears_ms']}",
              file=sys.stderr, flush=True)
        del lm_head
    from tessera.hal.cuda import quant_tune

    res["tuned"] = {str(k): list(v) for k, v in quant_tune._chosen.items()}
    with open(out_path, "w", encoding="utf-8") as f:
        json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
