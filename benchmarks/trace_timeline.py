"""`python -m tessera.benchmarks.trace_timeline TRACE.json[.gz] OUT.png [--step 1]`: the picture
of one step of a torch.profiler chrome trace written by the step profile's traces part
(`tests/hal_cuda/gpu_step_profile.py --only=traces`), and its numbers as JSON beside it.

The trace holds three steps, each marked on the host by `step i: launch` and `step i: finish`
ranges; the worker's phases (`inputs`, `forward`, `sample`, `copy-out`) are ranges inside the
launch. The picture spans step `--step` from its launch to the end of its finish:

    host: step        the launch, then the wait for the device and the result's copy-out
    host: phases      the worker's phases inside the launch
    host: launches    each kernel or graph launch the host makes (cudaLaunchKernel, ...)
    device            every kernel and copy in that span, coloured by kind (linear,
                      attention, norm, ...: profile_summary.KINDS)

so that one sees which phase of the host the device waits on, and what the device spends the
step on. The JSON beside the picture (OUT with .json) has the span, the host's launch time, the
device's busy time and its idle gaps, and the device time by kind.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import sys
from typing import Any

from tessera.benchmarks import plots
from tessera.benchmarks.profile_summary import _union, kind_of

PHASES = ("inputs", "forward", "draft", "sample", "copy-out")
COLOURS = {"linear": "#4e79a7", "attention": "#f28e2b", "collective": "#e15759",
           "norm": "#76b7b2", "rotary": "#59a14f", "sampling": "#edc948", "copy": "#b07aa1",
           "other": "#9c755f"}
_LAUNCH_CALLS = ("cudaLaunchKernel", "cudaGraphLaunch", "cuLaunchKernel", "cudaMemcpyAsync",
                 "cuLaunchKernelEx", "cudaLaunchKernelExC")


def _complete(trace: dict[str, Any]) -> list[dict[str, Any]]:
    return [e for e in trace.get("traceEvents", []) if e.get("ph") == "X" and "dur" in e]


def step_window(events: list[dict[str, Any]], step: int) -> tuple[float, float, float]:
    """(start, end of launch, end) of step `step`: its launch range to its finish range's end."""
    launch = [e for e in events if e.get("name") == f"step {step}: launch"
              and e.get("cat") != "gpu_user_annotation"]
    finish = [e for e in events if e.get("name") == f"step {step}: finish"
              and e.get("cat") != "gpu_user_annotation"]
    if not launch or not finish:
        names = sorted({e["name"] for e in events if str(e.get("name", "")).startswith("step ")})
        raise ValueError(f"no 'step {step}: launch' / 'finish' ranges in the trace "
                         f"(it has {names or 'none'})")
    first, done = launch[0], finish[0]
    return float(first["ts"]), float(first["ts"] + first["dur"]), float(done["ts"] + done["dur"])


def summarize(trace: dict[str, Any], step: int) -> dict[str, Any]:
    events = _complete(trace)
    start, launched, end = step_window(events, step)

    def inside(e: dict[str, Any]) -> bool:
        return float(e["ts"]) < end and float(e["ts"]) + float(e["dur"]) > start

    device = [e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")
              and inside(e)]
    phases = [e for e in events if e.get("name") in PHASES and e.get("cat") == "user_annotation"
              and inside(e)]
    launches = [e for e in events if e.get("cat") == "cuda_runtime" and inside(e)
                and any(call in str(e.get("name")) for call in _LAUNCH_CALLS)]
    busy = _union([(max(start, float(e["ts"])), min(end, float(e["ts"]) + float(e["dur"])))
                   for e in device])
    gaps = [b[0] - a[1] for a, b in zip(busy, busy[1:], strict=False)]
    by_kind: dict[str, float] = {}
    for e in device:
        kind = kind_of(str(e.get("name", "")))
        by_kind[kind] = by_kind.get(kind, 0.0) + float(e["dur"])
    return {
        "step": step, "span_us": end - start, "launch_us": launched - start,
        "device_busy_us": sum(b - a for a, b in busy),
        "device_first_us": (busy[0][0] - start) if busy else None,
        "device_idle_gaps_over_5us": sum(1 for g in gaps if g > 5.0),
        "device_idle_us": sum(gaps),
        "device_us_by_kind": {k: round(v, 1) for k, v in sorted(by_kind.items(),
                                                                  key=lambda kv: -kv[1])},
        "kernels": len(device), "host_launch_calls": len(launches),
        "phases_us": {str(e["name"]): float(e["dur"]) for e in phases},
        "_window": (start, launched, end), "_device": device, "_phases": phases,
        "_launches": launches,
    }


