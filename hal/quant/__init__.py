"""Quantized weights: the runtime schemes (fp8, int8, int4), their definition and quantizers.

    from tessera.hal.quant import QuantizedWeight, quantize, quant_linear_reference
    w = quantize(dense_weight, "int4")           # or a checkpoint's weight, from formats/
    y = platform.linear_kernel(w.scheme)(x, w_prepared, bias)   # see hal/base.py

Chip-neutral PyTorch only: formats/ converts checkpoint layouts into these, plugins run them.
"""

from tessera.hal.quant.quantize import (
    DEFAULT_GROUP_SIZE,
    quantize,
    quantize_activations_fp8,
    quantize_fp8,
    quantize_int4,
    quantize_int8,
)
from tessera.hal.quant.reference import (
    fp8_w8a8_reference,
    one_token_fused_reference,
    quant_linear_reference,
    rows_fused_reference,
)
from tessera.hal.quant.weight import (
    FP8_DTYPE,
    FP8_MAX,
    HALF_TILES,
    SCHEMES,
    QuantizationError,
    QuantizedWeight,
    cat_rows,
    check_scheme,
    half_tile,
    pack_int4,
    unpack_int4,
)

__all__ = [
    "DEFAULT_GROUP_SIZE",
    "FP8_DTYPE",
    "FP8_MAX",
    "HALF_TILES",
    "SCHEMES",
    "QuantizationError",
    "QuantizedWeight",
    "cat_rows",
    "check_scheme",
    "one_token_fused_reference",
    "rows_fused_reference",
    "fp8_w8a8_reference",
    "half_tile",
    "pack_int4",
    "quant_linear_reference",
    "quantize",
    "quantize_activations_fp8",
    "quantize_fp8",
    "quantize_int4",
    "quantize_int8",
    "unpack_int4",
]
