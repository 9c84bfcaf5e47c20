"""ModelContext: what every layer of a model needs to know besides its own sizes — the model
config, this rank's share of it (tensor-parallel slice, pipeline stage), the op table, the
communicator, the serving dtype and device, and the quantization plan."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from tessera.formats.config import ModelConfig
from tessera.formats.parallel import StageLayers
from tessera.hal.platform import Communicator, Platform
from tessera.worker_proc.tp import TPShape

if TYPE_CHECKING:
    from tessera.worker_proc.quant_plan import QuantPlan


@dataclass
class ModelContext:
    config: ModelConfig
    platform: Platform
    tp: TPShape
    dtype: torch.dtype
    device: torch.device
    max_positions: int
    communicator: Communicator | None = None
    quant: QuantPlan | None = None  # which linears run quantized (worker_proc/quant_plan.py)
    stage: StageLayers | None = None  # this pipeline stage's layers (None: all of them)
    _ops: dict[str, Callable[..., Any]] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if self.tp.size > 1 and self.communicator is None:
            raise ValueError("tensor parallelism needs a communicator")
        if self.stage is None:
            self.stage = StageLayers.of(self.config.num_layers, 1, 0)

    @property
    def layers(self) -> StageLayers:
        assert self.stage is not None
        return self.stage

    def op(self, name: str) -> Callable[..., Any]:
        """The plugin's op `name`, looked up once (a missing op fails here, at build time)."""
        fn = self._ops.get(name)
        if fn is None:
            fn = self._ops[name] = self.platform.op(name)
        return fn

    def fused_op(self, name: str) -> Callable[..., Any] | None:
        """The plugin's fused op `name`, or None: the layer then composes the unfused ops."""
        return self.platform.fused_op(name)

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum over the TP ranks (the identity on one rank)."""
        if self.tp.size == 1:
            return x
        assert self.communicator is not None
        return self.communicator.all_reduce(x)

    def all_gather(self, x: torch.Tensor, dim: int = -1) -> torch.Tensor:
        if self.tp.size == 1:
            return x
        assert self.communicator is not None
        return self.communicator.all_gather(x, dim=dim)
