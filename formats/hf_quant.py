"""AWQ, GPTQ and fp8 tensors of a Hugging Face checkpoint -> the runtime schemes (hal/quant).

AWQ ("gemm" packing, AutoAWQ): qweight int32 [K, N/8], eight output columns per int32 in the
order 0 2 4 6 1 3 5 7 (nibble i holds column 8j + (0, 2, 4, 6, 1, 3, 5, 7)[i]); qzeros int32
[K/g, N/8] packed the same way; scales float16 [K/g, N]. W[n, k] = s * (q - z).

GPTQ (AutoGPTQ / GPTQModel): qweight int32 [K/8, N], eight consecutive input rows per int32
(nibble i is row 8r + i); qzeros int32 [G, N/8], nibble i is column 8j + i, stored minus one
in the original "gptq" format (not in "gptq_v2"); scales float16 [G, N]; g_idx int32 [K], the
group of each input row. With act-order (desc_act) g_idx is not k // g: the rows are sorted
by group and the input is permuted to match (QuantizedWeight.input_perm).

fp8: weight float8_e4m3fn [N, K] and weight_scale: one per row ([N, 1] or [N]) or one per
tensor (a scalar, spread over the rows, so fused q/k/v keep their own scales).
"""

from __future__ import annotations

import torch

from tessera.formats.errors import ModelFormatError
from tessera.hal.quant.weight import FP8_DTYPE, QuantizedWeight, pack_int4

_AWQ_NIBBLE_OF_COLUMN = (0, 4, 1, 5, 2, 6, 3, 7)  # column 8j + c sits in nibble [c]


def _nibbles(packed: torch.Tensor, order: tuple[int, ...]) -> torch.Tensor:
    """int32 [R, C] -> uint8 [R, C, 8]: value c of each int32 is nibble order[c]."""
    shifts = torch.tensor([4 * i for i in order], dtype=torch.int32)
    return ((packed.to(torch.int32)[..., None] >> shifts) & 0xF).to(torch.uint8)


def unpack_columns(packed: torch.Tensor, awq_order: bool) -> torch.Tensor:
    """int32 [R, C/8] -> uint8 [R, C] (AWQ's interleaved order, or GPTQ's sequential one)."""
    order = _AWQ_NIBBLE_OF_COLUMN if awq_order else tuple(range(8))
    return _nibbles(packed, order).reshape(packed.shape[0], packed.shape[1] * 8)


def unpack_rows(packed: torch.Tensor) -> torch.Tensor:
    """int32 [R/8, C] -> uint8 [R, C], nibble i of row r being row 8r + i (GPTQ qweight)."""
    values = _nibbles(packed, tuple(range(8)))  # [R/8, C, 8]
    return values.permute(0, 2, 1).reshape(packed.shape[0] * 8, packed.shape[1])


def _int4(q_kn: torch.Tensor, z_gn: torch.Tensor, s_gn: torch.Tensor, group: int,
          input_perm: torch.Tensor | None = None) -> QuantizedWeight:
    """q [K, N], zero points and scales [G, N] -> int4 with W = s * q - s * z (exact)."""
    s = s_gn.float()
    return QuantizedWeight("int4", pack_int4(q_kn.t().contiguous()), s.t().contiguous(),
                           (-s * z_gn.float()).t().contiguous(), group, q_kn.shape[0],
                           input_perm=input_perm)


def _group_size(name: str, in_features: int, groups: int, declared: int) -> int:
    group = declared if declared > 0 else in_features
    if groups * group != in_features:
        raise ModelFormatError(f"{name}: {groups} groups of {group} do not cover its "
                               f"{in_features} inputs; does quantization_config.group_size "
                               f"match the tensors?")
    return group


def awq_weight(name: str, qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor,
               group_size: int) -> QuantizedWeight:
    q = unpack_columns(qweight, awq_order=True)  # [K, N]
    z = unpack_columns(qzeros, awq_order=True)  # [G, N]
    if z.shape[1] != q.shape[1] or tuple(scales.shape) != tuple(z.shape):
        raise ModelFormatError(f"{name}: AWQ qweight {tuple(qweight.shape)}, qzeros "
                               f"{tuple(qzeros.shape)} and scales {tuple(scales.shape)} "
                               f"disagree")
    group = _group_size(name, q.shape[0], z.shape[0], group_size)
    return _int4(q, z, scales, group)


def gptq_weight(name: str, qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor,
                g_idx: torch.Tensor | None, group_size: int, zeros_offset: int
                ) -> QuantizedWeight:
    q = unpack_rows(qweight)  # [K, N]
    z = unpack_columns(qzeros, awq_order=False).to(torch.int16) + zeros_offset  # [G, N]
    if z.shape[1] != q.shape[1] or tuple(scales.shape) != tuple(z.shape):
        raise ModelFormatError(f"{name}: GPTQ qweight {tuple(qweight.shape)}, qzeros "
                               f"{tuple(qzeros.shape)} and scales {tuple(scales.shape)} "
                               f"disagree")
    k = q.shape[0]
    group = _group_size(name, k, z.shape[0], group_size)
    plain = torch.arange(k) // group
    if g_idx is None or torch.equal(g_idx.long(), plain):
        return _int4(q, z, scales, group)
    # act-order: sort the rows by group; each group must then be `group` consecutive rows
    perm = torch.argsort(g_idx.long(), stable=True)
    if not torch.equal(g_idx.long()[perm], plain):
        raise ModelFormatError(f"{name}: g_idx does not assign {group} rows to each group")
    return _int4(q[perm], z, scales, group, input_perm=perm)


def fp8_weight(name: str, weight: torch.Tensor, weight_scale: torch.Tensor) -> QuantizedWeight:
    if weight.dtype != FP8_DTYPE:
        raise ModelFormatError(f"{name}: fp8 weights must be float8_e4m3fn, got {weight.dtype}")
    rows = weight.shape[0]
    scale = weight_scale.float().reshape(-1)
    if scale.numel() == 1:
        scale = scale.expand(rows)
    elif scale.numel() != rows:
        raise ModelFormatError(f"{name}: weight_scale of shape {tuple(weight_scale.shape)} is "
                               f"neither per tensor nor per output row (block-wise fp8 is not "
                               f"supported)")
    return QuantizedWeight("fp8", weight.contiguous(), scale.reshape(rows, 1).contiguous(), None,
                           weight.shape[1], weight.shape[1])
