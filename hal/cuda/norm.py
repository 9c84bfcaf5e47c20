"""RMSNorm and fused residual-add + RMSNorm as Triton kernels (one program per row).

Semantics are `hal/ops.py`'s: statistics in fp32, output in the input's dtype. A row of the
hidden size (4096 for Llama-3-8B) fits one block, so each row is read once and written once.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tessera.hal.cuda import pdl
from tessera.hal.cuda.pdl import enter as pdl_enter
from tessera.hal.cuda.quant_kernels import quant_row_fp8


@triton.jit
def _normed_row(x_ptr, res_ptr, w_ptr, res_out_ptr, row, x_stride, res_stride,
                res_out_stride, n_cols, eps, HAS_RESIDUAL: tl.constexpr, BLOCK: tl.constexpr):
    """One row's RMSNorm in float32 (lanes past the row 0), the residual added and stored
    first if HAS_RESIDUAL."""
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    # The weight is loaded first: a GPU issues in order, so a load after the reduction waits
    # for it, one more round trip to memory on a one-row step.
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    x = tl.load(x_ptr + row * x_stride + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:
        r = tl.load(res_ptr + row * res_stride + cols, mask=mask, other=0.0).to(tl.float32)
        x = x + r
        # The new residual is rounded to the storage dtype before it is normalised, exactly
        # as the reference does (residual_out is a tensor of x.dtype, then rms_norm of it).
        x_stored = x.to(res_out_ptr.dtype.element_ty)
        tl.store(res_out_ptr + row * res_out_stride + cols, x_stored, mask=mask)
        x = x_stored.to(tl.float32)
    mean_sq = tl.sum(x * x, axis=0) / n_cols
    inv = 1.0 / tl.sqrt(mean_sq + eps)
    return x * inv * w


@triton.jit
def _rms_norm_kernel(x_ptr, res_ptr, w_ptr, out_ptr, res_out_ptr, x_stride, res_stride,
                     out_stride, res_out_stride, n_cols, eps,
                     HAS_RESIDUAL: tl.constexpr, BLOCK: tl.constexpr,
                     USE_PDL: tl.constexpr = False):
    pdl_enter(USE_PDL)
    row = tl.program_id(0).to(tl.int64)
    y = _normed_row(x_ptr, res_ptr, w_ptr, res_out_ptr, row, x_stride, res_stride,
                    res_out_stride, n_cols, eps, HAS_RESIDUAL, BLOCK)
    cols = tl.arange(0, BLOCK)
    tl.store(out_ptr + row * out_stride + cols, y.to(out_ptr.dtype.element_ty),
             mask=cols < n_cols)


@triton.jit
def _rms_norm_quant_fp8_kernel(x_ptr, res_ptr, w_ptr, q_ptr, scale_ptr, res_out_ptr,
                               x_stride, res_stride, q_stride, res_out_stride, n_cols, eps,
                               HAS_RESIDUAL: tl.constexpr, BLOCK: tl.constexpr,
                               USE_PDL: tl.constexpr = False):
    """_rms_norm_kernel with the row quantized to e4m3 for a W8A8 product
    (quant_rows_fp8_kernel's scale a row) instead of stored: the normed row is rounded to
    x's dtype first, as the composition stores it, so the two quantize the same values."""
    pdl_enter(USE_PDL)
    row = tl.program_id(0).to(tl.int64)
    y = _normed_row(x_ptr, res_ptr, w_ptr, res_out_ptr, row, x_stride, res_stride,
                    res_out_stride, n_cols, eps, HAS_RESIDUAL, BLOCK)
    q, scale = quant_row_fp8(y.to(x_ptr.dtype.element_ty).to(tl.float32))
    cols = tl.arange(0, BLOCK)
    tl.store(q_ptr + row * q_stride + cols, q.to(q_ptr.dtype.element_ty), mask=cols < n_cols)
    tl.store(scale_ptr + row, scale)


def _launch(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor,
            eps: float) -> tuple[torch.Tensor, torch.Tensor | None]:
    if x.dim() != 2 or x.stride(-1) != 1:
        raise ValueError(f"rms_norm expects a 2-D row-major x, got shape {tuple(x.shape)} "
                         f"strides {x.stride()}")
    rows, cols = x.shape
    out = torch.empty_like(x)
    res_out = torch.empty_like(x) if residual is not None else None
    if rows == 0:
        return out, res_out
    block = triton.next_power_of_2(cols)
    num_warps = min(max(block // 512, 1), 16)
    res = residual if residual is not None else x
    _rms_norm_kernel[(rows,)](
        x, res, weight, out, res_out if res_out is not None else out,
        x.stride(0), res.stride(0), out.stride(0),
        (res_out if res_out is not None else out).stride(0), cols, float(eps),
        HAS_RESIDUAL=residual is not None, BLOCK=block, num_warps=num_warps,
        **pdl.launch_options())
    return out, res_out


def rms_norm_quant_fp8(x: torch.Tensor, weight: torch.Tensor, eps: float,
                       residual: torch.Tensor | None = None
                       ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(q e4m3 [T, C], scales float32 [T, 1], the new residual or None): rms_norm (or
    fused_add_rms_norm with a residual) then quantize_rows_fp8 of its output, in one launch
    and with the composition's values."""
    if x.dim() != 2 or x.stride(-1) != 1 or (residual is not None and (
            residual.shape != x.shape or residual.stride(-1) != 1)):
        raise ValueError(f"rms_norm_quant_fp8 expects a 2-D row-major x (and residual of its "
                         f"shape), got shape {tuple(x.shape)} strides {x.stride()}")
    rows, cols = x.shape
    q = torch.empty((rows, cols), dtype=torch.float8_e4m3fn, device=x.device)
    scales = torch.empty((rows, 1), dtype=torch.float32, device=x.device)
    res_out = torch.empty_like(x) if residual is not None else None
    if rows == 0:
        return q, scales, res_out
    block = triton.next_power_of_2(cols)
    res = residual if residual is not None else x
    _rms_norm_quant_fp8_kernel[(rows,)](
        x, res, weight, q, scales, res_out if res_out is not None else x,
        x.stride(0), res.stride(0), q.stride(0),
        (res_out if res_out is not None else x).stride(0), cols, float(eps),
        HAS_RESIDUAL=residual is not None, BLOCK=block,
        num_warps=min(max(block // 512, 1), 16), **pdl.launch_options())
    return q, scales, res_out


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    out, _ = _launch(x, None, weight, eps)
    return out


def fused_add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                       eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    out, res_out = _launch(x, residual, weight, eps)
    assert res_out is not None
    return out, res_out
