"""QuantLinear: the LinearMethod of a layer whose weights may be quantized (hal/quant).

Each checkpoint tensor arrives whole, dense or as a QuantizedWeight; this rank's rows and
columns of it are kept (quantized ones sliced as they are, or a dense one quantized first
when the plan says so, so every TP size sees the same values) until `finish`, which fuses
consecutive parts of the same layout into one matrix — a *segment* — and hands each to the
plugin's kernel once (`prepare`). A fused layer whose parts come in different layouts (a
GGUF Q4_K_M file stores some v projections as Q6_K next to Q4_K q/k) runs one product per
segment and concatenates the outputs; the usual case is one segment, one kernel call.
Dense segments (checkpoint tensors without a runtime scheme, the zero rows that pad a
vocabulary-parallel head) go through the HAL `linear` op.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeAlias

import torch

from tessera.hal.quant import QuantizedWeight, cat_rows, quantize
from tessera.hal.quant.quantize import group_size_for
from tessera.worker_proc.models.layers.params import materialize, meta_param, narrow

if TYPE_CHECKING:
    from tessera.hal.platform import QuantLinearKernel
    from tessera.worker_proc.models.layers.linear import Linear
    from tessera.worker_proc.quant_plan import QuantPlan

Weight: TypeAlias = torch.Tensor | QuantizedWeight


@dataclass
class Segment:
    start: int  # first output row
    size: int
    weight: Weight
    run: Callable[[torch.Tensor, Weight, torch.Tensor | None], torch.Tensor]
    kernel: QuantLinearKernel | None = None  # None: a dense segment


def _fusable(a: Weight, b: Weight) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)
    same_perm = (a.input_perm is None and b.input_perm is None) or (
        a.input_perm is not None and b.input_perm is not None
        and torch.equal(a.input_perm, b.input_perm))
    return (a.scheme, a.group_size, a.packing) == (b.scheme, b.group_size, b.packing) \
        and same_perm


class QuantLinear:
    def __init__(self, plan: QuantPlan, quantize_to: str | None) -> None:
        self.plan = plan
        self.quantize_to = quantize_to
        self.parts: dict[int, Weight] = {}  # first local row -> this rank's rows of a part
        self.segments: list[Segment] = []

    def create_weights(self, layer: Linear) -> None:
        layer.bias = meta_param(layer.out_features) if layer.has_bias else None

    def load(self, layer: Linear, name: str, tensor: Weight, part: str | None) -> None:
        if name == "bias" and layer.has_bias:
            if layer.bias_on_this_rank:
                assert isinstance(tensor, torch.Tensor)
                out = layer.output_part(part)
                dest = materialize(layer, "bias", layer.ctx.dtype, layer.ctx.device)
                narrow(dest, 0, out.dst, out.size).copy_(narrow(tensor, 0, out.src, out.size))
            return
        if name != "weight":
            raise KeyError(f"a linear layer has no tensor {name!r}")
        out = layer.output_part(part)
        start, size = layer.input_range
        weight = tensor
        if isinstance(weight, torch.Tensor) and self.quantize_to is not None:
            # The full tensor, so every rank holds the same values, in groups that divide this
            # rank's columns (a row-parallel layer gets a slice of them)
            weight = quantize(weight, self.quantize_to, group_size_for(layer.in_features))
        weight = narrow(narrow(weight, 0, out.src, out.size), 1, start, size)  # type: ignore[arg-type]
        device = layer.ctx.device
        if isinstance(weight, torch.Tensor):
            weight = weight.to(device=device, dtype=layer.ctx.dtype)
        else:
            weight = weight.to(device)
        self.parts[out.dst] = weight

    def finish(self, layer: Linear) -> None:
        if layer.has_bias and layer.bias is not None and layer.bias.is_meta:
            materialize(layer, "bias", layer.ctx.dtype, layer.ctx.device)  # zeros off rank 0
        if not self.parts:
            raise ValueError("a quantized linear layer finished loading without weights")
        rows = 0
        groups: list[list[Weight]] = []
        for dst in sorted(self.parts):
            if dst != rows:
                raise ValueError(f"linear layer rows {rows}..{dst} were never loaded")
            weight = self.parts[dst]
            if groups and _fusable(groups[-1][-1], weight):
                groups[-1].append(weight)
            else:
                groups.append([weight])
            rows += weight.shape[0]
        if rows < layer.out_features:  # the padding rows of a vocabulary-parallel head
            groups.append([torch.zeros((layer.out_features - rows, layer.in_features),
                                       dtype=layer.ctx.dtype, device=layer.ctx.device)])
        self.parts.clear()
        start = 0
        for index, group in enumerate(groups):
            segment = self._segment(layer, index, start, group)
            self.segments.append(segment)
            start += segment.size

    def _segment(self, layer: Linear, index: int, start: int, group: list[Weight]) -> Segment:
        if isinstance(group[0], torch.Tensor):
            dense = torch.cat(group) if len(group) > 1 else group[0]  # type: ignore[arg-type]
            layer.register_buffer(f"segment{index}_weight", dense, persistent=False)
            return Segment(start, dense.shape[0], dense, layer.linear_op)
        fused = cat_rows(group) if len(group) > 1 else group[0]  # type: ignore[arg-type]
        kernel = self.plan.kernel(fused.scheme)
        prepared = kernel.prepare(fused)
        for field in ("qweight", "scales", "offsets", "input_perm"):
            value = getattr(prepared, field)
            if value is not None:
                layer.register_buffer(f"segment{index}_{field}", value, persistent=False)
        return Segment(start, prepared.out_features, prepared, kernel.apply, kernel)

    def fuses_one_token(self) -> bool:
        """Whether one_token_fused runs in one launch here: one quantized segment whose
        plugin kernel fuses it (QuantLinearKernel.fuses)."""
        if len(self.segments) != 1:
            return False
        seg = self.segments[0]
        return seg.kernel is not None and seg.kernel.one_token_fused is not None and \
            isinstance(seg.weight, QuantizedWeight) and seg.kernel.fuses(seg.weight)

    def one_token_fused(self, layer: Linear, x: torch.Tensor, **fusions: object
                        ) -> torch.Tensor:
        """QuantLinearKernel.one_token_fused of the layer's one segment (fuses_one_token)."""
        seg = self.segments[0]
        assert seg.kernel is not None and seg.kernel.one_token_fused is not None
        return seg.kernel.one_token_fused(x, seg.weight, layer.bias, **fusions)

    def fuses_rows(self) -> bool:
        """Whether rows_fused is the plugin's: one quantized segment whose kernel offers
        QuantLinearKernel.rows_fused."""
        return len(self.segments) == 1 and self.segments[0].kernel is not None and \
            self.segments[0].kernel.rows_fused is not None and \
            isinstance(self.segments[0].weight, QuantizedWeight)

    def rows_fused(self, layer: Linear, x: torch.Tensor, **fusions: object
                   ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """QuantLinearKernel.rows_fused of the layer's one segment (fuses_rows)."""
        seg = self.segments[0]
        assert seg.kernel is not None and seg.kernel.rows_fused is not None
        return seg.kernel.rows_fused(x, seg.weight, layer.bias, **fusions)

    def apply(self, layer: Linear, x: torch.Tensor) -> torch.Tensor:
        bias = layer.bias
        if len(self.segments) == 1:
            seg = self.segments[0]
            return seg.run(x, seg.weight, bias)
        outs = [seg.run(x, seg.weight,
                        None if bias is None else bias[seg.start:seg.start + seg.size])
                for seg in self.segments]
        return torch.cat(outs, dim=-1)
