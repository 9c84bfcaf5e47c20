"""CUDA C kernels compiled at run time: NVRTC for the machine code, cuda-python's driver API
(`cuda.bindings`) to load and launch it on torch's current stream (also under graph
capture), with programmatic dependent launch where asked. The native GEMV (native_gemv) and
the native fp8-cache decode attention (native_attention) are built on it.

Where cuda-python is missing, `available()` is False and `compile_cubin` / `function` raise
NativeError, so the callers keep their Triton kernels."""

from __future__ import annotations

import functools
import threading
from typing import Any

import torch


class NativeError(RuntimeError):
    """NVRTC or the driver refused a native kernel (the message says which and why)."""


@functools.lru_cache(maxsize=1)
def _bindings() -> tuple[Any, Any] | None:
    try:
        from cuda.bindings import driver, nvrtc
    except ImportError:
        return None
    return driver, nvrtc


def available() -> bool:
    """Whether this process can compile and launch native kernels: cuda-python's driver
    and NVRTC bindings import, and a CUDA device is present."""
    return _bindings() is not None and torch.cuda.is_available()


def can_compile() -> bool:
    """Whether NVRTC's bindings import (compile_cubin needs no GPU)."""
    return _bindings() is not None


def ok(result: Any, what: str) -> Any:
    """A cuda-python call's values after its status (raises NativeError on failure)."""
    err, *rest = result if isinstance(result, tuple) else (result,)
    if int(err) != 0:
        raise NativeError(f"{what}: {err!r}")
    return rest[0] if len(rest) == 1 else tuple(rest)


def driver() -> Any:
    """cuda-python's driver bindings (NativeError without them)."""
    bindings = _bindings()
    if bindings is None:
        raise NativeError("native kernels need cuda-python (cuda.bindings)")
    return bindings[0]


def compile_cubin(source: str, arch: int) -> bytes:
    """NVRTC's sm_<arch> machine code for source (no GPU needed)."""
    bindings = _bindings()
    if bindings is None:
        raise NativeError("native kernels need cuda-python's NVRTC bindings "
                          "(cuda.bindings.nvrtc)")
    _, nvrtc = bindings
    prog = ok(nvrtc.nvrtcCreateProgram(source.encode(), b"tessera_native.cu", 0, [], []),
              "nvrtcCreateProgram")
    try:
        opts = [f"--gpu-architecture=sm_{arch}".encode(), b"--std=c++17"]
        err = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)[0]
        if int(err) != 0:
            size = ok(nvrtc.nvrtcGetProgramLogSize(prog), "nvrtcGetProgramLogSize")
            log = b" " * size
            nvrtc.nvrtcGetProgramLog(prog, log)
            raise NativeError(f"NVRTC: {err!r}\n{log.decode(errors='replace')}")
        size = ok(nvrtc.nvrtcGetCUBINSize(prog), "nvrtcGetCUBINSize")
        cubin = b" " * size
        ok(nvrtc.nvrtcGetCUBIN(prog, cubin), "nvrtcGetCUBIN")
        return cubin
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


_lock = threading.Lock()
_functions: dict[tuple[str, str, int, bytes], Any] = {}
_modules: list[Any] = []  # kept loaded for the life of the process


def function(defs: str, source: str, name: bytes, device: int, dynamic_shared: int = 0) -> Any:
    """The kernel `name` of defs + source, compiled for this device once a process, opted in
    at load to `dynamic_shared` bytes of dynamic shared memory (past 48 KB a launch needs it;
    defs must fix the size). (The key holds the two texts apart: the same objects every call,
    their hashes cached.)"""
    key = (defs, source, device, name)
    fn = _functions.get(key)
    if fn is not None:
        return fn
    with _lock:
        fn = _functions.get(key)
        if fn is None:
            drv = driver()
            major, minor = torch.cuda.get_device_capability(device)
            cubin = compile_cubin(defs + source, major * 10 + minor)
            with torch.cuda.device(device):
                torch.cuda.init()
                torch.empty(1, device=f"cuda:{device}")  # the primary context current
                module = ok(drv.cuModuleLoadData(cubin), "cuModuleLoadData")
                fn = ok(drv.cuModuleGetFunction(module, name), "cuModuleGetFunction")
                if dynamic_shared:
                    attr = drv.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
                    ok(drv.cuFuncSetAttribute(fn, attr, dynamic_shared), "cuFuncSetAttribute")
            _modules.append(module)
            _functions[key] = fn
    return fn


def launch(fn: Any, grid: int | tuple[int, int, int], block: int, stream: torch.cuda.Stream,
           params: int, use_pdl: bool, shared: int = 0) -> None:
    """fn on stream over grid (blocks, or (x, y, z)), with `shared` bytes of dynamic shared
    memory, with PDL's attribute if use_pdl. params: the address of the arguments' array."""
    drv = driver()
    handle = drv.CUstream(stream.cuda_stream)
    gx, gy, gz = (grid, 1, 1) if isinstance(grid, int) else grid
    if not use_pdl:
        ok(drv.cuLaunchKernel(fn, gx, gy, gz, block, 1, 1, shared, handle, params, 0),
           "cuLaunchKernel")
        return
    attr = drv.CUlaunchAttribute()
    attr.id = drv.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
    attr.value.programmaticStreamSerializationAllowed = 1
    config = drv.CUlaunchConfig()
    config.gridDimX, config.gridDimY, config.gridDimZ = gx, gy, gz
    config.blockDimX, config.blockDimY, config.blockDimZ = block, 1, 1
    config.sharedMemBytes = shared
    config.hStream = handle
    config.attrs = [attr]
    config.numAttrs = 1
    ok(drv.cuLaunchKernelEx(config, fn, params, 0), "cuLaunchKernelEx")
