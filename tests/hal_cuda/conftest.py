"""Run the cuda plugin's Triton kernels on the CPU through Triton's interpreter.

`triton.jit` decides at decoration time whether a kernel is compiled or interpreted, so the
kernel modules are (re)imported with TRITON_INTERPRET=1 set. The interpreter mishandles bf16
arithmetic, so these tests use fp32 at small shapes; the GPU tests cover bf16.
"""

from __future__ import annotations

import importlib
import os
import sys
from types import ModuleType

import pytest

KERNEL_MODULES = ("norm", "elementwise", "decode_attention", "extend_attention", "sampling")


def _interpreted(name: str) -> ModuleType:
    pytest.importorskip("triton")
    full = f"tessera.hal.cuda.{name}"
    old = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        module = sys.modules.get(full)
        if module is not None and getattr(module, "_interpreted", False):
            return module
        module = importlib.reload(module) if module is not None else importlib.import_module(full)
        module._interpreted = True  # type: ignore[attr-defined]
        return module
    finally:
        if old is None:
            os.environ.pop("TRITON_INTERPRET", None)
        else:
            os.environ["TRITON_INTERPRET"] = old


@pytest.fixture(scope="session")
def kernels() -> dict[str, ModuleType]:
    # Reload dependencies first: extend_attention imports helpers from decode_attention.
    return {name: _interpreted(name) for name in KERNEL_MODULES}
