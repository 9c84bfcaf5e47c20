"""The MoE kernel figure of B11: the plugin's grouped GEMM (`fused_moe`'s expert matmuls)
against one dense GEMM of the same FLOPs, on the Mixtral-8x7B shape at 256 tokens.

    tessera bench moe-kernel [--tokens 256] [--model benchmarks/configs/mixtral-8x7b.json]

Routing is a top-k of random scores (each expert gets about tokens * k / E pairs, as random
weights route). Timed with device events, median of --iters after --warmup:
  grouped_gemm    the gate/up GEMM over the (token, expert) pairs sorted by expert
  dense_gemm      [tokens * k, hidden] @ [hidden, 2 * inter]: the same FLOPs, one cuBLAS GEMM
  fused_moe       the whole op (alignment, both GEMMs, activation, weighted sum), against the
                  two dense GEMMs of its FLOPs
moe_gemm_fraction_of_dense = grouped TFLOP/s / dense TFLOP/s. With --sweep, a few block
shapes of the grouped GEMM are timed too, to show what tuning could give.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tessera.benchmarks.common import default_results_dir, new_result, write_result

DEFAULT_MODEL = os.path.join(os.path.dirname(os.path.abspath(__file__)), "configs",
                             "mixtral-8x7b.json")
# (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages) tried by --sweep
SWEEP = [(64, 128, 64, 4, 3), (64, 128, 64, 8, 3), (128, 128, 64, 8, 3), (64, 256, 64, 8, 3),
         (32, 128, 64, 4, 4), (128, 256, 64, 8, 3), (64, 64, 64, 4, 4)]


@dataclass(frozen=True)
class MoEShape:
    tokens: int
    hidden: int
    inter: int
    experts: int
    top_k: int

    @property
    def gate_up_flops(self) -> float:
        return 2.0 * self.tokens * self.top_k * self.hidden * 2 * self.inter

    @property
    def moe_flops(self) -> float:
        """Both expert GEMMs: gate/up (2I x H) and down (H x I) for every pair."""
        return self.gate_up_flops * 1.5


def tflops(flops: float, ms: float) -> float:
    return flops / (ms * 1e-3) / 1e12


def time_ms(fn: Callable[[], Any], iters: int, warmup: int) -> float:
    """Median device time of fn() in ms (CUDA events; wall time without a GPU, where the
    kernels run in Triton's interpreter: a dry run of the code, not a figure)."""
    import time

    import torch

    for _ in range(warmup):
        fn()
    if not torch.cuda.is_available():
        walls = []
        for _ in range(iters):
            start = time.perf_counter()
            fn()
            walls.append((time.perf_counter() - start) * 1e3)
        return statistics.median(walls)
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def measure(shape: MoEShape, iters: int, warmup: int, sweep: bool) -> dict[str, Any]:
    import torch

    from tessera.hal.cpu.moe import fused_moe as reference
    from tessera.hal.cuda import moe, moe_tune

    # Without a GPU (Triton's interpreter, which mishandles bf16 arithmetic): fp32 on the cpu.
    gpu = torch.cuda.is_available()
    dev, dtype = torch.device("cuda" if gpu else "cpu"), torch.bfloat16 if gpu else torch.float32
    gen = torch.Generator(device=dev).manual_seed(0)
    t, h, i, e, k = shape.tokens, shape.hidden, shape.inter, shape.experts, shape.top_k
    x = torch.randn(t, h, device=dev, generator=gen).to(dtype)
    w13 = (torch.randn(e, 2 * i, h, device=dev, generator=gen) * h ** -0.5).to(dtype)
    w2 = (torch.randn(e, h, i, device=dev, generator=gen) * i ** -0.5).to(dtype)
    scores = torch.rand(t, e, device=dev, generator=gen)
    weights, ids = torch.softmax(scores, -1).topk(k, dim=-1)
    ids = ids.to(torch.int32)

    block_m, block_n, block_k, _, _ = moe_tune.candidates(t, 2 * i, h, dtype)[0]
    align = moe.align_by_expert(ids, e, block_m)
    out = torch.empty(t * k, 2 * i, dtype=dtype, device=dev)

    def grouped(config: tuple[int, int, int, int, int] | None = None) -> Callable[[], None]:
        if config is None:
            a, bn, bk, kw = align, block_n, block_k, {}
        else:
            bm, bn, bk, warps, stages = config
            a, kw = moe.align_by_expert(ids, e, bm), {"num_warps": warps, "num_stages": stages}
        return lambda: moe.grouped_gemm(x, w13, out, a, k, a_row_is_token=True, block_n=bn,
                                        block_k=bk, **kw)

    pairs_x = x.repeat_interleave(k, dim=0)
    dense_w13 = w13[0].t().contiguous()  # [H, 2I]
    dense_w2 = w2[0].t().contiguous()  # [I, H]
    act = torch.randn(t * k, i, device=dev, generator=gen).to(dtype)
    figures: dict[str, Any] = {}
    grouped_ms = time_ms(grouped(), iters, warmup)
    dense_ms = time_ms(lambda: pairs_x @ dense_w13, iters, warmup)
    fused_ms = time_ms(lambda: moe.fused_moe(x, w13, w2, weights, ids), iters, warmup)
    dense_pair_ms = time_ms(lambda: (pairs_x @ dense_w13, act @ dense_w2), iters, warmup)
    figures.update({
        "grouped_gemm_ms": grouped_ms, "grouped_gemm_tflops": tflops(shape.gate_up_flops,
                                                                     grouped_ms),
        "dense_gemm_ms": dense_ms, "dense_gemm_tflops": tflops(shape.gate_up_flops, dense_ms),
        "moe_gemm_fraction_of_dense": dense_ms / grouped_ms,
        "fused_moe_ms": fused_ms, "fused_moe_tflops": tflops(shape.moe_flops, fused_ms),
        "dense_two_gemms_ms": dense_pair_ms,
        "fused_moe_fraction_of_dense": dense_pair_ms / fused_ms,
        "block_sizes": {"block_m": block_m, "block_n": block_n, "block_k": block_k},
    })
    # The op is right at this shape too: its output against the reference, in fp32.
    got = moe.fused_moe(x, w13, w2, weights, ids).float()
    want = reference(x[:32].float(), w13.float(), w2.float(), weights[:32], ids[:32])
    figures["fused_moe_rel_err_first32"] = float((got[:32] - want).norm() / want.norm())
    if sweep:
        figures["sweep"] = []
        for config in SWEEP:
            try:
                ms = time_ms(grouped(config), iters, warmup)
            except Exception as exc:  # noqa: BLE001 - a shape the device refuses (shared
                # memory, registers) is a finding of the sweep, not the end of B11
                figures["sweep"].append({"config": list(config),
                                         "error": f"{type(exc).__name__}: {exc}"[:300]})
                continue
            figures["sweep"].append({"config": list(config), "ms": ms,
                                     "tflops": tflops(shape.gate_up_flops, ms),
                                     "fraction_of_dense": dense_ms / ms})
        ran = [r for r in figures["sweep"] if "fraction_of_dense" in r]
        if ran:
            best = max(ran, key=lambda r: r["fraction_of_dense"])
            figures["best_swept_fraction_of_dense"] = best["fraction_of_dense"]
            figures["best_swept_config"] = best["config"]
    return figures


def shape_of(model: str, tokens: int) -> MoEShape:
    from tessera.formats.dummy import read_config_file

    config = read_config_file(model)
    if config.moe is None:
        raise SystemExit(f"{model} is not a Mixture-of-Experts config")
    return MoEShape(tokens, config.hidden_size, config.moe.intermediate_size,
                    config.moe.num_experts, config.moe.top_k)


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=DEFAULT_MODEL, help="a MoE config JSON (HF keys)")
    p.add_argument("--tokens", type=int, default=256)
    p.add_argument("--iters", type=int, default=50)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--sweep", action="store_true", help="also time a few block shapes")
    p.add_argument("--out-dir", default=default_results_dir())
    p.add_argument("--name", default="b11_moe_kernel")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="tessera bench moe-kernel", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_args(p)
    args = p.parse_args(argv)
    import torch

    if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
        print("tessera bench moe-kernel: needs a CUDA GPU (the cuda plugin's kernels), or "
              "TRITON_INTERPRET=1 for a dry run of the code on the cpu", file=sys.stderr)
        return 2
    shape = shape_of(args.model, args.tokens)
    figures = measure(shape, args.iters, args.warmup, args.sweep)
    print(f"[bench] MoE grouped GEMM {figures['grouped_gemm_tflops']:.0f} TFLOP/s vs dense "
          f"{figures['dense_gemm_tflops']:.0f} ({figures['moe_gemm_fraction_of_dense']:.2f})",
          file=sys.stderr)
    result = new_result("B11", {**vars(args), "shape": vars(shape)}, device=None)
    result["figures"] = figures
    path = write_result(result, args.out_dir, args.name, required=False)
    print(f"[bench] wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
