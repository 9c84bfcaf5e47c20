"""The runtime quantization schemes: layout checks, reshaping for TP/fusion, quantizers and
the definition (hal/quant)."""

from __future__ import annotations

import math

import pytest
import torch

from tessera.hal.cpu.quant_linear import fp8_to_float
from tessera.hal.quant import (
    FP8_DTYPE,
    QuantizationError,
    QuantizedWeight,
    cat_rows,
    fp8_w8a8_reference,
    pack_int4,
    quant_linear_reference,
    quantize,
    quantize_activations_fp8,
    unpack_int4,
)


def _dense(out_f: int, in_f: int, seed: int) -> torch.Tensor:
    return torch.randn((out_f, in_f), generator=torch.Generator().manual_seed(seed))


def test_int4_packing_round_trips_and_puts_even_columns_low() -> None:
    q = torch.randint(0, 16, (5, 12), dtype=torch.uint8, generator=torch.Generator()
                      .manual_seed(0))
    packed = pack_int4(q)
    assert packed.shape == (5, 6)
    assert torch.equal(packed[:, 0], q[:, 0] | (q[:, 1] << 4))
    assert torch.equal(unpack_int4(packed), q)


@pytest.mark.parametrize("tile", [32, 64, 128])
def test_int4_half_split_tiles(tile: int) -> None:
    """"halves<T>": byte j of each tile of T columns holds column j low and j + T / 2 high;
    the weight is the same whatever the packing, it slices on whole tiles only, and a tile
    that does not divide the width, or a width that is not a tile, is refused."""
    from dataclasses import replace

    gen = torch.Generator().manual_seed(tile)
    q = torch.randint(0, 16, (3, 4 * tile), dtype=torch.uint8, generator=gen)
    packed = pack_int4(q, tile)
    assert torch.equal(packed[:, 1], q[:, 1] | (q[:, tile // 2 + 1] << 4))
    assert torch.equal(packed[:, tile // 2], q[:, tile] | (q[:, tile + tile // 2] << 4))
    assert torch.equal(unpack_int4(packed, tile), q)
    w = quantize(_dense(3, 4 * tile, 5), "int4", 32)
    halves = replace(w, qweight=pack_int4(unpack_int4(w.qweight), tile),
                     packing=f"halves{tile}")
    assert torch.equal(halves.dequantize(), w.dequantize())
    assert torch.equal(halves.narrow_cols(tile, 2 * tile).dequantize(),
                       w.narrow_cols(tile, 2 * tile).dequantize())
    if tile > 32:
        with pytest.raises(QuantizationError, match="whole tiles"):
            halves.narrow_cols(32, tile)
    with pytest.raises(QuantizationError, match="packing"):
        replace(w, packing="halves48")
    with pytest.raises(QuantizationError, match="whole tiles"):
        replace(quantize(_dense(3, 3 * tile // 2, 5), "int4", 16),
                qweight=torch.zeros(3, 3 * tile // 4, dtype=torch.uint8),
                packing=f"halves{tile}")


@pytest.mark.parametrize("scheme,group", [("int8", 32), ("int8", 16), ("int4", 32),
                                          ("int4", 128)])
def test_integer_quantizers_round_to_within_half_a_step(scheme: str, group: int) -> None:
    w = _dense(20, 256, 1)
    q = quantize(w, scheme, group)
    assert q.group_size == group and q.num_groups == 256 // group
    step = q.scales.repeat_interleave(group, dim=1)
    err = (q.dequantize() - w).abs()
    assert bool((err <= step / 2 + 1e-6).all()), float((err - step / 2).max())


def test_int4_keeps_zero_exact_and_values_in_range() -> None:
    w = _dense(8, 64, 2)
    w[:, :32] = 0.0  # a group of zeros and a group mixing signs
    q = quantize(w, "int4", 32)
    assert bool((q.dequantize()[:, :32] == 0).all())
    assert int(unpack_int4(q.qweight).max()) <= 15


def test_fp8_quantizer_is_per_row_with_e4m3_precision() -> None:
    w = _dense(16, 128, 3) * torch.logspace(-3, 1, 16)[:, None]  # rows of very different size
    q = quantize(w, "fp8")
    assert q.qweight.dtype == FP8_DTYPE and q.scales.shape == (16, 1)
    rel = (q.dequantize() - w).abs() / w.abs().amax(dim=1, keepdim=True)
    # 3 mantissa bits: half a step is 2^-4 of the value; the row max maps to 448
    assert float(rel.max()) <= 2 ** -4


def test_fp8_to_float_is_exact_for_every_finite_code() -> None:
    codes = torch.arange(256, dtype=torch.uint8).view(FP8_DTYPE)
    finite = ~torch.isnan(codes.float())
    assert torch.equal(fp8_to_float(codes)[finite], codes.float()[finite])


def test_validation_names_the_problem() -> None:
    q = quantize(_dense(4, 64, 4), "int4", 32)
    with pytest.raises(QuantizationError, match="scales must be float32"):
        QuantizedWeight("int4", q.qweight, q.scales.half(), q.offsets, 32, 64)
    with pytest.raises(QuantizationError, match="does not divide"):
        QuantizedWeight("int4", q.qweight, q.scales, q.offsets, 24, 64)
    with pytest.raises(QuantizationError, match="columns"):
        QuantizedWeight("int4", q.qweight, q.scales, q.offsets, 32, 128)
    with pytest.raises(QuantizationError, match="need them"):
        QuantizedWeight("int4", q.qweight, q.scales, None, 32, 64)
    with pytest.raises(QuantizationError, match="unknown quantization scheme"):
        quantize(_dense(4, 64, 4), "int3")


@pytest.mark.parametrize("scheme", ["fp8", "int8", "int4"])
def test_row_and_column_slices_are_slices_of_the_dense_weight(scheme: str) -> None:
    w = _dense(12, 128, 5)
    q = quantize(w, scheme, None if scheme == "fp8" else 32)
    dense = q.dequantize()
    assert torch.equal(q.narrow_rows(4, 6).dequantize(), dense[4:10])
    assert torch.equal(q.index_rows(torch.tensor([3, 0, 7])).dequantize(), dense[[3, 0, 7]])
    assert torch.equal(q.narrow_cols(64, 64).dequantize(), dense[:, 64:])
    assert torch.equal(cat_rows([q.narrow_rows(0, 5), q.narrow_rows(5, 7)]).dequantize(), dense)


def test_column_slices_must_keep_whole_groups() -> None:
    q = quantize(_dense(4, 128, 6), "int4", 64)
    with pytest.raises(QuantizationError, match="groups are 64 columns wide"):
        q.narrow_cols(32, 64)


def test_fusing_needs_the_same_layout() -> None:
    a = quantize(_dense(4, 128, 7), "int4", 64)
    b = quantize(_dense(4, 128, 8), "int4", 32)
    with pytest.raises(QuantizationError, match="cannot fuse"):
        cat_rows([a, b])


def test_input_perm_is_part_of_the_definition() -> None:
    w = quantize(_dense(6, 64, 9), "int4", 32)
    perm = torch.randperm(64, generator=torch.Generator().manual_seed(10))
    x = torch.randn(3, 64)
    permuted = QuantizedWeight("int4", w.qweight, w.scales, w.offsets, 32, 64, input_perm=perm)
    expected = x[:, perm] @ w.dequantize().t()
    torch.testing.assert_close(quant_linear_reference(x, permuted), expected)
    with pytest.raises(QuantizationError, match="act-order"):
        permuted.narrow_cols(0, 32)


def test_w8a8_emulation_stays_near_the_definition() -> None:
    x = torch.randn(9, 256, generator=torch.Generator().manual_seed(11))
    w = quantize(_dense(64, 256, 12) / math.sqrt(256), "fp8")
    xq, sx = quantize_activations_fp8(x)
    assert xq.dtype == FP8_DTYPE and sx.shape == (9, 1)
    exact, w8a8 = quant_linear_reference(x, w), fp8_w8a8_reference(x, w)
    assert float((w8a8 - exact).norm() / exact.norm()) < 0.05
