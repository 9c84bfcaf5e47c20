"""CUDA graph runner (the `GraphRunner` contract, hal/platform.py).

All graphs share one memory pool, so the temporaries of every captured batch size come from
the same reserved memory (capture the largest batch first: the smaller ones then fit in what it
left). Captures and their warm-up run on a side stream of their own.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from tessera.hal.platform import GraphRunner


class _Capture:
    """torch.cuda.graph without its per-capture device synchronize and empty_cache (and, in
    older torch, gc.collect): `capture` synchronizes once after the warm-up runs, and a
    capture of twenty shapes in a row paid those for nothing (SGLang and vLLM measured 2-3x
    faster captures without them)."""

    def __init__(self, graph: torch.cuda.CUDAGraph, pool: Any, stream: torch.cuda.Stream
                 ) -> None:
        self.graph, self.pool = graph, pool
        self.stream_ctx = torch.cuda.stream(stream)

    def __enter__(self) -> _Capture:
        self.stream_ctx.stream.wait_stream(torch.cuda.current_stream())  # (ordering only)
        self.stream_ctx.__enter__()
        # thread_local: the worker's socket threads may touch CUDA state meanwhile.
        self.graph.capture_begin(self.pool, capture_error_mode="thread_local")
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self.graph.capture_end()
        finally:
            self.stream_ctx.__exit__(None, None, None)


class CudaGraphRunner(GraphRunner):
    def __init__(self, device: torch.device | None = None, warmup_runs: int = 2) -> None:
        self.device = device if device is not None else torch.device(
            "cuda", torch.cuda.current_device())
        self.warmup_runs = warmup_runs
        self.pool = torch.cuda.graph_pool_handle()
        self.graphs: dict[Any, torch.cuda.CUDAGraph] = {}
        self._stream: torch.cuda.Stream | None = None
        self._active: tuple[Any, Any] | None = None  # (key, its _Capture)

    # --- the GraphRunner contract ---------------------------------------------------------
    def begin_capture(self, key: Any) -> None:
        if self._active is not None:
            raise RuntimeError(f"begin_capture({key!r}) while capturing {self._active[0]!r}; "
                               f"call end_capture first")
        if key in self.graphs:
            raise ValueError(f"a graph for {key!r} is already captured; reset() first")
        graph = torch.cuda.CUDAGraph()
        if self._stream is None:
            self._stream = torch.cuda.Stream(device=self.device)
        ctx = _Capture(graph, self.pool, self._stream)
        ctx.__enter__()
        self.graphs[key] = graph
        self._active = (key, ctx)

    def end_capture(self, key: Any) -> None:
        if self._active is None or self._active[0] != key:
            raise RuntimeError(f"end_capture({key!r}) without a matching begin_capture")
        _, ctx = self._active
        self._active = None
        ctx.__exit__(None, None, None)

    def replay(self, key: Any) -> None:
        graph = self.graphs.get(key)
        if graph is None:
            raise KeyError(f"no graph captured for {key!r}; captured: {sorted(self.graphs)}")
        graph.replay()

    def reset(self) -> None:
        if self._active is not None:
            raise RuntimeError("reset() during a capture")
        self.graphs.clear()
        torch.cuda.synchronize(self.device)
        self.pool = torch.cuda.graph_pool_handle()

    def warm_up(self, fn: Callable[[], Any]) -> None:
        """On the capture stream, then wait for it: the capture must find everything
        compiled and allocated. The first capture warms up `warmup_runs` times; later ones
        (smaller shapes of the same work, whose workspaces exist by then) once, which still
        compiles a new shape's kernels."""
        if self._stream is None:
            self._stream = torch.cuda.Stream(device=self.device)
        self._stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self._stream):
            for _ in range(self.warmup_runs if not self.graphs else 1):
                fn()
        torch.cuda.current_stream(self.device).wait_stream(self._stream)
        torch.cuda.synchronize(self.device)
