"""What bounds the CUDA C one-token GEMV (hal/cuda/native_gemv.py) on the GPU: the kernel and
variants of its text that each leave one thing out, timed side by side inside CUDA graphs
over rotating weight copies on Llama-3-8B's linears (bf16 x; int4 in "halves128" with
groups of 128, fp8 a scale a row). Not a pytest module. The variants:

    full        the kernel as the plugin runs it
    no_scales   int4: the group scale and offset not loaded (1 and 0: wrong sums, the same
                weight and x traffic)
    no_x        x not loaded (every element 1: the same weights, scales and arithmetic)
    loads_only  the weights (and int4's scales) loaded and XOR-ed a run, no x and no
                arithmetic: the ceiling of this access pattern

call 41 measured int4 at 3.0 TB/s of weights and scales on gate_up where fp8 streams 4.1 on
the same pattern, and a tensor-core variant with a third of the instructions slower still
(docs/performance.md, "The one-token GEMV in CUDA C"): this says which of the loads binds.

    python3 tests/hal_cuda/native_gemv_probe.py OUT.json         # on the GPU, about a minute
    python3 tests/hal_cuda/native_gemv_probe.py OUT.json --cpu   # dry run: builds the variants'
                                                                 # text (and compiles them for
                                                                 # sm_90 where NVRTC is there)
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import torch

SHAPES = {"gate_up": (28672, 4096), "down": (4096, 14336), "qkv": (6144, 4096)}
CONFIGS = {"int4": [(8, 1, 2), (8, 1, 4), (4, 2, 2)], "fp8": [(8, 1, 8), (4, 2, 4)]}
COPIES = 3  # weight copies rotated through (together more than the L2)


def _cut(source: str, start: str, end: str, body: str) -> str:
    """source with the text from `start` up to (not including) `end` replaced by body."""
    a = source.index(start)
    b = source.index(end, a)
    return source[:a] + body + source[b:]


def variants(source: str) -> dict[str, dict[str, str]]:
    """scheme -> variant -> kernel text."""
    int4_compute = "        // the run's 32 columns: byte e's low nibble xl[e], its high one xh[e]"
    fp8_compute = "        float xf[16];\n"
    fp8_end = "#else\n        // the run's 32 columns"
    int4_end = "#endif\n    }\n}\n"
    scales = "            const int g = i < runs ? run_group(i) : 0;\n"
    scales_end = "#endif\n        }\n    }\n}\n"
    xor_int4 = """#pragma unroll
        for (int r = 0; r < R; ++r) {
            const uint4 v = wv[u][r];
            acc[r] += __uint_as_float((v.x ^ v.y ^ v.z ^ v.w) & 0x007FFFFFu) * sv[u][r] +
                      ov[u][r];
        }
"""
    xor_fp8 = """#pragma unroll
        for (int r = 0; r < R; ++r) {
            const uint4 v = wv[u][r];
            acc[r] += __uint_as_float((v.x ^ v.y ^ v.z ^ v.w) & 0x007FFFFFu);
        }
"""
    ones = "1.0f"
    int4_x = source.replace("            x_load(x, g, base, xl, ss);\n", "").replace(
        "            x_load(x, g, base + 8, xl + 8, ss);\n", "").replace(
        "            x_load(x, g, base + TILE / 2, xh, ss);\n", "").replace(
        "            x_load(x, g, base + TILE / 2 + 8, xh + 8, ss);\n",
        f"            for (int e = 0; e < 16; ++e) {{ xl[e] = {ones}; xh[e] = {ones}; }}\n")
    fp8_x = source.replace("        x_load(x, g, 16 * i, xf, ss);\n"
                           "        x_load(x, g, 16 * i + 8, xf + 8, ss);\n",
                           f"        for (int e = 0; e < 16; ++e) xf[e] = {ones};\n")
    out = {
        "int4": {
            "full": source,
            "no_scales": _cut(source, scales, scales_end,
                              "            sv[u][r] = 1.0f;\n            ov[u][r] = 0.0f;\n"),
            "no_x": int4_x,
            "loads_only": _cut(source, int4_compute, int4_end, xor_int4),
        },
        "fp8": {
            "full": source,
            "no_x": fp8_x,
            "loads_only": _cut(source, fp8_compute, fp8_end, xor_fp8),
        },
    }
    for scheme, vs in out.items():
        for name, text in vs.items():
            assert name == "full" or text != source, (scheme, name)
    return out


def main(argv: list[str]) -> int:
    here = str(Path(__file__).resolve().parent)
    if here not in sys.path:
        sys.path.insert(0, here)
    from gpu_bench import graph_time_us

    from tessera.hal.cuda import native_gemv, nvrtc
    from tessera.hal.cuda.quant_linear import prepare
    from tessera.hal.quant import quant_linear_reference, quantize

    out_path = Path(argv[0])
    texts = variants(native_gemv.SOURCE)
    if "--cpu" in argv:
        built: dict[str, Any] = {s: sorted(v) for s, v in texts.items()}
        if nvrtc.can_compile():
            for scheme, vs in texts.items():
                tile = 128 if scheme == "int4" else 0
                for text in vs.values():
                    defs = native_gemv.defines(scheme, 8, 1, 2, tile, False, True, False,
                                               7 if scheme == "int4" else -1)
                    nvrtc.compile_cubin(defs + text, 90)
            built["compiled_for"] = "sm_90"
        out_path.parent.mkdir(parents=True, exist_ok=True)
        out_path.write_text(json.dumps({"dry_run": True, "variants": built}, indent=1) + "\n")
        return 0
    res: dict[str, Any] = {"commit": os.environ.get("TESSERA_COMMIT"),
                           "device": torch.cuda.get_device_name(), "runs": []}
    for scheme, configs in CONFIGS.items():
        for name, (n, k) in SHAPES.items():
            if scheme == "fp8" and name == "qkv":
                continue
            ws = [prepare(quantize(torch.randn((n, k), device="cuda") * 0.02, scheme, None))
                  for _ in range(COPIES)]
            x = torch.randn((1, k), device="cuda").to(torch.bfloat16)
            nbytes = ws[0].nbytes
            exact = quant_linear_reference(x.float(), ws[0])
            for cfg in configs:
                for variant, text in texts[scheme].items():
                    row: dict[str, Any] = {"scheme": scheme, "shape": name,
                                           "config": list(cfg), "variant": variant}
                    try:
                        y = native_gemv.qgemv(x, ws[0], None, *cfg, source=text)
                        if variant == "full":
                            rel = float((y.float() - exact).norm() / exact.norm())
                            assert rel < 4e-3, rel
                        us = graph_time_us(_rotating(x, ws, cfg, text), reps=COPIES * 4)
                        row.update(us=us, GBps=nbytes / (us * 1e-6) / 1e9)
                    except Exception as e:  # noqa: BLE001 - every variant's outcome is kept
                        row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
                    res["runs"].append(row)
                    print(json.dumps(row), flush=True)
                    out_path.parent.mkdir(parents=True, exist_ok=True)
                    out_path.write_text(json.dumps(res, indent=1) + "\n")
    return 0


def _rotating(x: torch.Tensor, ws: list[Any], cfg: tuple[int, int, int], text: str) -> Any:
    """A call of the variant that takes the next weight copy each time."""
    from tessera.hal.cuda import native_gemv

    t = [0]

    def call() -> torch.Tensor:
        t[0] += 1
        return native_gemv.qgemv(x, ws[t[0] % COPIES], None, *cfg, source=text)
    return call


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
