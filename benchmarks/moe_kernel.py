"""The MoE kernel figures of B11: the plugin's grouped GEMM (`fused_moe`'s expert matmuls)
against one dense GEMM of the same FLOPs, on the Mixtral-8x7B shape at 256 tokens; the HBM
view of the same GEMM; the comparison again where it is compute-bound; and the decode sizes.

    tessera bench moe-kernel [--tokens 256] [--model benchmarks/configs/mixtral-8x7b.json]
                             [--bandwidth-gbps 4220] [--compute-tokens 8192]
                             [--decode-tokens 1,16] [--sweep]

Routing is a top-k of random scores (each expert gets about tokens * k / E pairs, as random
weights route). Timed with device events, median of --iters after --warmup. The grouped
GEMMs run with the tiles fused_moe takes (moe_tune measures them on the first call of a
shape bucket; the "untuned" figures force the heuristic tile, moe_tune's first candidate):
  grouped_gemm    the gate/up GEMM over the (token, expert) pairs sorted by expert
  dense_gemm      [tokens * k, hidden] @ [hidden, 2 * inter]: the same FLOPs, one cuBLAS GEMM
  fused_moe       the whole op (alignment, both GEMMs, activation, weighted sum), against the
                  two dense GEMMs of its FLOPs
moe_gemm_fraction_of_dense = grouped TFLOP/s / dense TFLOP/s. At 256 tokens (64 pairs per
expert) the grouped GEMM must read every expert's w13 (1.9 GB), the dense one a single
[2I, H] matrix: the grouped GEMM is bound by HBM, not by the tensor cores, so the same
GEMM is also shown as bytes of expert weights read per second (grouped_gemm_gbps) against the
bandwidth (--bandwidth-gbps, else a device copy measured: grouped_gemm_hbm_fraction), and the
grouped-vs-dense comparison is repeated at --compute-tokens (compute_bound_fraction_of_dense),
where both are compute-bound. "decode" times every moe_tune candidate of both GEMMs at
--decode-tokens (their GB/s of the active experts' weights) and fused_moe tuned and untuned.
With --sweep, every moe_tune candidate of the gate/up GEMM at --tokens is timed too.
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

Tile = tuple[int, int, int, int, int]  # (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages)
DEFAULT_MODEL = os.path.join(os.path.dirname(os.path.abspath(__file__)), "configs",
                             "mixtral-8x7b.json")


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

    def at(self, tokens: int) -> MoEShape:
        return MoEShape(tokens, self.hidden, self.inter, self.experts, self.top_k)


@dataclass(frozen=True)
class Weights:
    w13: Any  # [E, 2I, H]
    w2: Any  # [E, H, I]


@dataclass(frozen=True)
class Batch:
    """One batch's activations and routing, with what the GEMMs of it must read."""

    x: Any  # [T, H]
    weights: Any  # [T, k] fp32
    ids: Any  # [T, k] int32
    active_experts: int  # experts that hold at least one pair: their weights are read

    def fused_moe(self, w: Weights, tiles: Any = None) -> Any:
        """The op on the batch (tiles: a moe.MoETiles forced, else the tuner's)."""
        from tessera.hal.cuda import moe

        return moe.fused_moe(self.x, w.w13, w.w2, self.weights, self.ids, tiles=tiles)


@dataclass(frozen=True)
class Tiles:
    gate_up: Tile
    down: Tile
    untuned_gate_up: Tile
    untuned_down: Tile


def tflops(flops: float, ms: float) -> float:
    return flops / (ms * 1e-3) / 1e12


def gbps(nbytes: float, ms: float) -> float:
    return nbytes / (ms * 1e-3) / 1e9


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


