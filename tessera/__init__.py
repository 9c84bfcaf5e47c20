"""tessera: a portable LLM serving engine.

Importing the package is cheap: the offline engine (`tessera.LLM`, `tessera.Engine`) and
everything heavy (torch, zmq) load only when first used.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

__all__ = ["LLM", "Engine", "SamplingParams", "__version__"]


def __getattr__(name: str) -> Any:
    if name in ("LLM", "Engine"):
        from tessera import offline

        return getattr(offline, name)
    if name == "SamplingParams":
        from tessera.bus.messages import SamplingParams

        return SamplingParams
    raise AttributeError(f"module 'tessera' has no attribute {name!r}")
