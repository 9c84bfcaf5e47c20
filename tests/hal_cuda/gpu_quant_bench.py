"""Quantized linears on the GPU at the Llama-3-8B shapes: time, weight bandwidth and error of
bf16 (cuBLAS / the tuned GEMV), fp8 and int4 (group 128) at batch 1, 16, 64 and 256, each timed
inside CUDA graphs over rotating weight copies (so L2 does not hold them); then every batch-1
GEMV candidate of quant_tune (tile sizes and formulations) for fp8 and int4 at each shape, with
the one the tuner picks (those first; OUT.json is rewritten after every shape, so a run cut
off at its time limit keeps what it measured); then every several-token candidate of fp8 and
int4 for gate_up and down at batch 16, 64 and 256 (OUT.json["gemm_candidates"]). Not a
pytest module.

    python3 tests/hal_cuda/gpu_quant_bench.py OUT.json          # on the GPU, a few minutes
    QUANT_INT4_GROUP=row ... (int4 with one scale a row instead of groups of 128)
    QUANT_PARTS=w8a8 ...     (only every fp8 candidate of 64-256 tokens at the four shapes,
                              beside bf16: w8a8_sweep)
    python3 tests/hal_cuda/gpu_quant_bench.py OUT.json --cpu    # dry run: tiny shapes, Triton's
                                                                # interpreter (TRITON_INTERPRET=1)

The per-layer sum of the four linears x 32 (+ the bf16 LM head) is the step's linear time: the
number to hold against B12's targets (fp8 <= 2.3 ms, int4 <= 1.5 ms at batch 1).
OUT.json["gemv_candidates"][scheme][shape]: {"candidates": [{config, variant, us, GBps,
rel_err_vs_definition} or {config, error}], "fastest", "tuner_pick"}, "weight_bytes"}.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096),
          "down": (4096, 14336)}
BATCHES = (1, 16, 64, 256)
# the dry run: the same four linears, tiny (int4 groups of 128 still divide every width)
CPU_SHAPES = {"qkv": (48, 256), "o": (32, 256), "gate_up": (96, 256), "down": (32, 512)}
CPU_BATCHES = (1, 3)
GEMV_SCHEMES = ("fp8", "int4")
# QUANT_GEMV_WIDE=1: batch-1 tiles beyond the tuner's lists, measured beside them (which
# tiles the lists should hold); int4's BLOCK_K holds whole groups of 128
WIDE_GEMV: dict[str, list[tuple[int, int, int, int]]] = {
    "fp8": [(bn, bk, nw, v) for bn in (1, 2, 4, 8)
            for bk, nw in ((1024, 4), (2048, 8), (4096, 8), (512, 2), (2048, 4))
            for v in (0, 16, 20)],
    "int4": [(bn, bk, nw, v) for bn in (4, 8, 16)
             for bk, nw in ((1024, 4), (2048, 8), (4096, 8), (1024, 8), (2048, 4))
             for v in (0, 1, 2, 3)],
}

Timer = Callable[[Callable[[Any], torch.Tensor], list[Any]], float]


def _group(scheme: str, n_in: int) -> int | None:
    """The group size the sweeps quantize a scheme with: the scheme's default (None; int4's
    is 128, AWQ / GPTQ's), or for int4 one scale a row with QUANT_INT4_GROUP=row (how much
    the groups' scales and offsets cost)."""
    row = scheme == "int4" and os.environ.get("QUANT_INT4_GROUP") == "row"
    return n_in if row else None


@dataclass
class Setup:
    dev: torch.device
    dtype: torch.dtype
    shapes: dict[str, tuple[int, int]]
    batches: tuple[int, ...]
    lm_head: tuple[int, int]
    timer: Timer


def _graph_timer(call: Callable[[Any], torch.Tensor], weights: list[Any]) -> float:
    here = str(Path(__file__).resolve().parent)
    if here not in sys.path:
        sys.path.insert(0, here)
    from gpu_bench import graph_time_us

    t = [0]

    def run() -> torch.Tensor:
        t[0] += 1
        return call(weights[t[0] % len(weights)])
    return graph_time_us(run, reps=len(weights) * 4)


def _cpu_timer(call: Callable[[Any], torch.Tensor], weights: list[Any]) -> float:
    call(weights[0])
    t0 = time.perf_counter()
    for w in weights:
        call(w)
    return (time.perf_counter() - t0) * 1e6 / len(weights)


