"""The cuda plugin's GPU run: correctness against transformers, graphs vs eager,
decode-attention micro-benchmark and a B1 smoke figure. Writes JSON files into OUT_DIR.

    python3 tests/hal_cuda/gpu_run.py OUT_DIR            # on the GPU machine
    python3 tests/hal_cuda/gpu_run.py OUT_DIR --cpu      # dry run of the driver logic: cpu
                                                         # plugin, tiny config, fp32, no graphs

    python3 tests/hal_cuda/gpu_run.py OUT_DIR --only=b1_smoke --only=gemv_sweep   # some parts

Not a pytest module: it needs a GPU, minutes, and 16 GB for the 32-layer B1 model. The parts
live in gpu_engine.py (the stand-in scheduler driving the worker's model; transformers on the
same weights), gpu_checks.py (correctness) and gpu_bench.py (timings).
"""

from __future__ import annotations

import json
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from gpu_bench import (
    b1_smoke,
    decode_attention_bench,
    decode_attention_order_bench,
    decode_attention_regs_bench,
    gemv_sweep,
    op_timings,
)
from gpu_checks import bf16_noise_floor, bf16_op_swaps, check_against_hf, graphs_vs_eager_every_size
from gpu_engine import ROOT, TINY, log


def main(argv: list[str]) -> int:
    out_dir = Path(argv[0])
    out_dir.mkdir(parents=True, exist_ok=True)
    cpu = "--cpu" in argv
    only = [a.split("=", 1)[1] for a in argv if a.startswith("--only=")]
    report: dict[str, Any] = {"torch": torch.__version__}
    if cpu:
        from tessera.hal.cpu import CpuPlatform

        platform: Any = CpuPlatform()
        device = torch.device("cpu")
    else:
        import triton

        from tessera.hal.cuda import CudaPlatform

        platform = CudaPlatform()
        device = torch.device("cuda")
        report.update(triton=triton.__version__, device=torch.cuda.get_device_name(),
                      versions=platform.versions())
    big = json.loads((ROOT / "benchmarks/configs/llama3-8b-4layer.json").read_text())
    parts: dict[str, Callable[[], Any]] = {}
    if cpu:
        parts["vs_hf_fp32"] = lambda: check_against_hf(TINY, platform, torch.float32, device,
                                                       None, 6, [3, 20, 50], 16)
        parts["bf16_noise_floor"] = lambda: bf16_noise_floor(TINY, platform, device)
        parts["bf16_op_swaps"] = lambda: bf16_op_swaps(TINY, platform, device)
    else:
        parts["attention_bench"] = decode_attention_bench
        parts["attention_order"] = decode_attention_order_bench
        parts["attention_regs"] = decode_attention_regs_bench
        parts["gemv_sweep"] = gemv_sweep  # first: later parts run with its tuned shapes
        parts["vs_hf_fp32"] = lambda: check_against_hf(
            big, platform, torch.float32, device, platform.create_graph_runner(), 12,
            [7, 45, 130, 300], 128)
        parts["vs_hf_bf16"] = lambda: check_against_hf(
            big, platform, torch.bfloat16, device, platform.create_graph_runner(), 12,
            [7, 45, 130, 300], 128)
        parts["bf16_op_swaps"] = lambda: bf16_op_swaps(big, platform)
        parts["op_timings"] = op_timings
        parts["bf16_noise_floor"] = lambda: bf16_noise_floor(big, platform)
        parts["graphs_vs_eager"] = lambda: graphs_vs_eager_every_size(big, platform, 256)
        parts["b1_smoke"] = lambda: b1_smoke(platform)
    for name, part in parts.items():
        if only and name not in only:
            continue
        log("start", name)
        t0 = time.perf_counter()
        try:
            report[name] = part()
        except Exception:
            report[name] = {"error": traceback.format_exc()[-3000:]}
        report[name + "_seconds"] = time.perf_counter() - t0
        log("done", name, json.dumps(report[name])[:1500])
        (out_dir / "gpu_run.json").write_text(json.dumps(report, indent=1))
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
