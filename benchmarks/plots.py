"""Optional PNG plots. matplotlib is an optional extra (`pip install tessera[bench]`): without
it every function here returns None and the benchmark still writes its JSON."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any


def _pyplot() -> Any | None:
    try:
        import matplotlib

        matplotlib.use("Agg")  # no display on servers
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def available() -> bool:
    return _pyplot() is not None


def latency_cdfs(series: dict[str, Sequence[float]], path: str, title: str,
                 xlabel: str = "ms") -> str | None:
    """One empirical CDF per named series (e.g. "TTFT c=32"), log x axis. Returns the path."""
    plt = _pyplot()
    if plt is None or not any(series.values()):
        return None
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, values in series.items():
        vals = sorted(v for v in values if v > 0)
        if not vals:
            continue
        ys = [(i + 1) / len(vals) for i in range(len(vals))]
        ax.step(vals, ys, where="post", label=name)
    ax.set_xscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel("fraction of samples")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, plt, path)


def throughput_vs_concurrency(concurrency: Sequence[int], tok_per_s: Sequence[float],
                              itl_p99_ms: Sequence[float], path: str, title: str) -> str | None:
    """Output tokens/s (left axis) and ITL p99 (right axis) against concurrency."""
    plt = _pyplot()
    if plt is None or not concurrency:
        return None
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.plot(concurrency, tok_per_s, "o-", color="tab:blue", label="output tokens/s")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("concurrent requests")
    ax.set_ylabel("output tokens/s", color="tab:blue")
    right = ax.twinx()
    right.plot(concurrency, itl_p99_ms, "s--", color="tab:red", label="ITL p99 (ms)")
    right.set_ylabel("ITL p99 (ms)", color="tab:red")
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    return _save(fig, plt, path)


def bars(labels: Sequence[str], values: Sequence[float], path: str, title: str,
         ylabel: str) -> str | None:
    """A bar per label, its value written on top (tessera vs peer, cache vs no cache)."""
    plt = _pyplot()
    if plt is None or not labels:
        return None
    fig, ax = plt.subplots(figsize=(6, 4))
    rects = ax.bar(list(labels), list(values), color=["tab:blue", "tab:gray", "tab:orange"]
                   [: len(labels)])
    for rect, value in zip(rects, values, strict=True):
        ax.annotate(f"{value:.1f}", (rect.get_x() + rect.get_width() / 2, rect.get_height()),
                    ha="center", va="bottom")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    return _save(fig, plt, path)


def _save(fig: Any, plt: Any, path: str) -> str:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