def _rel_err(out: torch.Tensor, x: torch.Tensor, w: Any) -> float:
    from tessera.hal.quant import quant_linear_reference

    ref = quant_linear_reference(x.float(), w)
    return float((out.float() - ref).norm() / ref.norm())


def gemv_candidates(setup: Setup, scheme: str, n_out: int, n_in: int) -> dict[str, Any]:
    """Every batch-1 GEMV candidate the tuner would measure for this weight, timed the same
    way as the linears (graphs, rotating copies), and what quant_tune.gemv_config picks (its
    own do_bench measurement: on the GPU it should agree with the fastest here)."""
    from tessera.hal.cuda import quant_kernels, quant_linear, quant_tune
    from tessera.hal.quant import quantize

    dense = [torch.randn((n_out, n_in), device=setup.dev, dtype=setup.dtype) * 0.02
             for _ in range(3)]
    packed = [quant_linear.prepare(quantize(w, scheme, _group(scheme, n_in))) for w in dense]
    del dense
    x = torch.randn((1, n_in), device=setup.dev, dtype=setup.dtype)
    nbytes = packed[0].nbytes
    rows: list[dict[str, Any]] = []
    cands = quant_tune.gemv_candidates(packed[0])
    if os.environ.get("QUANT_GEMV_WIDE") == "1":  # and a grid of tiles the tuner does not list
        cands += [c for c in WIDE_GEMV[scheme] if c not in cands]
    for cand in cands:
        variant = cand[3]
        name = "+".join(n for n, flag in (("column", quant_kernels.GEMV_COLUMN),
                                          ("exp_cvt", quant_kernels.GEMV_EXP_CVT),
                                          ("x_vec", quant_kernels.GEMV_X_VEC),
                                          ("acc", quant_kernels.GEMV_ACC),
                                          ("dot", quant_kernels.GEMV_DOT),
                                          ("stages2", quant_kernels.GEMV_STAGES2),
                                          ("stages3", quant_kernels.GEMV_STAGES3),
                                          ("native", quant_kernels.GEMV_NATIVE),
                                          ("mma", quant_kernels.GEMV_MMA ^
                                           quant_kernels.GEMV_NATIVE))
                        if variant & flag) or "tile"
        row: dict[str, Any] = {"config": list(cand), "variant": name}
        try:  # through one_token, as the tuner runs them (GEMV_DOT: qgemm's tile)
            err = _rel_err(quant_tune.one_token(x, packed[0], None, cand), x, packed[0])
            us = setup.timer(lambda w, c=cand: quant_tune.one_token(x, w, None, c), packed)
            row.update(us=us, GBps=nbytes / (us * 1e-6) / 1e9, rel_err_vs_definition=err)
        except Exception as e:  # noqa: BLE001 - a candidate the compiler refuses is reported
            row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
        rows.append(row)
    timed = [r for r in rows if "us" in r]
    fastest = min(timed, key=lambda r: r["us"])["config"] if timed else None
    pick = list(quant_tune.gemv_config(packed[0], x, None))
    del packed
    return {"weight_bytes": nbytes, "candidates": rows, "fastest": fastest,
            "tuner_pick": pick}


def gemm_candidates(setup: Setup, scheme: str, n_out: int, n_in: int, batch: int
                    ) -> dict[str, Any]:
    """Every several-token candidate the tuner would measure for this weight and batch (int4:
    the "halves" tiles; fp8: W8A16 and W8A8 tiles and cuBLASLt), timed like the linears, with
    the tuner's own pick."""
    from tessera.hal.cuda import quant_linear, quant_tune
    from tessera.hal.quant import quantize

    dense = [torch.randn((n_out, n_in), device=setup.dev, dtype=setup.dtype) * 0.02
             for _ in range(3)]
    packed = [quant_linear.prepare(quantize(w, scheme, _group(scheme, n_in))) for w in dense]
    del dense
    x = torch.randn((batch, n_in), device=setup.dev, dtype=setup.dtype)
    bucket = quant_tune.batch_bucket(batch)
    if scheme == "fp8":
        cands = quant_tune.W8A8_CANDIDATES[bucket]

        def run(w: Any, c: tuple[int, ...]) -> torch.Tensor:
            return quant_tune.run_fp8(x, w, None, c)
    else:
        cands = quant_tune.INT4_GEMM_CANDIDATES[bucket]

        def run(w: Any, c: tuple[int, ...]) -> torch.Tensor:
            return quant_tune.run_gemm(x, w, None, c)
    rows: list[dict[str, Any]] = []
    for cand in cands:
        row: dict[str, Any] = {"config": list(cand)}
        try:
            err = _rel_err(run(packed[0], cand), x, packed[0])
            us = setup.timer(lambda w, c=cand: run(w, c), packed)
            row.update(us=us, TBps=packed[0].nbytes / (us * 1e-6) / 1e12,
                       TFLOPs=2 * batch * n_out * n_in / (us * 1e-6) / 1e12,
                       rel_err_vs_definition=err)
        except Exception as e:  # noqa: BLE001 - a candidate the compiler refuses is reported
            row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
        rows.append(row)
    timed = [r for r in rows if "us" in r]
    fastest = min(timed, key=lambda r: r["us"])["config"] if timed else None
    pick = list(quant_tune.fp8_config(packed[0], x, None) if scheme == "fp8"
                else quant_tune.gemm_config(packed[0], x, None))
    return {"candidates": rows, "fastest": fastest, "tuner_pick": pick}


