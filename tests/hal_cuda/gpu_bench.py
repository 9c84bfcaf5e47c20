"""Measuring parts of the GPU run (tests/hal_cuda/gpu_run.py): ops and linears timed inside
CUDA graphs, the GEMV sweep, the decode-attention micro-benchmark, the B1 smoke figure."""

from __future__ import annotations

import contextlib
import json
import re
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch
from gpu_engine import PAGE, ROOT, MiniEngine, random_model

from tessera.formats.config import ModelConfig
from tessera.worker_proc.forward_inputs import ForwardInputs


def graph_time_us(fn: Callable[[], Any], reps: int = 20, iters: int = 10) -> float:
    """GPU microseconds per call of fn: `reps` calls captured in one CUDA graph, replayed
    `iters` times (no launch gaps, unlike timing eager calls of microsecond kernels)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
        fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(reps):
            fn()
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3 / (iters * reps)


def op_timings() -> dict[str, Any]:
    """Each op of one Llama-3-8B decode layer at batch 1 and 64, timed inside graphs; the
    linears rotate over copies of their weight so that L2 does not hold it."""
    import torch.nn.functional as F

    from tessera.hal.cuda import CudaPlatform
    from tessera.hal.rope import cos_sin_cache

    op = CudaPlatform().op
    dev, dt, h, inter, hq, hk, d = torch.device("cuda"), torch.bfloat16, 4096, 14336, 32, 8, 128
    res: dict[str, Any] = {}
    table = cos_sin_cache(d, 8192, 500000.0, None, dev, dt)
    for batch in (1, 64):
        r: dict[str, float] = {}
        x = torch.randn((batch, h), device=dev, dtype=dt)
        w = torch.ones(h, device=dev, dtype=dt)
        r["rms_norm"] = graph_time_us(lambda: op("rms_norm")(x, w, 1e-5))  # noqa: B023
        r["fused_add_rms_norm"] = graph_time_us(
            lambda: op("fused_add_rms_norm")(x, x, w, 1e-5))  # noqa: B023
        qkv = torch.randn((batch, (hq + 2 * hk) * d), device=dev, dtype=dt)
        q = qkv[:, :hq * d].view(batch, hq, d)
        k = qkv[:, hq * d:(hq + hk) * d].view(batch, hk, d)
        pos = torch.full((batch,), 600, device=dev, dtype=torch.int64)
        r["rotary_embedding"] = graph_time_us(
            lambda: op("rotary_embedding")(pos, q, k, table))  # noqa: B023
        cache = torch.zeros((70000, hk, d), device=dev, dtype=dt)
        slots = torch.arange(batch, device=dev) * 1000 + 17
        r["store_kv"] = graph_time_us(
            lambda: op("store_kv")(cache, cache, k, k, slots))  # noqa: B023
        gu = torch.randn((batch, 2 * inter), device=dev, dtype=dt)
        r["silu_and_mul"] = graph_time_us(lambda: op("silu_and_mul")(gu))  # noqa: B023
        rtt = torch.arange(batch * 1024, device=dev, dtype=torch.int32).view(batch, 1024)
        lens = torch.full((batch,), 600, device=dev, dtype=torch.int32)
        qd = torch.randn((batch, hq, d), device=dev, dtype=dt)
        r["attention_decode_s600"] = graph_time_us(
            lambda: op("attention_decode")(qd, cache, cache, rtt, lens, d ** -0.5))  # noqa: B023
        for name, (n_out, n_in) in {"qkv": ((hq + 2 * hk) * d, h), "o": (h, hq * d),
                                    "gate_up": (2 * inter, h), "down": (h, inter),
                                    "lm_head": (128256, h)}.items():
            copies = [torch.randn((n_out, n_in), device=dev, dtype=dt) * 0.02
                      for _ in range(2 if name == "lm_head" else 4)]
            xin = torch.randn((batch, n_in), device=dev, dtype=dt)
            t = [0]

            def gemm(copies: list[torch.Tensor] = copies, xin: torch.Tensor = xin,
                     t: list[int] = t) -> torch.Tensor:
                t[0] += 1
                return F.linear(xin, copies[t[0] % len(copies)])

            us = graph_time_us(gemm, reps=len(copies) * 4)
            r[f"linear_{name}"] = us
            r[f"linear_{name}_TBps"] = n_out * n_in * 2 / (us * 1e-6) / 1e12
            del copies
        layer_ops = ("rms_norm", "fused_add_rms_norm", "rotary_embedding", "store_kv",
                     "silu_and_mul", "attention_decode_s600", "linear_qkv", "linear_o",
                     "linear_gate_up", "linear_down")
        per_layer = sum(r[k] for k in layer_ops) + r["fused_add_rms_norm"]
        r["sum_per_layer_us"] = per_layer
        r["linears_per_layer_us"] = sum(r[k] for k in layer_ops if k.startswith("linear"))
        r["estimated_step_ms"] = (32 * per_layer + r["linear_lm_head"]) / 1e3
        res[f"b{batch}"] = r
    return res


def gemv_sweep() -> dict[str, Any]:
    """The one-token GEMV against cuBLAS on the Llama-3-8B linears (bf16, inside graphs,
    weights rotated so L2 does not hold them); the winners go into gemv.TUNED for the rest of
    the run (b1_smoke then uses them)."""
    import torch.nn.functional as F

    from tessera.hal.cuda import gemv

    dev, dt = torch.device("cuda"), torch.bfloat16
    shapes = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096),
              "down": (4096, 14336), "lm_head": (128256, 4096)}
    gemv.TUNED.clear()  # measure every shape afresh
    configs = [(bn, bk, nw) for bn in (1, 2, 4, 8)
               for bk, nw in ((1024, 4), (2048, 8), (4096, 8), (4096, 16))]
    res: dict[str, Any] = {}
    for name, (n_out, n_in) in shapes.items():
        copies = [torch.randn((n_out, n_in), device=dev, dtype=dt) * 0.02
                  for _ in range(2 if name == "lm_head" else 4)]
        x = torch.randn((1, n_in), device=dev, dtype=dt)
        nbytes = n_out * n_in * 2

        def timed(fn: Callable[[torch.Tensor], torch.Tensor], copies: list[torch.Tensor] = copies
                  ) -> float:
            t = [0]

            def call() -> torch.Tensor:
                t[0] += 1
                return fn(copies[t[0] % len(copies)])
            return graph_time_us(call, reps=len(copies) * 4)

        row: dict[str, Any] = {"cublas_us": timed(lambda w: F.linear(x, w))}  # noqa: B023
        ref = F.linear(x.float(), copies[0].float())
        best = None
        for bn, bk, nw in configs:
            key = f"bn{bn}_bk{bk}_w{nw}"
            try:
                out = gemv.gemv(x, copies[0], None, bn, bk, nw).float()
                err = float((out - ref).norm() / ref.norm())
                us = timed(lambda w, bn=bn, bk=bk, nw=nw: gemv.gemv(x, w, None, bn, bk, nw))  # noqa: B023
                row[key] = {"us": us, "TBps": nbytes / (us * 1e-6) / 1e12, "rel_err": err}
                if err < 1e-2 and (best is None or us < best[0]):
                    best = (us, (bn, bk, nw))
            except Exception as exc:
                row[key] = {"error": repr(exc)[:300]}
        row["cublas_TBps"] = nbytes / (row["cublas_us"] * 1e-6) / 1e12
        if best is not None and best[0] < 0.97 * row["cublas_us"]:
            gemv.TUNED[(n_out, n_in)] = best[1]
            row["chosen"] = list(best[1])
            row["chosen_us"] = best[0]
        res[name] = row
    res["tuned"] = {f"{k[0]}x{k[1]}": list(v) for k, v in gemv.TUNED.items()}
    return res


@contextlib.contextmanager
def _attention_tunables(da: Any, cache: str, tile: tuple[int, ...]) -> Iterator[None]:
    """decode_attention's (BLOCK_N, warps, stages) for this cache ("bf16", "fp8" words,
    "fp8_elements") set to `tile` for the block at every batch size, restored after; a
    fourth element of an fp8 tile is its maxnreg (None: the compiler's choice)."""
    names = ("BLOCK_N", "NUM_WARPS", "NUM_STAGES", "FP8_BLOCK_N", "FP8_NUM_WARPS",
             "FP8_NUM_STAGES", "FP8_MAXNREG", "FP8_AS_WORDS", "FP8_SMALL_TILE")
    saved = {n: getattr(da, n) for n in names}
    da.FP8_AS_WORDS = cache == "fp8"
    if cache == "fp8":
        da.FP8_SMALL_TILE = None  # the tile at every batch
    prefix = "FP8_" if cache == "fp8" else ""
    for name, value in zip(("BLOCK_N", "NUM_WARPS", "NUM_STAGES"), tile[:3], strict=True):
        setattr(da, prefix + name, value)
    if len(tile) > 3:
        if cache != "fp8":
            raise ValueError(f"a maxnreg for the {cache} cache's tile: only fp8's has one")
        da.FP8_MAXNREG = tile[3]
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(da, name, value)


def _paged_decode_case(batch: int, seq: int, hq: int, hk: int, d: int
                       ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(q, k cache, v cache, page table) of `batch` requests of up to `seq` tokens each, bf16,
    their pages scattered over the cache as a pool leaves them (page 0 unused)."""
    per_req = -(-seq // PAGE)  # pages a request holds (its last one partly)
    slots = (batch * per_req + 1) * PAGE
    kc = torch.randn((slots, hk, d), device="cuda", dtype=torch.bfloat16)
    vc = torch.randn_like(kc)
    pages = torch.randperm(slots // PAGE - 1, device="cuda")[:batch * per_req] + 1
    rtt = (pages.view(batch, -1)[:, :, None] * PAGE
           + torch.arange(PAGE, device="cuda")).reshape(batch, per_req * PAGE).int()
    q = torch.randn((batch, hq, d), device="cuda", dtype=torch.bfloat16)
    return q, kc, vc, rtt


def decode_attention_bench() -> dict[str, Any]:
    """Decode attention at Llama-3-8B's heads over a bf16 cache and an e4m3 one (read as words,
    and element by element as before they were: `fp8_elements`), each over its tunables,
    timed inside graphs (20 calls a replay) on pages scattered as a pool leaves them. GB/s
    counts the cache bytes read; the small cases fit in L2 and measure latency."""
    from tessera.hal.cuda import decode_attention as da
    from tessera.hal.reference import reference_op

    hq, hk, d = 32, 8, 128
    cases = [(1, 4096), (32, 1024), (64, 2048), (128, 600), (128, 2048), (256, 600),
             (256, 1024), (128, 4096)]
    configs = {
        "bf16": [(64, 4, 2), (64, 4, 3), (32, 2, 3), (128, 8, 2), (64, 2, 2)],
        "fp8": [(64, 4, 2), (64, 4, 3), (128, 4, 2), (128, 4, 3), (128, 8, 2), (64, 8, 2),
                (32, 4, 3), (64, 2, 2), (32, 2, 3), (128, 8, 3), (64, 2, 3), (128, 2, 2),
                (32, 2, 2)],
        "fp8_elements": [(64, 4, 2), (32, 4, 3)],
    }
    out: dict[str, Any] = {"shape": {"hq": hq, "hk": hk, "head_dim": d, "q": "bfloat16"},
                           "defaults": {"bf16": list(da.tunables(False)),
                                        "fp8": list(da.tunables(True))}, "cases": {}}
    for batch, seq in cases:
        q, kc16, vc16, rtt = _paged_decode_case(batch, seq, hq, hk, d)
        lens = torch.full((batch,), seq, dtype=torch.int32, device="cuda")
        case: dict[str, Any] = {"splits": da.num_splits(batch, hk, q.device)}
        for cache, cfgs in configs.items():
            fp8 = cache != "bf16"
            kc = kc16.to(torch.float8_e4m3fn) if fp8 else kc16
            vc = vc16.to(torch.float8_e4m3fn) if fp8 else vc16
            kv_bytes = 2 * batch * seq * hk * d * kc.element_size()
            row: dict[str, Any] = {"kv_bytes": kv_bytes}
            for bn, nw, ns in cfgs:
                try:
                    with _attention_tunables(da, cache, (bn, nw, ns)):
                        us = graph_time_us(lambda q=q, kc=kc, vc=vc, rtt=rtt, lens=lens:
                                           da.attention_decode(q, kc, vc, rtt, lens, d ** -0.5))
                    row[f"bn{bn}_w{nw}_s{ns}"] = {"us": round(us, 2),
                                                  "GBps": round(kv_bytes / us / 1e3)}
                except Exception as exc:  # a config that does not compile is a result too
                    row[f"bn{bn}_w{nw}_s{ns}"] = {"error": repr(exc)[:300]}
            timed = {k: v["us"] for k, v in row.items() if isinstance(v, dict) and "us" in v}
            if timed:
                row["best"] = min(timed, key=timed.__getitem__)
                # The split count at the best tunables, beside the heuristic's (case["splits"])
                best = tuple(int(x) for x in re.findall(r"\d+", row["best"]))
                by_splits: dict[int, float] = {}
                for n_split in (1, 2, 4, 8, 16):
                    with _attention_tunables(da, cache, best):
                        by_splits[n_split] = round(graph_time_us(
                            lambda q=q, kc=kc, vc=vc, rtt=rtt, lens=lens, n=n_split:
                            da.attention_decode(q, kc, vc, rtt, lens, d ** -0.5, splits=n)), 2)
                row["best_us_by_splits"] = by_splits
            if batch * seq <= 64 * 2048:
                got = da.attention_decode(q, kc, vc, rtt, lens, d ** -0.5).float()
                ext = torch.ones(batch, dtype=torch.int32, device="cuda")
                indptr = torch.arange(batch + 1, dtype=torch.int32, device="cuda")
                ref = reference_op("attention_extend")(q.float(), kc.float(), vc.float(), rtt,
                                                       lens, ext, indptr, d ** -0.5)
                row["rel_err_vs_fp32_reference"] = float((got - ref).norm() / ref.norm())
            case[cache] = row
            del kc, vc
        out["cases"][f"b{batch}_s{seq}"] = case
        log_line = {c: (case[c].get("best"), case[c][case[c]["best"]]["us"],
                        case[c]["best_us_by_splits"]) for c in configs if "best" in case[c]}
        print(f"decode attention b{batch}_s{seq}: {log_line}", flush=True)
        del kc16, vc16
        torch.cuda.empty_cache()
    return out


FP8_ORDER_CASES = ("b2_256", "b2_128", "b3_c128_128", "b2_64", "b2_32")


def _fp8_order_case(da: Any, q: torch.Tensor, kc16: torch.Tensor, vc16: torch.Tensor,
                    table: torch.Tensor, lens: torch.Tensor, kv_bytes: int) -> dict[str, Any]:
    """The same batch (longest first, heads-first grid) over an e4m3 cache read as words, at
    a few tiles; GB/s of fp8 bytes. (Call 51 also timed the scores' dot with the converted
    keys as its first operand, FP8_SWAP_QK at 2fdf9f3: at the default tile within 1% from 128
    requests up, 8% slower at 64 and 7% faster at 32, at the other tiles 30-100% slower; not
    kept.)"""
    kc, vc = kc16.to(torch.float8_e4m3fn), vc16.to(torch.float8_e4m3fn)
    d = q.shape[-1]
    row: dict[str, Any] = {"kv_bytes": kv_bytes}
    for tile in ((64, 2, 3), (64, 4, 3), (128, 4, 2), (128, 8, 2)):
        key = f"bn{tile[0]}_w{tile[1]}_s{tile[2]}"
        try:
            with _attention_tunables(da, "fp8", tile):
                us = graph_time_us(lambda: da.attention_decode(q, kc, vc, table, lens,
                                                               d ** -0.5))
            row[key] = {"us": round(us, 2), "GBps": round(kv_bytes / us / 1e3)}
        except Exception as exc:  # a tile that does not compile is a result too
            row[key] = {"error": repr(exc)[:300]}
    return row


# (BLOCK_N, warps, stages, maxnreg) over fp8 words: the default first, then tiles whose
# sm_90a build (ptxas -v, CUDA 13.0) fits more programs an SM under a register cap: (32, 2, *,
# 128) 128 registers (8 bytes spilled at 3-4 stages, none at 2), 21.6 KB: eight programs, 16
# warps; (16, 2, 4, 128) 125 registers, 12.9 KB; (64, 4, 3, 128) no spill, four programs of
# four warps; (32, 4, 3) 114 registers; (128, 4, 2) the fastest at 32 requests in call 55.
FP8_REG_TILES = ((64, 2, 3, None), (32, 2, 3, None), (32, 2, 3, 128), (32, 2, 2, 128),
                 (32, 2, 4, 128), (16, 2, 4, 128), (16, 2, 3, 128), (32, 4, 3, None),
                 (64, 4, 3, None), (64, 4, 3, 128), (128, 4, 2, None))


def decode_attention_regs_bench() -> dict[str, Any]:
    """Decode attention's stage 1 over the fp8 cache (words) at tiles with a register cap
    (Triton's maxnreg) and without, on B2's and B3's spreads of context (longest first, as
    the scheduler orders them) and one request of 2048, the bf16 cache's default beside them:
    us, GB/s of the cache's bytes, and each tile's largest difference to the default tile's
    output."""
    from tessera.hal.cuda import decode_attention as da

    hq, hk, d = 32, 8, 128
    cases = {"b2_256": (256, 100, 2048), "b2_128": (128, 200, 2048),
             "b3_c128_128": (128, 256, 1536), "b3_c128_89": (89, 256, 1536),
             "b2_64": (64, 400, 2048), "b2_32": (32, 600, 2048), "b3_c32": (32, 256, 1536),
             "b2_16": (16, 800, 2048), "b1_2048": (1, 2048, 2048)}
    gen = torch.Generator().manual_seed(0)
    out: dict[str, Any] = {"shape": {"hq": hq, "hk": hk, "head_dim": d},
                           "fp8_tiles": [list(t) for t in FP8_REG_TILES],
                           "bf16_tile": list(da.tunables(False)[:3]), "cases": {}}
    for name, (batch, lo, hi) in cases.items():
        lens_cpu = torch.randint(lo, hi + 1, (batch,), generator=gen, dtype=torch.int32)
        q, kc16, vc16, rtt = _paged_decode_case(batch, hi, hq, hk, d)
        desc = torch.argsort(lens_cpu, descending=True, stable=True)
        q, rtt, lens = q[desc.cuda()].contiguous(), rtt[desc.cuda()].contiguous(), \
            lens_cpu[desc].cuda()
        kv_bytes = int(2 * lens_cpu.sum()) * hk * d * 2
        case: dict[str, Any] = {"batch": batch, "context": [lo, hi],
                                "splits": da.num_splits(batch, hk, q.device)}
        us = graph_time_us(lambda q=q, kc=kc16, vc=vc16, rtt=rtt, lens=lens:
                           da.attention_decode(q, kc, vc, rtt, lens, d ** -0.5))
        case["bf16"] = {"us": round(us, 2), "GBps": round(kv_bytes / us / 1e3)}
        kc8, vc8 = kc16.to(torch.float8_e4m3fn), vc16.to(torch.float8_e4m3fn)
        row: dict[str, Any] = {"kv_bytes": kv_bytes // 2}
        base = None
        for tile in FP8_REG_TILES:
            key = f"bn{tile[0]}_w{tile[1]}_s{tile[2]}" + (f"_r{tile[3]}" if tile[3] else "")
            try:
                with _attention_tunables(da, "fp8", tile):
                    got = da.attention_decode(q, kc8, vc8, rtt, lens, d ** -0.5)
                    us = graph_time_us(lambda q=q, kc=kc8, vc=vc8, rtt=rtt, lens=lens:
                                       da.attention_decode(q, kc, vc, rtt, lens, d ** -0.5))
                base = got if base is None else base
                row[key] = {"us": round(us, 2), "GBps": round(kv_bytes / 2 / us / 1e3),
                            "max_diff": float((got.float() - base.float()).abs().max())}
            except Exception as exc:  # a tile that does not compile is a result too
                row[key] = {"error": repr(exc)[:300]}
        case["fp8"] = row
        print(f"decode attention regs {name}: bf16 {case['bf16']['us']}, fp8 "
              + ", ".join(f"{k} {v.get('us', v)}" for k, v in row.items()
                          if isinstance(v, dict)), flush=True)
        out["cases"][name] = case
        del kc16, vc16, kc8, vc8
        torch.cuda.empty_cache()
    return out


def decode_attention_order_bench() -> dict[str, Any]:
    """Decode attention over contexts of unequal lengths (B2's and B3 c=128's spreads), bf16
    cache at Llama-3-8B's heads: the batch in a random order or longest first (as the
    scheduler orders a step's decodes), stage 1's grid with the KV heads or the batch as its
    first (fastest dispatched) dimension. GB/s counts the cache bytes read; `ideal_us` is
    `uniform_mean_heads_first` the same batch with every context at the mean (no spread)."""
    from tessera.hal.cuda import decode_attention as da

    hq, hk, d = 32, 8, 128
    # (name, batch, shortest, longest context)
    cases = [("b2_256", 256, 100, 2048), ("b2_128", 128, 200, 2048), ("b2_64", 64, 400, 2048),
             ("b2_32", 32, 600, 2048), ("b3_c128_89", 89, 256, 1536),
             ("b3_c128_128", 128, 256, 1536), ("b3_c32", 32, 256, 1536),
             # call 48 found b2_64 slower longest first and heads-first, the others faster:
             # other draws and the batches between
             ("b2_64_draw2", 64, 400, 2048), ("b2_64_draw3", 64, 400, 2048),
             ("b2_48", 48, 400, 2048), ("b2_80", 80, 300, 2048), ("b2_96", 96, 300, 2048)]
    gen = torch.Generator().manual_seed(0)
    out: dict[str, Any] = {"shape": {"hq": hq, "hk": hk, "head_dim": d, "cache": "bfloat16"},
                           "tunables": list(da.tunables(False)), "cases": {}}
    saved = da.HEADS_FIRST
    try:
        for name, batch, lo, hi in cases:
            lens_cpu = torch.randint(lo, hi + 1, (batch,), generator=gen, dtype=torch.int32)
            q, kc, vc, rtt = _paged_decode_case(batch, hi, hq, hk, d)
            kv_bytes = int(2 * lens_cpu.sum()) * hk * d * 2
            case: dict[str, Any] = {"batch": batch, "context": [lo, hi],
                                    "mean_context": round(float(lens_cpu.float().mean()), 1),
                                    "splits": da.num_splits(batch, hk, q.device),
                                    "kv_bytes": kv_bytes}
            desc = torch.argsort(lens_cpu, descending=True, stable=True).cuda()
            orders = {"random": None, "longest_first": desc}
            for order, perm in orders.items():
                lens = lens_cpu.cuda() if perm is None else lens_cpu.cuda()[perm]
                table = rtt if perm is None else rtt[perm].contiguous()
                qq = q if perm is None else q[perm].contiguous()
                for heads_first in (False, True):
                    da.HEADS_FIRST = heads_first
                    us = graph_time_us(lambda qq=qq, kc=kc, vc=vc, table=table, lens=lens:
                                       da.attention_decode(qq, kc, vc, table, lens, d ** -0.5))
                    key = f"{order}_{'heads' if heads_first else 'batch'}_first"
                    case[key] = {"us": round(us, 2), "GBps": round(kv_bytes / us / 1e3)}
                    if order == "longest_first":  # more splits: the long requests shared out
                        for n in (2, 4):
                            us = graph_time_us(
                                lambda qq=qq, kc=kc, vc=vc, table=table, lens=lens, n=n:
                                da.attention_decode(qq, kc, vc, table, lens, d ** -0.5,
                                                    splits=n))
                            case[f"{key}_splits{n}"] = {"us": round(us, 2),
                                                        "GBps": round(kv_bytes / us / 1e3)}
            if name in FP8_ORDER_CASES:
                case["fp8"] = _fp8_order_case(da, q[desc].contiguous(), kc, vc,
                                              rtt[desc].contiguous(), lens_cpu.cuda()[desc],
                                              kv_bytes // 2)
            # the same bytes at one length for every request (no spread): the rate to reach
            mean = int(lens_cpu.float().mean().round())
            uni = torch.full((batch,), mean, dtype=torch.int32, device="cuda")
            da.HEADS_FIRST = True
            uni_us = graph_time_us(lambda q=q, kc=kc, vc=vc, rtt=rtt, uni=uni:
                                   da.attention_decode(q, kc, vc, rtt, uni, d ** -0.5))
            uni_bytes = 2 * batch * mean * hk * d * 2
            case["uniform_mean_heads_first"] = {"us": round(uni_us, 2),
                                                "GBps": round(uni_bytes / uni_us / 1e3)}
            # the result does not depend on the order: longest first, mapped back
            da.HEADS_FIRST = True
            got = da.attention_decode(q[desc].contiguous(), kc, vc, rtt[desc].contiguous(),
                                      lens_cpu.cuda()[desc], d ** -0.5)
            ref = da.attention_decode(q, kc, vc, rtt, lens_cpu.cuda(), d ** -0.5)
            case["reordered_equal"] = bool(torch.equal(got, ref[desc]))
            out["cases"][name] = case
            print(f"decode attention order {name}: "
                  + ", ".join(f"{k} {v['us']}" for k, v in case.items()
                              if isinstance(v, dict) and "us" in v), flush=True)
            if "fp8" in case:
                print(f"decode attention order {name} fp8: "
                      + ", ".join(f"{k} {v.get('us', v) if isinstance(v, dict) else v}"
                                  for k, v in case["fp8"].items()),
                      flush=True)
            del kc, vc
            torch.cuda.empty_cache()
    finally:
        da.HEADS_FIRST = saved
    return out


def b1_smoke(platform: Any) -> dict[str, Any]:
    """Llama-3-8B shape, bf16, random weights: 512-token prefill (TTFT) and 128 decode steps at
    batch 1 through a captured graph; eager and larger batches for comparison."""
    from tessera.worker_proc.graph_decode import DecodeGraphs

    cfg = json.loads((ROOT / "benchmarks/configs/llama3-8b.json").read_text())
    mc = ModelConfig.from_hf_dict(cfg)
    dev, dtype, width = torch.device("cuda"), torch.bfloat16, 1024
    model = random_model(mc, platform, dtype, dev)
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    kv = platform.create_kv_arena(mc.num_layers, 65 * width, mc.num_kv_heads, mc.head_dim, dtype)

    def fwd(inp: ForwardInputs) -> torch.Tensor:
        with torch.inference_mode():
            return model(inp, kv)

    engine = MiniEngine(fwd, dev, 64, width)
    for r in range(64):
        engine.alloc(r, 0, width)
    gen = torch.Generator().manual_seed(3)
    prompt = torch.randint(0, mc.vocab_size, (512,), generator=gen).tolist()
    ttft = []
    for _ in range(6):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        tok = int(fwd(engine.inputs([(0, prompt, 0, True)])).argmax(-1)[0])
        ttft.append((time.perf_counter() - t0) * 1e3)
    res: dict[str, Any] = {"weight_bytes": weight_bytes, "prompt_tokens": 512,
                           "ttft_ms_median": sorted(ttft[1:])[len(ttft[1:]) // 2],
                           "ttft_ms_all": ttft}
    runner = platform.create_graph_runner()
    graphs = DecodeGraphs(fwd, runner, 64, width, dev, sizes=[1, 16, 64])
    graphs.capture_all()

    def decode_loop(run: Callable[[ForwardInputs], torch.Tensor], batch: int, steps: int,
                    start_tok: int) -> float:
        toks = [start_tok] * batch
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for i in range(steps):
            inp = engine.inputs([(r, [toks[r]], 512 + i, True) for r in range(batch)])
            toks = run(inp).argmax(-1).tolist()  # host sync each step, as serving does
        return (time.perf_counter() - t0) * 1e3 / steps

    decode_loop(graphs.run, 1, 5, tok)
    res["decode_ms_per_step_graph_b1"] = decode_loop(graphs.run, 1, 128, tok)
    res["decode_ms_per_step_eager_b1"] = decode_loop(fwd, 1, 16, tok)
    # replay alone (inputs already on the device): the GPU time of one step
    graphs.run(engine.inputs([(0, [tok], 600, True)]))
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(50):
        runner.replay(1)
    end.record()
    torch.cuda.synchronize()
    res["replay_only_ms_b1"] = start.elapsed_time(end) / 50
    for batch in (16, 64):
        res[f"decode_ms_per_step_graph_b{batch}"] = decode_loop(graphs.run, batch, 32, tok)
    runner.reset()
    from tessera.hal.cuda import decode_attention as da
    from tessera.hal.cuda import gemv

    res["gemv_tuned_shapes"] = [f"{k[0]}x{k[1]}" for k in gemv.TUNED]
    saved, gemv.TUNED = dict(gemv.TUNED), {}
    cublas_only = DecodeGraphs(fwd, runner, 1, width, dev, sizes=[1])
    cublas_only.capture_all()
    cublas_only.run(engine.inputs([(0, [tok], 600, True)]))
    start.record()
    for _ in range(50):
        runner.replay(1)
    end.record()
    torch.cuda.synchronize()
    res["replay_only_ms_b1_cublas_only"] = start.elapsed_time(end) / 50
    runner.reset()
    gemv.TUNED = saved

    default_splits = da.MAX_SPLITS
    for max_splits in (8, 64):
        da.MAX_SPLITS = max_splits
        small = DecodeGraphs(fwd, runner, 1, width, dev, sizes=[1])
        small.capture_all()
        small.run(engine.inputs([(0, [tok], 600, True)]))
        start.record()
        for _ in range(50):
            runner.replay(1)
        end.record()
        torch.cuda.synchronize()
        res[f"replay_only_ms_b1_max_splits{max_splits}"] = start.elapsed_time(end) / 50
        runner.reset()
    da.MAX_SPLITS = default_splits
    res["roofline_ms_b1"] = weight_bytes / 4.22e12 * 1e3
    res["target_ms_b1"] = 4.2
    runner.reset()
    return res
