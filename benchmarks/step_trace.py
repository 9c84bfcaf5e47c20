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
device. `idle_ms`: how long after the previous step's output was ready this step's launch
ended, when it ended later: a device left with nothing queued (no work at all, between
requests, counts too); `idle_after_sent_ms`, the part of it after the scheduler had sent the
step: the device waiting on the bus and the worker's launch.
`--cost-model tokens|flat`: each row also gets `model_ms`, what the scheduling simulator's
model of the H200 charges its composition (`sched_sim.CostModel`; the launch line's decodes,
prompt tokens and the decodes' context), and each kind the model's total beside the measured.
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
                if e["e"] == "launched" and e.get("padded"):
                    row["padded"] = e["padded"]
                if e["e"] == "launch":
                    for key in ("tokens", "requests", "decodes", "context"):
                        if key in e:
                            row[key] = e[key]
    rows = []
    last_ready: int | None = None
    for row in sorted((r for r in by_step.values()
                       if "ready" in r and "launch" in r and r["launch"] >= since_ns),
                      key=lambda r: r["ready"]):
        out: dict[str, Any] = {k: row.get(k) for k in ("step", "tokens", "requests", "decodes",
                                                        "context", "padded")}
        out["kind"] = _kind(row)
        launched = row.get("launched", row["launch"])
        out["launch_ms"] = (launched - row["launch"]) / 1e6
        if row["step"] in sent:
            out["queued_ms"] = (row["launch"] - sent[row["step"]]) / 1e6
        start = last_ready if last_ready is not None else row["launch"]
        out["interval_ms"] = (row["ready"] - start) / 1e6
        out["idle_ms"] = max(0.0, (launched - last_ready) / 1e6) if last_ready is not None \
            else 0.0
        # the part of it after the scheduler had sent the step: the bus and the worker
        out["idle_after_sent_ms"] = min(out["idle_ms"], max(0.0, (
            launched - sent[row["step"]]) / 1e6)) if row["step"] in sent else out["idle_ms"]
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


def model_ms(row: dict[str, Any], cost: Any, padded: bool = False) -> float | None:
    """What the cost model charges the row's composition (None: the trace lacks it);
    `padded`: with its prompt tokens grown by the graph's padding (padding rows read no KV)."""
    if any(row.get(k) is None for k in ("tokens", "decodes", "context")):
        return None
    decodes, tokens, context = int(row["decodes"]), int(row["tokens"]), int(row["context"])
    extra = max(0, int(row.get("padded") or 0) - tokens) if padded else 0
    if decodes == tokens:  # a decode graph's padding rows: decodes of no context
        return float(cost.composed_ms(decodes + extra, 0, context))
    return float(cost.composed_ms(decodes, tokens - decodes + extra, context))


def summarize(directory: str, top: int = 30, since_ns: int = 0,
              cost_model: str | None = None) -> dict[str, Any]:
    events = load(directory)
    rows = step_rows(events, since_ns)
    cost = None
    if cost_model:
        from tessera.benchmarks.sched_sim import CostModel
        cost = CostModel(cost_model)
        for r in rows:
            r["model_ms"] = model_ms(r, cost)
            r["model_padded_ms"] = model_ms(r, cost, padded=True)
    kinds: dict[str, dict[str, float]] = {}
    for kind in sorted({r["kind"] for r in rows}):
        of_kind = [r for r in rows if r["kind"] == kind]
        vals = [r["interval_ms"] for r in of_kind]
        launch = [r["launch_ms"] for r in of_kind]
        kinds[kind] = {"steps": len(vals), "interval_ms_total": sum(vals),
                       "interval_ms_median": statistics.median(vals),
                       "interval_ms_max": max(vals),
                       "launch_ms_median": statistics.median(launch),
                       "launch_ms_max": max(launch),
                       "idle_ms_total": sum(r["idle_ms"] for r in of_kind),
                       "idle_after_sent_ms_total": sum(r["idle_after_sent_ms"] for r in of_kind),
                       "decodes_mean": statistics.mean(r["decodes"] or 0 for r in of_kind),
                       "prefill_tokens_mean": statistics.mean(
                           (r["tokens"] or 0) - (r["decodes"] or 0) for r in of_kind)}
        modeled = [r["model_ms"] for r in of_kind if r.get("model_ms") is not None]
        if cost is not None and modeled:
            kinds[kind]["model_ms_total"] = sum(modeled)
            kinds[kind]["model_padded_ms_total"] = sum(
                r["model_padded_ms"] for r in of_kind if r.get("model_padded_ms") is not None)
            kinds[kind]["modeled_steps"] = len(modeled)
        padded = [r for r in of_kind if r.get("padded")]
        if padded:
            kinds[kind]["padding_tokens_mean"] = statistics.mean(
                max(0, r["padded"] - (r["tokens"] or 0)) for r in padded)
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
    p.add_argument("--cost-model", choices=["tokens", "flat"],
                   help="each step's cost in the scheduling simulator's model beside it")
    args = p.parse_args(argv)
    result = summarize(args.directory, args.top, cost_model=args.cost_model)
    if not result["steps"]:
        print(f"no worker step in {args.directory}", file=sys.stderr)
        return 1
    print(f"{result['steps']} steps, {result['interval_ms_total']:.0f} ms")
    for kind, k in result["kinds"].items():
        print(f"  {kind:8s} {k['steps']:5d} steps {k['interval_ms_total']:9.0f} ms, median "
              f"{k['interval_ms_median']:7.2f}, max {k['interval_ms_max']:7.2f}; launch median "
              f"{k['launch_ms_median']:6.2f} max {k['launch_ms_max']:6.2f}; idle "
              f"{k['idle_ms_total']:7.0f} ms ({k['idle_after_sent_ms_total']:.0f} once sent)"
              + (f"; model {k['model_ms_total']:9.0f} ms ({k['model_padded_ms_total']:.0f} "
                 f"padded)" if "model_ms_total" in k else ""))
    for r in result["slowest"][:10]:
        print(f"  step {r['step']}: {r['interval_ms']:.1f} ms ({r['kind']}, {r['tokens']} "
              f"tokens, {r['requests']} requests; launch {r['launch_ms']:.1f} ms, queued "
              f"{r.get('queued_ms', float('nan')):.1f} ms, gc {r.get('gc_ms', 0.0):.1f} ms)")
    return write_out(args.out, result)


if __name__ == "__main__":
    sys.exit(main())
