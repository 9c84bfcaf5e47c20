"""The cpu plugin's quantized linear over one weight block and over several, in both of its
orders: one row and many rows multiply each block as block @ x^T, 2 to ROWS_FIRST_MAX rows as
x @ block^T; every one equals the scheme's definition (quant_linear_reference) in float32."""

from __future__ import annotations

import pytest
import torch

from tessera.hal.cpu import quant_linear
from tessera.hal.quant import quant_linear_reference, quantize

# 1536 inputs in blocks of 85 output rows (BLOCK rows of 1536 weights); 200 outputs: three
# blocks, the last one short. The plugin's own blocks hold whole projections of this size, so
# the test sets a smaller one; a block of everything is the one-block case.
OUT_F, IN_F = 200, 1536
BLOCK = 85 * IN_F


@pytest.mark.parametrize("block", [BLOCK, quant_linear.BLOCK_ELEMENTS])
@pytest.mark.parametrize("rows", [1, 2, 5, quant_linear.ROWS_FIRST_MAX,
                                  quant_linear.ROWS_FIRST_MAX + 1, 64])
@pytest.mark.parametrize("scheme,group", [("int4", 32), ("int8", 128), ("fp8", None)])
def test_blocks_in_either_order_give_the_definition(scheme: str, group: int | None,
                                                    rows: int, block: int,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(quant_linear, "BLOCK_ELEMENTS", block)
    gen = torch.Generator().manual_seed(rows)
    w = quant_linear.prepare(quantize(torch.randn((OUT_F, IN_F), generator=gen) / 40.0,
                                      scheme, group))
    assert -(-OUT_F // (quant_linear.BLOCK_ELEMENTS // IN_F)) == (3 if block == BLOCK else 1)
    x = torch.randn((rows, IN_F), generator=gen)
    bias = torch.randn(OUT_F, generator=gen)
    for b in (None, bias):
        out = quant_linear.apply(x, w, b)
        assert out.shape == (rows, OUT_F) and out.is_contiguous()
        torch.testing.assert_close(out, quant_linear_reference(x, w, b), atol=1e-4, rtol=1e-4)
