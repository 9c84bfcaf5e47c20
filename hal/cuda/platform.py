"""The `cuda` plugin: Triton kernels, cuBLAS through torch for linear, CUDA graphs, NCCL.

Importing this module needs neither a GPU nor Triton: kernel modules are imported when the
platform is constructed, which the registry does only after `is_available()` said yes.

`HAL_CUDA_UNFUSE` turns fused ops off, for A/B runs: a comma-separated list of fused op
names (hal/ops.py FUSED_OP_NAMES), or `all`. A fused op turned off is not registered, so the
worker composes the unfused ops instead, in eager steps and captured graphs alike. Read when
the platform is constructed (once per worker process); unset, every fused op is on.

`HAL_CUDA_PDL=0` launches the decode path's Triton kernels without programmatic dependent
launch (hal/cuda/pdl.py; unset or 1: with it, on sm_90 and later), for A/B runs.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from typing import Any, ClassVar

import torch
import torch.nn.functional as F

from tessera.hal.base import OpTablePlatform
from tessera.hal.cuda import runtime
from tessera.hal.local_comm import make_local_communicator
from tessera.hal.ops import FUSED_OP_NAMES
from tessera.hal.platform import (
    Capabilities,
    Communicator,
    Event,
    GraphRunner,
    KVArena,
    QuantLinearKernel,
    StepProfile,
)

UNFUSE_VARIABLE = "HAL_CUDA_UNFUSE"


def unfused_ops(value: str | None) -> frozenset[str]:
    """The fused ops that `HAL_CUDA_UNFUSE`'s value turns off."""
    names = {n.strip() for n in (value or "").split(",") if n.strip()}
    if "all" in names:
        return frozenset(FUSED_OP_NAMES)
    unknown = sorted(names - set(FUSED_OP_NAMES))
    if unknown:
        raise ValueError(f"{UNFUSE_VARIABLE} names unknown fused ops {unknown}; the fused ops "
                         f"are {list(FUSED_OP_NAMES)} (or 'all')")
    return frozenset(names)


