"""Linear: the one layer every weight matmul of a model goes through (attention projections,
MLPs, the LM head, the MoE router), with its tensor-parallel layout and its checkpoint loading.

The quantization seam. A Linear owns *where* its weights come from and *which rows/columns*
of each checkpoint tensor this rank keeps (its `OutputPart`s and `input_range`: column-,
row-parallel or replicated, with q/k/v or gate/up fused into one matrix). *What* it stores and
*how* it multiplies is its `method`, a `LinearMethod`:

    create_weights(layer)               register the parameters (on the meta device)
    load(layer, name, tensor, part)     take one checkpoint tensor ("weight", "bias", or a
                                        scheme's own names: "qweight", "scales", ...) and
                                        copy this rank's share of it into the parameters
    finish(layer)                       after the last tensor: repack, transpose, ... (once)
    apply(layer, x) -> y                the matmul, through a HAL op

`DenseLinear` stores weight [out, in] (+ bias [out]) in the serving dtype and calls the HAL
`linear` op. A quantized scheme (packed int4 + scales, fp8 + scales, GGUF blocks) is another
LinearMethod that stores its own parameters and calls its own op variant; it is chosen in
`make_method`, the one place that picks a method for a layer, so no model file changes.
`OutputPart` / `input_range` are in unquantized units (rows and columns of the logical
[out, in] matrix); a packed scheme converts them to its packing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import torch
from torch import nn

from tessera.worker_proc.models.layers.params import materialize, meta_param, narrow

if TYPE_CHECKING:
    from tessera.hal.platform import RotaryStore
    from tessera.worker_proc.models.context import ModelContext


@dataclass(frozen=True)
class OutputPart:
    """One checkpoint tensor fused into this rank's output rows: local rows
    [dst, dst + size) take rows [src, src + size) of the full checkpoint tensor."""

    name: str | None
    dst: int
    src: int
    size: int


class LinearMethod(Protocol):
    def create_weights(self, layer: Linear) -> None: ...

    def load(self, layer: Linear, name: str, tensor: torch.Tensor, part: str | None) -> None:
        ...

    def finish(self, layer: Linear) -> None: ...

    def apply(self, layer: Linear, x: torch.Tensor) -> torch.Tensor: ...


class DenseLinear:
    """Unquantized: weight [out, in] and bias [out] in the serving dtype; the HAL `linear`."""

    def create_weights(self, layer: Linear) -> None:
        layer.weight = meta_param(layer.out_features, layer.in_features)
        layer.bias = meta_param(layer.out_features) if layer.has_bias else None

    def load(self, layer: Linear, name: str, tensor: torch.Tensor, part: str | None) -> None:
        if name not in ("weight", "bias") or (name == "bias" and not layer.has_bias):
            raise KeyError(f"a dense linear layer has no tensor {name!r}")
        if not isinstance(tensor, torch.Tensor):  # a quantized weight for a dense layer
            tensor = tensor.dequantize(layer.params_dtype)
        dest = materialize(layer, name, layer.params_dtype, layer.ctx.device)
        out = layer.output_part(part)
        if name == "weight":
            start, size = layer.input_range
            src = narrow(narrow(tensor, 0, out.src, out.size), 1, start, size)
            narrow(dest, 0, out.dst, out.size).copy_(src)
        elif layer.bias_on_this_rank:
            narrow(dest, 0, out.dst, out.size).copy_(narrow(tensor, 0, out.src, out.size))

    def finish(self, layer: Linear) -> None:
        if layer.has_bias and layer.bias is not None and layer.bias.is_meta:
            # A row-parallel bias lives on rank 0 only: the other ranks add zeros.
            materialize(layer, "bias", layer.params_dtype, layer.ctx.device)

    def apply(self, layer: Linear, x: torch.Tensor) -> torch.Tensor:
        return layer.linear_op(x, layer.weight, layer.bias)  # type: ignore[no-any-return]


def make_method(layer: Linear) -> LinearMethod:
    """The LinearMethod a layer uses: dense, unless the model's quantization plan
    (worker_proc/quant_plan.py) keeps a checkpoint's quantized weights or quantizes at load.
    The LM head is quantized at load only with --quantize-lm-head (plan.lm_head), a head that
    shares the embedding's table stays dense (the model gives the head its own copy when it is
    to be quantized), and so does a layer that asked for its own precision (a router kept in
    float32)."""
    plan = layer.ctx.quant
    if plan is None or not plan.active or layer.role == "tied_lm_head" or \
            layer.params_dtype != layer.ctx.dtype:
        return DenseLinear()
    from tessera.worker_proc.models.layers.quant_linear import QuantLinear

    return QuantLinear(plan, plan.lm_head if layer.role == "lm_head" else plan.quantize_to)


class Linear(nn.Module):
    """y = x W^T (+ b) for this rank's share of W; build with `column`, `row` or `replicated`.

    column: output rows split across ranks (each part of a fused matrix split on its own);
    row: input columns split across ranks, the partial outputs summed with all_reduce (unless
    `reduce=False`: the caller sums several partials at once); bias added on rank 0 only.
    """

    weight: nn.Parameter
    bias: nn.Parameter | None

    def __init__(self, ctx: ModelContext, in_features: int, out_features: int,
                 parts: list[OutputPart], *, bias: bool, input_range: tuple[int, int] | None,
                 reduce: bool = False, bias_on_this_rank: bool = True,
                 params_dtype: torch.dtype | None = None, role: str = "linear") -> None:
        super().__init__()
        self.ctx = ctx
        self.params_dtype = params_dtype or ctx.dtype
        self.role = role  # "linear", "lm_head" or "tied_lm_head" (see make_method)
        self.in_features, self.out_features = in_features, out_features
        self.parts = {p.name: p for p in parts}
        self.input_range = input_range or (0, in_features)
        self.has_bias = bias
        self.bias_on_this_rank = bias_on_this_rank
        self.reduce = reduce
        self.linear_op = ctx.op("linear")
        self.method = make_method(self)
        self.method.create_weights(self)

    # -- the three layouts ------------------------------------------------------------------

    @classmethod
    def column(cls, ctx: ModelContext, in_features: int, parts: list[OutputPart], *,
               bias: bool = False, out_features: int | None = None,
               role: str = "linear") -> Linear:
        """Output-sharded; `parts` say which rows of which checkpoint tensor this rank keeps
        (see `split_parts`, `qkv_parts`). out_features defaults to the sum of the parts."""
        out = out_features if out_features is not None else sum(p.size for p in parts)
        return cls(ctx, in_features, out, parts, bias=bias, input_range=None, role=role)

    @classmethod
    def row(cls, ctx: ModelContext, in_features_full: int, out_features: int, *,
            bias: bool = False, reduce: bool = True) -> Linear:
        """Input-sharded: this rank keeps columns [rank * n, (rank + 1) * n) of the full
        matrix, n = in_features_full / tp size."""
        tp = ctx.tp
        local = in_features_full // tp.size
        return cls(ctx, local, out_features, [OutputPart(None, 0, 0, out_features)],
                   bias=bias, input_range=(tp.rank * local, local),
                   reduce=reduce and tp.size > 1, bias_on_this_rank=tp.rank == 0)

    @classmethod
    def replicated(cls, ctx: ModelContext, in_features: int, out_features: int, *,
                   bias: bool = False, params_dtype: torch.dtype | None = None) -> Linear:
        """Whole on every rank. `params_dtype` overrides the serving dtype (a router kept in
        float32); the input must then be in that dtype too."""
        return cls(ctx, in_features, out_features, [OutputPart(None, 0, 0, out_features)],
                   bias=bias, input_range=None, params_dtype=params_dtype)

    # -- loading and running ----------------------------------------------------------------

    def output_part(self, part: str | None) -> OutputPart:
        try:
            return self.parts[part]
        except KeyError:
            raise KeyError(f"linear layer has no fused part {part!r}; it has "
                           f"{list(self.parts)}") from None

    def load(self, param: str, tensor: torch.Tensor, part: str | None = None) -> None:
        self.method.load(self, param, tensor, part)

    def finish_loading(self) -> None:
        self.method.finish(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.method.apply(self, x)
        return self.ctx.all_reduce(y) if self.reduce else y

    @property
    def is_dense(self) -> bool:
        return isinstance(self.method, DenseLinear)

    def fuses_one_token(self) -> bool:
        """Whether one_token_fused is one launch for this layer: quantized, one segment, its
        plugin kernel fusing it, and no row-parallel sum after the product."""
        from tessera.worker_proc.models.layers.quant_linear import QuantLinear

        return not self.reduce and isinstance(self.method, QuantLinear) and \
            self.method.fuses_one_token()

    def one_token_fused(self, x: torch.Tensor, *,
                        norm: tuple[torch.Tensor, float] | None = None,
                        residual: torch.Tensor | None = None, silu: bool = False,
                        rope: RotaryStore | None = None) -> torch.Tensor:
        """One token's product with an RMSNorm before it, or a residual add, the gated SiLU
        or the rotary and KV store after it, in one launch
        (QuantLinearKernel.one_token_fused); only where fuses_one_token() is True."""
        from tessera.worker_proc.models.layers.quant_linear import QuantLinear

        assert isinstance(self.method, QuantLinear) and not self.reduce
        return self.method.one_token_fused(self, x, norm=norm, residual=residual, silu=silu,
                                           rope=rope)

    def fuses_rows(self) -> bool:
        """Whether rows_fused is this layer's plugin kernel's (QuantLinearKernel.rows_fused):
        quantized, one segment, a kernel that offers it."""
        from tessera.worker_proc.models.layers.quant_linear import QuantLinear

        return isinstance(self.method, QuantLinear) and self.method.fuses_rows()

    def rows_fused(self, x: torch.Tensor, *, norm: tuple[torch.Tensor, float] | None = None,
                   residual: torch.Tensor | None = None, silu: bool = False
                   ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(the product of norm(x) or of silu_and_mul(x), the new residual or None):
        fused_add_rms_norm / rms_norm / silu_and_mul and this product as the plugin fuses
        them (QuantLinearKernel.rows_fused), then the row-parallel sum as forward; only
        where fuses_rows() is True."""
        from tessera.worker_proc.models.layers.quant_linear import QuantLinear

        assert isinstance(self.method, QuantLinear)
        y, residual_out = self.method.rows_fused(self, x, norm=norm, residual=residual,
                                                 silu=silu)
        return (self.ctx.all_reduce(y) if self.reduce else y), residual_out

    def forward_fused(self, op: Callable[..., torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        """`op(x, weight, bias)` in place of the `linear` op: a fused op whose last step is
        this layer's product (dense layers only), then the row-parallel sum as forward."""
        if not self.is_dense:
            raise TypeError("a fused product needs a dense layer; this one is quantized")
        y = op(x, self.weight, self.bias)
        return self.ctx.all_reduce(y) if self.reduce else y


def split_parts(ctx: ModelContext, sizes: dict[str, int]) -> list[OutputPart]:
    """Column-parallel parts of matrices fused side by side (gate/up, ...): each full size is
    split evenly across the ranks and this rank's slices are stacked in order."""
    parts, dst = [], 0
    for name, full in sizes.items():
        local = full // ctx.tp.size
        parts.append(OutputPart(name, dst, ctx.tp.rank * local, local))
        dst += local
    return parts


def qkv_parts(ctx: ModelContext, head_dim: int) -> list[OutputPart]:
    """q/k/v fused: this rank's query heads, then its KV heads (a KV head replicated on
    several ranks when there are fewer KV heads than ranks; tp.py)."""
    tp, d = ctx.tp, head_dim
    q, kv = tp.num_heads * d, tp.num_kv_heads * d
    kv_src = tp.kv_head_start * d
    return [OutputPart("q", 0, tp.rank * q, q), OutputPart("k", q, kv_src, kv),
            OutputPart("v", q + kv, kv_src, kv)]
