"""The fp8 W8A8 product at 64-256 tokens, timed on the device in the ways torch offers, beside
bf16: where cuBLASLt's row-scaled product loses (call 56: down at 256 tokens 46.5 us against
an estimate of ~20 at the fp8 tensor cores' rate, o and qkv under one wave of tiles).

    python tests/hal_cuda/fp8_gemm_probe.py OUT.json [--triton] [--tokens=16,32]

Each candidate runs 20 times inside a CUDA graph, cycling over four copies of the weight (a
step's weights do not stay in L2), the graph replayed 10 times; us per product. Run from the
repository with tessera installed (gpu_bench's timing imports it). Candidates (all from already-quantized
activations, as the rows-fused path hands them):

    bf16        F.linear over the bf16 weight
    scaled_mm   torch._scaled_mm(xq, wq^T), row scales (the engine's SCALED_MM)
    swap        torch._scaled_mm(wq, xq^T) (the transposed product: cuBLASLt sees the weight's
                rows as its M) and the (N, M) result copied to (M, N)
    swap_view   the same without the copy (what a consumer reading the transpose would pay)
    split<G>    K split G ways as a batched fp8 product (torch._scaled_grouped_mm, 3-D x 3-D,
                one launch), the G bf16 partials summed in float32
    t<tile>     tessera's Triton W8A8 tile (quant_tune's config tuples: BLOCK_M, BLOCK_N,
                BLOCK_K, warps, stages, A8 or A8F, K split), with --triton (tessera
                installed): A8 promotes each K tile's dot into float32, A8F accumulates in
                place; c<config>: every candidate the tuner measures at that many tokens, run as
                it runs them (from bf16 activations), and A8F tiles for 16-32 tokens

Each candidate's max relative error against the float product of the dequantized operands is
recorded beside its time.
"""

from __future__ import annotations

import itertools
import json
import sys

import torch
import torch.nn.functional as F

SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096),
          "down": (4096, 14336)}
TOKENS = [64, 128, 256]  # --tokens N,N,... instead
COPIES = 4
REPLAYS = 20


