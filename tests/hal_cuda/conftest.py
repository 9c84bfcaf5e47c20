"""Run the cuda plugin's Triton kernels on the CPU through Triton's interpreter.

Triton decides at decoration time whether a `@triton.jit` function is compiled or interpreted,
and that includes its own library functions (tl.sum, tl.max, ...), decorated when triton is
first imported. So TRITON_INTERPRET=1 must be set before triton is imported: this conftest sets
it at import on a machine without a GPU (nothing else in the suite uses Triton on the CPU). If
triton was nevertheless imported earlier, the tests fail and say so (re-importing triton in
one process does not reliably switch its own library functions to the interpreter).
The interpreter mishandles bf16 arithmetic, so these tests use fp32 at small shapes; the GPU
tests cover bf16 and the compiled kernels.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType

import pytest
import torch

KERNEL_MODULES = ("norm", "elementwise", "decode_attention", "extend_attention", "sampling",
                  "gemv", "token_mask", "moe", "quant_linear", "token_gemm")
_ON_GPU = torch.cuda.is_available()

if not _ON_GPU:
    os.environ["TRITON_INTERPRET"] = "1"


@pytest.fixture(scope="session")
def kernels() -> dict[str, ModuleType]:
    """The kernel modules with interpreted kernels (import order: extend_attention imports
    helpers from decode_attention)."""
    if _ON_GPU:
        pytest.skip("interpreter tests run on machines without a GPU; the GPU tests cover "
                    "the compiled kernels")
    pytest.importorskip("triton")
    os.environ["TRITON_INTERPRET"] = "1"
    import triton

    if not triton.knobs.runtime.interpret:
        pytest.fail("triton was imported before tests/hal_cuda/conftest.py could set "
                    "TRITON_INTERPRET=1 (some earlier test module imports it at collection); "
                    "import triton lazily there, or run tests/hal_cuda in its own pytest process")
    return {name: importlib.import_module(f"tessera.hal.cuda.{name}") for name in KERNEL_MODULES}
