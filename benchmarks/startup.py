"""`tessera bench startup`: B10, the time from `tessera serve` to ready, by phase.

    tessera bench startup --model benchmarks/configs/llama3-8b.json --load-format dummy
                          [--runs 2] [--real-weights] [-- more tessera serve flags]

Each run starts `tessera serve` with the flags given (graphs on unless they say otherwise),
waits until /health answers 200, reads the engine's own start-up report from /status
(bus/startup.py: ready_s from the launch of `tessera serve` to every process ready, and its
phases: processes_up, platform, weights, kv_arena, graph_capture, warmup, other), and stops
it. Figures: `ready_s` and `phases` are the median run's (the first run may pay for cold
compile caches; every run is kept under `runs`), `ready_wall_s` as this benchmark saw it
(process start to /health 200, so also the launcher's own interpreter start).

--real-weights also writes a Hugging Face folder of the same shape (bf16 safetensors of random
values, a word-level tokenizer) and starts the engine from it once: `real_ready_s`,
`real_phases`. It is skipped with a reason (in the result) when the disk has less room than
the weights plus 10% or the weights exceed --real-max-gb; the folder is deleted afterwards
unless --keep-weights.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
import urllib.request
from typing import Any

from tessera.benchmarks.common import default_results_dir, new_result, write_result
from tessera.benchmarks.server_launch import ServerProcess


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="benchmarks/configs/llama3-8b.json")
    p.add_argument("--load-format", default="dummy")
    p.add_argument("--runs", type=int, default=2, help="starts measured (default: 2)")
    p.add_argument("--real-weights", action="store_true",
                   help="also start once from a real-size safetensors folder written here")
    p.add_argument("--weights-dir", default=None,
                   help="where to write it (default: a new folder in the temp dir)")
    p.add_argument("--real-max-gb", type=float, default=40.0,
                   help="skip --real-weights above this size (default: 40)")
    p.add_argument("--keep-weights", action="store_true")
    p.add_argument("--ready-timeout-s", type=float, default=900.0)
    p.add_argument("--out-dir", default=default_results_dir())
    p.add_argument("--name", default="b10_startup")


def fetch_json(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return json.loads(resp.read())  # type: ignore[no-any-return]


def one_start(serve_args: list[str], timeout_s: float, log_path: str) -> dict[str, Any]:
    start = time.perf_counter()
    with ServerProcess(serve_args, log_path=log_path) as server:
        server.wait_ready(timeout_s)
        wall = time.perf_counter() - start
        # /health can answer a moment before the supervisor has taken the server's Ready
        deadline = time.monotonic() + 30.0
        while True:
            status = fetch_json(server.url + "/status")
            if status.get("startup") or time.monotonic() > deadline:
                break
            time.sleep(0.1)
    startup = status.get("startup") or {}
    if not startup.get("phases"):
        raise RuntimeError(f"the server reported no start-up phases: {status}")
    return {"ready_wall_s": round(wall, 3), "ready_s": round(float(startup["ready_s"]), 3),
            "phases": startup["phases"], "stages": startup.get("stages", {}),
            "detail": startup.get("detail", {})}


def median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    order = sorted(runs, key=lambda r: r["ready_s"])
    return order[(len(order) - 1) // 2]


def real_weights_run(args: argparse.Namespace, extra: list[str], log: str
                     ) -> dict[str, Any]:
    from tessera.benchmarks.weights_folder import weights_bytes, write_folder

    need = weights_bytes(args.model)
    folder = args.weights_dir or tempfile.mkdtemp(prefix="tessera-b10-weights-")
    os.makedirs(folder, exist_ok=True)
    free = shutil.disk_usage(folder).free
    if need > args.real_max_gb * 2**30:
        return {"skipped": f"weights of {need / 2**30:.1f} GiB exceed --real-max-gb "
                           f"{args.real_max_gb:g}"}
    if free < need * 1.1:
        return {"skipped": f"{free / 2**30:.1f} GiB free in {folder}, the weights need "
                           f"{need / 2**30:.1f} GiB"}
    try:
        device = "cpu"
        try:
            import torch

            if torch.cuda.is_available():
                device = "cuda"
        except ImportError:
            pass
        written = write_folder(args.model, folder, device=device)
        print(f"[bench] wrote {written.bytes / 2**30:.1f} GiB in {written.shards} shard(s) in "
              f"{written.seconds:.1f} s to {folder}", file=sys.stderr)
        if not args.keep_weights:
            # Page cache holds what was just written: a start right now would read memory,
            # not the disk. Ask the kernel to drop this folder's pages (no root needed).
            drop_page_cache(folder)
        run = one_start(["--model", folder, *extra], args.ready_timeout_s, log)
        return {"ready_s": run["ready_s"], "phases": run["phases"], "detail": run["detail"],
                "weights_gb": round(written.bytes / 1e9, 2), "shards": written.shards,
                "write_s": round(written.seconds, 1)}
    finally:
        if not args.keep_weights:
            shutil.rmtree(folder, ignore_errors=True)


def drop_page_cache(folder: str) -> None:
    for name in os.listdir(folder):
        path = os.path.join(folder, name)
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            continue
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        except (OSError, AttributeError):
            pass
        finally:
            os.close(fd)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="tessera bench startup", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_args(p)
    args, extra = p.parse_known_args(argv)
    extra = [a for a in extra if a != "--"]
    log_dir = os.path.join(tempfile.gettempdir(), "tessera-bench-logs")
    os.makedirs(log_dir, exist_ok=True)
    log = os.path.join(log_dir, f"b10-{os.getpid()}.log")
    print(f"[bench] server log: {log}", file=sys.stderr)
    serve_args = ["--model", args.model, "--load-format", args.load_format, *extra]
    runs = []
    for i in range(args.runs):
        run = one_start(serve_args, args.ready_timeout_s, log)
        print(f"[bench] start {i + 1}/{args.runs}: ready in {run['ready_s']:.2f} s "
              f"({run['ready_wall_s']:.2f} s seen from here): {run['phases']}", file=sys.stderr)
        runs.append(run)
    chosen = median_run(runs)
    config = {k: v for k, v in vars(args).items() if k not in ("out_dir", "name")}
    config["serve_flags"] = extra
    result = new_result("B10", config)
    result["figures"] = {
        "ready_s": chosen["ready_s"], "phases": chosen["phases"],
        "ready_wall_s": chosen["ready_wall_s"], "stages": chosen["stages"],
        "detail": chosen["detail"], "ready_s_each": [r["ready_s"] for r in runs],
        "runs": runs, "target_ready_s": 15.0,
    }
    if args.real_weights:
        try:
            result["figures"]["real"] = real_weights_run(args, extra, log)
        except Exception as exc:  # the dummy starts' figures are B10's own: keep them
            result["figures"]["real"] = {"failed": f"{type(exc).__name__}: {exc}"}
            print(f"[bench] B10 real-weights start failed: {exc}", file=sys.stderr)
        real = result["figures"]["real"]
        if "ready_s" in real:
            result["figures"]["real_ready_s"] = real["ready_s"]
            result["figures"]["real_phases"] = real["phases"]
    path = write_result(result, args.out_dir, args.name)
    print(f"[bench] B10: ready in {chosen['ready_s']:.2f} s -> {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
