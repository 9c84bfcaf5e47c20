"""`python -m tessera.benchmarks.profile_summary DIR [--out FILE]`: what the workers'
--profile-dir profiles say, one entry per layout folder, step window and rank.

DIR holds worker<rank>.steps<A>-<B>.{kernels,trace}.json, directly or in one folder per layout
(`tessera bench b5 --profile-dir DIR` writes DIR/tp1, DIR/tp2, DIR/pp2). For each profile:

    wall_ms             the window, from the profiler's start to its stop (every step done)
    device_busy_ms      the union of the device's kernel and copy intervals in the trace
    device_ms_by_kind   kernel time by kind (linear, attention, collective, norm, ...)
    top_kernels         the 12 kernels with the most device time, with their launch counts

and, for every window where several ranks of one layout were profiled, `both_busy_ms`: the time
two ranks' devices were busy at once (a pipeline's stages overlapping; ranks of one host share
the trace clock), beside each rank's busy time.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections import defaultdict
from typing import Any

_NAME = re.compile(r"^worker(\d+)\.steps(\d+)-(\d+)\.kernels\.json$")

# Kernel kinds by name, first match wins.
KINDS = (
    ("collective", ("nccl", "one_shot", "all_reduce", "allreduce", "all_gather", "sendrecv",
                    "multimem", "barrier")),
    ("attention", ("attention", "attn", "decode_stage", "stage1", "stage2", "extend", "flash")),
    ("linear", ("gemv", "gemm", "nvjet", "cutlass", "sm90_xmma", "qgemm", "matmul", "_mm",
                "splitk", "dequant", "cublas")),
    ("norm", ("norm",)),
    ("rotary", ("rotary", "rope")),
    ("sampling", ("argmax", "sample", "softmax", "topk", "top_k", "multinomial", "sort")),
    ("copy", ("memcpy", "memset", "copy", "cat", "stack")),
)


def kind_of(name: str) -> str:
    low = name.lower()
    for kind, keys in KINDS:
        if any(k in low for k in keys):
            return kind
    return "other"


def _device_events(trace: dict[str, Any]) -> list[dict[str, Any]]:
    return [e for e in trace.get("traceEvents", [])
            if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]


def _union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for start, end in sorted(intervals):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


def _length(intervals: list[tuple[float, float]]) -> float:
    return sum(end - start for start, end in intervals)


def _intersect(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> float:
    i = j = 0
    total = 0.0
    while i < len(a) and j < len(b):
        start, end = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if end > start:
            total += end - start
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def summarize_profile(kernels_path: str) -> tuple[dict[str, Any], list[tuple[float, float]]]:
    """One profile's summary and its device-busy intervals (microseconds, trace clock)."""
    with open(kernels_path, encoding="utf-8") as f:
        table = json.load(f)
    busy: list[tuple[float, float]] = []
    by_kind: dict[str, float] = defaultdict(float)
    per_kernel: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    trace_path = kernels_path[:-len(".kernels.json")] + ".trace.json"
    if os.path.exists(trace_path):
        with open(trace_path, encoding="utf-8") as f:
            trace = json.load(f)
        for e in _device_events(trace):
            start, dur = float(e["ts"]), float(e.get("dur", 0.0))
            busy.append((start, start + dur))
            name = str(e.get("name", ""))
            by_kind[kind_of(name)] += dur
            per_kernel[name][0] += dur
            per_kernel[name][1] += 1
    busy = _union(busy)
    steps = max(1, int(table.get("steps", 1)))
    top = sorted(per_kernel.items(), key=lambda kv: -kv[1][0])[:12]
    summary = {
        "rank": table.get("rank"), "first_step": table.get("first_step"), "steps": steps,
        "wall_ms": round(float(table.get("wall_s", 0.0)) * 1000.0, 3),
        "device_busy_ms": round(_length(busy) / 1000.0, 3),
        "device_busy_ms_per_step": round(_length(busy) / 1000.0 / steps, 4),
        "device_ms_by_kind_per_step": {k: round(v / 1000.0 / steps, 4)
                                       for k, v in sorted(by_kind.items(), key=lambda kv: -kv[1])},
        "top_kernels": [{"name": name[:160], "ms_per_step": round(t / 1000.0 / steps, 4),
                         "launches_per_step": round(n / steps, 2)} for name, (t, n) in top],
    }
    return summary, busy


def summarize_folder(folder: str) -> dict[str, Any]:
    """Every profile directly in `folder`, by window, with the ranks' overlap."""
    windows: dict[str, dict[int, tuple[dict[str, Any], list[tuple[float, float]]]]] = \
        defaultdict(dict)
    for name in sorted(os.listdir(folder)):
        match = _NAME.match(name)
        if match:
            rank, first, last = (int(g) for g in match.groups())
            windows[f"steps{first}-{last}"][rank] = summarize_profile(os.path.join(folder, name))
    out: dict[str, Any] = {}
    for window, ranks in windows.items():
        entry: dict[str, Any] = {"ranks": {str(r): s for r, (s, _) in sorted(ranks.items())}}
        if len(ranks) >= 2:
            (r0, (_, b0)), (r1, (_, b1)) = sorted(ranks.items())[:2]
            entry["both_busy_ms"] = {f"{r0}&{r1}": round(_intersect(b0, b1) / 1000.0, 3)}
        out[window] = entry
    return out


def summarize(root: str) -> dict[str, Any]:
    """The folder's own profiles (key "."), and each sub-folder's (a layout)."""
    result: dict[str, Any] = {}
    own = summarize_folder(root)
    if own:
        result["."] = own
    for name in sorted(os.listdir(root)):
        path = os.path.join(root, name)
        if os.path.isdir(path):
            found = summarize_folder(path)
            if found:
                result[name] = found
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tessera.benchmarks.profile_summary",
                                description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dir")
    p.add_argument("--out", help="write the summary here (JSON) as well as printing it")
    args = p.parse_args(argv)
    result = summarize(args.dir)
    if not result:
        print(f"no worker profiles under {args.dir}", file=sys.stderr)
        return 1
    text = json.dumps(result, indent=1)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            f.write(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
