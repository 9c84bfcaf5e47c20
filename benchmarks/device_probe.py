"""Measure the two roofline constants of the device at the start of a run: memory bandwidth
(a large device-to-device copy, read + write bytes over time) and matmul peak (a large square
matmul in the run's dtype). Either can be given instead (`--bandwidth-gbps`, `--peak-tflops`).
"""

from __future__ import annotations

import time
from typing import Any

from tessera.benchmarks.roofline import Device


def _sync(torch: Any, device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _best_time(fn: Any, torch: Any, device: str, repeats: int) -> float:
    fn()  # warm-up (allocations, kernel selection)
    _sync(torch, device)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        _sync(torch, device)
        best = min(best, time.perf_counter() - t0)
    return best


def measure_bandwidth_gbps(device: str = "cuda", nbytes: int | None = None,
                           repeats: int = 10) -> float:
    """Copy bandwidth in GB/s, counting the bytes read and the bytes written."""
    import torch

    if nbytes is None:
        nbytes = 2 << 30 if device.startswith("cuda") else 256 << 20
    src = torch.empty(nbytes // 4, dtype=torch.float32, device=device).fill_(1.0)
    dst = torch.empty_like(src)
    seconds = _best_time(lambda: dst.copy_(src), torch, device, repeats)
    return 2 * nbytes / seconds / 1e9


def measure_peak_tflops(device: str = "cuda", dtype: str = "bfloat16", n: int | None = None,
                        repeats: int = 10) -> float:
    """Dense matmul throughput in TFLOP/s for an n x n x n product."""
    import torch

    torch_dtype = getattr(torch, dtype)
    if n is None:
        n = 8192 if device.startswith("cuda") else 1024
    a = torch.randn(n, n, device=device).to(torch_dtype)
    b = torch.randn(n, n, device=device).to(torch_dtype)
    inner = 10 if device.startswith("cuda") else 1  # amortize launch cost on a fast device

    def work() -> None:
        for _ in range(inner):
            torch.matmul(a, b)

    seconds = _best_time(work, torch, device, repeats) / inner
    return 2 * n**3 / seconds / 1e12


def probe(device: str, dtype: str, bandwidth_gbps: float | None = None,
          peak_tflops: float | None = None) -> tuple[Device, dict[str, str]]:
    """The roofline Device, measuring what was not given. Also says where each number came
    from ("measured" / "given") for the result JSON."""
    source = {"bandwidth": "given", "peak": "given"}
    if bandwidth_gbps is None:
        bandwidth_gbps = measure_bandwidth_gbps(device)
        source["bandwidth"] = "measured"
    if peak_tflops is None:
        peak_tflops = measure_peak_tflops(device, dtype)
        source["peak"] = "measured"
    return Device(bandwidth_gbps=bandwidth_gbps, peak_tflops=peak_tflops), source


def torch_device() -> str:
    try:
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    except ImportError:
        return "cpu"
