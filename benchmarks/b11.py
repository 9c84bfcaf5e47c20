"""`tessera bench b11`: workload B11 (BENCHMARKS.md) in one command — the Mixtral-8x7B shape
(bf16, random weights, one GPU): B1 (batch-1 decode against its roofline, which counts only the
experts each step reads), B2 (offline throughput against the bound of its steps) and the MoE
kernel figures (grouped GEMM at 256 tokens against a dense GEMM of the same FLOPs, its GB/s of
expert weights against the bandwidth, the same comparison at a compute-bound batch, fused_moe
at decode sizes: moe_kernel.py).

    tessera bench b11 [--model benchmarks/configs/mixtral-8x7b.json] [--suffix h200]
                      [--bandwidth-gbps 4220 --peak-tflops 794] [--b1-flags "..."]
                      [--b2-flags "..."] [--kernel-flags "..."] [engine flags...]

Writes b11_b1_<suffix>.json (a B1 result), b11_b2_<suffix>.json (a B2 result),
b11_moe_kernel_<suffix>.json and b11_<suffix>.json (workload "B11": decode_ms_per_step,
roofline_fraction, moe_gemm_fraction_of_dense, and the rest of the three parts).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from typing import Any

from tessera.benchmarks import latency, moe_kernel, offline
from tessera.benchmarks.common import default_results_dir, new_result, write_result

# The kernel part's further figures carried into b11_<suffix>.json.
KERNEL_EXTRA = ("grouped_gemm_gbps", "grouped_gemm_hbm_fraction", "fused_moe_hbm_fraction",
                "compute_bound_fraction_of_dense", "compute_fused_moe_fraction_of_dense",
                "decode1_fused_moe_ms", "decode1_fused_moe_hbm_fraction",
                "decode1_untuned_fused_moe_ms")


def _read(out_dir: str, name: str) -> dict[str, Any]:
    with open(os.path.join(out_dir, f"{name}.json"), encoding="utf-8") as f:
        return json.load(f)  # type: ignore[no-any-return]


def combine(b1: dict[str, Any], b2: dict[str, Any], kernel: dict[str, Any]) -> dict[str, Any]:
    """The B11 figures from its three parts."""
    f1, f2, fk = b1["figures"], b2["figures"], kernel["figures"]
    return {
        "decode_ms_per_step": f1["decode_ms_per_step"],
        "roofline_fraction": f1["roofline_fraction"],
        "roofline_decode_ms_per_step": f1["roofline_decode_ms_per_step"],
        "ttft_ms": f1["ttft_ms"],
        "b2_output_tok_per_s": f2["output_tok_per_s"],
        "b2_roofline_bound_tok_per_s": f2["roofline_bound_tok_per_s"],
        "b2_roofline_fraction": f2["roofline_fraction"],
        "moe_gemm_fraction_of_dense": fk["moe_gemm_fraction_of_dense"],
        "grouped_gemm_tflops": fk["grouped_gemm_tflops"],
        "dense_gemm_tflops": fk["dense_gemm_tflops"],
        "fused_moe_tflops": fk["fused_moe_tflops"],
        "fused_moe_fraction_of_dense": fk["fused_moe_fraction_of_dense"],
        # the kernel part's HBM, compute-bound and decode views, where it ran them
        **{name: fk[name] for name in KERNEL_EXTRA if name in fk},
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="tessera bench b11", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=moe_kernel.DEFAULT_MODEL)
    p.add_argument("--suffix", default="h200")
    p.add_argument("--out-dir", default=default_results_dir())
    p.add_argument("--bandwidth-gbps", type=float)
    p.add_argument("--peak-tflops", type=float)
    p.add_argument("--no-sweep", action="store_true", help="skip the kernel's block sweep")
    p.add_argument("--b1-flags", default="", help="more flags for the B1 part (one string)")
    p.add_argument("--b2-flags", default="", help="more flags for the B2 part (one string)")
    p.add_argument("--kernel-flags", default="",
                   help="more flags for the MoE kernel part (one string, e.g. \"--tokens 16\")")
    args, engine_flags = p.parse_known_args(argv)
    common = ["--model", args.model, "--load-format", "dummy", "--out-dir", args.out_dir]
    if args.bandwidth_gbps:
        common += ["--bandwidth-gbps", str(args.bandwidth_gbps)]
    if args.peak_tflops:
        common += ["--peak-tflops", str(args.peak_tflops)]
    names = {part: f"b11_{part}_{args.suffix}" for part in ("b1", "b2", "moe_kernel")}
    runs = {"b1": (latency.main, [*common, "--name", names["b1"],
                                  *shlex.split(args.b1_flags), *engine_flags]),
            "b2": (offline.main, [*common, "--name", names["b2"], "--no-progress",
                                  *shlex.split(args.b2_flags), *engine_flags]),
            "moe_kernel": (moe_kernel.main, [
                "--model", args.model, "--out-dir", args.out_dir, "--name", names["moe_kernel"],
                *([] if args.no_sweep else ["--sweep"]),
                *(["--bandwidth-gbps", str(args.bandwidth_gbps)] if args.bandwidth_gbps else []),
                *shlex.split(args.kernel_flags)])}
    failed: dict[str, str] = {}
    for part, (bench, part_argv) in runs.items():
        # A part that fails leaves the others their run (each writes its own JSON).
        try:
            code = bench(part_argv)
        except SystemExit as exc:  # argparse's refusal; a signal's exit (>= 128) goes on up
            code = exc.code if isinstance(exc.code, int) else 1
            if code >= 128:
                raise
            why = f"exit code {code}"
        except Exception as exc:  # noqa: BLE001
            code, why = 1, f"{type(exc).__name__}: {exc}"
        else:
            why = f"exit code {code}"
        if code:
            failed[part] = why
            print(f"tessera bench b11: the {part} part failed ({why})", file=sys.stderr)
    if failed:
        print(f"tessera bench b11: no b11_{args.suffix}.json, parts failed: {failed}",
              file=sys.stderr)
        return 1
    parts = {part: _read(args.out_dir, name) for part, name in names.items()}
    result = new_result("B11", {**vars(args), "engine_flags": engine_flags,
                                "parts": {k: f"{v}.json" for k, v in names.items()}})
    result["figures"] = combine(parts["b1"], parts["b2"], parts["moe_kernel"])
    path = write_result(result, args.out_dir, f"b11_{args.suffix}")
    f = result["figures"]
    print(f"[bench] B11: decode {f['decode_ms_per_step']:.2f} ms/step "
          f"({f['roofline_fraction']:.0%} of roofline), B2 {f['b2_output_tok_per_s']:.0f} tok/s "
          f"({f['b2_roofline_fraction']:.0%}), grouped GEMM {f['moe_gemm_fraction_of_dense']:.2f}"
          f" of dense; wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
