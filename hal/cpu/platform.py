"""The `cpu` plugin: every op in plain PyTorch, gloo for collectives, eager execution.

Its ops are the oracle of the conformance suite (hal/reference.py), except attention, which
it runs in a batched form (`batched_attention.py`) that the suite checks against the reference:
it is also the plugin the worker uses to serve small models on a machine without an
accelerator.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, ClassVar

import torch

from tessera.hal.base import OpTablePlatform
from tessera.hal.local_comm import make_local_communicator
from tessera.hal.platform import (
    Capabilities,
    Communicator,
    GraphRunner,
    MemoryPolicy,
    QuantLinearKernel,
)
from tessera.hal.reference import reference_ops


class CpuPlatform(OpTablePlatform):
    name: ClassVar[str] = "cpu"
    priority: ClassVar[int] = 0  # the fallback when nothing better is available
    capabilities: ClassVar[Capabilities] = Capabilities(
        graph_capture=False,
        dtypes=("float32", "bfloat16"),
        default_dtype="float32",
        max_capture_batch=0,
        devices_shared=True,
        communicator_backends=("gloo",),
        quant_schemes=("fp8", "int8", "int4"),
        kv_cache_dtypes=("fp8_e4m3",),
    )
    # Host memory is shared with everything else on the machine (often several engines in
    # CI): a modest share of it by default, and no more slots than a small host can use.
    memory_policy: ClassVar[MemoryPolicy] = MemoryPolicy(
        shared_with_host=True, default_share=0.1, default_max_tokens=32768)

    @classmethod
    def is_available(cls) -> bool:
        return True

    def register_ops(self) -> dict[str, Callable[..., Any]]:
        from tessera.hal.cpu import batched_attention

        # The reference ops, but attention in its batched form (same results, checked by the
        # conformance suite against the reference).
        return {**reference_ops(), "attention_extend": batched_attention.attention_extend,
                "attention_decode": batched_attention.attention_decode}

    def register_quant_linears(self) -> dict[str, QuantLinearKernel]:
        from tessera.hal.cpu.quant_linear import quant_linears

        return quant_linears()

    def device(self, rank: int = 0) -> torch.device:
        return torch.device("cpu")

    def synchronize(self) -> None:
        pass  # eager: every op has finished when it returns

    def mem_get_info(self) -> tuple[int, int]:
        return host_memory()

    def create_graph_runner(self) -> GraphRunner | None:
        return None

    def create_communicator(self, rank: int, world_size: int, init_method: str,
                            loopback: bool = False,
                            device_index: int | None = None) -> Communicator:
        local = make_local_communicator(rank, world_size, loopback)
        if local is not None:
            return local
        from tessera.hal.cpu.communicator import GlooCommunicator

        return GlooCommunicator(rank, world_size, init_method)

    def versions(self) -> dict[str, str]:
        return {"intra-op threads": str(torch.get_num_threads()), "names": cpu_model_name(),
                "runtime": f"torch {torch.__version__}"}


def cpu_model_name() -> str:
    """The processor's model name (/proc/cpuinfo on Linux) and its core count."""
    name = ""
    try:
        with open("/proc/cpuinfo") as f:
            name = next((line.split(":", 1)[1].strip() for line in f
                         if line.startswith("model name")), "")
    except OSError:
        pass
    import platform

    return f"{name or platform.processor() or platform.machine()} x {os.cpu_count()}"


def host_memory() -> tuple[int, int]:
    """(available, total) bytes of RAM, from /proc/meminfo where there is one."""
    try:
        with open("/proc/meminfo") as f:
            info = {line.split(":")[0]: int(line.split()[1]) * 1024 for line in f}
        return info["MemAvailable"], info["MemTotal"]
    except (OSError, KeyError, ValueError, IndexError):
        page = os.sysconf("SC_PAGE_SIZE")
        return os.sysconf("SC_AVPHYS_PAGES") * page, os.sysconf("SC_PHYS_PAGES") * page