def draw(summary: dict[str, Any], path: str, title: str) -> str | None:
    plt = plots._pyplot()
    if plt is None:
        return None
    from matplotlib.patches import Patch
    start, launched, end = summary["_window"]
    ms = lambda t: (float(t) - start) / 1000.0  # noqa: E731
    fig, ax = plt.subplots(figsize=(13, 3.6))
    lanes = {"device": 0, "host: launches": 1, "host: phases": 2, "host: step": 3}
    ax.broken_barh([(0, ms(launched))], (lanes["host: step"] - 0.4, 0.8), color="#bab0ac")
    ax.broken_barh([(ms(launched), ms(end) - ms(launched))], (lanes["host: step"] - 0.4, 0.8),
                   color="#e7e1dc")
    ax.text(0, lanes["host: step"], " launch", va="center", fontsize=8)
    ax.text(ms(launched), lanes["host: step"], " wait for the device, copy-out", va="center",
            fontsize=8)
    for e in summary["_phases"]:
        ax.broken_barh([(ms(e["ts"]), float(e["dur"]) / 1000.0)],
                       (lanes["host: phases"] - 0.4, 0.8), color="#d4a6c8", edgecolor="white")
        ax.text(ms(e["ts"]), lanes["host: phases"], " " + str(e["name"]), va="center",
                fontsize=7)
    ax.broken_barh([(ms(e["ts"]), max(float(e["dur"]) / 1000.0, 0.002))
                    for e in summary["_launches"]], (lanes["host: launches"] - 0.4, 0.8),
                   color="#555555")
    for kind, colour in COLOURS.items():
        bars = [(ms(e["ts"]), max(float(e["dur"]) / 1000.0, 0.001))
                for e in summary["_device"] if kind_of(str(e.get("name", ""))) == kind]
        if bars:
            ax.broken_barh(bars, (lanes["device"] - 0.4, 0.8), color=colour)
    ax.set_yticks(list(lanes.values()), list(lanes))
    ax.set_xlabel("ms from the step's launch")
    ax.set_xlim(0, ms(end))
    ax.set_title(title, fontsize=10)
    kinds = [k for k in COLOURS if any(kind_of(str(e.get("name", ""))) == k
                                       for e in summary["_device"])]
    ax.legend(handles=[Patch(color=COLOURS[k], label=k) for k in kinds], fontsize=7,
              loc="upper right", ncol=len(kinds) or 1)
    return plots._save(fig, plt, path)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tessera.benchmarks.trace_timeline",
                                description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("trace")
    p.add_argument("out", help="the picture (PNG); its numbers go beside it as .json")
    p.add_argument("--step", type=int, default=1, help="which of the trace's steps (0-2)")
    p.add_argument("--title", default="")
    args = p.parse_args(argv)
    opener = gzip.open if args.trace.endswith(".gz") else open
    with opener(args.trace, "rt", encoding="utf-8") as f:
        trace = json.load(f)
    summary = summarize(trace, args.step)
    title = args.title or (f"{os.path.basename(args.trace)}, step {args.step}: "
                           f"{summary['span_us'] / 1000:.2f} ms, device busy "
                           f"{summary['device_busy_us'] / 1000:.2f} ms, host launch "
                           f"{summary['launch_us'] / 1000:.2f} ms")
    png = draw(summary, args.out, title)
    figures = {k: v for k, v in summary.items() if not k.startswith("_")}
    figures["trace"] = os.path.basename(args.trace)
    figures["picture"] = os.path.basename(png) if png else None
    with open(os.path.splitext(args.out)[0] + ".json", "w", encoding="utf-8") as f:
        json.dump(figures, f, indent=1)
    print(json.dumps(figures, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