def _embedding(ids: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return F.embedding(ids, weight)


class CudaPlatform(OpTablePlatform):
    name: ClassVar[str] = "cuda"
    priority: ClassVar[int] = 100
    environment_variables: ClassVar[tuple[str, ...]] = (
        "CUDA_VISIBLE_DEVICES", "NCCL_P2P_DISABLE", "NCCL_IB_DISABLE", "PYTORCH_CUDA_ALLOC_CONF",
        "TRITON_INTERPRET", UNFUSE_VARIABLE, "HAL_CUDA_PDL")
    capabilities: ClassVar[Capabilities] = Capabilities(
        graph_capture=True,
        asynchronous=True,
        dtypes=("bfloat16", "float16", "float32"),
        default_dtype="bfloat16",
        max_capture_batch=256,
        communicator_backends=("nccl",),
        # fp8 weights need compute capability 8.9+ (checked when a weight is prepared)
        quant_schemes=("fp8", "int8", "int4"),
        kv_cache_dtypes=("fp8_e4m3",),
        # On one H200 (docs/performance.md): fp8 batch-1 decode 2.86 ms a step at 3 in flight
        # against 2.85-3.50 at 2 (its 1.6 ms launch and 3.2 ms round trip no longer hid behind
        # one step), c=128 serving ITL p99 30.1 against 36.0 ms; bf16 B1 and B2 unchanged.
        overlap_steps=3,
        extra={"kernels": "triton", "linear": "cublas; triton gemv for tuned one-token shapes, "
                                               "triton token gemm for tuned 2-256 token ones",
               "quantized linear": "triton dequantizing GEMV / GEMM; fp8 prefill through "
                                   "torch._scaled_mm (W8A8)"},
    )

    @classmethod
    def is_available(cls) -> bool:
        try:
            import triton  # noqa: F401
        except ImportError:
            return False
        return bool(torch.cuda.is_available())

    def register_ops(self) -> dict[str, Callable[..., Any]]:
        from tessera.hal.cuda import (
            decode_attention,
            elementwise,
            extend_attention,
            gemv,
            moe,
            norm,
            sampling,
            token_mask,
        )

        ops: dict[str, Callable[..., Any]] = {
            "embedding": _embedding,
            "rms_norm": norm.rms_norm,
            "fused_add_rms_norm": norm.fused_add_rms_norm,
            "rotary_embedding": elementwise.rotary_embedding,
            "silu_and_mul": elementwise.silu_and_mul,
            "gelu_tanh_and_mul": elementwise.gelu_tanh_and_mul,
            "linear": gemv.linear,  # cuBLAS, the tuned one-token GEMV or token GEMM
            "store_kv": elementwise.store_kv,
            "attention_extend": extend_attention.attention_extend,
            "attention_decode": decode_attention.attention_decode,
            "fused_moe": moe.fused_moe,
            "sample": sampling.sample,
            "apply_token_mask": token_mask.apply_token_mask,
        }
        fused: dict[str, Callable[..., Any]] = {
            "rotary_store_kv": elementwise.rotary_store_kv,
            "moe_softmax_topk": moe.moe_softmax_topk,
        }
        off = unfused_ops(os.environ.get(UNFUSE_VARIABLE))
        from tessera.hal.cuda import compile_watch, pdl

        pdl.setting(os.environ.get(pdl.VARIABLE))  # a value it cannot read fails here, not mid-step

        compile_watch.install()  # counts kernel compiles for the worker's slow-launch report
        ops.update({name: fn for name, fn in fused.items() if name not in off})
        return ops

    def register_quant_linears(self) -> dict[str, QuantLinearKernel]:
        from tessera.hal.cuda.quant_linear import quant_linears

        return quant_linears()

    def device(self, rank: int = 0) -> torch.device:
        count = max(1, torch.cuda.device_count())
        return torch.device("cuda", rank % count)

    def use_device(self, index: int) -> None:
        torch.cuda.set_device(self.device(index))

    def device_count(self) -> int:
        return int(torch.cuda.device_count())

    def synchronize(self) -> None:
        torch.cuda.synchronize()

    def mem_get_info(self) -> tuple[int, int]:
        free, total = torch.cuda.mem_get_info(torch.cuda.current_device())
        return int(free), int(total)

    def allocator_counters(self) -> dict[str, int]:
        # torch's caching allocator: retries free every cached block and call cudaFree
        # (synchronizing the device); device allocations are cudaMalloc calls
        from tessera.hal.cuda import compile_watch

        stats = torch.cuda.memory_stats(torch.cuda.current_device())
        return {"alloc_retries": int(stats.get("num_alloc_retries", 0)),
                "device_allocs": int(stats.get("num_device_alloc", 0)),
                "kernel_compiles": compile_watch.compiles()}

    def recent_compiles(self) -> list[str]:
        from tessera.hal.cuda import compile_watch

        return compile_watch.take_recent()

    def create_kv_arena(self, num_layers: int, num_slots: int, kv_heads: int, head_dim: int,
                        dtype: torch.dtype) -> KVArena:
        # On the current device (the worker sets it to its rank's GPU); zeroed so that padding
        # slots (page 0), which padded graph replays read, hold finite values.
        storage = torch.zeros((num_layers, 2, num_slots, kv_heads, head_dim), dtype=dtype,
                              device=torch.device("cuda", torch.cuda.current_device()))
        return KVArena(storage, num_layers, num_slots, kv_heads, head_dim)

    def create_graph_runner(self) -> GraphRunner | None:
        from tessera.hal.cuda.graph import CudaGraphRunner

        return CudaGraphRunner()

    def create_event(self) -> Event:
        return runtime.CudaEvent()

    def pinned_empty(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        return runtime.pinned_empty(shape, dtype)

    def host_to_device(self, host: torch.Tensor, device: torch.device) -> torch.Tensor:
        return runtime.host_to_device(host, device)

    def host_to_device_many(self, hosts: list[torch.Tensor],
                            device: torch.device) -> list[torch.Tensor]:
        return runtime.host_to_device_many(hosts, device)

    def device_to_host(self, tensor: torch.Tensor) -> torch.Tensor:
        return runtime.device_to_host(tensor)

    def profile_range(self, name: str) -> contextlib.AbstractContextManager[None]:
        return runtime.nvtx_range(name)

    def start_profile(self) -> StepProfile:
        from torch.profiler import ProfilerActivity

        return StepProfile([ProfilerActivity.CPU, ProfilerActivity.CUDA], self.synchronize)

    def create_communicator(self, rank: int, world_size: int, init_method: str,
                            loopback: bool = False,
                            device_index: int | None = None) -> Communicator:
        local = make_local_communicator(rank, world_size, loopback)
        if local is not None:
            return local
        from tessera.hal.cuda.communicator import NcclCommunicator

        return NcclCommunicator(rank, world_size, init_method, device_index=device_index)

    def versions(self) -> dict[str, str]:
        info = {"torch": torch.__version__, "cuda": str(torch.version.cuda)}
        try:
            import triton

            info["triton"] = triton.__version__
            from tessera.hal.cuda import pdl

            info["programmatic dependent launch"] = "on" if pdl.on() else "off"
        except ImportError:
            info["triton"] = "missing"
        info["runtime"] = f"CUDA {torch.version.cuda}"
        info["driver"] = driver_version()
        if torch.cuda.is_available():
            info["device"] = torch.cuda.get_device_name()
            info["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
            count = torch.cuda.device_count()
            info["names"] = ", ".join(torch.cuda.get_device_name(i) for i in range(count))
            # Which pairs reach each other's memory directly (NVLink or PCIe P2P).
            info["topology"] = "; ".join(
                f"{i}->{j} p2p {'yes' if torch.cuda.can_device_access_peer(i, j) else 'no'}"
                for i in range(count) for j in range(count) if i != j) or "one device"
        return info


def driver_version() -> str:
    """The NVIDIA kernel driver's version ("550.54.15"), from /proc where Linux has it."""
    try:
        with open("/proc/driver/nvidia/version") as f:
            first = f.readline()
    except OSError:
        return "unknown"
    words = first.split()
    return next((w for w in words if w.count(".") >= 1 and w[0].isdigit()), first.strip())
