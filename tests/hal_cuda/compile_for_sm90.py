"""Compile the cuda plugin's fused kernels for an H100/H200 (sm_90) on a machine without a GPU:
Triton's front end, its passes and the ptxas it ships, down to a cubin. The interpreter runs
a kernel's Python, not its compilation: a kernel the compiler refuses (a value of two types
out of an `if`, a constexpr misuse) passes there and fails on the GPU.

    python tests/hal_cuda/compile_for_sm90.py    # one JSON line: kernel -> "ok" or the error

Run with TRITON_INTERPRET unset (decorated kernels are otherwise interpreter functions).
"""

from __future__ import annotations

import json
import sys
from typing import Any


def _signature(fn: Any, types: dict[str, str], consts: dict[str, Any]) -> dict[str, str]:
    return {n: "constexpr" if n in consts else types.get(n, "i32") for n in fn.arg_names}


def cases() -> list[tuple[str, Any, dict[str, str], dict[str, Any]]]:
    from tessera.hal.cuda import elementwise, gemv

    out = []
    fn = elementwise._rotary_store_kv_kernel
    for dt in ("bf16", "fp16", "fp32"):
        for fp8 in (False, True):
            cache = "*fp8e4nv" if fp8 else f"*{dt}"
            types = {n: f"*{dt}" for n in ("q_ptr", "k_ptr", "v_ptr", "qo_ptr", "cs_ptr")}
            types.update(pos_ptr="*i64", slot_ptr="*i32", kc_ptr=cache, vc_ptr=cache,
                         k_scale="fp32", v_scale="fp32")
            # Llama-3-8B's decode launch: 32 q heads and 8 KV heads of 128 in one block each
            consts = {"HALF": 64, "BLOCK_H": 32, "BLOCK_HALF": 64, "Q_BLOCKS": 1, "FP8": fp8}
            out.append((f"rotary_store_kv {dt} fp8={fp8}", fn, _signature(fn, types, consts),
                        consts))
    fn = gemv._gemv_kernel
    for bias in (False, True):
        types = {"x_ptr": "*bf16", "w_ptr": "*bf16", "b_ptr": "*bf16", "out_ptr": "*bf16"}
        consts = {"HAS_BIAS": bias, "BLOCK_N": 2, "BLOCK_K": 2048}
        out.append((f"gemv bias={bias}", fn, _signature(fn, types, consts), consts))
    return out


def main() -> int:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    target = GPUTarget("cuda", 90, 32)
    results: dict[str, str] = {}
    for name, fn, signature, consts in cases():
        try:
            triton.compile(ASTSource(fn=fn, signature=signature, constexprs=consts),
                           target=target, options={"num_warps": 4})
            results[name] = "ok"
        except Exception as e:  # noqa: BLE001 - every kernel's outcome is reported
            results[name] = f"{type(e).__name__}: {e}"
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
