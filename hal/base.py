"""`OpTablePlatform`: the usual way to write a plugin — an op dict plus declared fallbacks.

A plugin subclasses it, returns its own implementations from `register_ops()` and lists in
`reference_fallbacks` the ops it deliberately borrows from the reference (cpu) plugin. Anything
else is missing, and asking for it raises `MissingOpError`: a fallback is never silent, and
`tessera doctor` shows which ops are native and which are borrowed.

Quantized linears follow the same rule per scheme: `register_quant_linears()` gives the
kernels of the schemes listed in `capabilities.quant_schemes`, `reference_quant_fallbacks` the
schemes deliberately run by the reference (dequantize, then a dense matmul: correct, slow, and
shown as such by `tessera doctor`); any other scheme raises `MissingSchemeError`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar, Literal

import torch

from tessera.hal.errors import MissingOpError, MissingSchemeError
from tessera.hal.ops import FUSED_OP_NAMES, OP_NAMES
from tessera.hal.platform import KVArena, Platform, QuantLinearKernel

OpSource = Literal["native", "reference", "missing"]


class OpTablePlatform(Platform):
    """A Platform whose ops come from a dict built once, at construction."""

    # Ops this plugin borrows from the cpu reference on purpose (they run on this plugin's
    # device: the reference ops are device-generic PyTorch).
    reference_fallbacks: ClassVar[tuple[str, ...]] = ()
    # Quantization schemes this plugin runs through the reference kernel on purpose.
    reference_quant_fallbacks: ClassVar[tuple[str, ...]] = ()
    # Higher wins when no plugin is named ("best available"). cpu is 0, cuda 100.
    priority: ClassVar[int] = 50

    def __init__(self) -> None:
        ops = dict(self.register_ops())
        unknown = sorted(set(ops) - set(OP_NAMES) - set(FUSED_OP_NAMES))
        if unknown:
            raise ValueError(f"plugin {self.name!r} registers unknown ops {unknown}; "
                             f"the op names are {list(OP_NAMES)}, the fused ones "
                             f"{list(FUSED_OP_NAMES)}")
        bad = sorted(set(self.reference_fallbacks) - set(OP_NAMES))
        if bad:
            raise ValueError(f"plugin {self.name!r} declares fallbacks for unknown ops {bad}")
        self._ops: dict[str, Callable[..., Any]] = ops
        from tessera.hal.quant.weight import SCHEMES

        quant = dict(self.register_quant_linears())
        declared = tuple(self.capabilities.quant_schemes)
        if set(quant) != set(declared):
            raise ValueError(f"plugin {self.name!r} declares quant_schemes {list(declared)} but "
                             f"registers quantized linears for {sorted(quant)}")
        unknown = sorted((set(quant) | set(self.reference_quant_fallbacks)) - set(SCHEMES))
        if unknown:
            raise ValueError(f"plugin {self.name!r} names unknown quantization schemes "
                             f"{unknown}; the schemes are {list(SCHEMES)}")
        self._quant: dict[str, QuantLinearKernel] = quant

    def register_ops(self) -> dict[str, Callable[..., Any]]:
        """name -> implementation of the ops this plugin supplies itself."""
        return {}

    def register_quant_linears(self) -> dict[str, QuantLinearKernel]:
        """scheme -> the plugin's own kernel; the keys must be `capabilities.quant_schemes`."""
        return {}

    def scheme_source(self, scheme: str) -> OpSource:
        if scheme in self._quant:
            return "native"
        if scheme in self.reference_quant_fallbacks:
            return "reference"
        return "missing"

    def linear_kernel(self, scheme: str) -> QuantLinearKernel:
        kernel = self._quant.get(scheme)
        if kernel is not None:
            return kernel
        if scheme in self.reference_quant_fallbacks:
            from tessera.hal.quant.reference import quant_linear_reference

            return QuantLinearKernel(scheme, quant_linear_reference)
        raise MissingSchemeError(scheme, self.name, tuple(sorted(self._quant)),
                                 self.reference_quant_fallbacks)

    def registered_ops(self) -> list[str]:
        return sorted(self._ops)

    def op_source(self, name: str) -> OpSource:
        if name in self._ops:
            return "native"
        if name in self.reference_fallbacks:
            return "reference"
        return "missing"

    def op(self, name: str) -> Callable[..., Any]:
        impl = self._ops.get(name)
        if impl is not None:
            return impl
        if name in self.reference_fallbacks:
            from tessera.hal.reference import reference_op

            return reference_op(name)
        raise MissingOpError(name, self.name, self.registered_ops())

    def fused_op(self, name: str) -> Callable[..., Any] | None:
        # A fused op is never borrowed from the reference: the worker's composition of this
        # plugin's own ops is the better fallback.
        if name not in FUSED_OP_NAMES:
            raise KeyError(f"no fused op {name!r}; the fused ops are {list(FUSED_OP_NAMES)}")
        return self._ops.get(name)

    # --- defaults a plugin may keep ------------------------------------------------------
    def create_kv_arena(self, num_layers: int, num_slots: int, kv_heads: int, head_dim: int,
                        dtype: torch.dtype) -> KVArena:
        # One allocation for every layer's K and V; zeroed so that padding slots read as 0.
        storage = torch.zeros((num_layers, 2, num_slots, kv_heads, head_dim), dtype=dtype,
                              device=self.device())
        return KVArena(storage, num_layers, num_slots, kv_heads, head_dim)

    def versions(self) -> dict[str, str]:
        """Library / driver versions this plugin depends on, shown by `tessera doctor`."""
        return {}
