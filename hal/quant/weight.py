"""QuantizedWeight: a linear layer's weight in one of the runtime quantization schemes.

Every checkpoint format (GGUF blocks, AWQ, GPTQ, FP8 files) is converted at load into one of
three layouts, row-major over the output rows like a dense weight [out, in], so that tensor
parallelism slices and fuses them the way it does dense weights:

    scheme  qweight                                  value of W[n, k]
    fp8     float8_e4m3fn [N, K]                     scales[n, 0] * q[n, k]
    int8    int8 [N, K]                              scales[n, k // gs] * q[n, k]
    int4    uint8 [N, K // 2], two per byte          scales[n, k // gs] * q[n, k] + offsets[n, k // gs]
            (column 2j in the low nibble, 2j + 1 in the high one; q in 0..15)

scales / offsets are float32 [N, K // gs]; fp8 has one scale per output row (gs = K). Every
format's dequantization is exact in this form (a float16 scale times a small integer fits in
float32's mantissa), so a converted checkpoint computes what its own format defines.
`input_perm` (GPTQ act-order) reorders the input columns: y = x[:, input_perm] @ W^T.

A plugin may keep a weight in its own layout after `prepare` (hal/base.py); the cpu plugin
holds int4 one value per byte (`packing == "bytes"`), because unpacking nibbles in PyTorch
costs more than the matmul. The cuda plugin holds int4 in half-split tiles
(`packing == "halves<T>"`, T = 32, 64 or 128): the columns fall in tiles of T, and byte j of a
tile's T / 2 bytes holds its column j in the low nibble and column j + T / 2 in the high one,
so either nibble of a row of bytes is a contiguous run of columns (a tensor-core dot each,
without interleaving them back). "nibbles" is the same with T = 2. `dequantize` reads every
layout.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import torch

SCHEMES: tuple[str, ...] = ("fp8", "int8", "int4")
FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = 448.0  # largest finite float8_e4m3fn
_QDTYPES = {"fp8": FP8_DTYPE, "int8": torch.int8, "int4": torch.uint8}


class QuantizationError(ValueError):
    """A quantized tensor or scheme that cannot be used as asked (the message says why)."""


def check_scheme(scheme: str) -> str:
    if scheme not in SCHEMES:
        raise QuantizationError(f"unknown quantization scheme {scheme!r}; the runtime schemes "
                                f"are {', '.join(SCHEMES)}")
    return scheme


@dataclass
class QuantizedWeight:
    scheme: str
    qweight: torch.Tensor
    scales: torch.Tensor
    offsets: torch.Tensor | None
    group_size: int
    in_features: int
    input_perm: torch.Tensor | None = None
    packing: str = "nibbles"  # int4 only: "nibbles", "halves<T>" (two per byte), "bytes" (one)

    def __post_init__(self) -> None:
        self.validate()

    # -- shape facts --------------------------------------------------------------------------
    @property
    def out_features(self) -> int:
        return int(self.qweight.shape[0])

    @property
    def num_groups(self) -> int:
        return self.in_features // self.group_size

    @property
    def shape(self) -> tuple[int, int]:
        """The logical (dense) shape [out, in]."""
        return (self.out_features, self.in_features)

    @property
    def device(self) -> torch.device:
        return self.qweight.device

    @property
    def nbytes(self) -> int:
        """Bytes held on the device (what a matmul streams)."""
        tensors = [self.qweight, self.scales, self.offsets, self.input_perm]
        return sum(t.numel() * t.element_size() for t in tensors if t is not None)

    def validate(self) -> None:
        check_scheme(self.scheme)
        k, gs = self.in_features, self.group_size
        if self.qweight.dim() != 2:
            raise QuantizationError(f"{self.scheme} qweight must be 2-D, got shape "
                                    f"{tuple(self.qweight.shape)}")
        if self.qweight.dtype != _QDTYPES[self.scheme]:
            raise QuantizationError(f"{self.scheme} qweight must be {_QDTYPES[self.scheme]}, got "
                                    f"{self.qweight.dtype}")
        if gs <= 0 or k % gs:
            raise QuantizationError(f"{self.scheme}: group size {gs} does not divide the "
                                    f"{k} input features")
        if self.scheme == "fp8" and gs != k:
            raise QuantizationError("fp8 weights take one scale per output row (group size = "
                                    "in_features); block-wise fp8 is not supported")
        cols = k // 2 if self.scheme == "int4" and self.packing != "bytes" else k
        tile = half_tile(self.packing) if self.scheme == "int4" else None
        if self.scheme == "int4" and self.packing != "bytes" and tile is None:
            raise QuantizationError(f"int4 packing must be 'nibbles', 'halves<T>' (T one of "
                                    f"{HALF_TILES}) or 'bytes', got {self.packing!r}")
        if self.scheme == "int4" and k % 2:
            raise QuantizationError(f"int4 needs an even number of input features, got {k}")
        if tile is not None and k % tile:
            raise QuantizationError(f"int4 {self.packing}: {k} input features are not whole "
                                    f"tiles of {tile}")
        if self.qweight.shape[1] != cols:
            raise QuantizationError(f"{self.scheme} qweight has {self.qweight.shape[1]} columns, "
                                    f"expected {cols} for {k} input features")
        want = (self.out_features, k // gs)
        if tuple(self.scales.shape) != want or self.scales.dtype != torch.float32:
            raise QuantizationError(f"{self.scheme} scales must be float32 {want}, got "
                                    f"{self.scales.dtype} {tuple(self.scales.shape)}")
        if (self.offsets is not None) != (self.scheme == "int4"):
            raise QuantizationError("offsets belong to int4 weights, and int4 weights need them")
        if self.offsets is not None and (tuple(self.offsets.shape) != want
                                         or self.offsets.dtype != torch.float32):
            raise QuantizationError(f"int4 offsets must be float32 {want}, got "
                                    f"{self.offsets.dtype} {tuple(self.offsets.shape)}")
        if self.input_perm is not None and tuple(self.input_perm.shape) != (k,):
            raise QuantizationError(f"input_perm must have {k} entries, got "
                                    f"{tuple(self.input_perm.shape)}")

    # -- reshaping (tensor parallelism, fused projections, llama.cpp's q/k row order) ---------
    def _map_rows(self, f: Callable[[torch.Tensor], torch.Tensor]) -> QuantizedWeight:
        """Apply a row operation to every per-row tensor."""
        return replace(self, qweight=f(self.qweight), scales=f(self.scales),
                       offsets=None if self.offsets is None else f(self.offsets))

    def narrow_rows(self, start: int, size: int) -> QuantizedWeight:
        return self._map_rows(lambda t: t.narrow(0, start, size))

    def index_rows(self, index: torch.Tensor) -> QuantizedWeight:
        return self._map_rows(lambda t: t.index_select(0, index.to(t.device)))

    def narrow_cols(self, start: int, size: int) -> QuantizedWeight:
        """Input columns [start, start + size) (row-parallel sharding). The cut must fall on
        group boundaries, since each group shares a scale."""
        gs = self.group_size
        if self.input_perm is not None and (start, size) != (0, self.in_features):
            raise QuantizationError("a GPTQ act-order (desc_act) weight cannot be split along "
                                    "its input columns; use --tp-size 1 or a checkpoint "
                                    "quantized without desc_act")
        if self.scheme == "fp8":
            if (start, size) == (0, self.in_features):
                return self
            return replace(self, qweight=self.qweight.narrow(1, start, size), group_size=size,
                           in_features=size)
        if start % gs or size % gs:
            raise QuantizationError(f"cannot split {self.scheme} input columns at "
                                    f"[{start}, {start + size}): the quantization groups are "
                                    f"{gs} columns wide; choose a --tp-size that keeps whole "
                                    f"groups per rank")
        per_byte = 2 if self.scheme == "int4" and self.packing != "bytes" else 1
        tile = half_tile(self.packing) if self.scheme == "int4" else None
        if tile is not None and (start % tile or size % tile):
            raise QuantizationError(f"cannot split int4 {self.packing} input columns at "
                                    f"[{start}, {start + size}): not whole tiles of {tile}")
        return replace(
            self, qweight=self.qweight.narrow(1, start // per_byte, size // per_byte),
            scales=self.scales.narrow(1, start // gs, size // gs),
            offsets=None if self.offsets is None else self.offsets.narrow(1, start // gs,
                                                                          size // gs),
            in_features=size)

    def narrow(self, dim: int, start: int, length: int) -> QuantizedWeight:
        """Tensor.narrow on the logical [out, in] matrix (rows: any; columns: whole groups)."""
        if dim == 0:
            return self.narrow_rows(start, length)
        if dim in (1, -1):
            return self.narrow_cols(start, length)
        raise QuantizationError(f"a quantized weight is 2-D, cannot narrow dim {dim}")

    def to(self, device: torch.device | str) -> QuantizedWeight:
        def move(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t.to(device)
        return replace(self, qweight=self.qweight.to(device), scales=self.scales.to(device),
                       offsets=move(self.offsets), input_perm=move(self.input_perm))

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The dense weight [out, in] this stands for (computed in float32, then cast)."""
        n, k, gs = self.out_features, self.in_features, self.group_size
        q = unpack_int4(self.qweight, half_tile(self.packing) or 2) \
            if self.scheme == "int4" and self.packing != "bytes" else self.qweight
        w = q.float().view(n, k // gs, gs)
        w = w * self.scales[..., None]
        if self.offsets is not None:
            w = w + self.offsets[..., None]
        w = w.view(n, k)
        if self.input_perm is not None:
            # y = x[:, perm] @ W^T  ==  x @ W'^T with W'[:, perm] = W
            dense = torch.empty_like(w)
            dense[:, self.input_perm.to(w.device)] = w
            w = dense
        return w.to(dtype)


def cat_rows(weights: list[QuantizedWeight]) -> QuantizedWeight:
    """Stack weights of the same scheme, group size and input along the output rows (q/k/v or
    gate/up fused into one matrix)."""
    first = weights[0]
    for w in weights[1:]:
        same = (w.scheme, w.group_size, w.in_features, w.packing) == \
            (first.scheme, first.group_size, first.in_features, first.packing)
        if not same:
            raise QuantizationError(
                f"cannot fuse a {w.scheme} weight (group {w.group_size}, {w.in_features} in) "
                f"with a {first.scheme} one (group {first.group_size}, {first.in_features} in)")
        if (w.input_perm is None) != (first.input_perm is None) or (
                w.input_perm is not None and first.input_perm is not None
                and not torch.equal(w.input_perm, first.input_perm)):
            raise QuantizationError("cannot fuse GPTQ act-order weights whose input orders "
                                    "differ")
    offsets = None if first.offsets is None else \
        torch.cat([w.offsets for w in weights if w.offsets is not None])
    return replace(first, qweight=torch.cat([w.qweight for w in weights]),
                   scales=torch.cat([w.scales for w in weights]), offsets=offsets)


HALF_TILES = (32, 64, 128)  # the tile widths of the "halves<T>" int4 packings


def half_tile(packing: str) -> int | None:
    """T of an int4 packing whose bytes pair column j of a tile of T with column j + T / 2
    ("nibbles": T = 2, "halves<T>": T), else None ("bytes", or not a packing)."""
    if packing == "nibbles":
        return 2
    if packing.startswith("halves") and packing[6:].isdigit() and \
            int(packing[6:]) in HALF_TILES:
        return int(packing[6:])
    return None


def pack_int4(q: torch.Tensor, tile: int = 2) -> torch.Tensor:
    """uint8 [N, K] of values 0..15 -> uint8 [N, K // 2]. tile 2 ("nibbles"): column 2j in
    the low nibble, 2j + 1 in the high one; tile T ("halves<T>"): in each tile of T columns,
    byte j holds column j low and column j + T / 2 high."""
    k = q.shape[-1]
    if k % tile or tile % 2:
        raise QuantizationError(f"int4 packing in tiles of {tile} needs a multiple of {tile} "
                                f"columns, got {k}")
    q = q.to(torch.uint8).reshape(*q.shape[:-1], k // tile, 2, tile // 2)
    return (q[..., 0, :] | (q[..., 1, :] << 4)).reshape(*q.shape[:-3], k // 2).contiguous()


def unpack_int4(packed: torch.Tensor, tile: int = 2) -> torch.Tensor:
    """The inverse of pack_int4: uint8 [N, K // 2] -> uint8 [N, K] of values 0..15."""
    half = packed.shape[-1]
    p = packed.reshape(*packed.shape[:-1], half * 2 // tile, tile // 2)
    return torch.stack((p & 0xF, p >> 4), dim=-2).reshape(*packed.shape[:-1], half * 2)
