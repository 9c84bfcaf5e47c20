"""What the compiler makes of each quantized-GEMV candidate on an H100/H200 (sm_90), without a
GPU: registers a thread, shared memory, and the barriers, shared-memory loads and int -> float
conversion instructions (I2F) in the SASS. Shared memory and barriers in a GEMV's loop mean a
layout conversion every iteration (x crossing to the weight tile's columns, GEMV_X_VEC's
reason); I2F runs at a quarter of the FMA rate (GEMV_EXP_CVT's). A first sort of the
candidates before the device measures them (tests/hal_cuda/gpu_quant_bench.py).

    python tests/hal_cuda/qgemv_sm90_stats.py [fp8|int8|int4 ...]   # one JSON line a candidate

bf16 x, Llama-3-8B's specialization (pointers and sizes divisible by 16), groups of 128 for
int8 / int4, one scale per row for fp8. Run with TRITON_INTERPRET unset. Needs the nvdisasm and
cuobjdump that Triton ships.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from typing import Any

from compile_for_sm90 import OPCODE, Case, disassemble, qgemv_case


def _sass_stats(cubin: bytes) -> dict[str, int]:
    sass, regs = disassemble(cubin)
    ops = Counter(m.group(1).split(".")[0] for m in OPCODE.finditer(sass))
    return {"registers": regs, "barriers": ops["BAR"],
            "shared_loads": ops["LDS"], "i2f": ops["I2F"] + ops["I2FP"],
            "instructions": sum(ops.values())}


def stats(case: Case) -> dict[str, Any]:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    kernel = triton.compile(ASTSource(fn=case.fn, signature=case.signature,
                                      constexprs=case.consts, attrs=case.attrs()),
                            target=GPUTarget("cuda", 90, 32),
                            options={"num_warps": case.num_warps})
    return {"shared_bytes": kernel.metadata.shared, **_sass_stats(kernel.asm["cubin"])}


def main(schemes: list[str]) -> int:
    from tessera.hal.cuda import quant_kernels, quant_tune

    for scheme in schemes or list(quant_tune.GEMV_CANDIDATES):
        for cand in quant_tune.GEMV_CANDIDATES[scheme]:
            block_n, block_k, num_warps, variant = cand
            if variant & (quant_kernels.GEMV_DOT | quant_kernels.GEMV_NATIVE):
                continue  # not a qgemv tile (qgemm's, or the CUDA C GEMV's)
            case = qgemv_case(scheme, None if scheme == "fp8" else 128, variant,
                              block_n=block_n, block_k=block_k, num_warps=num_warps)
            try:
                row: dict[str, Any] = stats(case)
            except Exception as e:  # noqa: BLE001 - every candidate's outcome is reported
                row = {"error": f"{type(e).__name__}: {str(e)[:200]}"}
            print(json.dumps({"scheme": scheme, "config": list(cand), **row}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