class Bench:
    """The shape's expert weights on the device and the timed pieces of fused_moe."""

    def __init__(self, shape: MoEShape, iters: int, warmup: int) -> None:
        import torch

        # Without a GPU (Triton's interpreter, which mishandles bf16 arithmetic): fp32 on cpu.
        gpu = torch.cuda.is_available()
        self.torch = torch
        self.dev = torch.device("cuda" if gpu else "cpu")
        self.dtype = torch.bfloat16 if gpu else torch.float32
        self.shape, self.iters, self.warmup = shape, iters, warmup
        self.gen = torch.Generator(device=self.dev).manual_seed(0)
        h, i, e = shape.hidden, shape.inter, shape.experts
        x = self.randn(shape.tokens, h)  # drawn first: the figure's inputs as before
        self.w = Weights((self.randn(e, 2 * i, h) * h ** -0.5).to(self.dtype),
                         (self.randn(e, h, i) * i ** -0.5).to(self.dtype))
        self.main = self.routed(x)

    def randn(self, *size: int) -> Any:
        return self.torch.randn(*size, device=self.dev, generator=self.gen)

    def routed(self, x: Any) -> Batch:
        torch, e, k = self.torch, self.shape.experts, self.shape.top_k
        scores = torch.rand(x.shape[0], e, device=self.dev, generator=self.gen)
        weights, ids = torch.softmax(scores, -1).topk(k, dim=-1)
        return Batch(x.to(self.dtype), weights, ids.to(torch.int32),
                     int(torch.unique(ids).numel()))

    def batch(self, tokens: int) -> Batch:
        return self.routed(self.randn(tokens, self.shape.hidden))

    def time(self, fn: Callable[[], Any]) -> float:
        return time_ms(fn, self.iters, self.warmup)

    def elem(self) -> int:
        return int(self.torch.empty((), dtype=self.dtype).element_size())

    def gate_up_bytes(self, b: Batch) -> int:
        return b.active_experts * 2 * self.shape.inter * self.shape.hidden * self.elem()

    def expert_bytes(self, b: Batch) -> int:
        """Both GEMMs' weights of the experts the batch reaches."""
        return self.gate_up_bytes(b) * 3 // 2

    def gemm(self, b: Batch, tile: Tile, down: bool = False) -> Callable[[], None]:
        """One grouped GEMM of the batch with the tile (its own alignment)."""
        from tessera.hal.cuda import moe

        torch, s = self.torch, self.shape
        align = moe.align_by_expert(b.ids, s.experts, tile[0])
        _, bn, bk, warps, stages = tile
        pairs = b.x.shape[0] * s.top_k
        kw = {"block_n": bn, "block_k": bk, "num_warps": warps, "num_stages": stages}
        if not down:
            out = torch.empty(pairs, 2 * s.inter, dtype=self.dtype, device=self.dev)
            return lambda: moe.grouped_gemm(b.x, self.w.w13, out, align, s.top_k,
                                            a_row_is_token=True, **kw)
        act = self.randn(pairs, s.inter).to(self.dtype)
        out = torch.zeros(pairs, s.hidden, dtype=torch.float32, device=self.dev)
        w = b.weights.reshape(-1).float().contiguous()
        return lambda: moe.grouped_gemm(act, self.w.w2, out, align, s.top_k,
                                        a_row_is_token=False, weights=w, **kw)

    def tiles(self, b: Batch) -> Tiles:
        """The tiles fused_moe takes for the batch (its first call of a shape bucket measures
        them on a GPU; the look-ups here find them kept) and the untuned heuristic's."""
        from tessera.hal.cuda import moe_tune

        s, tokens = self.shape, b.x.shape[0]
        b.fused_moe(self.w)
        gate_up = moe_tune.gate_up_tile(b.x, s.experts, 2 * s.inter, s.top_k,
                                        lambda t: self.gemm(b, t)())
        down = moe_tune.down_tile(b.x, s.experts, s.hidden, s.inter, s.top_k, gate_up[0],
                                  lambda t: self.gemm(b, t, down=True)())
        first = moe_tune.candidates(tokens, 2 * s.inter, s.hidden, self.dtype)[0]
        first_down = moe_tune.candidates(tokens, s.hidden, s.inter, self.dtype, first[0])[0]
        return Tiles(gate_up, down, first, first_down)


def versus_dense(bench: Bench, b: Batch, tiles: Tiles) -> dict[str, Any]:
    """The batch's gate/up GEMM and fused_moe against dense GEMMs of the same FLOPs."""

    shape = bench.shape.at(b.x.shape[0])
    pairs_x = b.x.repeat_interleave(shape.top_k, dim=0)
    dense_w13 = bench.w.w13[0].t().contiguous()  # [H, 2I]
    dense_w2 = bench.w.w2[0].t().contiguous()  # [I, H]
    act = bench.randn(pairs_x.shape[0], shape.inter).to(bench.dtype)
    grouped_ms = bench.time(bench.gemm(b, tiles.gate_up))
    dense_ms = bench.time(lambda: pairs_x @ dense_w13)
    fused_ms = bench.time(lambda: b.fused_moe(bench.w))
    dense_pair_ms = bench.time(lambda: (pairs_x @ dense_w13, act @ dense_w2))
    return {
        "grouped_gemm_ms": grouped_ms, "grouped_gemm_tflops": tflops(shape.gate_up_flops,
                                                                     grouped_ms),
        "dense_gemm_ms": dense_ms, "dense_gemm_tflops": tflops(shape.gate_up_flops, dense_ms),
        "moe_gemm_fraction_of_dense": dense_ms / grouped_ms,
        "fused_moe_ms": fused_ms, "fused_moe_tflops": tflops(shape.moe_flops, fused_ms),
        "dense_two_gemms_ms": dense_pair_ms,
        "fused_moe_fraction_of_dense": dense_pair_ms / fused_ms,
    }