def quant_rows(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    scale = t.abs().amax(dim=1, keepdim=True).float().clamp(min=1e-12) / 448.0
    return (t.float() / scale).to(torch.float8_e4m3fn), scale


def time_graph(fn) -> float:
    """us per call of fn(i), the calls cycling over the weight copies: gpu_bench's graph
    timing (REPLAYS calls captured, the graph replayed)."""
    from gpu_bench import graph_time_us

    copies = itertools.cycle(range(COPIES))
    return graph_time_us(lambda: fn(next(copies)), reps=REPLAYS, iters=10)


def candidates(x: torch.Tensor, w: list[torch.Tensor]) -> dict:
    xq, xs = quant_rows(x)
    wq_s = [quant_rows(t) for t in w]
    m, k = x.shape
    n = w[0].shape[0]
    ref = (xq.float() * xs) @ (wq_s[0][0].float() * wq_s[0][1]).t()

    out: dict = {}

    def record(name, fn, check) -> None:
        try:
            got = check()
            err = float(((got.float() - ref).abs().max() / ref.abs().max()).item())
            out[name] = {"us": round(time_graph(fn), 2), "max_rel_err": err}
        except Exception as exc:  # noqa: BLE001 - a candidate torch or the device refuses
            out[name] = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}

    record("bf16", lambda i: F.linear(x, w[i]), lambda: F.linear(x, w[0]))

    def scaled(i):
        wq, ws = wq_s[i]
        return torch._scaled_mm(xq, wq.t(), scale_a=xs, scale_b=ws.view(1, -1),
                                out_dtype=torch.bfloat16)

    record("scaled_mm", scaled, lambda: scaled(0))

    def swap_view(i):
        wq, ws = wq_s[i]
        return torch._scaled_mm(wq, xq.t(), scale_a=ws, scale_b=xs.view(1, -1),
                                out_dtype=torch.bfloat16).t()

    record("swap_view", swap_view, lambda: swap_view(0))
    record("swap", lambda i: swap_view(i).contiguous(), lambda: swap_view(0).contiguous())

    for g in (2, 4):
        if k % (16 * g):
            continue
        # A (G, M, K/G) and B (G, N, K/G): each operand's K split into G contiguous slices
        xa = xq.view(m, g, k // g).transpose(0, 1).contiguous()
        wb = [wq.view(n, g, k // g).transpose(0, 1).contiguous() for wq, _ in wq_s]
        sa = xs.view(1, m).expand(g, m).contiguous()
        sb = [ws.view(1, n).expand(g, n).contiguous() for _, ws in wq_s]

        def split(i, xa=xa, wb=wb, sa=sa, sb=sb):
            parts = torch._scaled_grouped_mm(xa, wb[i].transpose(-2, -1), sa, sb[i],
                                             out_dtype=torch.bfloat16)
            return parts.float().sum(0).to(torch.bfloat16)

        record(f"split{g}", split, lambda split=split: split(0))
    if TRITON:
        from tessera.hal.cuda import quant_linear as ql
        from tessera.hal.cuda import quant_tune as qt
        from tessera.hal.quant import quantize

        qw = [ql.prepare(quantize(t, "fp8")) for t in w]
        for cfg in TRITON_TILES:
            if cfg[0] > 2 * m:
                continue

            def tri(i, cfg=cfg):
                return qt.run_fp8_quantized(xq, xs, qw[i], None, cfg, torch.bfloat16)

            record("t" + "_".join(map(str, cfg)), tri, lambda tri=tri: tri(0))
        # the tuner's own candidates for this batch, as it runs them (from bf16 activations:
        # a W8A8 one quantizes them first), and A8F tiles for the small buckets
        extra = SMALL_A8F if m <= 32 else []
        for cfg in list(qt.W8A8_CANDIDATES[qt.batch_bucket(m)]) + extra:
            if not qt.a8f_fits(cfg, k):
                continue

            def cur(i, cfg=cfg):
                return qt.run_fp8(x, qw[i], None, cfg)

            record("c" + "_".join(map(str, cfg)), cur, lambda cur=cur: cur(0))
    return out


SMALL_A8F = [(16, 64, 128, 4, 4, 3, 4), (16, 64, 128, 4, 4, 3, 2), (32, 64, 128, 4, 4, 3, 4),
             (32, 64, 128, 4, 4, 3, 2), (32, 128, 128, 4, 4, 3), (16, 128, 128, 4, 4, 3)]


# (BLOCK_M, BLOCK_N, BLOCK_K, warps, stages, flag, split): A8 = 1, A8F = 3
TRITON_TILES = [(64, 128, 128, 4, 4, 1, 1), (64, 128, 128, 4, 4, 1, 2),
                (64, 128, 128, 4, 4, 3, 1), (64, 128, 128, 4, 4, 3, 2),
                (64, 128, 128, 4, 4, 3, 4), (64, 64, 128, 4, 4, 3, 1),
                (64, 64, 128, 4, 4, 3, 2), (64, 64, 128, 4, 4, 3, 4),
                (128, 128, 128, 8, 3, 1, 1), (128, 128, 128, 8, 3, 3, 1),
                (128, 128, 128, 8, 3, 3, 2), (128, 64, 128, 4, 4, 3, 1),
                (128, 64, 128, 4, 4, 3, 2), (64, 128, 256, 8, 3, 3, 1),
                (64, 128, 256, 8, 3, 3, 2), (128, 256, 128, 8, 3, 3, 1)]
TRITON = False


def main(path: str) -> None:
    torch.manual_seed(0)
    dev = torch.device("cuda")
    result: dict = {"device": torch.cuda.get_device_name(dev), "torch": torch.__version__,
                    "copies": COPIES, "replays": REPLAYS, "cases": {}}
    for name, (n, k) in SHAPES.items():
        w = [torch.randn(n, k, device=dev, dtype=torch.bfloat16) / k ** 0.5
             for _ in range(COPIES)]
        for m in TOKENS:
            x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
            case = candidates(x, w)
            result["cases"][f"{name}_{m}"] = case
            line = ", ".join(f"{c} {v['us']}" if "us" in v else f"{c} error"
                             for c, v in case.items())
            print(f"[fp8probe] {name} x {m}: {line}", flush=True)
        del w
        torch.cuda.empty_cache()
    with open(path, "w", encoding="utf-8") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    TRITON = "--triton" in sys.argv[2:]
    for arg in sys.argv[2:]:
        if arg.startswith("--tokens="):
            TOKENS[:] = [int(t) for t in arg.split("=", 1)[1].split(",")]
    main(sys.argv[1])
