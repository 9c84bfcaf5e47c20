"""What the one-token fusion (QuantLinearKernel.one_token_fused, hal/cuda/native_gemv.py's
NORM / RES / SILU) costs and saves on the GPU, per scheme and Llama-3-8B linear: each fused
launch beside the composition it replaces (the plain native GEMV with the rms_norm kernel
before it, the residual add or silu_and_mul after it), both timed inside CUDA graphs over
rotating weight copies, each at its fastest native config. Not a pytest module.

    python3 tests/hal_cuda/fusion_probe.py OUT.json          # on the GPU, about a minute
    python3 tests/hal_cuda/fusion_probe.py OUT.json --cpu    # dry run: the plan only
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import torch

# (linear, (N, K), fusion): the fusions forward_one_token asks of each linear
CASES = [("qkv", (6144, 4096), "norm"), ("qkv", (6144, 4096), "norm_rope"),
         ("o", (4096, 4096), "residual"),
         ("gate_up", (28672, 4096), "norm_silu"), ("gate_up", (28672, 4096), "silu"),
         ("down", (4096, 14336), "residual")]
COPIES = 3


def main(argv: list[str]) -> int:
    here = str(Path(__file__).resolve().parent)
    if here not in sys.path:
        sys.path.insert(0, here)
    out_path = Path(argv[0])
    if "--cpu" in argv:
        out_path.parent.mkdir(parents=True, exist_ok=True)
        out_path.write_text(json.dumps({"dry_run": True, "cases": CASES}, indent=1) + "\n")
        return 0
    res: dict[str, Any] = {"commit": os.environ.get("TESSERA_COMMIT"),
                           "device": torch.cuda.get_device_name(), "runs": []}
    for scheme in ("fp8", "int4"):
        for name, (n, k), fusion in CASES:
            row = _case(scheme, name, n, k, fusion)
            res["runs"].append(row)
            print(json.dumps(row), flush=True)
            out_path.parent.mkdir(parents=True, exist_ok=True)
            out_path.write_text(json.dumps(res, indent=1) + "\n")
    return 0


def _case(scheme: str, name: str, n: int, k: int, fusion: str) -> dict[str, Any]:
    from gpu_bench import graph_time_us

    from tessera.hal.cuda import elementwise, native_gemv, norm, quant_tune
    from tessera.hal.cuda.quant_linear import prepare
    from tessera.hal.quant import quantize

    ws = [prepare(quantize(torch.randn((n, k), device="cuda") * 0.02, scheme,
                           None if scheme == "fp8" else 128)) for _ in range(COPIES)]
    x = torch.randn((1, k), device="cuda").to(torch.bfloat16)
    g = (torch.rand(k, device="cuda") + 0.5).to(torch.bfloat16)
    r = torch.randn((1, n), device="cuda").to(torch.bfloat16)
    nrm = (g, 1e-5) if fusion.startswith("norm") else None
    resid = r if fusion == "residual" else None
    silu = fusion.endswith("silu")
    rope = None
    if fusion.endswith("rope"):  # Llama-3-8B's 32 / 8 heads of 128, a bf16 cache
        from tessera.hal.platform import RotaryStore
        from tessera.hal.rope import cos_sin_cache

        kc = torch.zeros((4096, 8, 128), device="cuda", dtype=torch.bfloat16)
        rope = RotaryStore(torch.tensor([600], device="cuda"),
                           cos_sin_cache(128, 8192, 500000.0, None, "cuda", torch.bfloat16),
                           kc, torch.zeros_like(kc), torch.tensor([700], device="cuda"), 32, 8,
                           128)
    t = [0]

    def fused(cfg: tuple[int, ...]) -> Any:
        def call() -> torch.Tensor:
            t[0] += 1
            return native_gemv.qgemv(x, ws[t[0] % COPIES], None, *cfg[:3], norm=nrm,
                                     residual=resid, silu=silu, rope=rope)
        return call

    def composed(cfg: tuple[int, ...]) -> Any:
        def call() -> torch.Tensor:
            t[0] += 1
            h = norm.rms_norm(x, g, 1e-5) if nrm is not None else x
            y = native_gemv.qgemv(h, ws[t[0] % COPIES], None, *cfg[:3])
            if silu:
                y = elementwise.silu_and_mul(y)
            if rope is not None:
                q, k_, v = y.split([4096, 1024, 1024], dim=-1)
                return elementwise.rotary_store_kv(
                    rope.positions, q.view(1, 32, 128), k_.view(1, 8, 128),
                    v.view(1, 8, 128), rope.cos_sin, rope.k_cache, rope.v_cache, rope.slots)
            return y + r if resid is not None else y
        return call

    def plain(cfg: tuple[int, ...]) -> Any:
        def call() -> torch.Tensor:
            t[0] += 1
            return native_gemv.qgemv(x, ws[t[0] % COPIES], None, *cfg[:3])
        return call

    row: dict[str, Any] = {"scheme": scheme, "linear": name, "fusion": fusion}
    for label, make in (("fused", fused), ("composed", composed), ("gemv", plain)):
        best: tuple[float, list[int]] | None = None
        for cfg in quant_tune.NATIVE_CANDIDATES[scheme]:
            if label == "fused" and (silu or rope is not None) and (
                    cfg[0] % 2 or 64 % (cfg[0] // 2)):
                continue
            try:
                us = graph_time_us(make(cfg), reps=COPIES * 4)
            except Exception as e:  # noqa: BLE001 - kept, the next config tried
                row.setdefault("errors", []).append(f"{label} {cfg}: {e}"[:200])
                continue
            if best is None or us < best[0]:
                best = (us, list(cfg[:3]))
        if best is not None:
            row[f"{label}_us"], row[f"{label}_config"] = round(best[0], 2), best[1]
    if "fused_us" in row and "composed_us" in row:
        row["saved_us"] = round(row["composed_us"] - row["fused_us"], 2)
    return row


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
