"""Decode attention over an fp8 cache: the CUDA C stage 1 (hal/cuda/native_attention.py) at
several tiles (warps a block, stages a ring) beside the Triton stage 1 at its defaults,
Llama-3-8B's heads, timed inside graphs (gpu_bench.graph_time_us) on pages scattered as a
pool leaves them; uniform contexts and B2's / B3's spreads longest first (as the scheduler
orders a step).
GB/s counts the fp8 cache bytes read. The fastest tile is also timed with its loads alone
(`*_loads_only`, the kernel's probe 1): the ceiling of its access pattern.

    python tests/hal_cuda/native_attention_bench.py OUT.json
    python tests/hal_cuda/native_attention_bench.py OUT.json --probes  # the loads' probes alone
    python tests/hal_cuda/native_attention_bench.py OUT.json --cpu   # dry run: the plan only
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_bench import _paged_decode_case, graph_time_us  # noqa: E402

from tessera.hal.cuda import decode_attention as da  # noqa: E402
from tessera.hal.cuda import native_attention as na  # noqa: E402
from tessera.hal.reference import reference_op  # noqa: E402

HQ, HK, D = 32, 8, 128
UNIFORM = [(1, 4096), (32, 1024), (64, 2048), (128, 600), (128, 2048), (256, 600),
           (256, 1024), (128, 4096)]
SPREAD = [("b2_256", 256, 100, 2048), ("b2_128", 128, 200, 2048), ("b2_64", 64, 400, 2048),
          ("b2_32", 32, 600, 2048), ("b3_c128_128", 128, 256, 1536)]


TILES = ["4,3", "2,3", "2,4", "4,2", "4,4", "8,2", "8,3", "2,6"]


def _time(q: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor, rtt: torch.Tensor,
          lens: torch.Tensor, native: bool, tile: str = TILES[0],
          splits: int | None = None) -> float:
    os.environ[na.VARIABLE] = "1" if native else "0"
    os.environ[na.TILE_VARIABLE] = tile
    na.enabled.cache_clear()
    na.tile.cache_clear()
    return graph_time_us(lambda: da.attention_decode(q, kc, vc, rtt, lens, D ** -0.5,
                                                     splits=splits))


def _probe_launch(q: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor, rtt: torch.Tensor,
                  lens: torch.Tensor, tile: str, n_split: int, probe: int
                  ) -> tuple[Any, torch.Tensor]:
    """(a launch of the native stage 1 at `tile` as its probe `probe` (native_attention.
    defines), its output): 1 the loads alone, 2 those with whole-line K requests, 3 probe 1
    with a block over a request's KV heads (`tile`'s warps are the heads), 4 the whole kernel
    so (its output right where n_split is 1)."""
    batch = q.shape[0]
    ext = torch.ones(batch, dtype=torch.int32, device="cuda")
    qo = torch.arange(batch, dtype=torch.int32, device="cuda")
    mid = (batch, HQ, n_split, D) if n_split > 1 else (1, 1, 1, 1)
    mid_o = torch.empty(mid, dtype=torch.float32, device="cuda")
    mid_lse = torch.empty(mid[:3], dtype=torch.float32, device="cuda")
    out = torch.empty_like(q)
    os.environ[na.TILE_VARIABLE] = tile
    na.tile.cache_clear()
    scale_log2 = D ** -0.5 * 1.4426950408889634

    def launch() -> None:
        na.launch_stage1(q, kc, vc, rtt, lens, ext, qo, mid_o, mid_lse, out, scale_log2, 0,
                         0.0, n_split, False, da.HEADS_FIRST and batch <= 65535, probe=probe)

    return launch, out


def _probe_us(q: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor, rtt: torch.Tensor,
              lens: torch.Tensor, tile: str, n_split: int, probe: int = 1) -> float:
    """The native stage 1 at `tile` as its probe `probe` (_probe_launch), timed: probes 1-3
    are its loads alone, the ceiling of their access pattern."""
    return graph_time_us(_probe_launch(q, kc, vc, rtt, lens, tile, n_split, probe)[0])


def _case(q: torch.Tensor, kc16: torch.Tensor, vc16: torch.Tensor, rtt: torch.Tensor,
          lens: torch.Tensor) -> dict[str, Any]:
    kc, vc = kc16.to(torch.float8_e4m3fn), vc16.to(torch.float8_e4m3fn)
    batch = q.shape[0]
    kv_bytes = int(2 * lens.sum()) * HK * D
    row: dict[str, Any] = {"kv_bytes": kv_bytes,
                           "splits": da.num_splits(batch, HK, q.device)}

    def note(key: str, us: float) -> None:
        row[key] = {"us": round(us, 2), "GBps": round(kv_bytes / us / 1e3)}

    note("triton", _time(q, kc, vc, rtt, lens, False))
    for tile in TILES:
        key = "native_w{}_s{}".format(*tile.split(","))
        try:
            note(key, _time(q, kc, vc, rtt, lens, True, tile))
        except Exception as exc:  # a variant that fails is a result too
            row[key] = {"error": repr(exc)[:300]}
    timed = {k: v["us"] for k, v in row.items() if k.startswith("native") and "us" in v}
    if timed:
        best = min(timed, key=timed.__getitem__)
        row["best_native"] = best
        tile = ",".join(best.replace("native_w", "").split("_s"))
        for n in (1, 2, 4):
            note(f"{best}_splits{n}", _time(q, kc, vc, rtt, lens, True, tile, n))
            note(f"triton_splits{n}", _time(q, kc, vc, rtt, lens, False, splits=n))
        row["speedup"] = round(row["triton"]["us"] / row[best]["us"], 3)
        note(f"{best}_loads_only", _probe_us(q, kc, vc, rtt, lens, tile, row["splits"]))
    # correctness beside the timing: native against Triton and the fp32 reference
    os.environ[na.VARIABLE] = "1"
    os.environ[na.TILE_VARIABLE] = TILES[0]
    na.enabled.cache_clear()
    na.tile.cache_clear()
    got = da.attention_decode(q, kc, vc, rtt, lens, D ** -0.5).float()
    os.environ[na.VARIABLE] = "0"
    na.enabled.cache_clear()
    tri = da.attention_decode(q, kc, vc, rtt, lens, D ** -0.5).float()
    row["rel_vs_triton"] = float((got - tri).norm() / tri.norm())
    if batch * int(lens.max()) <= 64 * 2048:
        ext = torch.ones(batch, dtype=torch.int32, device="cuda")
        indptr = torch.arange(batch + 1, dtype=torch.int32, device="cuda")
        ref = reference_op("attention_extend")(q.float(), kc.float(), vc.float(), rtt, lens,
                                               ext, indptr, D ** -0.5)
        row["rel_vs_reference"] = float((got - ref).norm() / ref.norm())
    return row


PROBE_TILES = ["4,3", "1,4", "1,8"]
PROBE_CASES = ("b2_256", "b2_128", "b256_s1024")


def _probes(q: torch.Tensor, kc16: torch.Tensor, vc16: torch.Tensor, rtt: torch.Tensor,
            lens: torch.Tensor) -> dict[str, Any]:
    """`--probes`: Triton's stage 1 beside the native one at PROBE_TILES (one warp a block:
    a warp's tiles are consecutive keys), each whole, with its loads alone and with
    whole-line K requests alone (probes 1 and 2); then the loads alone of a block over all
    the KV heads of a request, a warp a head (probe 3), at 3 and 6 stages, and at 4 times
    the splits; then the whole kernel so (probe 4), timed and checked against Triton."""
    kc, vc = kc16.to(torch.float8_e4m3fn), vc16.to(torch.float8_e4m3fn)
    kv_bytes = int(2 * lens.sum()) * HK * D
    splits = da.num_splits(q.shape[0], HK, q.device)
    row: dict[str, Any] = {"kv_bytes": kv_bytes, "splits": splits}

    def note(key: str, us: float) -> None:
        row[key] = {"us": round(us, 2), "GBps": round(kv_bytes / us / 1e3)}

    note("triton", _time(q, kc, vc, rtt, lens, False))
    for tile in PROBE_TILES:
        w, st = tile.split(",")
        note(f"native_w{w}_s{st}", _time(q, kc, vc, rtt, lens, True, tile))
        for probe in (1, 2):
            note(f"native_w{w}_s{st}_probe{probe}",
                 _probe_us(q, kc, vc, rtt, lens, tile, splits, probe))
    # a block over a request's KV heads, a warp each: HK times fewer blocks, so also at 4
    # times the splits
    for st, n in ((3, splits), (3, 4 * splits), (6, splits)):
        note(f"native_heads_s{st}_splits{n}_probe3",
             _probe_us(q, kc, vc, rtt, lens, f"{HK},{st}", n, 3))
    # the whole kernel so (probe 4), and its output at one split against Triton's
    for n in (splits, 4 * splits):
        note(f"native_heads_s3_splits{n}_probe4",
             _probe_us(q, kc, vc, rtt, lens, f"{HK},3", n, 4))
    launch, got = _probe_launch(q, kc, vc, rtt, lens, f"{HK},3", 1, 4)
    launch()
    os.environ[na.VARIABLE] = "0"
    na.enabled.cache_clear()
    tri = da.attention_decode(q, kc, vc, rtt, lens, D ** -0.5).float()
    row["probe4_rel_vs_triton"] = float((got.float() - tri).norm() / tri.norm())
    return row


def _inputs() -> Any:
    """(name, q, k cache, v cache, page table, lens) of every case, bf16 caches."""
    for batch, seq in UNIFORM:
        q, kc, vc, rtt = _paged_decode_case(batch, seq, HQ, HK, D)
        yield (f"b{batch}_s{seq}", q, kc, vc, rtt,
               torch.full((batch,), seq, dtype=torch.int32, device="cuda"))
    gen = torch.Generator().manual_seed(0)
    for name, batch, lo, hi in SPREAD:
        lens_cpu = torch.randint(lo, hi + 1, (batch,), generator=gen, dtype=torch.int32)
        q, kc, vc, rtt = _paged_decode_case(batch, hi, HQ, HK, D)
        desc = torch.argsort(lens_cpu, descending=True, stable=True)
        yield name, q, kc, vc, rtt[desc.cuda()].contiguous(), lens_cpu[desc].cuda()


def main() -> None:
    out_path = Path(sys.argv[1])
    probing = "--probes" in sys.argv
    if "--cpu" in sys.argv:
        out_path.parent.mkdir(parents=True, exist_ok=True)
        out_path.write_text(json.dumps({"plan": {"uniform": UNIFORM, "spread": SPREAD,
                                                 "probes": list(PROBE_CASES) if probing
                                                 else []}}))
        return
    torch.manual_seed(0)
    result: dict[str, Any] = {"device": torch.cuda.get_device_name(),
                              "commit": os.environ.get("TESSERA_COMMIT", "unknown"),
                              "shape": {"hq": HQ, "hk": HK, "head_dim": D, "q": "bfloat16",
                                        "cache": "float8_e4m3fn"},
                              "triton_tunables": list(da.tunables(True)), "cases": {}}
    for name, q, kc, vc, rtt, lens in _inputs():
        if probing:
            if name in PROBE_CASES:
                result["cases"][name] = row = _probes(q, kc, vc, rtt, lens)
                print(f"native attention probes {name}: " + ", ".join(
                    f"{k} {v['us']}" for k, v in row.items() if isinstance(v, dict))
                    + f"; probe 4 rel {row['probe4_rel_vs_triton']:.2e}", flush=True)
            continue
        result["cases"][name] = row = _case(q, kc, vc, rtt, lens)
        print(f"native attention {name}: triton {row['triton']['us']} us, "
              f"{row.get('best_native')} {row.get(row.get('best_native', ''), {})} "
              f"speedup {row.get('speedup')} loads alone "
              f"{row.get(str(row.get('best_native')) + '_loads_only')} "
              f"rel {row['rel_vs_triton']:.2e}", flush=True)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