def hbm_view(bench: Bench, b: Batch, grouped_ms: float, fused_ms: float,
             bandwidth_gbps: float) -> dict[str, Any]:
    """Bytes of expert weights the GEMMs must read (every expert a pair reaches) over time."""
    gemm_bytes, all_bytes = bench.gate_up_bytes(b), bench.expert_bytes(b)
    return {"active_experts": b.active_experts,
            "grouped_gemm_weight_bytes": gemm_bytes,
            "grouped_gemm_gbps": gbps(gemm_bytes, grouped_ms),
            "grouped_gemm_hbm_fraction": gbps(gemm_bytes, grouped_ms) / bandwidth_gbps,
            "fused_moe_weight_bytes": all_bytes,
            "fused_moe_gbps": gbps(all_bytes, fused_ms),
            "fused_moe_hbm_fraction": gbps(all_bytes, fused_ms) / bandwidth_gbps}


def candidate_rows(bench: Bench, b: Batch, tiles: list[Tile], nbytes: int,
                   bandwidth_gbps: float, down: bool = False) -> list[dict[str, Any]]:
    """Each tile's time on one GEMM of the batch, and its GB/s of the weights it reads."""
    rows: list[dict[str, Any]] = []
    for tile in tiles:
        try:
            ms = bench.time(bench.gemm(b, tile, down))
        except Exception as exc:  # noqa: BLE001 - a tile the device refuses (shared memory,
            # registers) is a finding of the sweep, not the end of B11
            rows.append({"config": list(tile), "error": f"{type(exc).__name__}: {exc}"[:300]})
            continue
        rows.append({"config": list(tile), "ms": ms, "gbps": gbps(nbytes, ms),
                     "hbm_fraction": gbps(nbytes, ms) / bandwidth_gbps})
    return rows


def decode(bench: Bench, tokens: int, bandwidth_gbps: float) -> dict[str, Any]:
    """fused_moe at a decode batch, tuned and untuned, and every candidate of both GEMMs."""
    from tessera.hal.cuda import moe, moe_tune

    s, b = bench.shape, bench.batch(tokens)
    tiles = bench.tiles(b)
    nbytes = bench.expert_bytes(b)
    untuned = moe.MoETiles(tiles.untuned_gate_up, tiles.untuned_down)
    tuned_ms = bench.time(lambda: b.fused_moe(bench.w))
    untuned_ms = bench.time(lambda: b.fused_moe(bench.w, untuned))
    gate_up = moe_tune.candidates(tokens, 2 * s.inter, s.hidden, bench.dtype)
    down = moe_tune.candidates(tokens, s.hidden, s.inter, bench.dtype, tiles.gate_up[0])
    return {
        "tokens": tokens, "active_experts": b.active_experts, "weight_bytes": nbytes,
        "fused_moe_ms": tuned_ms, "fused_moe_gbps": gbps(nbytes, tuned_ms),
        "fused_moe_hbm_fraction": gbps(nbytes, tuned_ms) / bandwidth_gbps,
        "untuned_fused_moe_ms": untuned_ms, "untuned_fused_moe_gbps": gbps(nbytes, untuned_ms),
        "untuned_fused_moe_hbm_fraction": gbps(nbytes, untuned_ms) / bandwidth_gbps,
        "gate_up_tile": list(tiles.gate_up), "down_tile": list(tiles.down),
        "gate_up_candidates": candidate_rows(bench, b, gate_up, bench.gate_up_bytes(b),
                                             bandwidth_gbps),
        "down_candidates": candidate_rows(bench, b, down, nbytes - bench.gate_up_bytes(b),
                                          bandwidth_gbps, down=True),
    }


