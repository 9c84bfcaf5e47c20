"""Programmatic dependent launch (PDL) of the cuda plugin's Triton kernels, sm_90 and later.

In a CUDA graph (and a stream) a kernel's programs start only once the kernel before it has
finished and its writes are flushed: between two kernels the chip idles through the launch
and the ramp of the next one's first loads. A decode step of one request runs about 330 small
kernels, so that gap is paid 330 times a step. With PDL a kernel is launched with the
programmatic-stream-serialization attribute (Triton's `launch_pdl`): its programs may start
while the kernel before it is still running, and

- every program calls `gdc_wait` (`griddepcontrol.wait`) before it reads or writes anything
  another kernel writes: the wait returns once the kernel before has completed and its
  memory is visible, which transitively covers every kernel before that one;
- right after the wait it calls `gdc_launch_dependents`, so the kernel after it may be
  launched as soon as all of this kernel's programs have passed their wait: one kernel of
  lookahead, never more;
- before the wait a program may touch only what no kernel writes. `HAL_CUDA_PDL=prefetch`
  has the one-token GEMVs issue L2 prefetches of their weight rows there
  (`prefetch_rows_l2`), to stream the weights while the kernel before them finishes. On an
  H200 that was slower, not faster (`tests/hal_cuda/pdl_bench.py`, pdl_bench_h200.json):
  every program prefetches its rows, most of them after the kernel before has already
  finished, so the L2 sees each line requested twice; gate_up's GEMV took 70.9 us against
  54.4 us plain and 53.8 us with PDL alone. So it is not the default.

Measured on an H200 (docs/performance.md, "Programmatic dependent launch"): a bf16 decode
layer of one request 119.6 us against 124.3 us plain, fp8 74.6 against 80.3, int4 87.2
against 93.1; B12's batch-1 steps 4.08 / 2.67 / 3.02 ms against 4.20 / 2.84 / 3.23.

A kernel launched this way after one that is not (a cuBLAS GEMM, a copy) simply waits for it
to complete, as without PDL. `HAL_CUDA_PDL=0` turns it off for A/B runs (`small`: the GEMVs
launched plainly, the other kernels with PDL; `prefetch`: above); unset or 1, it is on where
the device (compute capability 9.0 or later) and Triton (`launch_pdl`) allow. Read once per
process, on the first launch; `forced()` overrides it in tests and benchmarks.
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Iterator
from typing import Any

import torch
import triton
import triton.language as tl

from tessera.hal.cuda import env

VARIABLE = "HAL_CUDA_PDL"
LINE_BYTES = 128  # an L2 line: one prefetch a line


MODES = ("on", "off", "prefetch", "small")


def setting(value: str | None) -> str:
    """The mode `HAL_CUDA_PDL`'s value asks for: on (unset, 1: every kernel of the decode
    path), off (0), prefetch (on, the one-token GEMVs also prefetching their weight rows into
    L2 before their wait) or small (the GEMVs launched plainly, the other kernels with
    PDL)."""
    text = (value or "").strip().lower()
    if text == "" or text in env.ON:
        return "on"
    if text in env.OFF:
        return "off"
    if text in MODES:
        return text
    raise ValueError(f"{VARIABLE}={value!r}: expected 1 (on, the default), 0 (off), "
                     "prefetch or small")


def triton_supports() -> bool:
    """Whether this Triton launches with the PDL attribute (its CUDA options' launch_pdl)."""
    try:
        from triton.backends.nvidia.compiler import CUDAOptions
    except ImportError:
        return False
    return "launch_pdl" in getattr(CUDAOptions, "__dataclass_fields__", {})


@functools.lru_cache(maxsize=1)
def _configured() -> str:
    if os.environ.get("TRITON_INTERPRET") == "1" or not torch.cuda.is_available():
        return "off"
    chosen = setting(os.environ.get(VARIABLE))
    if chosen == "off" or not triton_supports() or torch.cuda.get_device_capability() < (9, 0):
        return "off"
    return chosen


_forced: list[str] = []


def mode() -> str:
    """This process's PDL mode (MODES): the environment's where the device and Triton allow
    it, else off; `forced` overrides it."""
    return _forced[-1] if _forced else _configured()


def on() -> bool:
    """Whether this process launches any of its kernels with PDL."""
    return mode() != "off"


@contextlib.contextmanager
def forced(value: bool | str) -> Iterator[None]:
    """PDL on, off or in one of MODES inside the block, whatever the environment says
    (tests, A/B timing)."""
    chosen = ("on" if value else "off") if isinstance(value, bool) else setting(value)
    _forced.append(chosen)
    try:
        yield
    finally:
        _forced.pop()


def launch_options() -> dict[str, Any]:
    """The keyword arguments a PDL-aware kernel's launch takes: its USE_PDL constexpr and
    Triton's launch_pdl, or nothing (the constexpr's default, False)."""
    return {} if mode() == "off" else {"USE_PDL": True, "launch_pdl": True}


def gemv_launch_options(row_bytes: int) -> dict[str, Any]:
    """launch_options() of a one-token GEMV whose weight rows are row_bytes long: none in
    mode small; in mode prefetch also PREFETCH and PF_LINES."""
    current = mode()
    if current in ("off", "small"):
        return {}
    options = launch_options()
    if current == "prefetch":
        options.update(PREFETCH=True, PF_LINES=prefetch_lines(row_bytes))
    return options


def prefetch_lines(row_bytes: int) -> int:
    """The PF_LINES constexpr of a GEMV program: L2 lines of each of its weight rows, a
    power of two (rows x lines addresses in one tensor)."""
    return triton.next_power_of_2(max(1, -(-row_bytes // LINE_BYTES)))


@triton.jit
def enter(USE_PDL: tl.constexpr):
    """A program's first step under PDL: wait for the kernel before, then let the next one
    launch. Nothing another kernel writes may be touched before it."""
    if USE_PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()


@triton.jit
def prefetch_rows_l2(w_ptr, row0, n_rows, row_stride, row_len,
                     ROWS: tl.constexpr, PF_LINES: tl.constexpr):
    """An L2 prefetch of every 128-byte line of weight rows row0 .. row0 + ROWS - 1
    (row_stride and row_len in elements; rows past n_rows and lines past a row's end fold
    onto the last valid ones). Weights are never written by a kernel, so this may run
    before `enter`."""
    ELEM: tl.constexpr = w_ptr.dtype.element_ty.primitive_bitwidth // 8
    i = tl.arange(0, ROWS * PF_LINES)
    row = tl.minimum(row0 + i // PF_LINES, n_rows - 1).to(tl.int64)
    byte = tl.minimum((i % PF_LINES) * 128, row_len * ELEM - 1).to(tl.int64)
    addr = w_ptr.to(tl.pointer_type(tl.uint8)) + row * (row_stride * ELEM) + byte
    tl.inline_asm_elementwise("prefetch.global.L2 [$1];\n\tmov.u32 $0, 0;", "=r,l",
                              [addr.to(tl.int64, bitcast=True)], dtype=tl.int32,
                              is_pure=False, pack=1)
