"""`tessera bench b5`: workload B5 (BENCHMARKS.md) in one command — B1 (batch-1 latency) and
B2 (offline throughput) at TP=1, TP=2 and PP=2, one layout after the other on the same
machine, and the ratios of the two-device layouts to one device.

    tessera bench b5 [--model benchmarks/configs/llama3-8b.json] [--suffix h200]
                     [--layouts tp1,tp2,pp2] [--bandwidth-gbps 4220 --peak-tflops 794]
                     [--num-requests 256] [--iters 5] [--b1-flags "..."] [--b2-flags "..."]
                     [engine flags...]

Writes b5_<layout>_b1_<suffix>.json (a B1 result), b5_<layout>_b2_<suffix>.json (a B2
result) and b5_<suffix>.json (workload "B5"): `tp2_b1_ratio` (TP=2 ms/step over TP=1's),
`tp2_b2_ratio` and `pp2_b2_ratio` (tok/s over TP=1's), each part's figures and roofline
fraction (every part's bound is over the devices it used: roofline.parallel_devices).

Each layout is one engine start-up: B1 runs on it, then B2. A layout whose part fails is
recorded in `errors` and the others still run. A TP layout that fails with the one-shot
all-reduce on is run once more with it off (--all-reduce-one-shot-max-kb 0), and the result
says so (`fallbacks`).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import sys
import traceback
from dataclasses import dataclass
from typing import Any

from tessera.benchmarks import latency, offline
from tessera.benchmarks.common import default_results_dir, new_result, write_result

DEFAULT_MODEL = os.path.join(os.path.dirname(os.path.abspath(__file__)), "configs",
                             "llama3-8b.json")


@dataclass(frozen=True)
class Layout:
    name: str
    tp_size: int
    pp_size: int

    @property
    def flags(self) -> list[str]:
        return ["--tp-size", str(self.tp_size), "--pp-size", str(self.pp_size)]


LAYOUTS = {"tp1": Layout("tp1", 1, 1), "tp2": Layout("tp2", 2, 1), "pp2": Layout("pp2", 1, 2),
           "tp2pp2": Layout("tp2pp2", 2, 2)}


def _read(out_dir: str, name: str) -> dict[str, Any] | None:
    try:
        with open(os.path.join(out_dir, f"{name}.json"), encoding="utf-8") as f:
            return json.load(f)  # type: ignore[no-any-return]
    except FileNotFoundError:
        return None


def _ratio(num: float | None, den: float | None) -> float | None:
    if num is None or den is None or den == 0:
        return None
    return num / den


def combine(parts: dict[str, dict[str, dict[str, Any] | None]]) -> dict[str, Any]:
    """The B5 figures from the parts' results: parts[layout]["b1" | "b2"] (None: missing)."""

    def fig(layout: str, part: str, key: str) -> float | None:
        result = parts.get(layout, {}).get(part)
        value = None if result is None else result["figures"].get(key)
        return None if value is None else float(value)

    figures: dict[str, Any] = {
        "tp2_b1_ratio": _ratio(fig("tp2", "b1", "decode_ms_per_step"),
                               fig("tp1", "b1", "decode_ms_per_step")),
        "tp2_b2_ratio": _ratio(fig("tp2", "b2", "output_tok_per_s"),
                               fig("tp1", "b2", "output_tok_per_s")),
        "pp2_b2_ratio": _ratio(fig("pp2", "b2", "output_tok_per_s"),
                               fig("tp1", "b2", "output_tok_per_s")),
        "pp2_b1_ratio": _ratio(fig("pp2", "b1", "decode_ms_per_step"),
                               fig("tp1", "b1", "decode_ms_per_step")),
    }
    for layout in parts:
        figures[layout] = {
            "b1_decode_ms_per_step": fig(layout, "b1", "decode_ms_per_step"),
            "b1_ttft_ms": fig(layout, "b1", "ttft_ms"),
            "b1_roofline_decode_ms_per_step": fig(layout, "b1", "roofline_decode_ms_per_step"),
            "b1_roofline_fraction": fig(layout, "b1", "roofline_fraction"),
            "b2_output_tok_per_s": fig(layout, "b2", "output_tok_per_s"),
            "b2_roofline_bound_tok_per_s": fig(layout, "b2", "roofline_bound_tok_per_s"),
            "b2_roofline_fraction": fig(layout, "b2", "roofline_fraction"),
        }
    return figures


