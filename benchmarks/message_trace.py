"""`python -m tessera.benchmarks.message_trace DIR [--out JSON] [--skip N]`: where a request's
time to its first token goes, hop by hop, from the lines of `--trace-messages-dir DIR`
(bus/trace.py).

For each request the caller sent, its path is followed through the processes' lines: the
caller's GenerateRequest, the tokenizer, the scheduler taking it, the step that produced its
first token (of the SampledTokens the scheduler took in the drain before it sent the
TokenBatch naming the request, the first holding a prefill sent after it took the request),
that step's ForwardBatch to the worker, the worker's launch, the device's output
seen ready, the SampledTokens back, the TokenBatch to the detokenizer, its RequestOutputBatch
to the caller, and (offline) the caller's loop handing the first token over. Each stage is the
time between two of these events; the stages add up to the time to first token as the
caller's process sees it. Reported per stage over the requests (after the first `--skip`):
median, mean, min and max, in ms, with each request's own row.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import statistics
import sys
from collections.abc import Callable, Iterable
from typing import Any

Event = dict[str, Any]

# (stage, the event that ends it): each stage starts where the one before ended.
STAGES = (
    ("caller to tokenizer", "tokenizer_take"),
    ("tokenizer", "tokenizer_send"),
    ("tokenizer to scheduler", "scheduler_take"),
    ("scheduler, to the step's batch", "batch_send"),
    ("scheduler to worker", "worker_take"),
    ("worker, before the launch", "launch"),
    ("worker launch (host)", "launched"),
    ("device, until seen ready", "ready"),
    ("worker, tokens out", "worker_send"),
    ("worker to scheduler", "result_take"),
    ("scheduler, output", "output_send"),
    ("scheduler to detokenizer", "detok_take"),
    ("detokenizer", "detok_send"),
    ("detokenizer to caller", "caller_recv"),
    ("caller's loop", "first"),
)


def load(directory: str) -> list[Event]:
    events: list[Event] = []
    for path in sorted(glob.glob(os.path.join(directory, "*.jsonl"))):
        with open(path) as f:
            for line in f:
                line = line.strip()
                if line:
                    try:
                        events.append(json.loads(line))
                    except ValueError:
                        continue  # a line cut short by a crash
    events.sort(key=lambda e: e["t"])
    return events


def _first(events: Iterable[Event], pred: Callable[[Event], bool]) -> Event | None:
    return next((e for e in events if pred(e)), None)


def _names(e: Event, rid: str) -> bool:
    return e.get("rid") == rid or rid in (e.get("rids") or ())


def request_path(events: list[Event], rid: str) -> dict[str, int] | None:
    """The times (ns) of one request's events on its way to its first token; None when its
    path is not complete in the trace."""
    sent = _first(events, lambda e: e["e"] == "send" and e["m"] == "GenerateRequest"
                  and e.get("rid") == rid)
    if sent is None:
        return None
    caller = sent["p"]
    t: dict[str, int] = {"send": sent["t"]}
    after = [e for e in events if e["t"] >= sent["t"]]

    def at(name: str, pred: Callable[[Event], bool]) -> Event | None:
        e = _first(after, pred)
        if e is not None:
            t[name] = e["t"]
        return e

    at("tokenizer_take", lambda e: e["e"] == "take" and e["m"] == "GenerateRequest"
       and e.get("rid") == rid)
    at("tokenizer_send", lambda e: e["e"] == "send" and e["m"] == "TokenizedRequest"
       and e.get("rid") == rid)
    at("scheduler_take", lambda e: e["e"] == "take" and e["m"] == "TokenizedRequest"
       and e.get("rid") == rid)
    out = at("output_send", lambda e: e["e"] == "send" and e["m"] == "TokenBatch"
             and _names(e, rid))
    if out is None:
        return None
    result = _first_token_result(after, out, t["scheduler_take"] if "scheduler_take" in t
                                 else sent["t"])
    if result is None:
        return None
    step = result.get("step")
    t["result_take"] = result["t"]
    batch = at("batch_send", lambda e: e["e"] == "send" and e["m"] == "ForwardBatch"
               and e.get("step") == step and e["p"] == out["p"])
    answer = _first(after, lambda e: e["e"] == "send" and e["m"] == "SampledTokens"
                    and e.get("step") == step)
    if batch is None or answer is None:
        return None
    t["worker_send"] = answer["t"]
    worker = answer["p"]

    def of_step(event: str) -> Callable[[Event], bool]:
        return lambda e: (e["p"] == worker and e["e"] == event and e["m"] == "ForwardBatch"
                          and e.get("step") == step)

    at("worker_take", of_step("take"))
    launch = at("launch", of_step("launch"))
    if launch is not None and "tokens" in launch:
        t["tokens"] = launch["tokens"]  # the step's prefill and decode tokens
    at("launched", of_step("launched"))
    at("ready", of_step("ready"))
    at("detok_take", lambda e: e["e"] == "take" and e["m"] == "TokenBatch" and _names(e, rid)
       and e["t"] >= out["t"])
    at("detok_send", lambda e: e["e"] == "send" and e["m"] == "RequestOutputBatch"
       and _names(e, rid))
    at("caller_recv", lambda e: e["p"] == caller and e["e"] == "recv" and _names(e, rid))
    at("first", lambda e: e["p"] == caller and e["e"] == "first" and e.get("rid") == rid)
    return t


def _first_token_result(after: list[Event], out: Event, admitted: int) -> Event | None:
    """The SampledTokens whose step made the first token that `out` carries. A process writes
    the takes of a drain before it handles any of them, so a loaded worker's next step can be
    taken in the drain with the one that made the token: of the drain's results (its last run
    of SampledTokens takes before `out`), the first whose batch was sent after the scheduler
    took the request and held a prefill row; the drain's last where none is known to."""
    run: list[Event] = []
    closed = False
    for e in after:
        if e["t"] > out["t"]:
            break
        if e["p"] != out["p"]:
            continue
        if e["e"] == "take" and e["m"] == "SampledTokens":
            if closed:
                run, closed = [], False
            run.append(e)
        elif e["e"] == "send" and e is not out:
            closed = True
    if not run:
        return None
    steps = {e.get("step") for e in run}
    sent_at: dict[Any, int] = {}
    prefill: dict[Any, bool] = {}
    for e in after:
        if e["t"] > out["t"]:
            break
        if e["m"] != "ForwardBatch" or e.get("step") not in steps:
            continue
        if e["e"] == "send" and e["p"] == out["p"]:
            sent_at.setdefault(e["step"], e["t"])
        elif e["e"] == "launch" and "requests" in e and "decodes" in e:
            prefill.setdefault(e["step"], e["requests"] > e["decodes"])
    for e in run:
        if sent_at.get(e.get("step"), -1) >= admitted and prefill.get(e.get("step")):
            return e
    return run[-1]