W8A8_BATCHES = (64, 128, 256)


def w8a8_sweep(setup: Setup, res: dict[str, Any], save: Callable[[], None]) -> None:
    """QUANT_PARTS=w8a8: every fp8 candidate of several tokens (W8A16, W8A8 tiles, K splits,
    cuBLASLt) at each of the four shapes and 64, 128 and 256 tokens, beside bf16's library
    GEMM on the same shape, into res["w8a8"]["<shape> b<batch>"]; and per batch the step's
    linears (32 layers, no LM head) at the tuner's picks against bf16's, res["w8a8_step"]."""
    import torch.nn.functional as F

    res["w8a8"], res["w8a8_step"] = {}, {}
    batches = W8A8_BATCHES if setup.dev.type == "cuda" else (3,)
    for batch in batches:
        step = {"bf16_ms": 0.0, "fp8_pick_ms": 0.0, "fp8_fastest_ms": 0.0}
        for name, (n_out, n_in) in setup.shapes.items():
            r = gemm_candidates(setup, "fp8", n_out, n_in, batch)
            dense = [torch.randn((n_out, n_in), device=setup.dev, dtype=setup.dtype) * 0.02
                     for _ in range(3)]
            x = torch.randn((batch, n_in), device=setup.dev, dtype=setup.dtype)
            r["bf16_us"] = setup.timer(lambda w, x=x: F.linear(x, w), dense)
            del dense
            timed = {tuple(c["config"]): c["us"] for c in r["candidates"] if "us" in c}
            pick_us = timed.get(tuple(r["tuner_pick"]), float("nan"))
            step["bf16_ms"] += 32 * r["bf16_us"] / 1e3
            step["fp8_pick_ms"] += 32 * pick_us / 1e3
            step["fp8_fastest_ms"] += 32 * min(timed.values(), default=float("nan")) / 1e3
            res["w8a8"][f"{name} b{batch}"] = r
            save()
            print(f"w8a8 {name} b{batch}: bf16 {r['bf16_us']:.1f} us; " + ", ".join(
                f"{c['config']} {c['us']:.1f}" if "us" in c else f"{c['config']} error"
                for c in r["candidates"]) + f"; pick {r['tuner_pick']}",
                file=sys.stderr, flush=True)
        res["w8a8_step"][f"b{batch}"] = step
        save()
        print(f"w8a8 step linears b{batch}: {step}", file=sys.stderr, flush=True)