def per_layout_profile(engine_flags: list[str], layout: str) -> list[str]:
    """The engine flags with --profile-dir D made D/<layout> (each layout's workers write
    their own profiles)."""
    out = list(engine_flags)
    for i, flag in enumerate(out):
        if flag == "--profile-dir" and i + 1 < len(out):
            out[i + 1] = os.path.join(out[i + 1], layout)
        elif flag.startswith("--profile-dir="):
            out[i] = "--profile-dir=" + os.path.join(flag.split("=", 1)[1], layout)
    return out


def _run_part(bench: Any, argv: list[str], llm: Any) -> str | None:
    """Run one part in this process on `llm`; None when it succeeded, else why not."""
    try:
        code = bench.main(argv, llm=llm)
    except Exception as exc:  # noqa: BLE001 - one layout failing must not lose the others
        traceback.print_exc()
        return f"{type(exc).__name__}: {str(exc)[-2000:]}"
    return None if not code else f"exit code {code}"


class LayoutTimeout(Exception):
    """A layout ran past --layout-timeout-s (raised in the main thread by SIGALRM)."""


def _on_alarm(signum: int, frame: Any) -> None:
    raise LayoutTimeout("the layout ran past --layout-timeout-s")


def _run_layout(engine_argv: list[str], parts: dict[str, tuple[Any, list[str]]],
                timeout_s: int) -> dict[str, str]:
    """Start one engine with `engine_argv` and run every part on it (B1 and B2 share the
    engine: one start-up per layout), all within `timeout_s` (a hung layout must not take the
    others' time). The parts that failed, and why."""
    from tessera.benchmarks.engine_args import add_engine_args, engine_kwargs
    from tessera.offline import LLM

    parser = argparse.ArgumentParser(add_help=False)
    add_engine_args(parser)
    kwargs = engine_kwargs(parser.parse_args(engine_argv))
    errors: dict[str, str] = {}
    previous = signal.signal(signal.SIGALRM, _on_alarm)
    signal.alarm(timeout_s)
    try:
        try:
            llm = LLM(**kwargs)
        except Exception as exc:  # noqa: BLE001
            traceback.print_exc()
            return {part: f"the engine did not start: {type(exc).__name__}: "
                          f"{str(exc)[-2000:]}" for part in parts}
        with llm:
            for part, (bench, argv) in parts.items():
                failed = _run_part(bench, [*argv, *engine_argv], llm)
                if failed:
                    errors[part] = failed
                    if "LayoutTimeout" in failed:
                        break
    except LayoutTimeout as exc:  # while the engine stopped
        errors.setdefault(next(iter(parts)), str(exc))
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    for part in parts:  # a part never reached because the time ran out
        if part not in errors and any("LayoutTimeout" in e for e in errors.values()):
            errors[part] = "not run: the layout ran past --layout-timeout-s"
    return errors


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="tessera bench b5", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=DEFAULT_MODEL)
    p.add_argument("--load-format", default="dummy")
    p.add_argument("--suffix", default="h200")
    p.add_argument("--out-dir", default=default_results_dir())
    p.add_argument("--layouts", default="tp1,tp2,pp2",
                   help=f"comma-separated, of {', '.join(LAYOUTS)}")
    p.add_argument("--bandwidth-gbps", type=float)
    p.add_argument("--peak-tflops", type=float)
    p.add_argument("--num-requests", type=int, default=256, help="B2's request count")
    p.add_argument("--iters", type=int, default=5, help="B1's measured requests")
    p.add_argument("--warmup", type=int, default=2, help="B1's unmeasured requests")
    p.add_argument("--layout-timeout-s", type=int, default=170,
                   help="wall-clock limit of one layout (engine start, B1 and B2)")
    p.add_argument("--b1-flags", default="", help="more flags for every B1 part (one string)")
    p.add_argument("--b2-flags", default="", help="more flags for every B2 part (one string)")
    args, engine_flags = p.parse_known_args(argv)
    layouts = [s.strip() for s in args.layouts.split(",") if s.strip()]
    unknown = [name for name in layouts if name not in LAYOUTS]
    if unknown or "tp1" not in layouts:
        p.error(f"--layouts must include tp1 and name only {', '.join(LAYOUTS)}; got "
                f"{args.layouts!r}")
    if any(f in engine_flags for f in ("--tp-size", "--pp-size", "--tensor-parallel-size")):
        p.error("the layouts set --tp-size and --pp-size; leave them out")
    common = ["--out-dir", args.out_dir]
    if args.bandwidth_gbps:
        common += ["--bandwidth-gbps", str(args.bandwidth_gbps)]
    if args.peak_tflops:
        common += ["--peak-tflops", str(args.peak_tflops)]
    part_args = {"b1": (latency, ["--iters", str(args.iters), "--warmup", str(args.warmup),
                                  *shlex.split(args.b1_flags)]),
                 "b2": (offline, ["--no-progress", "--num-requests", str(args.num_requests),
                                  *shlex.split(args.b2_flags)])}
    one_shot_set = any(f.startswith("--all-reduce-one-shot-max-kb") for f in engine_flags)
    names: dict[str, dict[str, str]] = {}
    errors: dict[str, str] = {}
    fallbacks: list[str] = []
    for name in layouts:
        layout = LAYOUTS[name]
        names[name] = {part: f"b5_{name}_{part}_{args.suffix}" for part in part_args}
        runs = {part: (bench, [*common, "--name", names[name][part], *extra])
                for part, (bench, extra) in part_args.items()}
        engine_argv = ["--model", args.model, "--load-format", args.load_format, *layout.flags,
                       *per_layout_profile(engine_flags, name)]
        print(f"[bench] B5 {name}: {' '.join(layout.flags)}", file=sys.stderr, flush=True)
        failed = _run_layout(engine_argv, runs, args.layout_timeout_s)
        if failed and layout.tp_size > 1 and not one_shot_set:
            print(f"[bench] B5 {name} failed ({failed}); again without the one-shot "
                  f"all-reduce", file=sys.stderr, flush=True)
            fallbacks += [f"{name} {part}: {why}" for part, why in failed.items()]
            failed = _run_layout([*engine_argv, "--all-reduce-one-shot-max-kb", "0"], runs,
                                 args.layout_timeout_s)
        errors.update({f"{name} {part}": why for part, why in failed.items()})
    read = {name: {part: _read(args.out_dir, n) if f"{name} {part}" not in errors else None
                   for part, n in by_part.items()}
            for name, by_part in names.items()}
    result = new_result("B5", {**vars(args), "engine_flags": engine_flags,
                               "parts": {k: {p: f"{n}.json" for p, n in v.items()}
                                         for k, v in names.items()}})
    result["figures"] = combine(read)
    result["errors"] = errors
    result["fallbacks"] = fallbacks
    path = write_result(result, args.out_dir, f"b5_{args.suffix}")
    f = result["figures"]

    def show(value: float | None) -> str:
        return "n/a" if value is None else f"{value:.3f}"

    print(f"[bench] B5: tp2_b1_ratio {show(f['tp2_b1_ratio'])} (target <= 0.58), tp2_b2_ratio "
          f"{show(f['tp2_b2_ratio'])} (>= 1.8), pp2_b2_ratio {show(f['pp2_b2_ratio'])} (>= 1.6)"
          f"; {len(errors)} part(s) failed; wrote {path}", file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
