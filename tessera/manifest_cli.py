"""`tessera manifest`: the runs recorded under the runs folder, and what changed between two.

    tessera manifest list                 newest last: id, kind, model, outcome
    tessera manifest show RUN             the manifest as JSON
    tessera manifest diff A B [--all]     every setting that differs, one line each:
                                          arguments.max_running_requests: 256 -> 8

RUN is a manifest.json, a folder holding one (a run directory), a run id (or a unique part of
one) in the runs folder, or -1 for the newest run, -2 for the one before, and so on. The diff
leaves out `run` (times, pid, run directory, start-up figures: they differ every time) unless
--all; it exits 0 when nothing differs, 1 otherwise (like diff).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from tessera.config import Env
from tessera.manifest import MANIFEST, runs_dir

MISSING = "<absent>"


def recorded_runs(folder: str) -> list[str]:
    """Ids of the runs in the runs folder, oldest first."""
    try:
        return sorted(d for d in os.listdir(folder)
                      if os.path.isfile(os.path.join(folder, d, MANIFEST)))
    except OSError:
        return []


def find_manifest(ref: str, folder: str) -> str:
    if os.path.isfile(ref):
        return ref
    if os.path.isdir(ref) and os.path.isfile(os.path.join(ref, MANIFEST)):
        return os.path.join(ref, MANIFEST)
    runs = recorded_runs(folder)
    if ref.lstrip("-").isdigit() and ref.startswith("-"):
        index = int(ref)
        if -len(runs) <= index < 0:
            return os.path.join(folder, runs[index], MANIFEST)
        raise SystemExit(f"tessera manifest: {ref}: only {len(runs)} run(s) recorded in "
                         f"{folder}")
    matches = [r for r in runs if ref in r]
    if len(matches) == 1:
        return os.path.join(folder, matches[0], MANIFEST)
    if matches:
        raise SystemExit(f"tessera manifest: {ref!r} matches {len(matches)} runs; give more "
                         f"of the id: {', '.join(matches[-5:])}")
    raise SystemExit(f"tessera manifest: no manifest {ref!r}: not a file, a folder holding "
                     f"{MANIFEST}, nor a run in {folder} (tessera manifest list)")


def load(path: str) -> dict[str, Any]:
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    if not isinstance(data, dict):
        raise SystemExit(f"tessera manifest: {path} does not hold a manifest")
    return data


def flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    """{"a": {"b": 1}} -> {"a.b": 1}; lists stay whole values."""
    if isinstance(value, dict) and value:
        out: dict[str, Any] = {}
        for key, inner in value.items():
            out.update(flatten(inner, f"{prefix}.{key}" if prefix else str(key)))
        return out
    return {prefix: value}


def diff(a: dict[str, Any], b: dict[str, Any], include_run: bool = False
         ) -> list[tuple[str, Any, Any]]:
    """(dotted key, value in a, value in b) for every key whose value differs."""
    skip = ("id",) if include_run else ("id", "run")
    fa = flatten({k: v for k, v in a.items() if k not in skip})
    fb = flatten({k: v for k, v in b.items() if k not in skip})
    return [(key, fa.get(key, MISSING), fb.get(key, MISSING))
            for key in sorted(set(fa) | set(fb)) if fa.get(key, MISSING) != fb.get(key, MISSING)]


def _show(value: Any) -> str:
    return value if value is MISSING else json.dumps(value)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tessera manifest", description=__doc__.split("\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog=__doc__.split("\n", 2)[2])
    parser.add_argument("--runs-dir", default=None,
                        help="the runs folder (default: TESSERA_RUNS_DIR, else "
                             "~/.local/state/tessera/runs)")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="the recorded runs, newest last")
    show = sub.add_parser("show", help="one manifest as JSON")
    show.add_argument("run")
    d = sub.add_parser("diff", help="what changed between two runs")
    d.add_argument("a")
    d.add_argument("b")
    d.add_argument("--all", action="store_true", help="include the `run` section")
    args = parser.parse_args(argv)
    folder = args.runs_dir or runs_dir(Env.read().runs_dir)
    if args.command == "list":
        for run in recorded_runs(folder):
            data = load(os.path.join(folder, run, MANIFEST))
            model = data.get("model", {}).get("name", "")
            print(f"{run}  {data.get('kind', '?'):<8} {model}  "
                  f"{data.get('run', {}).get('outcome', '')}")
        return 0
    if args.command == "show":
        print(json.dumps(load(find_manifest(args.run, folder)), indent=1))
        return 0
    a_path, b_path = find_manifest(args.a, folder), find_manifest(args.b, folder)
    changes = diff(load(a_path), load(b_path), include_run=args.all)
    for key, old, new in changes:
        print(f"{key}: {_show(old)} -> {_show(new)}")
    if not changes:
        print("no difference" + ("" if args.all else " (outside `run`; --all compares it too)"))
    return 1 if changes else 0


if __name__ == "__main__":
    sys.exit(main())
