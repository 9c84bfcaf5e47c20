"""The kernels Nsight Compute (ncu) profiles in `run_gpu.sh ncu`: each target runs once
inside an NVTX range named "ncu" (ncu --nvtx --nvtx-include "ncu/"), its inputs made and its
tuner run outside it, so the report holds these kernels and nothing else, in the order this
prints their names.

    python3 tests/hal_cuda/ncu_kernels.py attention   # decode attention's stage 1
    python3 tests/hal_cuda/ncu_kernels.py linears     # the projections, bf16 / fp8 / int4

attention: B2's 256 requests (contexts 100-2048, longest first, as gpu_bench's order bench
draws them) over a bf16 cache and an e4m3 one (the default tiles), then its 32-request case
over the e4m3 cache at the default tile and at (128, 4, 2), 21% faster there (calls 51, 54).
linears: Llama-3-8B's four projections at 256 tokens in bf16 (the library GEMM) and fp8
(W8A8: the row quantization and the scaled GEMM), and at one token in fp8 and int4 (the
GEMVs B12's B1 runs).

Not a pytest module: it needs a GPU and ncu around it.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable
from typing import Any

import torch
from gpu_bench import _attention_tunables, _paged_decode_case

LINEARS = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096),
           "down": (4096, 14336)}


def profiled(name: str, fn: Callable[[], Any]) -> None:
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_push("ncu")
    fn()
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_pop()
    print(f"profiled {name}", flush=True)


def _attention_case(da: Any, name: str, batch: int, lo: int, hi: int,
                    gen: torch.Generator) -> None:
    hq, hk, d = 32, 8, 128
    lens_cpu = torch.randint(lo, hi + 1, (batch,), generator=gen, dtype=torch.int32)
    q, kc, vc, rtt = _paged_decode_case(batch, hi, hq, hk, d)
    desc = torch.argsort(lens_cpu, descending=True, stable=True).cuda()
    q, rtt, lens = q[desc].contiguous(), rtt[desc].contiguous(), lens_cpu.cuda()[desc]
    k8, v8 = kc.to(torch.float8_e4m3fn), vc.to(torch.float8_e4m3fn)
    runs: list[tuple[str, torch.Tensor, torch.Tensor, tuple[int, int, int] | None]] = [
        ("fp8_default", k8, v8, None)]
    if batch == 256:
        runs.insert(0, ("bf16_default", kc, vc, None))
    else:
        runs.append(("fp8_bn128_w4_s2", k8, v8, (128, 4, 2)))
    for label, k, v, tile in runs:
        def call(k: torch.Tensor = k, v: torch.Tensor = v) -> torch.Tensor:
            return da.attention_decode(q, k, v, rtt, lens, d ** -0.5)

        with _attention_tunables(da, "fp8", tile) if tile else contextlib.nullcontext():
            call()  # compiled outside the range
            profiled(f"{name}_{label}", call)


def attention() -> None:
    from tessera.hal.cuda import decode_attention as da

    gen = torch.Generator().manual_seed(0)
    for name, batch, lo, hi in (("b2_256", 256, 100, 2048), ("b2_32", 32, 600, 2048)):
        _attention_case(da, name, batch, lo, hi, gen)
        torch.cuda.empty_cache()


def _linear_case(name: str, n: int, k: int, gen: torch.Generator) -> None:
    from tessera.hal.cuda.quant_linear import apply, prepare
    from tessera.hal.quant import quantize

    dense = torch.randn((n, k), device="cuda", generator=gen) * k ** -0.5
    w16 = dense.to(torch.bfloat16)
    x256 = torch.randn((256, k), device="cuda", generator=gen).to(torch.bfloat16)
    x1 = x256[:1].contiguous()
    torch.nn.functional.linear(x256, w16)
    profiled(f"{name}_bf16_m256", lambda: torch.nn.functional.linear(x256, w16))
    for scheme, group, rows in (("fp8", None, (256, 1)), ("int4", 128, (1,))):
        w = prepare(quantize(dense, scheme, group))
        for m in rows:
            x = x256 if m == 256 else x1
            apply(x, w, None)  # the tuner's launches outside the range
            profiled(f"{name}_{scheme}_m{m}", lambda x=x, w=w: apply(x, w, None))


def linears() -> None:
    gen = torch.Generator(device="cuda").manual_seed(0)
    for name, (n, k) in LINEARS.items():
        _linear_case(name, n, k, gen)
        torch.cuda.empty_cache()


if __name__ == "__main__":
    {"attention": attention, "linears": linears}[sys.argv[1]]()
