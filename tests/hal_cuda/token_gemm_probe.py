"""The token GEMM (hal/cuda/token_gemm.py) against cuBLAS at Llama-3-8B's linears, 2-256
tokens, on the GPU: what token_gemm.TUNED should hold. Not a pytest module.

Each product runs 20 times inside a CUDA graph, cycling over four copies of the weight (a
step's weights do not stay in L2), the graph replayed 10 times: us per product, cuBLAS
(F.linear) beside every configuration token_gemm.candidates() lists. A candidate's result is
checked against the float product (max |error| over max |product|) and refused where its
error passes twice cuBLAS's plus 1e-3. `picks` holds, per weight shape, each token count's
fastest candidate where it beats cuBLAS by 3% or more (else null: cuBLAS), in the form
HAL_CUDA_TOKEN_GEMM_TABLE reads; `layers` sums the four projections of a decode layer.

Every candidate is compiled first, in parallel processes (Triton's cache on disk is shared),
so the timing loop does not wait on the compiler.

    python3 tests/hal_cuda/token_gemm_probe.py OUT.json [--tokens=16,64]   # on the GPU
    python3 tests/hal_cuda/token_gemm_probe.py OUT.json --cpu             # dry run: tiny
                                             # shapes in fp32 through Triton's interpreter
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

if "--cpu" in sys.argv:  # before triton is imported: its interpreter, chosen at import
    os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096),
          "down": (4096, 14336), "lm_head": (128256, 4096)}
LAYER = ("qkv", "o", "gate_up", "down")
TOKENS = [2, 4, 8, 16, 32, 64, 96, 128, 192, 256]
COPIES = 4
REPLAYS = 20
MARGIN = 0.97  # a candidate replaces cuBLAS only this much faster or more
COMPILERS = 8


def _time(fn: Any) -> float:
    from gpu_bench import graph_time_us  # beside this script, which is run as one

    copies = itertools.cycle(range(COPIES))
    return graph_time_us(lambda: fn(next(copies)), reps=REPLAYS, iters=10)


def _error(got: torch.Tensor, ref: torch.Tensor) -> float:
    return float((got.float() - ref).abs().max() / ref.abs().max().clamp(min=1e-30))


def _all_configs(tokens: list[int]) -> list[tuple[int, ...]]:
    from tessera.hal.cuda import token_gemm as tg

    configs = {c for (n, k) in SHAPES.values() for m in tokens for c in tg.candidates(m, n, k)}
    return sorted(configs)


def compile_worker(index: int, count: int, tokens: list[int]) -> None:
    """Compile this worker's share of every candidate (one launch each, on a product every
    Llama shape's launches share a compiled kernel with: the same specializations)."""
    from tessera.hal.cuda import token_gemm as tg

    dev = torch.device("cuda")
    x = torch.randn(16, 4096, device=dev, dtype=torch.bfloat16)
    w = torch.randn(4096, 4096, device=dev, dtype=torch.bfloat16)
    for config in _all_configs(tokens)[index::count]:
        try:
            tg.token_gemm(x, w, None, config)
        except Exception as e:  # noqa: BLE001 - reported; the timing loop skips it too
            print(f"[tokengemm] compile {config}: {type(e).__name__}: {e}", flush=True)
    torch.cuda.synchronize()


def compile_all(tokens: list[int]) -> float:
    t0 = time.monotonic()
    procs = [subprocess.Popen([sys.executable, __file__, "--compile-worker", str(i),
                               str(COMPILERS), ",".join(map(str, tokens))])
             for i in range(COMPILERS)]
    for p in procs:
        p.wait()
    return time.monotonic() - t0


def probe_case(x: torch.Tensor, w: list[torch.Tensor], cands: list[tuple[int, ...]],
               timer: Any) -> dict[str, Any]:
    from tessera.hal.cuda import token_gemm as tg

    ref = x.float() @ w[0].float().T
    case: dict[str, Any] = {"cublas": {"us": round(timer(lambda i: F.linear(x, w[i])), 2),
                                       "err": _error(F.linear(x, w[0]), ref)}}
    limit = 2 * case["cublas"]["err"] + 1e-3
    for config in cands:
        key = "t" + "_".join(map(str, config))
        try:
            err = _error(tg.token_gemm(x, w[0], None, config), ref)
            if err > limit:
                case[key] = {"error": f"max error {err:.2e} over {limit:.2e}"}
                continue
            us = timer(lambda i, c=config: tg.token_gemm(x, w[i], None, c))
            case[key] = {"us": round(us, 2), "err": err}
        except Exception as e:  # noqa: BLE001 - a configuration that fails is recorded
            case[key] = {"error": f"{type(e).__name__}: {str(e)[:200]}"}
    return case


