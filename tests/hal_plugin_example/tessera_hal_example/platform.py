"""ExamplePlatform: runs on the host CPU, a few native ops, the reference for the rest, and
graph capture, events and profiler ranges of its own, all through the Platform contract."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any, ClassVar

import torch

from tessera.hal.base import OpTablePlatform
from tessera.hal.local_comm import make_local_communicator
from tessera.hal.platform import Capabilities, Communicator, Event, GraphRunner, MemoryPolicy
from tessera_hal_example import ops
from tessera_hal_example.graph import RecordingGraphRunner


class ExampleEvent(Event):
    """Work is finished when its call returns; asking about a mark never made is a bug of the
    caller, and this plugin says so."""

    def __init__(self) -> None:
        self.recorded = False

    def record(self) -> None:
        self.recorded = True

    def query(self) -> bool:
        if not self.recorded:
            raise RuntimeError("query() of an event that was never recorded")
        return True

    def synchronize(self) -> None:
        if not self.recorded:
            raise RuntimeError("synchronize() of an event that was never recorded")


class ExamplePlatform(OpTablePlatform):
    name: ClassVar[str] = "example"
    # Below cpu: installing this package must not change what "best available" picks.
    priority: ClassVar[int] = -10
    capabilities: ClassVar[Capabilities] = Capabilities(
        graph_capture=True, max_capture_batch=16,
        dtypes=("float32", "bfloat16"), default_dtype="float32",
        communicator_backends=("gloo",),
    )
    memory_policy: ClassVar[MemoryPolicy] = MemoryPolicy(
        shared_with_host=True, default_share=0.1, default_max_tokens=32768)
    # Explicit, per op: these run the cpu reference, and `tessera doctor` says so.
    reference_fallbacks: ClassVar[tuple[str, ...]] = (
        "embedding", "rotary_embedding", "linear", "sample", "apply_token_mask",
        "gelu_tanh_and_mul", "fused_moe",
    )

    @classmethod
    def is_available(cls) -> bool:
        return True

    def register_ops(self) -> dict[str, Callable[..., Any]]:
        return {
            "rms_norm": ops.rms_norm,
            "fused_add_rms_norm": ops.fused_add_rms_norm,
            "silu_and_mul": ops.silu_and_mul,
            "store_kv": ops.store_kv,
            "attention_extend": ops.attention_extend,
            "attention_decode": ops.attention_decode,
        }

    def device(self, rank: int = 0) -> torch.device:
        return torch.device("cpu")

    def synchronize(self) -> None:
        pass

    def mem_get_info(self) -> tuple[int, int]:
        from tessera.hal.cpu.platform import host_memory

        return host_memory()

    def create_graph_runner(self) -> GraphRunner | None:
        return RecordingGraphRunner()

    def create_event(self) -> Event:
        return ExampleEvent()

    def profile_range(self, name: str) -> contextlib.AbstractContextManager[Any]:
        return torch.profiler.record_function(name)

    def create_communicator(self, rank: int, world_size: int, init_method: str,
                            loopback: bool = False) -> Communicator:
        local = make_local_communicator(rank, world_size, loopback)
        if local is not None:
            return local
        from tessera.hal.cpu.communicator import GlooCommunicator

        return GlooCommunicator(rank, world_size, init_method)
