"""What every benchmark shares: the result JSON (machine, device, commit, versions, config,
figures), percentile summaries, and where results go.

    result = new_result("B1", config={...}, device=detect_device())
    result["figures"] = {"decode_ms_per_step": 4.1, "ttft_ms": 20.0}
    path = write_result(result, out_dir, "b1_latency")
"""

from __future__ import annotations

import datetime as _dt
import importlib.metadata
import json
import math
import os
import platform
import socket
import subprocess
from collections.abc import Sequence
from typing import Any

WORKLOADS = ("B1", "B2", "B3", "B4", "B5", "B7", "B8", "B9", "B10", "B11", "B12", "C1", "C2",
             "HOST")

# The figures each workload must report (BENCHMARKS.md). B3 keeps one entry per
# concurrency tier under figures["tiers"], each with TIER_FIGURES.
REQUIRED_FIGURES: dict[str, tuple[str, ...]] = {
    "B1": ("decode_ms_per_step", "ttft_ms"),
    "B2": ("output_tok_per_s", "roofline_bound_tok_per_s", "roofline_fraction"),
    "B3": ("tiers",),
    "B4": ("cache_hit_rate", "ideal_hit_rate", "speedup_vs_no_cache"),
    "B5": ("tp2_b1_ratio", "tp2_b2_ratio", "pp2_b2_ratio"),
    "B7": ("dp2_throughput_ratio", "dp2_hit_rate_fraction", "single", "replicas"),
    "B8": ("fraction_of_plain", "plain", "grammar"),
    "B9": ("copy_speedup", "random_ratio"),
    "B10": ("ready_s", "phases"),
    "B11": ("decode_ms_per_step", "roofline_fraction", "moe_gemm_fraction_of_dense"),
    # B12's parts run together or as separate commands merged into one result (quant.py),
    # and its figure names carry the variants measured: none is required of every run
    "B12": (),
    "C1": ("output_tok_per_s", "peer_output_tok_per_s", "speedup_vs_peer"),
    "C2": ("scheduler_ms_per_step_bs256",),
    "HOST": ("tiers",),
}
TIER_FIGURES = ("concurrency", "ttft_p50_ms", "ttft_p99_ms", "itl_p50_ms", "itl_p99_ms",
                "output_tok_per_s", "errors")

_VERSIONED = ("torch", "transformers", "numpy", "pyzmq", "msgpack", "aiohttp", "triton",
              "xgrammar", "tessera")


def repo_root() -> str:
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def default_results_dir() -> str:
    """benchmarks/results/ of the checkout this file lives in."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


def git_commit() -> str:
    """The commit measured: TESSERA_COMMIT when set (a copy of the tree on a GPU machine may
    carry stale git metadata), else git's HEAD, "-dirty" with uncommitted changes."""
    if os.environ.get("TESSERA_COMMIT"):
        return os.environ["TESSERA_COMMIT"]
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo_root(), capture_output=True,
                             text=True, timeout=5)
        commit = out.stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               cwd=repo_root(), capture_output=True, text=True, timeout=5)
        return commit + ("-dirty" if dirty.stdout.strip() else "") if commit else "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def versions() -> dict[str, str]:
    found = {"python": platform.python_version()}
    for name in _VERSIONED:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return found


def machine() -> dict[str, Any]:
    info: dict[str, Any] = {
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
    }
    try:
        # Other work on the machine changes every figure: say how busy it was at the start.
        info["load_average_1m"] = round(os.getloadavg()[0], 2)
    except OSError:
        pass
    try:
        with open("/proc/meminfo") as f:
            kb = int(f.readline().split()[1])
        info["memory_gb"] = round(kb / 2**20, 1)
    except (OSError, ValueError, IndexError):
        pass
    return info


def detect_device() -> str:
    """'NVIDIA H200'-style name of the first accelerator, else 'cpu'."""
    try:
        import torch

        if torch.cuda.is_available():
            return torch.cuda.get_device_name(0)
    except ImportError:
        pass
    return "cpu"


def new_result(workload: str, config: dict[str, Any], device: str | None = None) -> dict[str, Any]:
    if workload not in WORKLOADS:
        raise ValueError(f"unknown workload {workload!r}; one of {', '.join(WORKLOADS)}")
    return {
        "workload": workload,
        "time": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "machine": machine(),
        "device": device or detect_device(),
        "commit": git_commit(),
        "versions": versions(),
        "config": portable_paths({k: v for k, v in config.items() if v is not None}),
        # The plugins' switches for A/B runs (HAL_CUDA_DECODE_FP8_TILE, ...) set for this run.
        "plugin_env": {k: v for k, v in sorted(os.environ.items()) if k.startswith("HAL_")},
        "figures": {},
    }


def portable_paths(value: Any) -> Any:
    """Paths of this machine written so that a committed result does not carry them: inside
    the checkout relative to it, in the temp dir as $TMPDIR/..., in the home as ~/..."""
    import tempfile

    if isinstance(value, dict):
        return {k: portable_paths(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [portable_paths(v) for v in value]
    if not isinstance(value, str) or not os.path.isabs(value):
        return value
    for root, label in ((repo_root(), "."), (tempfile.gettempdir(), "$TMPDIR"),
                        (os.path.expanduser("~"), "~")):
        if value == root or value.startswith(root.rstrip(os.sep) + os.sep):
            rel = os.path.relpath(value, root)
            return rel if label == "." else os.path.join(label, rel)
    return value


def missing_figures(result: dict[str, Any]) -> list[str]:
    """The required figure names the result lacks (empty when complete)."""
    figures = result.get("figures", {})
    missing = [n for n in REQUIRED_FIGURES.get(result.get("workload", ""), ()) if n not in figures]
    for i, tier in enumerate(figures.get("tiers", []) if result.get("workload") == "B3" else []):
        missing += [f"tiers[{i}].{n}" for n in TIER_FIGURES if n not in tier]
    return missing


def write_result(result: dict[str, Any], out_dir: str, name: str, required: bool = True) -> str:
    """Write `name`.json under out_dir (created) and return its path. Refuses an incomplete
    result, so that a broken benchmark fails loudly instead of committing a hole (`required`
    False: one part of a workload, run alone, which the workload's own run completes)."""
    missing = missing_figures(result) if required else []
    if missing:
        raise ValueError(f"result for {result.get('workload')} lacks figures: {missing}")
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, f"{name}.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(_clean(result), f, indent=1, sort_keys=False)
        f.write("\n")
    return path


def _clean(value: Any) -> Any:
    """JSON has no NaN/inf: write them as null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    if hasattr(value, "item") and callable(value.item):  # numpy scalars
        return _clean(value.item())
    return value


# --------------------------------------------------------------------------------------------
# Statistics
# --------------------------------------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default), q in [0, 100]; NaN for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def summarize(values: Sequence[float]) -> dict[str, float]:
    """mean, p50, p90, p99 (and count) of a list of numbers."""
    vals = list(values)
    return {
        "mean": sum(vals) / len(vals) if vals else float("nan"),
        "p50": percentile(vals, 50),
        "p90": percentile(vals, 90),
        "p99": percentile(vals, 99),
        "count": len(vals),
    }