def pick(case: dict[str, Any]) -> tuple[list[int] | None, float]:
    """The fastest candidate's config where it beats cuBLAS by MARGIN, and its us."""
    base = case["cublas"]["us"]
    timed = [(v["us"], k) for k, v in case.items() if k != "cublas" and "us" in v]
    if not timed or min(timed)[0] > MARGIN * base:
        return None, base
    us, key = min(timed)
    return [int(v) for v in key[1:].split("_")], us


def main(argv: list[str]) -> int:
    from tessera.hal.cuda import token_gemm as tg

    out_path = Path(argv[0])
    tokens = list(TOKENS)
    for arg in argv[1:]:
        if arg.startswith("--tokens="):
            tokens = [int(t) for t in arg.split("=", 1)[1].split(",")]
    cpu = "--cpu" in argv
    shapes = SHAPES
    result: dict[str, Any] = {"tokens": tokens, "copies": COPIES, "replays": REPLAYS,
                              "margin": MARGIN, "cases": {}, "picks": {}, "layers": {}}
    if cpu:  # the dry run: tiny shapes, fp32, the interpreter, wall-clock "times"
        dev, dtype = torch.device("cpu"), torch.float32
        shapes = {"qkv": (96, 64), "o": (64, 64), "gate_up": (256, 64), "down": (64, 128),
                  "lm_head": (320, 64)}
        tokens = [2, 16]
        result["tokens"] = tokens

        def timer(fn: Any) -> float:
            t0 = time.perf_counter()
            fn(0)
            return (time.perf_counter() - t0) * 1e6
    else:
        dev, dtype = torch.device("cuda"), torch.bfloat16
        result["device"] = torch.cuda.get_device_name(dev)
        result["torch"] = torch.__version__
        result["compile_s"] = round(compile_all(tokens), 1)
        print(f"[tokengemm] compiled {len(_all_configs(tokens))} configs in "
              f"{result['compile_s']} s", flush=True)
        timer = _time
    torch.manual_seed(0)
    for name, (n, k) in shapes.items():
        copies = 1 if cpu else COPIES
        w = [torch.randn(n, k, device=dev, dtype=dtype) / k ** 0.5 for _ in range(copies)]
        w += w[:1] * (COPIES - copies)
        rows = []
        for m in tokens:
            x = torch.randn(m, k, device=dev, dtype=dtype)
            cands = tg.candidates(m, n, k)
            if cpu:  # the chip's candidates are too wide for these shapes: two small tiles
                cands = [c for c in ((16, 32, 32, 4, 2, 1), (16, 32, 32, 4, 2, 2))
                         if tg.fits(k, c)]
            case = probe_case(x, w, cands, timer)
            config, us = pick(case)
            case["pick"] = {"config": config, "us": us,
                            "speedup": round(case["cublas"]["us"] / us, 3)}
            result["cases"][f"{name}_{m}"] = case
            rows.append([m, config])
            print(f"[tokengemm] {name} x {m}: cuBLAS {case['cublas']['us']} us, pick "
                  f"{config} {us} us ({len(cands)} candidates)", flush=True)
        result["picks"][f"{n},{k}"] = rows
        del w
        if not cpu:
            torch.cuda.empty_cache()
    for m in tokens:
        cases = [result["cases"][f"{name}_{m}"] for name in LAYER]
        base = sum(c["cublas"]["us"] for c in cases)
        picked = sum(c["pick"]["us"] for c in cases)
        mb = sum(2 * shapes[name][0] * shapes[name][1] for name in LAYER) / 1e6
        result["layers"][str(m)] = {"cublas_us": round(base, 2), "picked_us": round(picked, 2),
                                    "weight_mb": mb,
                                    "cublas_tbps": round(mb / base, 3) if base else None,
                                    "picked_tbps": round(mb / picked, 3) if picked else None}
        print(f"[tokengemm] layer x {m}: cuBLAS {base:.1f} us, picked {picked:.1f} us",
              flush=True)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--compile-worker"]:
        compile_worker(int(sys.argv[2]), int(sys.argv[3]),
                       [int(t) for t in sys.argv[4].split(",")])
        sys.exit(0)
    sys.exit(main(sys.argv[1:]))