def linears(setup: Setup, platform: Any, res: dict[str, Any],
            save: Callable[[], None]) -> None:
    """Every scheme through the plugin's linear op at each batch, into res["b<batch>"]."""
    from tessera.hal.quant import quantize

    linear = platform.op("linear")
    for batch in setup.batches:
        per: dict[str, Any] = {}
        totals = {"bf16": 0.0, "fp8": 0.0, "int4": 0.0}
        for name, (n_out, n_in) in setup.shapes.items():
            dense = [torch.randn((n_out, n_in), device=setup.dev, dtype=setup.dtype) * 0.02
                     for _ in range(3)]
            x = torch.randn((batch, n_in), device=setup.dev, dtype=setup.dtype)
            row: dict[str, Any] = {}
            us = setup.timer(lambda w, x=x: linear(x, w, None), dense)
            row["bf16"] = {"us": us, "TBps": n_out * n_in * 2 / (us * 1e-6) / 1e12}
            totals["bf16"] += us
            for scheme in ("fp8", "int4"):
                kernel = platform.linear_kernel(scheme)
                packed = [kernel.prepare(quantize(w, scheme)) for w in dense]
                err = _rel_err(kernel(x, packed[0]), x, packed[0])
                us = setup.timer(lambda w, x=x, k=kernel: k(x, w), packed)
                row[scheme] = {"us": us, "TBps": packed[0].nbytes / (us * 1e-6) / 1e12,
                               "rel_err_vs_definition": err, "bytes": packed[0].nbytes}
                totals[scheme] += us
                del packed
            per[name] = row
            del dense
            print(f"b{batch} {name}: " + ", ".join(
                f"{k} {v['us']:.1f} us ({v['TBps']:.2f} TB/s)" for k, v in row.items()),
                file=sys.stderr, flush=True)
        lm_head = torch.randn(setup.lm_head, device=setup.dev, dtype=setup.dtype) * 0.02
        x = torch.randn((batch, setup.lm_head[1]), device=setup.dev, dtype=setup.dtype)
        head_us = setup.timer(lambda w, x=x: linear(x, w, None), [lm_head, lm_head.clone()])
        per["step_linears_ms"] = {k: (32 * v + head_us) / 1e3 for k, v in totals.items()}
        per["lm_head_bf16_us"] = head_us
        res[f"b{batch}"] = per
        save()
        print(f"b{batch}: 32 layers of linears + bf16 lm_head, ms: {per['step_linears_ms']}",
              file=sys.stderr, flush=True)
        del lm_head


def main(argv: list[str]) -> int:
    out = Path(argv[0])
    if "--cpu" in argv:
        os.environ["TRITON_INTERPRET"] = "1"  # before triton is first imported
        setup = Setup(torch.device("cpu"), torch.float32, CPU_SHAPES, CPU_BATCHES,
                      (512, 256), _cpu_timer)
        device = "cpu (dry run, Triton interpreter)"
    else:
        setup = Setup(torch.device("cuda"), torch.bfloat16, SHAPES, BATCHES, (128256, 4096),
                      _graph_timer)
        device = torch.cuda.get_device_name()
    from tessera.hal.cuda import CudaPlatform, autotune

    # the commit measured (the device copy's git metadata is stale: gpu_session.sh sets it)
    res: dict[str, Any] = {"commit": os.environ.get("TESSERA_COMMIT"), "device": device,
                           "gemv_candidates": {}}
    out.parent.mkdir(parents=True, exist_ok=True)

    def save() -> None:  # after every piece: a run cut off at its time limit keeps the rest
        res["tuned"] = {str(k): list(v) for k, v in autotune.chosen.items()}
        out.write_text(json.dumps(res, indent=1) + "\n")

    if os.environ.get("QUANT_PARTS") == "w8a8":
        w8a8_sweep(setup, res, save)
        save()
        return 0
    # the candidates first: which formulation wins is what this run is for
    for scheme in GEMV_SCHEMES:
        per_shape: dict[str, Any] = {}
        res["gemv_candidates"][scheme] = per_shape
        for name, (n_out, n_in) in setup.shapes.items():
            per_shape[name] = r = gemv_candidates(setup, scheme, n_out, n_in)
            save()
            best = min((c for c in r["candidates"] if "us" in c), key=lambda c: c["us"],
                       default=None)
            print(f"gemv {scheme} {name}: {len(r['candidates'])} candidates, fastest "
                  f"{r['fastest']} {best['us'] if best else float('nan'):.1f} us "
                  f"({best['GBps'] if best else float('nan'):.0f} GB/s), tuner picks "
                  f"{r['tuner_pick']}", file=sys.stderr, flush=True)
    # the several-token candidates of the two largest linears (QUANT_GEMM_SWEEP=0: none)
    res["gemm_candidates"] = {}
    sweep = [] if os.environ.get("QUANT_GEMM_SWEEP") == "0" else setup.batches[1:]
    for batch in sweep:
        for scheme in GEMV_SCHEMES:
            for name in ("gate_up", "down"):
                n_out, n_in = setup.shapes[name]
                r = gemm_candidates(setup, scheme, n_out, n_in, batch)
                res["gemm_candidates"][f"{scheme} {name} b{batch}"] = r
                save()
                best = min((c for c in r["candidates"] if "us" in c), key=lambda c: c["us"],
                           default=None)
                print(f"gemm {scheme} {name} b{batch}: fastest {r['fastest']} "
                      f"{best['us'] if best else float('nan'):.1f} us, tuner picks "
                      f"{r['tuner_pick']}", file=sys.stderr, flush=True)
    linears(setup, CudaPlatform(), res, save)
    save()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
