"""Does int4's one-token GEMV gain from the tensor cores once its loads stay contiguous? The
kernel of hal/cuda/native_gemv_mma.py (its docstring says how it works) beside the plugin's
CUDA C GEMV (native_gemv.py) on Llama-3-8B's linears (bf16 x, groups of 128), inside CUDA
graphs over rotating weight copies, each checked against the float reference; and two
variants of its text that each leave one thing out (`variants`). Not a pytest module.

    python3 tests/hal_cuda/int4_mma_probe.py OUT.json         # on the GPU, about a minute
    python3 tests/hal_cuda/int4_mma_probe.py OUT.json --cpu   # dry run: compiles each
                                                              # config for sm_90 where
                                                              # NVRTC is there
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # its sibling modules

SHAPES = {"gate_up": (28672, 4096), "down": (4096, 14336), "qkv": (6144, 4096),
          "o": (4096, 4096)}
# the tuner's configs of both kernels (quant_tune.MMA_CANDIDATES, NATIVE_CANDIDATES["int4"]),
# the variants at two of the tensor-core ones
VARIANT_CONFIGS = [(16, 1, 4), (32, 1, 4)]
COPIES = 3  # weight copies rotated through (together more than the L2)


def variants() -> dict[str, str]:
    """The kernel ("mma") and two variants of its text that each leave one thing out:
    "mma_loads" its weight and scale loads alone (XOR-ed into the sums: the interleaved
    pattern's ceiling), "mma_unstaged" without x's staging (what the prologue costs; wrong
    sums)."""
    from native_gemv_probe import _cut

    from tessera.hal.cuda.native_gemv_mma import SOURCE

    loop = "            uint4 b[4];\n"
    loop_end = "        kt0 += WARPS * U;\n"
    xor = """#pragma unroll
            for (int j = 0; j < RT; ++j)
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    const uint4 v = wv[u][j][h];
                    acc[j][h] += __uint_as_float((v.x ^ v.y ^ v.z ^ v.w) & 0x007FFFFFu) *
                                 sv[u][j][h] + ov[u][j][h];
                }
        }
"""
    stage = "    for (int base = warp; base < kt_n; base += 8 * WARPS) {"
    stage_end = "    __syncthreads();\n    while (true) {"
    out = {"mma": SOURCE, "mma_loads": _cut(SOURCE, loop, loop_end, xor),
           "mma_unstaged": _cut(SOURCE, stage, stage_end, "")}
    assert len(set(out.values())) == 3
    return out


def main(argv: list[str]) -> int:
    from tessera.hal.cuda import native_gemv_mma, nvrtc

    out_path = Path(argv[0])
    if "--cpu" in argv:
        built: dict[str, Any] = {"variant_configs": [list(c) for c in VARIANT_CONFIGS]}
        if nvrtc.can_compile():  # the variants' text (the kernel's: test_int4_mma_probe_cpu)
            for rows, u, warps in VARIANT_CONFIGS:
                for k in sorted({k for _, k in SHAPES.values()}):
                    for name, text in variants().items():
                        if name != "mma":
                            nvrtc.compile_cubin(native_gemv_mma.defines(rows, u, warps, k,
                                                                        False, True) + text, 90)
            built["compiled_for"] = "sm_90"
        out_path.parent.mkdir(parents=True, exist_ok=True)
        out_path.write_text(json.dumps({"dry_run": True, **built}, indent=1) + "\n")
        return 0
    return _measure(out_path)


def _measure(out_path: Path) -> int:
    from gpu_bench import graph_time_us

    from tessera.hal.cuda import native_gemv, native_gemv_mma, quant_tune
    from tessera.hal.cuda.quant_linear import prepare
    from tessera.hal.quant import quant_linear_reference, quantize

    res: dict[str, Any] = {"commit": os.environ.get("TESSERA_COMMIT"),
                           "device": torch.cuda.get_device_name(), "runs": []}

    def keep(row: dict[str, Any]) -> None:
        res["runs"].append(row)
        print(json.dumps(row), flush=True)
        out_path.parent.mkdir(parents=True, exist_ok=True)
        out_path.write_text(json.dumps(res, indent=1) + "\n")

    for name, (n, k) in SHAPES.items():
        ws = [prepare(quantize(torch.randn((n, k), device="cuda") * 0.02, "int4", None))
              for _ in range(COPIES)]
        assert native_gemv_mma.weight_fits(ws[0]), ws[0].packing
        qis = [native_gemv_mma.interleave(w.qweight) for w in ws]
        x = torch.randn((1, k), device="cuda").to(torch.bfloat16)
        exact = quant_linear_reference(x.float(), ws[0])
        nbytes = ws[0].nbytes
        runs: list[tuple[str, tuple[int, ...], Any]] = [
            ("plain", c[:3], lambda i, c=c, x=x, ws=ws: native_gemv.qgemv(x, ws[i], None, *c[:3]))
            for c in quant_tune.NATIVE_CANDIDATES["int4"]]
        for c in quant_tune.MMA_CANDIDATES:
            cfg = c[:3]
            for kernel, text in variants().items():
                if n % cfg[0] or (kernel != "mma" and cfg not in VARIANT_CONFIGS):
                    continue
                runs.append((kernel, cfg, lambda i, c=cfg, t=text, x=x, ws=ws, qis=qis:
                             native_gemv_mma.launch(x, ws[i], qis[i], None, *c, source=t)))
        for kernel, cfg, call in runs:
            row: dict[str, Any] = {"shape": name, "kernel": kernel, "config": list(cfg)}
            try:
                rel = float((call(0).float() - exact).norm() / exact.norm())
                row["rel_err"] = rel
                assert rel < 4e-3 or kernel not in ("plain", "mma"), rel
                us = graph_time_us(_rotating(call), reps=COPIES * 4)
                row.update(us=us, GBps=nbytes / (us * 1e-6) / 1e9)
            except Exception as e:  # noqa: BLE001 - every config's outcome is kept
                row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
            keep(row)
    best: dict[str, dict[str, float]] = {}
    for r in res["runs"]:
        if "us" in r:
            b = best.setdefault(r["shape"], {})
            b[r["kernel"]] = min(b.get(r["kernel"], float("inf")), r["us"])
    res["best_us"] = best
    out_path.write_text(json.dumps(res, indent=1) + "\n")
    print(json.dumps({"best_us": best}), flush=True)
    return 0


def _rotating(call: Any) -> Any:
    """A call that takes the next weight copy each time."""
    t = [0]

    def run() -> torch.Tensor:
        t[0] += 1
        return call(t[0] % COPIES)
    return run


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