def measure(shape: MoEShape, iters: int, warmup: int, sweep: bool,
            bandwidth_gbps: float | None = None, compute_tokens: int = 0,
            decode_tokens: tuple[int, ...] = ()) -> dict[str, Any]:
    from tessera.benchmarks.device_probe import measure_bandwidth_gbps
    from tessera.hal.cpu.moe import fused_moe as reference
    from tessera.hal.cuda import moe_tune

    bench = Bench(shape, iters, warmup)
    figures: dict[str, Any] = {"bandwidth_gbps": bandwidth_gbps,
                               "bandwidth_source": "given"}
    if bandwidth_gbps is None:
        figures["bandwidth_gbps"] = bandwidth_gbps = measure_bandwidth_gbps(str(bench.dev))
        figures["bandwidth_source"] = "measured"
    b = bench.main
    tiles = bench.tiles(b)
    figures.update(versus_dense(bench, b, tiles))
    figures["untuned_grouped_gemm_ms"] = bench.time(bench.gemm(b, tiles.untuned_gate_up))
    figures["block_sizes"] = dict(zip(("block_m", "block_n", "block_k", "num_warps",
                                       "num_stages"), tiles.gate_up, strict=True))
    figures["tiles"] = {"gate_up": list(tiles.gate_up), "down": list(tiles.down)}
    figures.update(hbm_view(bench, b, figures["grouped_gemm_ms"], figures["fused_moe_ms"],
                            bandwidth_gbps))
    # The op is right at this shape too: its output against the reference, in fp32.
    x, w13, w2 = b.x, bench.w.w13, bench.w.w2
    got = b.fused_moe(bench.w).float()
    want = reference(x[:32].float(), w13.float(), w2.float(), b.weights[:32], b.ids[:32])
    figures["fused_moe_rel_err_first32"] = float((got[:32] - want).norm() / want.norm())
    if sweep:
        cands = moe_tune.candidates(shape.tokens, 2 * shape.inter, shape.hidden, bench.dtype)
        figures["sweep"] = candidate_rows(bench, b, cands, bench.gate_up_bytes(b),
                                          bandwidth_gbps)
        for row in figures["sweep"]:
            if "ms" in row:
                row["tflops"] = tflops(shape.gate_up_flops, row["ms"])
                row["fraction_of_dense"] = figures["dense_gemm_ms"] / row["ms"]
        ran = [r for r in figures["sweep"] if "fraction_of_dense" in r]
        if ran:
            best = max(ran, key=lambda r: r["fraction_of_dense"])
            figures["best_swept_fraction_of_dense"] = best["fraction_of_dense"]
            figures["best_swept_config"] = best["config"]
    if compute_tokens:
        cb = bench.batch(compute_tokens)
        ctiles = bench.tiles(cb)
        compute = versus_dense(bench, cb, ctiles)
        compute["compute_bound_fraction_of_dense"] = compute.pop("moe_gemm_fraction_of_dense")
        figures.update({"compute_tokens": compute_tokens,
                        "compute_tiles": {"gate_up": list(ctiles.gate_up),
                                          "down": list(ctiles.down)},
                        **{k if k.startswith("compute") else f"compute_{k}": v
                           for k, v in compute.items()}})
    if decode_tokens:
        figures["decode"] = [decode(bench, t, bandwidth_gbps) for t in decode_tokens]
        for d in figures["decode"]:
            for name in ("fused_moe_ms", "fused_moe_hbm_fraction", "untuned_fused_moe_ms",
                         "untuned_fused_moe_hbm_fraction"):
                figures[f"decode{d['tokens']}_{name}"] = d[name]
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
    p.add_argument("--sweep", action="store_true",
                   help="also time every moe_tune candidate of the gate/up GEMM at --tokens")
    p.add_argument("--bandwidth-gbps", type=float,
                   help="HBM bandwidth for the *_hbm_fraction figures (else a copy measured)")
    p.add_argument("--compute-tokens", type=int, default=8192,
                   help="a compute-bound batch for the grouped-vs-dense comparison (0: none)")
    p.add_argument("--decode-tokens", default="1,16",
                   help="decode batches timed with every candidate tile (comma list; '': none)")
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
    decode_tokens = tuple(int(t) for t in args.decode_tokens.split(",") if t.strip())
    if args.compute_tokens < 0 or any(t <= 0 for t in decode_tokens):
        p.error("--compute-tokens must be >= 0 and --decode-tokens positive")
    figures = measure(shape, args.iters, args.warmup, args.sweep, args.bandwidth_gbps,
                      args.compute_tokens, decode_tokens)
    print(f"[bench] MoE grouped GEMM {figures['grouped_gemm_tflops']:.0f} TFLOP/s vs dense "
          f"{figures['dense_gemm_tflops']:.0f} ({figures['moe_gemm_fraction_of_dense']:.2f}), "
          f"{figures['grouped_gemm_gbps']:.0f} GB/s of expert weights "
          f"({figures['grouped_gemm_hbm_fraction']:.2f} of {figures['bandwidth_gbps']:.0f})",
          file=sys.stderr)
    if "compute_bound_fraction_of_dense" in figures:
        print(f"[bench] at {args.compute_tokens} tokens: grouped "
              f"{figures['compute_grouped_gemm_tflops']:.0f} TFLOP/s vs dense "
              f"{figures['compute_dense_gemm_tflops']:.0f} "
              f"({figures['compute_bound_fraction_of_dense']:.2f})", file=sys.stderr)
    for d in figures.get("decode", []):
        print(f"[bench] decode {d['tokens']} tokens: fused_moe {d['fused_moe_ms']:.3f} ms "
              f"({d['fused_moe_hbm_fraction']:.2f} of HBM), untuned "
              f"{d['untuned_fused_moe_ms']:.3f} ms; tiles {d['gate_up_tile']} {d['down_tile']}",
              file=sys.stderr)
    result = new_result("B11", {**vars(args), "shape": vars(shape)}, device=None)
    result["figures"] = figures
    path = write_result(result, args.out_dir, args.name, required=False)
    print(f"[bench] wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
