"""`python benchmarks/pick_tile.py GPU_RUN_JSON [CASES]`: the fastest fp8 decode-attention
tile of `run_gpu.sh attnregs`'s report over B2's batches (the summed microseconds of the
cases named, default b2_256,b2_128,b2_64,b2_32), printed as HAL_CUDA_DECODE_FP8_TILE takes it
(BLOCK_N,WARPS,STAGES[,MAXNREG]). Tiles that failed, or whose output strays from the default
tile's by more than 1e-2, are not candidates; nothing is printed when none is left."""

from __future__ import annotations

import json
import sys
from typing import Any

DEFAULT_CASES = ("b2_256", "b2_128", "b2_64", "b2_32")
MAX_DIFF = 1e-2


def pick(report: dict[str, Any], cases: tuple[str, ...] = DEFAULT_CASES) -> str | None:
    bench = report.get("attention_regs") or {}
    tiles = bench.get("fp8_tiles") or []
    rows = [bench.get("cases", {}).get(c, {}).get("fp8", {}) for c in cases]
    best, best_us = None, float("inf")
    for tile in tiles:
        key = f"bn{tile[0]}_w{tile[1]}_s{tile[2]}" + (f"_r{tile[3]}" if tile[3] else "")
        cells = [row.get(key) for row in rows]
        if not all(isinstance(c, dict) and "us" in c and c.get("max_diff", 0.0) <= MAX_DIFF
                   for c in cells):
            continue
        total = sum(c["us"] for c in cells)  # type: ignore[index]
        if total < best_us:
            best, best_us = tile, total
    if best is None:
        return None
    return ",".join(str(v) for v in best if v is not None)


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    try:
        with open(argv[0]) as f:
            report = json.load(f)
    except (OSError, ValueError) as exc:
        print(f"pick_tile: {exc}", file=sys.stderr)
        return 1
    cases = tuple(argv[1].split(",")) if len(argv) > 1 else DEFAULT_CASES
    tile = pick(report, cases)
    if tile is not None:
        print(tile)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
