"""ExamplePlatform: runs on the host CPU, four native ops, the reference for the rest."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import torch

from tessera.hal.base import OpTablePlatform
from tessera.hal.local_comm import make_local_communicator
from tessera.hal.platform import Capabilities, Communicator, GraphRunner
from tessera_hal_example import ops


class ExamplePlatform(OpTablePlatform):
    name: ClassVar[str] = "example"
    # Below cpu: installing this package must not change what "best available" picks.
    priority: ClassVar[int] = -10
    capabilities: ClassVar[Capabilities] = Capabilities(
        dtypes=("float32", "bfloat16"), default_dtype="float32",
        communicator_backends=("gloo",),
    )
    # Explicit, per op: these run the cpu reference, and `tessera doctor` says so.
    reference_fallbacks: ClassVar[tuple[str, ...]] = (
        "embedding", "rotary_embedding", "linear", "attention_extend", "attention_decode",
        "sample", "apply_token_mask", "gelu_tanh_and_mul", "fused_moe",
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
        }

    def device(self, rank: int = 0) -> torch.device:
        return torch.device("cpu")

    def synchronize(self) -> None:
        pass

    def mem_get_info(self) -> tuple[int, int]:
        from tessera.hal.cpu.platform import host_memory

        return host_memory()

    def create_graph_runner(self) -> GraphRunner | None:
        return None

    def create_communicator(self, rank: int, world_size: int, init_method: str,
                            loopback: bool = False) -> Communicator:
        local = make_local_communicator(rank, world_size, loopback)
        if local is not None:
            return local
        from tessera.hal.cpu.communicator import GlooCommunicator

        return GlooCommunicator(rank, world_size, init_method)
