"""Compile the cuda plugin's fused, quantized-GEMV / GEMM and MoE grouped-GEMM kernels for an H100/H200 (sm_90) on a
machine without a GPU: Triton's front end, its passes and the ptxas it ships, down to a cubin.
The interpreter runs a kernel's Python, not its compilation: a kernel the compiler refuses (a
value of two types out of an `if`, a constexpr misuse) passes there and fails on the GPU.

    python tests/hal_cuda/compile_for_sm90.py    # one JSON line: kernel -> "ok" or the error
    python tests/hal_cuda/compile_for_sm90.py --pdl   # the PDL launches: no memory before the wait

Run with TRITON_INTERPRET unset (decorated kernels are otherwise interpreter functions).
Arguments are specialized as the launcher does for Llama-3-8B's shapes (pointers and sizes
divisible by 16), so the loads vectorize as they will on the device.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SHARED_LIMIT = 227 * 1024  # what sm_90 allows one program
# a SASS line's opcode (group 1), after its offset and any predicate
OPCODE = re.compile(r"/\*[0-9a-f]{4}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]+)")


def disassemble(cubin: bytes) -> tuple[str, int]:
    """(the SASS, registers a thread; -1 where not said) of a cubin, by the nvdisasm and
    cuobjdump that Triton ships."""
    import triton

    tools = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        sass = subprocess.run([str(tools / "nvdisasm"), "-c", f.name], capture_output=True,
                              text=True, check=True).stdout
        usage = subprocess.run([str(tools / "cuobjdump"), "-res-usage", f.name],
                               capture_output=True, text=True, check=True).stdout
    regs = re.search(r"REG:(\d+)", usage)
    return sass, int(regs.group(1)) if regs else -1


@dataclass
class Case:
    name: str
    fn: Any
    signature: dict[str, str]
    consts: dict[str, Any]
    num_warps: int = 4
    divisible_by_16: tuple[str, ...] = field(default_factory=tuple)
    num_stages: int = 3
    max_shared: int = SHARED_LIMIT  # bytes of shared memory the compiled kernel may use
    maxnreg: int | None = None  # registers a thread may hold (None: ptxas's choice)

    def __post_init__(self) -> None:
        # constexprs the case leaves at their defaults (USE_PDL, PREFETCH, ...) are given
        # them, as the launcher does, instead of becoming run-time arguments
        import inspect

        for p in inspect.signature(self.fn.fn).parameters.values():
            if p.default is not inspect.Parameter.empty and p.name not in self.consts \
                    and "constexpr" in str(p.annotation):
                self.consts = {**self.consts, p.name: p.default}
                self.signature = {**self.signature, p.name: "constexpr"}

    def attrs(self) -> dict[tuple[int, ...], list[list[Any]]]:
        return {(i,): [["tt.divisibility", 16]] for i, n in enumerate(self.fn.arg_names)
                if n in self.divisible_by_16}


def _signature(fn: Any, types: dict[str, str], consts: dict[str, Any]) -> dict[str, str]:
    return {n: "constexpr" if n in consts else types.get(n, "i32") for n in fn.arg_names}


def qgemv_case(scheme: str, group: int | None, variant: int, block_n: int = 4,
               block_k: int = 4096, num_warps: int = 8) -> Case:
    """The quantized GEMV for bf16 x: `group` None is one scale per output row."""
    from tessera.hal.cuda import quant_kernels as qk

    fn = qk.qgemv_kernel
    qtypes = {"fp8": "*fp8e4nv", "int8": "*i8", "int4": "*u8"}
    types = {"x_ptr": "*bf16", "q_ptr": qtypes[scheme], "s_ptr": "*fp32", "o_ptr": "*fp32",
             "b_ptr": "*bf16", "out_ptr": "*bf16"}
    consts = {"KIND": {"fp8": qk.FP8, "int8": qk.INT8, "int4": qk.INT4}[scheme],
              "GROUP": group or 1, "PER_ROW": group is None, "HAS_BIAS": False,
              "BLOCK_N": block_n, "BLOCK_K": block_k,
              "COLUMN": bool(variant & qk.GEMV_COLUMN),
              "EXP_CVT": bool(variant & qk.GEMV_EXP_CVT),
              "X_VEC": bool(variant & qk.GEMV_X_VEC),
              "ACC": bool(variant & qk.GEMV_ACC),
              "STAGES": qk.gemv_stages(variant),
              "HALF": 64 if scheme == "int4" else 1}  # int4 as prepare holds it: halves128
    return Case(f"qgemv {scheme} group={group or 'row'} variant={variant}", fn,
                _signature(fn, types, consts), consts, num_warps=num_warps,
                divisible_by_16=("x_ptr", "q_ptr", "s_ptr", "o_ptr", "out_ptr", "n_out",
                                 "n_in", "q_s0", "s_s0"))


def _qgemv_cases() -> list[Case]:
    """Every GEMV formulation the tuner lists (quant_tune.GEMV_CANDIDATES' variants) at a wide
    candidate tile, grouped (AWQ's 128) and one scale per row."""
    from tessera.hal.cuda import quant_kernels as qk
    from tessera.hal.cuda import quant_tune

    listed = {s: sorted({c[3] for c in cands if not c[3] & (qk.GEMV_DOT | qk.GEMV_NATIVE)})
              for s, cands in quant_tune.GEMV_CANDIDATES.items()}
    return [qgemv_case(scheme, group, variant)
            for scheme, group, variants in (
                ("fp8", None, listed["fp8"]), ("int8", 128, listed["int8"]),
                ("int4", 128, listed["int4"]),
                ("int4", None, (0, qk.GEMV_EXP_CVT | qk.GEMV_X_VEC)))
            for variant in variants]


def _qgemm_cases() -> list[Case]:
    """The quantized GEMM (decode batches, prefill): int4 in "halves128" tiles (two dots of
    contiguous halves, the exponent-bit nibbles), grouped and per row, at every tile of
    quant_tune's int4 lists and the GEMV_DOT one-token tiles, through qgemm_kernel or, for
    tiles flagged WT, qgemm_wt_kernel; int4 "nibbles" (interleaved back) and int8 grouped at a
    skinny and a large tile; fp8 at every W8A16, WT and W8A8 tile listed."""
    from tessera.hal.cuda import quant_kernels as qk
    from tessera.hal.cuda import quant_tune

    qtypes = {"fp8": "*fp8e4nv", "int8": "*i8", "int4": "*u8"}
    two: list[tuple[int, ...]] = [(16, 64, 128, 4, 4), (128, 128, 64, 8, 3)]
    int4_tiles = list(dict.fromkeys(
        [t for ts in quant_tune.INT4_GEMM_CANDIDATES.values() for t in ts
         if t != quant_tune.DEQUANT_MM]
        + [quant_tune.dot_tile(c)[:2] + (128,) + quant_tune.dot_tile(c)[3:] + (quant_tune.WT,)
           for c in quant_tune.GEMV_CANDIDATES["int4"] if c[3] & qk.GEMV_DOT]))
    fp8_tiles = list(dict.fromkeys(t for ts in quant_tune.W8A8_CANDIDATES.values()
                                   for t in ts if t != quant_tune.SCALED_MM))
    plan: list[tuple[str, int | None, int, tuple[int, ...]]] = \
        [("int4", 128, 64, t) for t in int4_tiles] + \
        [("int4", None, 64, t) for t in two + [t + (quant_tune.WT,) for t in two]] + \
        [("int4", 128, 1, t) for t in two] + [("int8", 128, 1, t) for t in two] + \
        [("fp8", None, 1, t) for t in fp8_tiles]
    out = []
    for scheme, group, half, cfg in plan:
        bm, bn, bk, warps, stages = quant_tune.tile(cfg)
        wt, a_fp8 = quant_tune.is_wt(cfg), quant_tune.is_w8a8(cfg)
        fn = qk.qgemm_wt_kernel if wt else qk.qgemm_kernel
        if half > 1:
            bk = 2 * half  # qgemm takes the weight's tile as BLOCK_K
        types = {"x_ptr": "*fp8e4nv" if a_fp8 else "*bf16", "q_ptr": qtypes[scheme],
                 "s_ptr": "*fp32", "o_ptr": "*fp32", "b_ptr": "*bf16", "out_ptr": "*bf16",
                 "xs_ptr": "*fp32"}
        consts = {"KIND": {"fp8": qk.FP8, "int8": qk.INT8, "int4": qk.INT4}[scheme],
                  "GROUP": group or 1, "PER_ROW": group is None, "HAS_BIAS": False,
                  "BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk,
                  "DOT_PREC": "tf32", "HALF": half, "NIB_BIAS": 128.0 if half > 1 else 0.0}
        if not wt:
            consts["A_FP8"] = a_fp8
        consts["SPLIT_K"] = quant_tune.split_k(cfg)
        out.append(Case(f"qgemm{'_wt' if wt else ''} {scheme} group={group or 'row'} "
                        f"w8a8={a_fp8} half={half} {(bm, bn, bk, warps, stages)} "
                        f"split={quant_tune.split_k(cfg)}", fn,
                        _signature(fn, types, consts), consts,
                        num_warps=warps, num_stages=stages,
                        divisible_by_16=tuple(n for n in (
                            "x_ptr", "q_ptr", "s_ptr", "o_ptr", "out_ptr", "xs_ptr", "N", "K",
                            "x_s0", "q_s0", "s_s0", "out_s0") if n in fn.arg_names)))
    return out


def _dequant_cases() -> list[Case]:
    """DEQUANT_MM's expansion of a weight to bf16, for every layout the plugin holds."""
    from tessera.hal.cuda import quant_kernels as qk

    fn = qk.dequant_kernel
    qtypes = {"fp8": "*fp8e4nv", "int8": "*i8", "int4": "*u8"}
    out = []
    for scheme, group, half in (("int4", 128, 64), ("int4", None, 64), ("int4", 16, 1),
                                ("int8", 128, 1), ("fp8", None, 1)):
        types = {"q_ptr": qtypes[scheme], "s_ptr": "*fp32", "o_ptr": "*fp32",
                 "out_ptr": "*bf16"}
        consts = {"KIND": {"fp8": qk.FP8, "int8": qk.INT8, "int4": qk.INT4}[scheme],
                  "GROUP": group or 1, "PER_ROW": group is None, "HALF": half,
                  "BLOCK_N": 32, "BLOCK_K": 2 * half if half > 1 else 128}
        out.append(Case(f"dequant {scheme} group={group or 'row'} half={half}", fn,
                        _signature(fn, types, consts), consts,
                        divisible_by_16=("q_ptr", "s_ptr", "o_ptr", "out_ptr", "N", "K",
                                         "q_s0", "s_s0", "out_s0")))
    return out


def _quant_rows_cases() -> list[Case]:
    """W8A8's per-token fp8 quantization of bf16 activations: a row in one block (read once)
    at 4096 and 16384 wide, and in several."""
    from tessera.hal.cuda import quant_kernels as qk

    fn = qk.quant_rows_fp8_kernel
    types = {"x_ptr": "*bf16", "out_ptr": "*fp8e4nv", "scale_ptr": "*fp32"}
    return [Case(f"quant_rows_fp8 BLOCK_K={block}", fn,
                 _signature(fn, types, {"BLOCK_K": block}), {"BLOCK_K": block},
                 num_warps=4 if block <= 4096 else 8,
                 divisible_by_16=("x_ptr", "out_ptr", "scale_ptr", "K", "x_s0", "out_s0"))
            for block in (4096, 16384)]


def _moe_cases() -> list[Case]:
    """Every tile moe_tune lists, as the gate/up and the down GEMM, bf16 at Mixtral-8x7B's
    strides: each compiles, within moe_tune's estimate of its shared memory (the estimate
    that keeps too large a tile from being measured)."""
    from tessera.hal.cuda import moe, moe_tune

    fn = moe._grouped_gemm_kernel
    types = {"a_ptr": "*bf16", "b_ptr": "*bf16", "c_ptr": "*bf16", "w_ptr": "*fp32",
             "pairs_ptr": "*i32", "expert_ptr": "*i32"}
    tiles = list(dict.fromkeys(t for bucket in moe_tune.BUCKETS.values() for t in bucket))
    out = []
    for tile in tiles:
        bm, bn, bk, warps, stages = tile
        for gemm, row_is_token, c_type in (("gate_up", True, "*bf16"), ("down", False, "*fp32")):
            consts = {"TOP_K": 2, "A_ROW_IS_TOKEN": row_is_token, "MUL_WEIGHT": not row_is_token,
                      "BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "DOT_PREC": "tf32"}
            out.append(Case(f"moe {gemm} {tile}", fn,
                            _signature(fn, {**types, "c_ptr": c_type}, consts), consts,
                            num_warps=warps, num_stages=stages,
                            max_shared=min(SHARED_LIMIT, moe_tune.shared_bytes(tile, 2)),
                            divisible_by_16=("a_ptr", "b_ptr", "c_ptr", "w_ptr", "pairs_ptr",
                                             "expert_ptr", "N", "K", "a_s0", "b_s0", "b_s1",
                                             "c_s0")))
    return out


def _decode_attention_cases() -> list[Case]:
    """Decode attention's stage 1 and the extend kernel at Llama-3-8B's heads (4 query heads a
    KV head, 128 wide) over a bf16 cache and an e4m3 one read as uint16 words (the hardware's
    e4m3x2 conversion in inline PTX, which the interpreter never runs); stage 1 at the
    module's tunables and the fp8 ones, split and not."""
    from tessera.hal.cuda import decode_attention as da
    from tessera.hal.cuda import extend_attention as ea

    fn = da._decode_stage1
    out = []
    for cache, words in (("*bf16", False), ("*u16", True)):
        types = {"q_ptr": "*bf16", "kc_ptr": cache, "vc_ptr": cache, "rtt_ptr": "*i32",
                 "seq_lens_ptr": "*i32", "ext_lens_ptr": "*i32", "qo_ptr": "*i32",
                 "mid_o_ptr": "*fp32", "mid_lse_ptr": "*fp32", "out_ptr": "*bf16",
                 "sm_scale_log2": "fp32", "logit_cap": "fp32"}
        # (tile, the ONE_SPLIT values it meets): the default's batches take one split or
        # several, the fp8 small-batch tile's two or three
        tiles = [(da.tunables(words), (True, False))]
        if words and da.FP8_SMALL_TILE is not None:
            tiles.append((da.tunables(words, da.FP8_SMALL_BATCH[0]), (False,)))
        for (block_n, warps, stages, maxnreg), splits in tiles:
            for one_split in splits:
                consts = {"HAS_CAP": False, "GROUP": 4, "HEAD_DIM": 128,
                          "ONE_SPLIT": one_split, "BLOCK_H": 16, "BLOCK_D": 128,
                          "BLOCK_N": block_n, "DOT_PREC": "tf32", "MIXED": False,
                          "FP8_WORDS": words, "ASM_CVT": words}
                out.append(Case(f"decode_attention stage1 cache={cache[1:]} one_split="
                                f"{one_split} block_n={block_n}", fn,
                                _signature(fn, types, consts), consts, num_warps=warps,
                                num_stages=stages, maxnreg=maxnreg,
                                divisible_by_16=("q_ptr", "kc_ptr", "vc_ptr", "rtt_ptr",
                                                 "out_ptr", "q_s0", "q_s1", "c_s0", "c_s1",
                                                 "rtt_s0", "o_s0", "o_s1")))
    fn = ea._extend_kernel
    for cache, words in (("*bf16", False), ("*u16", True)):
        types = {"q_ptr": "*bf16", "kc_ptr": cache, "vc_ptr": cache, "rtt_ptr": "*i32",
                 "seq_lens_ptr": "*i32", "ext_lens_ptr": "*i32", "qo_ptr": "*i32",
                 "out_ptr": "*bf16", "sm_scale_log2": "fp32", "logit_cap": "fp32"}
        consts = {"HAS_CAP": False, "GROUP": 4, "HEAD_DIM": 128, "BLOCK_M": ea.BLOCK_M,
                  "BLOCK_N": ea.BLOCK_N, "BLOCK_D": 128, "REQS": 32, "DOT_PREC": "tf32",
                  "FP8_WORDS": words, "ASM_CVT": words}
        out.append(Case(f"extend_attention cache={cache[1:]}", fn, _signature(fn, types, consts),
                        consts, num_warps=ea.NUM_WARPS,
                        num_stages=ea.FP8_NUM_STAGES if words else ea.NUM_STAGES,
                        divisible_by_16=("q_ptr", "kc_ptr", "vc_ptr", "rtt_ptr", "out_ptr",
                                         "q_s0", "q_s1", "c_s0", "c_s1", "rtt_s0", "o_s0",
                                         "o_s1")))
    return out


def cases() -> list[Case]:
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
            out.append(Case(f"rotary_store_kv {dt} fp8={fp8}", fn,
                            _signature(fn, types, consts), consts))
    fn = gemv._gemv_kernel
    for bias in (False, True):
        types = {"x_ptr": "*bf16", "w_ptr": "*bf16", "b_ptr": "*bf16", "out_ptr": "*bf16"}
        consts = {"HAS_BIAS": bias, "BLOCK_N": 2, "BLOCK_K": 2048}
        out.append(Case(f"gemv bias={bias}", fn, _signature(fn, types, consts), consts))
    from tessera.hal.cuda import moe

    fn = moe._align_kernel
    for experts in (8, 256):  # Mixtral's 8 experts, DeepSeek-V3's 256
        e_block = max(16, experts)
        consts = {"BLOCK_M": 16, "E_BLOCK": e_block, "P_BLOCK": max(16, 4096 // e_block),
                  "B_BLOCK": max(16, 2048 // e_block)}
        types = {"ids_ptr": "*i32", "sorted_ptr": "*i32", "block_expert_ptr": "*i32"}
        out.append(Case(f"moe align E={experts}", fn, _signature(fn, types, consts), consts))
    fn = moe._combine_kernel
    consts = {"TOP_K": 2, "BLOCK_H": 1024}
    types = {"src_ptr": "*fp32", "ids_ptr": "*i32", "out_ptr": "*bf16"}
    out.append(Case("moe combine", fn, _signature(fn, types, consts), consts))
    fn = moe._softmax_topk_kernel
    for experts, top_k in ((8, 2), (256, 8)):
        consts = {"TOP_K": top_k, "K_BLOCK": top_k, "E_BLOCK": max(16, experts),
                  "RENORMALIZE": True}
        types = {"logits_ptr": "*bf16", "weights_ptr": "*fp32", "ids_ptr": "*i32"}
        out.append(Case(f"moe softmax top-{top_k} of {experts}", fn,
                        _signature(fn, types, consts), consts, num_warps=1))
    return out + _decode_attention_cases() + _qgemv_cases() + _qgemm_cases() + _dequant_cases() + _quant_rows_cases() + \
        _moe_cases()


def pdl_cases() -> list[Case]:
    """Every kernel a decode or mixed step launches with programmatic dependent launch
    (hal/cuda/pdl.py), compiled with USE_PDL: the GEMVs with their L2 prefetch (the mode
    HAL_CUDA_PDL=prefetch, the strictest case: memory touched before the wait), the others
    as their decode launch specializes them."""
    from tessera.hal.cuda import decode_attention as da
    from tessera.hal.cuda import elementwise, norm, sampling
    from tessera.hal.cuda import quant_kernels as qk

    picked = [c for c in cases() if c.name in (
        "rotary_store_kv bf16 fp8=False", "rotary_store_kv bf16 fp8=True", "gemv bias=False",
        "gemv bias=True", "decode_attention stage1 cache=bf16 one_split=False block_n=64",
        "decode_attention stage1 cache=u16 one_split=True block_n=64",
        "extend_attention cache=bf16")]
    picked += [qgemv_case("fp8", None, 0, 4, 2048, 4), qgemv_case("int4", 128, 0, 16, 2048, 4),
               qgemv_case("fp8", None, qk.GEMV_ACC | qk.GEMV_X_VEC, 2, 1024, 4)]
    bf16 = "*bf16"
    small = [
        (norm._rms_norm_kernel, {"x_ptr": bf16, "res_ptr": bf16, "w_ptr": bf16, "out_ptr": bf16,
                                 "res_out_ptr": bf16, "eps": "fp32"},
         {"HAS_RESIDUAL": True, "BLOCK": 4096}, 8),
        (elementwise._act_and_mul_kernel, {"x_ptr": bf16, "out_ptr": bf16},
         {"BLOCK": 1024, "GELU": False}, 4),
        (elementwise._store_kv_kernel, {"kc_ptr": bf16, "vc_ptr": bf16, "k_ptr": bf16,
                                        "v_ptr": bf16, "slot_ptr": "*i32", "k_scale": "fp32",
                                        "v_scale": "fp32"},
         {"HEAD_DIM": 128, "BLOCK_H": 8, "BLOCK_D": 128, "FP8": False}, 4),
        (elementwise._rotary_kernel, {"pos_ptr": "*i64", "q_ptr": bf16, "k_ptr": bf16,
                                      "qo_ptr": bf16, "ko_ptr": bf16, "cs_ptr": bf16},
         {"HALF": 64, "BLOCK_H": 32, "BLOCK_HALF": 64, "Q_BLOCKS": 1}, 4),
        (da._decode_stage2, {"mid_o_ptr": "*fp32", "mid_lse_ptr": "*fp32", "out_ptr": bf16,
                             "ext_lens_ptr": "*i32", "qo_ptr": "*i32"},
         {"HEAD_DIM": 128, "BLOCK_S": da.MAX_SPLITS, "BLOCK_D": 128, "MIXED": False}, 4),
        (sampling._argmax_partial_kernel, {"x_ptr": bf16, "val_ptr": "*fp32", "idx_ptr": "*i64"},
         {"BLOCK": 2048}, 8),
        (sampling._argmax_merge_kernel, {"val_ptr": "*fp32", "idx_ptr": "*i64",
                                         "out_ptr": "*i64"}, {"PARTS": 64}, 1),
        (qk.quant_rows_fp8_kernel, {"x_ptr": bf16, "out_ptr": "*fp8e4nv", "scale_ptr": "*fp32"},
         {"BLOCK_K": 4096}, 4),
        # the activations' quantization in the norm's and the SiLU's kernels (rows_fused)
        (norm._rms_norm_quant_fp8_kernel, {"x_ptr": bf16, "res_ptr": bf16, "w_ptr": bf16,
                                           "q_ptr": "*fp8e4nv", "scale_ptr": "*fp32",
                                           "res_out_ptr": bf16, "eps": "fp32"},
         {"HAS_RESIDUAL": True, "BLOCK": 4096}, 8),
        (elementwise._silu_and_mul_quant_fp8_kernel, {"x_ptr": bf16, "q_ptr": "*fp8e4nv",
                                                      "scale_ptr": "*fp32"},
         {"BLOCK": 16384}, 16),
    ]
    picked += [Case(fn.__name__, fn, _signature(fn, types, consts), consts, num_warps=warps)
               for fn, types, consts, warps in small]
    out = []
    for case in picked:
        consts = {**case.consts, "USE_PDL": True}
        if "PREFETCH" in case.fn.arg_names:
            consts.update(PREFETCH=True, PF_LINES=32)
        out.append(Case(f"{case.name} USE_PDL", case.fn,
                        _signature(case.fn, {n: t for n, t in case.signature.items()
                                             if t != "constexpr"}, consts), consts,
                        num_warps=case.num_warps, divisible_by_16=case.divisible_by_16,
                        num_stages=case.num_stages, max_shared=case.max_shared,
                        maxnreg=case.maxnreg))
    return out


_MEMORY = ("ld.global", "st.global", "cp.async", "atom.", "red.", "ld.volatile", "ld.relaxed",
           "ld.acquire")


def pdl_order(ptx: str, prefetch: bool = False) -> str:
    """'ok' when the kernel waits for the kernel before (griddepcontrol.wait) before any
    access to global memory but an L2 prefetch (which `prefetch` requires there), and then
    lets the next one launch; else what is wrong."""
    lines = [ln.strip() for ln in ptx.splitlines()]
    waits = [i for i, ln in enumerate(lines) if ln.startswith("griddepcontrol.wait")]
    releases = [i for i, ln in enumerate(lines)
                if ln.startswith("griddepcontrol.launch_dependents")]
    if not waits or not releases:
        return "no griddepcontrol.wait / launch_dependents"
    early = [ln for ln in lines[:waits[0]] if any(m in ln for m in _MEMORY)]
    if early:
        return f"global memory touched before the wait: {early[:3]}"
    if releases[0] < waits[0]:
        return "launch_dependents before the wait"
    if prefetch and not any(ln.startswith("prefetch.global.L2") for ln in lines[:waits[0]]):
        return "no L2 prefetch of the weights before the wait"
    return "ok"


def main() -> int:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    target = GPUTarget("cuda", 90, 32)
    pdl = "--pdl" in sys.argv[1:]
    results: dict[str, str] = {}
    only = os.environ.get("SM90_ONLY", "")  # a substring of the cases' names: those alone
    # --shard=I/N: every N-th case from the I-th, so N processes share the compiles
    shard = next((a.split("=", 1)[1] for a in sys.argv[1:] if a.startswith("--shard=")), "0/1")
    index, count = (int(x) for x in shard.split("/"))
    for case in (pdl_cases() if pdl else cases())[index::count]:
        if only not in case.name:
            continue
        try:
            options: dict[str, Any] = {"num_warps": case.num_warps,
                                       "num_stages": case.num_stages}
            if case.maxnreg is not None:
                options["maxnreg"] = case.maxnreg
            kernel = triton.compile(ASTSource(fn=case.fn, signature=case.signature,
                                              constexprs=case.consts, attrs=case.attrs()),
                                    target=target, options=options)
            shared = kernel.metadata.shared
            results[case.name] = "ok" if shared <= case.max_shared else \
                f"{shared} bytes of shared memory, more than {case.max_shared}"
            if pdl and results[case.name] == "ok":
                results[case.name] = pdl_order(kernel.asm["ptx"],
                                               prefetch="PREFETCH" in case.fn.arg_names)
        except Exception as e:  # noqa: BLE001 - every kernel's outcome is reported
            results[case.name] = f"{type(e).__name__}: {e}"
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
