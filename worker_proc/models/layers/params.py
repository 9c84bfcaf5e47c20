"""Parameters built on the meta device and materialized on the real one when their first
tensor streams in, so that loading never holds two copies of a model."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch
from torch import nn


def meta_param(*shape: int) -> nn.Parameter:
    return nn.Parameter(torch.empty(shape, device="meta"), requires_grad=False)


def materialize(module: nn.Module, name: str, dtype: torch.dtype,
                device: torch.device) -> torch.Tensor:
    """The storage of `module.<name>` on `device`, allocated on first use. Zeros, not empty:
    rows no checkpoint tensor writes (the padding of a vocab-parallel head) must be defined."""
    param = module._parameters[name]
    assert param is not None, f"{type(module).__name__}.{name} is not a parameter"
    if param.is_meta:
        param = nn.Parameter(torch.zeros(param.shape, dtype=dtype, device=device),
                             requires_grad=False)
        module._parameters[name] = param
    return param.data


def narrow(tensor: torch.Tensor, dim: int, start: int, length: int) -> torch.Tensor:
    if start == 0 and length == tensor.shape[dim]:
        return tensor
    return tensor.narrow(dim, start, length)


class Loadable(Protocol):
    def load(self, param: str, tensor: torch.Tensor, part: str | None = None) -> None:
        """Copy this rank's share of a full (Hugging Face) tensor into `param`; `part` names
        which of several fused tensors it is (q/k/v, gate/up)."""


@dataclass(frozen=True)
class Target:
    """Where one checkpoint tensor goes: `module.load(param, tensor, part)`, after narrowing
    the checkpoint tensor to rows [start, start + length) of `dim` when `narrow_to` is set (a
    checkpoint that already fuses q/k/v or gate/up is split back into its parts this way)."""

    module: Loadable
    param: str = "weight"
    part: str | None = None
    narrow_to: tuple[int, int, int] | None = None  # (dim, start, length)

    def load(self, tensor: torch.Tensor) -> None:
        if self.narrow_to is not None:
            tensor = narrow(tensor, *self.narrow_to)
        self.module.load(self.param, tensor, self.part)


Targets = dict[str, list[Target]]  # checkpoint tensor name -> where it goes (one or more)


def add_target(targets: Targets, name: str, target: Target) -> None:
    targets.setdefault(name, []).append(target)
