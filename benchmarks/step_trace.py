"""`python -m tessera.benchmarks.step_trace DIR [--out JSON] [--top N]`: where a run's time
goes step by step, from the lines of `--trace-messages-dir DIR` (bus/trace.py).

A run's wall time is the sum of its steps' intervals: from one step's output seen ready on the
worker to the next one's. For each step of the first worker rank the trace gives its
composition (tokens, requests, decodes: the worker's launch line), when the scheduler sent it,
when the worker began and ended its host launch, and when the device's output was seen ready;
and the garbage collector's pauses of every process (`bus/gc_pauses.py`) that fell inside the
interval. The summary splits the intervals by kind (decode-only, mixed, prefill-only) and
lists the slowest steps with what held them: the host launch (`launch_ms`), the batch's wait
before it (`queued_ms`: the scheduler's turn, the bus, the previous step's output), or the
device.
"""

from __future__ import annotations

import statistics
import sys
from typing import Any

from tessera.benchmarks.message_trace import Event, load, trace_parser, write_out


def _worker_name(events: list[Event]) -> str | None:
    names = sorted({e["p"] for e in events if e["e"] == "launch" and e["m"] == "ForwardBatch"})
    return names[0] if names else None


def step_rows(events: list[Event], since_ns: int = 0) -> list[dict[str, Any]]:
    """One row per step the first worker rank launched from `since_ns` on (wall-clock ns)
    and saw ready, in order, with times in ms."""
    worker = _worker_name(events)
    if worker is None:
        return []
    by_step: dict[int, dict[str, Any]] = {}
    sent: dict[int, int] = {}
    pauses: list[Event] = []
    for e in events:
        if e["e"] == "gc":
            pauses.append(e)
        elif e["m"] == "ForwardBatch" and e.get("step") is not None:
            if e["e"] == "send" and e["p"].startswith("scheduler"):
                sent.setdefault(int(e["step"]), e["t"])
            elif e["p"] == worker and e["e"] in ("launch", "launched", "ready"):
                row = by_step.setdefault(int(e["step"]), {"step": int(e["step"])})
                row[e["e"]] = e["t"]
                if e["e"] == "launch":
                    for key in ("tokens", "requests", "decodes"):
                        if key in e:
                            row[key] = e[key]
    rows = []
    last_ready: int | None = None
    for row in sorted((r for r in by_step.values()
                       if "ready" in r and "launch" in r and r["launch"] >= since_ns),
                      key=lambda r: r["ready"]):
        out: dict[str, Any] = {k: row.get(k) for k in ("step", "tokens", "requests", "decodes")}
        out["kind"] = _kind(row)
        out["launch_ms"] = (row.get("launched", row["launch"]) - row["launch"]) / 1e6
        if row["step"] in sent:
            out["queued_ms"] = (row["launch"] - sent[row["step"]]) / 1e6
        start = last_ready if last_ready is not None else row["launch"]
        out["interval_ms"] = (row["ready"] - start) / 1e6
        held = [{"process": p["p"], "gen": p.get("gen"), "ms": p.get("ms")}
                for p in pauses if start < p["t"] <= row["ready"]]
        if held:
            out["gc"] = held
            out["gc_ms"] = sum(float(h["ms"] or 0.0) for h in held)
        rows.append(out)
        last_ready = row["ready"]
    return rows


def _kind(row: dict[str, Any]) -> str:
    tokens, decodes = row.get("tokens"), row.get("decodes")
    if tokens is None or decodes is None:
        return "unknown"
    if tokens == decodes:
        return "decode"
    return "mixed" if decodes else "prefill"


def summarize(directory: str, top: int = 30, since_ns: int = 0) -> dict[str, Any]:
    events = load(directory)
    rows = step_rows(events, since_ns)
    kinds: dict[str, dict[str, float]] = {}
    for kind in sorted({r["kind"] for r in rows}):
        vals = [r["interval_ms"] for r in rows if r["kind"] == kind]
        launch = [r["launch_ms"] for r in rows if r["kind"] == kind]
        kinds[kind] = {"steps": len(vals), "interval_ms_total": sum(vals),
                       "interval_ms_median": statistics.median(vals),
                       "interval_ms_max": max(vals),
                       "launch_ms_median": statistics.median(launch),
                       "launch_ms_max": max(launch)}
    gc_total: dict[str, float] = {}
    for e in events:
        if e["e"] == "gc" and e["t"] >= since_ns:
            gc_total[e["p"]] = gc_total.get(e["p"], 0.0) + float(e.get("ms") or 0.0)
    slowest = sorted(rows, key=lambda r: -r["interval_ms"])[:top]
    return {"steps": len(rows), "interval_ms_total": sum(r["interval_ms"] for r in rows),
            "kinds": kinds, "gc_ms_traced": gc_total,
            "gc_ms_in_steps": sum(r.get("gc_ms", 0.0) for r in rows),
            "slowest": slowest, "rows": rows}


def main(argv: list[str] | None = None) -> int:
    p = trace_parser("step_trace", __doc__,
                     "write the summary (and every step's row) here as JSON")
    p.add_argument("--top", type=int, default=30, help="the slowest steps to list")
    args = p.parse_args(argv)
    result = summarize(args.directory, args.top)
    if not result["steps"]:
        print(f"no worker step in {args.directory}", file=sys.stderr)
        return 1
    print(f"{result['steps']} steps, {result['interval_ms_total']:.0f} ms")
    for kind, k in result["kinds"].items():
        print(f"  {kind:8s} {k['steps']:5d} steps {k['interval_ms_total']:9.0f} ms, median "
              f"{k['interval_ms_median']:7.2f}, max {k['interval_ms_max']:7.2f}; launch median "
              f"{k['launch_ms_median']:6.2f} max {k['launch_ms_max']:6.2f}")
    for r in result["slowest"][:10]:
        print(f"  step {r['step']}: {r['interval_ms']:.1f} ms ({r['kind']}, {r['tokens']} "
              f"tokens, {r['requests']} requests; launch {r['launch_ms']:.1f} ms, queued "
              f"{r.get('queued_ms', float('nan')):.1f} ms, gc {r.get('gc_ms', 0.0):.1f} ms)")
    return write_out(args.out, result)


if __name__ == "__main__":
    sys.exit(main())