def stages(path: dict[str, int]) -> dict[str, float]:
    """Stage -> ms, for the stages whose ends the trace holds (a missing event merges its
    stage into the next one)."""
    out: dict[str, float] = {}
    last = path["send"]
    for stage, end in STAGES:
        if end in path:
            out[stage] = (path[end] - last) / 1e6
            last = path[end]
    out["total"] = (last - path["send"]) / 1e6
    return out


def summarize(directory: str, skip: int = 0) -> dict[str, Any]:
    events = load(directory)
    rids = [e["rid"] for e in events if e["e"] == "send" and e["m"] == "GenerateRequest"
            and e.get("rid")]
    rows = []
    for rid in dict.fromkeys(rids):
        path = request_path(events, rid)
        if path is not None:
            rows.append({"rid": rid, "prefill_tokens": path.get("tokens"),
                         "ms": stages(path)})
    measured = rows[skip:]
    summary: dict[str, dict[str, float]] = {}
    for stage in [s for s, _ in STAGES] + ["total"]:
        vals = [r["ms"][stage] for r in measured if stage in r["ms"]]
        if vals:
            summary[stage] = {"median": statistics.median(vals), "mean": statistics.fmean(vals),
                              "min": min(vals), "max": max(vals), "count": len(vals)}
    return {"requests": len(rids), "traced": len(rows), "skipped": min(skip, len(rows)),
            "stages_ms": summary, "per_request": measured}


def trace_parser(module: str, doc: str | None, out_help: str) -> argparse.ArgumentParser:
    """The command line of a tool that reads a --trace-messages-dir folder: the folder, and
    where its JSON goes."""
    p = argparse.ArgumentParser(prog=f"python -m tessera.benchmarks.{module}", description=doc,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("directory")
    p.add_argument("--out", help=out_help)
    return p


def write_out(path: str | None, result: dict[str, Any]) -> int:
    """--out: the result as JSON there (none given: nothing written); the exit status, 0."""
    if path:
        with open(path, "w") as f:
            json.dump(result, f, indent=1)
    return 0


def main(argv: list[str] | None = None) -> int:
    p = trace_parser("message_trace", __doc__, "write the summary here as JSON")
    p.add_argument("--skip", type=int, default=0, help="leave out the first N requests")
    args = p.parse_args(argv)
    result = summarize(args.directory, args.skip)
    if not result["traced"]:
        print(f"no complete request path in {args.directory} ({result['requests']} requests "
              f"sent)", file=sys.stderr)
        return 1
    print(f"{result['traced']} of {result['requests']} requests traced, first "
          f"{result['skipped']} left out; ms to the first token:")
    for stage, s in result["stages_ms"].items():
        print(f"  {stage:34s} median {s['median']:8.3f}  mean {s['mean']:8.3f}  "
              f"min {s['min']:8.3f}  max {s['max']:8.3f}")
    return write_out(args.out, result)


if __name__ == "__main__":
    sys.exit(main())
