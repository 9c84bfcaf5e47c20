"""Decode attention's stage 1 over an fp8 cache as the compiler makes it for an H100/H200
(sm_90), without a GPU: the SASS instructions of each kernel's main loop, by opcode, and per
4 KB of cache it reads (one native tile: 16 keys of K and V at 128 dims; a Triton program's
iteration reads BLOCK_N keys over all its warps). The loop is the smallest that issues the
cache's copies (cp.async) between a label and the branch back to it.

    python tests/hal_cuda/decode_attention_sm90_stats.py     # one JSON line a kernel

The native kernel (hal/cuda/native_attention.py) at Llama-3-8B's group of 4, bf16 q, at its
default tile and with its loads alone (probe 1); Triton's stage 1 at the fp8 tunables
(compile_for_sm90's cases). Run with TRITON_INTERPRET unset. Needs cuda-python's NVRTC and
the nvdisasm / cuobjdump that Triton ships. The native loop's rescale of the accumulators
(32 FMUL) is a branch taken only where a max moved: it is in the static count.
"""

from __future__ import annotations

import json
import re
import sys
from collections import Counter
from typing import Any

from compile_for_sm90 import OPCODE, _decode_attention_cases, disassemble

_LABEL = re.compile(r"^\s*(\.L_x_\d+):")
_BRANCH = re.compile(r"BRA(?:\.\w+)?\s+(?:!?U?P\w+,\s*)?`\((\.L_x_\d+)\)")


def main_loop(sass: str) -> Counter[str]:
    """Opcodes of the smallest backward-branching loop of a SASS listing that issues cache
    copies (LDGSTS: cp.async); warp-divergence fallbacks branch back across wider spans."""
    lines = sass.splitlines()
    labels = {m.group(1): i for i, ln in enumerate(lines) if (m := _LABEL.match(ln))}
    best: Counter[str] = Counter()
    for i, ln in enumerate(lines):
        m = _BRANCH.search(ln)
        if m is None or labels.get(m.group(1), i) >= i:
            continue
        body = Counter(x.group(1).split(".")[0] for x in map(OPCODE.search,
                                                              lines[labels[m.group(1)]:i + 1])
                       if x is not None)
        if body["LDGSTS"] and (not best or sum(body.values()) < sum(best.values())):
            best = body
    return best


def _stats(cubin: bytes, bytes_per_iteration: int) -> dict[str, Any]:
    sass, regs = disassemble(cubin)
    loop = main_loop(sass)
    total = sum(loop.values())
    return {"registers": regs, "loop_instructions": total,
            "per_4kb": round(total * 4096 / bytes_per_iteration, 1),
            "loop": dict(loop.most_common())}


def main() -> int:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from tessera.hal.cuda import native_attention as na
    from tessera.hal.cuda import nvrtc

    for probe in (0, 1):
        defs = na.defines(4, na.WARPS, na.STAGES, False, False, False, True, True, probe)
        row = _stats(nvrtc.compile_cubin(defs + na.SOURCE, 90), na.STAGE_BYTES)
        print(json.dumps({"kernel": f"native {na.WARPS},{na.STAGES}"
                          + (" loads alone" if probe else ""), **row}), flush=True)
    for case in _decode_attention_cases():
        if "stage1" not in case.name or "u16" not in case.name:
            continue
        options: dict[str, Any] = {"num_warps": case.num_warps, "num_stages": case.num_stages}
        if case.maxnreg is not None:
            options["maxnreg"] = case.maxnreg
        kernel = triton.compile(ASTSource(fn=case.fn, signature=case.signature,
                                          constexprs=case.consts, attrs=case.attrs()),
                                target=GPUTarget("cuda", 90, 32), options=options)
        # each warp runs the loop once per iteration: its count x warps covers BLOCK_N keys
        per_iteration = case.consts["BLOCK_N"] * 2 * 128 // case.num_warps
        print(json.dumps({"kernel": f"triton {case.name}", "warps": case.num_warps,
                          **_stats(kernel.asm["cubin"], per_iteration)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
