"""Programmatic dependent launch (hal/cuda/pdl.py) timed on the GPU, each way against the
plain launches, inside CUDA graphs as a decode step replays them:

- one-token bf16 GEMVs alone (qkv, gate_up, down of Llama-3-8B; 20 launches a graph over four
  copies of the weight, so nothing is served from L2), in each PDL mode;
- a chain of decode layers of one request (fused add + norm, qkv, rotary + KV store, split
  attention and merge, o, norm, gate_up, SiLU, down) at the 8B shapes, bf16, fp8 and int4
  weights, in each mode.

    python tests/hal_cuda/pdl_bench.py OUT.json [--layers 8] [--context 600]

Writes one JSON object: microseconds a launch (GEMVs) and a layer (chains), medians of the
replays.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from collections.abc import Callable
from typing import Any

import torch
from decode_chain import HK, HQ, D, decode_layers

HIDDEN, INTER = 4096, 14336


def _time_graph(fn: Callable[[], Any], replays: int = 30) -> float:
    """Median ms of one replay of fn captured in a CUDA graph (after an eager warm-up)."""
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    del graph
    return statistics.median(times)


def gemv_alone(modes: list[str]) -> dict[str, Any]:
    from tessera.hal.cuda import gemv, pdl

    out: dict[str, Any] = {}
    gen = torch.Generator(device="cuda").manual_seed(0)
    for name, (n, k) in {"qkv": (6144, 4096), "gate_up": (28672, 4096),
                         "down": (4096, 14336)}.items():
        ws = [(torch.randn((n, k), device="cuda", generator=gen) * 0.02).bfloat16()
              for _ in range(4)]
        x = torch.randn((1, k), device="cuda", generator=gen).bfloat16()
        cfg = gemv.TUNED[(n, k)]
        row: dict[str, float] = {}
        for mode in modes:
            with pdl.forced(mode):
                ms = _time_graph(lambda x=x, ws=ws, cfg=cfg: [
                    gemv.gemv(x, ws[i % 4], None, *cfg) for i in range(20)])
            row[mode] = round(ms * 1000 / 20, 2)
        out[name] = row
        print(f"[pdl] gemv {name}: {row}", file=sys.stderr)
        del ws
    return out


def chain(weights: str, layers: int, context: int, modes: list[str]) -> dict[str, float]:
    from tessera.hal.cuda import CudaPlatform, pdl
    from tessera.hal.cuda.quant_linear import apply, prepare
    from tessera.hal.quant import quantize
    from tessera.hal.rope import cos_sin_cache

    platform = CudaPlatform()
    op = platform.op
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(1)

    def weight(n: int, k: int) -> object:
        dense = torch.randn((n, k), device=dev, generator=gen) * k ** -0.5
        if weights == "bf16":
            return dense.to(torch.bfloat16)
        return prepare(quantize(dense, weights, 128 if weights == "int4" else None))

    def linear(x: torch.Tensor, w: object) -> torch.Tensor:
        return op("linear")(x, w, None) if isinstance(w, torch.Tensor) else apply(x, w, None)

    mats = [{"qkv": weight((HQ + 2 * HK) * D, HIDDEN), "o": weight(HIDDEN, HQ * D),
             "gate_up": weight(2 * INTER, HIDDEN), "down": weight(HIDDEN, INTER)}
            for _ in range(layers)]
    norm_w = torch.ones(HIDDEN, device=dev, dtype=torch.bfloat16)
    table = cos_sin_cache(D, 8192, 500000.0, None, dev, torch.bfloat16)
    width = -(-(context + 1) // 16) * 16
    kv = platform.create_kv_arena(layers, width, HK, D, torch.bfloat16)
    kv.storage.normal_()
    x = torch.randn((1, HIDDEN), device=dev, dtype=torch.bfloat16)
    position = torch.full((1,), context, dtype=torch.int64, device=dev)
    rtt = torch.arange(width, device=dev, dtype=torch.int32)[None, :]
    seq_len = torch.full((1,), context + 1, dtype=torch.int32, device=dev)

    def step() -> torch.Tensor:
        return decode_layers(op, linear, mats, norm_w, table, kv, x, position, position, rtt,
                             seq_len)[0]

    out: dict[str, float] = {}
    for mode in modes:
        with pdl.forced(mode):
            ms = _time_graph(step)
        out[mode] = round(ms * 1000 / layers, 2)
    print(f"[pdl] chain {weights}: us a layer {out}", file=sys.stderr)
    return out


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--context", type=int, default=600)
    parser.add_argument("--cpu", action="store_true",
                        help="a session's dry rehearsal: write that nothing was measured")
    args = parser.parse_args()
    if args.cpu:
        with open(args.out, "w") as f:
            json.dump({"dry_run": True, "measured": "nothing: PDL needs an sm_90 GPU"}, f)
        return 0
    from tessera.hal.cuda import pdl

    if not torch.cuda.is_available():
        print("pdl_bench: needs a GPU", file=sys.stderr)
        return 1
    modes = ["off", "on", "prefetch", "small"]
    result: dict[str, Any] = {"commit": os.environ.get("TESSERA_COMMIT"),
                              "triton_supports_pdl": pdl.triton_supports(),
                              "device": torch.cuda.get_device_name(),
                              "layers": args.layers, "context": args.context,
                              "unit": "us a GEMV launch / us a decode layer"}
    result["gemv_alone"] = gemv_alone(modes)
    result["chain"] = {}
    for weights in ("bf16", "fp8", "int4"):
        result["chain"][weights] = chain(weights, args.layers, args.context, modes)
        torch.cuda.empty_cache()
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
