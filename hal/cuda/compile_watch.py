"""Kernel compiles seen by this process, for the worker's slow-launch report.

Triton compiles (or loads from its disk cache) a kernel the first time it meets a new
specialization: a new constexpr, a new dtype, or an integer argument newly divisible by 16 or
equal to 1. While serving that costs a step 0.1-3 s. `install()` chains a hook onto Triton's
`jit_post_compile_hook`, which Triton calls once per kernel it puts in its in-memory cache,
and counts them with the kernel's name and specialization, so that a slow step can say which
kernel compiled instead of leaving it to be guessed.
"""

from __future__ import annotations

import threading
from collections import deque
from typing import Any

_lock = threading.Lock()
_count = 0
_recent: deque[str] = deque(maxlen=32)
_installed = False


def install() -> bool:
    """Start counting (idempotent); False when this Triton has no such hook."""
    global _installed
    with _lock:
        if _installed:
            return True
        try:
            from triton import knobs
        except ImportError:
            return False
        runtime = getattr(knobs, "runtime", None)
        if runtime is None or not hasattr(runtime, "jit_post_compile_hook"):
            return False
        previous = runtime.jit_post_compile_hook

        def hook(*args: Any, **kwargs: Any) -> Any:
            _note(kwargs.get("repr") or str(kwargs.get("fn", "?")))
            return previous(*args, **kwargs) if previous is not None else None

        runtime.jit_post_compile_hook = hook
        _installed = True
        return True


def _note(what: str) -> None:
    global _count
    with _lock:
        _count += 1
        _recent.append(what)


def compiles() -> int:
    """Kernels compiled or loaded into memory since `install()`."""
    return _count


def take_recent() -> list[str]:
    """The kernels noted since the last call (at most the last 32), oldest first. The worker
    asks at every launch: with nothing noted (the usual case) no lock is taken."""
    if not _recent:
        return []
    with _lock:
        out = list(_recent)
        _recent.clear()
    return out
