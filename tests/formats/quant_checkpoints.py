"""Write AWQ, GPTQ and fp8 checkpoints the way their tools do, for the loader tests.

The packing below follows AutoAWQ's WQLinear_GEMM.from_linear and AutoGPTQ's QuantLinear.pack
line for line (the loader's unpacking is written independently in formats/hf_quant.py), and
every writer also returns the float weights the checkpoint stands for: its dequantized twin.
"""

from __future__ import annotations

import json
import os
import zlib
from dataclasses import dataclass
from typing import Any

import torch

AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]


@dataclass
class Packed:
    tensors: dict[str, torch.Tensor]  # suffix -> tensor ("qweight", "scales", ...)
    dequantized: torch.Tensor  # float32 [N, K]: what the checkpoint means


def _random_int4(n: int, k: int, group: int, seed: int
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 16, (n, k), generator=gen, dtype=torch.int32)
    z = torch.randint(0, 16, (n, k // group), generator=gen, dtype=torch.int32)
    s = (torch.rand((n, k // group), generator=gen) * 0.02 + 0.001).half()
    return q, z, s


def awq_pack(n: int, k: int, group: int, seed: int) -> Packed:
    q, z, s = _random_int4(n, k, group, seed)
    intweight = q.t().contiguous()  # [K, N]
    qweight = torch.zeros((k, n // 8), dtype=torch.int32)
    for col in range(n // 8):
        for i in range(8):
            qweight[:, col] |= intweight[:, col * 8 + AWQ_ORDER[i]] << (i * 4)
    zeros = z.t().contiguous()  # [G, N]
    qzeros = torch.zeros((k // group, n // 8), dtype=torch.int32)
    for col in range(n // 8):
        for i in range(8):
            qzeros[:, col] |= zeros[:, col * 8 + AWQ_ORDER[i]] << (i * 4)
    deq = (q - z.repeat_interleave(group, 1)).float() * s.float().repeat_interleave(group, 1)
    return Packed({"qweight": qweight, "qzeros": qzeros, "scales": s.t().contiguous()}, deq)


def gptq_pack(n: int, k: int, group: int, seed: int, *, desc_act: bool = False,
              v2: bool = False, sym: bool = False, order_seed: int | None = None) -> Packed:
    q, z, s = _random_int4(n, k, group, seed)
    if sym:
        z = torch.full_like(z, 8)
    elif not v2:
        z = z.clamp(min=1)  # the original format stores zero - 1: a zero point of 0 cannot be
    gen = torch.Generator().manual_seed(seed + 1 if order_seed is None else order_seed)
    order = torch.randperm(k, generator=gen) if desc_act else torch.arange(k)
    g_idx = (torch.argsort(order) // group).to(torch.int32)  # column order[r] is in group r // g
    intweight = q.t().contiguous()  # [K, N]
    qweight = torch.zeros((k // 8, n), dtype=torch.int32)
    i = row = 0
    while row < qweight.shape[0]:
        for j in range(i, i + 8):
            qweight[row] |= intweight[j] << (4 * (j - i))
        i += 8
        row += 1
    stored = (z if v2 else z - 1).t().contiguous()  # [G, N]; v1 keeps zero - 1
    qzeros = torch.zeros((k // group, n // 8), dtype=torch.int32)
    i = col = 0
    while col < qzeros.shape[1]:
        for j in range(i, i + 8):
            qzeros[:, col] |= (stored[:, j] & 0xF) << (4 * (j - i))
        i += 8
        col += 1
    gk = g_idx.long()
    deq = (q - z[:, gk]).float() * s.float()[:, gk]
    return Packed({"qweight": qweight, "qzeros": qzeros, "scales": s.t().contiguous(),
                   "g_idx": g_idx}, deq)


def fp8_pack(weight: torch.Tensor, per_tensor: bool) -> Packed:
    w = weight.float()
    amax = w.abs().amax() if per_tensor else w.abs().amax(dim=1, keepdim=True)
    scale = (amax / 448.0).clamp_min(1e-12)
    q = (w / scale).clamp(-448, 448).to(torch.float8_e4m3fn)
    deq = q.float() * scale
    return Packed({"weight": q, "weight_scale": scale.reshape(()) if per_tensor else scale}, deq)


LINEAR_SUFFIXES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
# Projections that read the same input: GPTQ's act-order sorts the input columns by the
# Hessian of that input, so they share one order (and fuse into one matrix)
_SAME_INPUT = {"k_proj": "q_proj", "v_proj": "q_proj", "up_proj": "gate_proj"}


def _order_seed(module: str) -> int:
    prefix, _, last = module.rpartition(".")
    return zlib.crc32(f"{prefix}.{_SAME_INPUT.get(last, last)}".encode())


def quantization_config(method: str, group: int, **kw: Any) -> dict[str, Any]:
    if method == "awq":
        return {"quant_method": "awq", "bits": 4, "group_size": group, "zero_point": True,
                "version": "gemm"}
    if method == "gptq":
        return {"quant_method": "gptq", "bits": 4, "group_size": group,
                "desc_act": kw.get("desc_act", False), "sym": kw.get("sym", False),
                "checkpoint_format": "gptq_v2" if kw.get("v2") else "gptq"}
    strategy = "tensor" if kw.get("per_tensor") else "channel"
    return {"quant_method": "compressed-tensors", "format": "float-quantized",
            "config_groups": {"group_0": {
                "targets": ["Linear"],
                "weights": {"num_bits": 8, "type": "float", "strategy": strategy,
                            "symmetric": True, "dynamic": False},
                "input_activations": {"num_bits": 8, "type": "float", "strategy": "token",
                                      "dynamic": True}}},
            "ignore": ["lm_head"]}


def write_quantized(folder: str, twin_folder: str, method: str, group: int = 32,
                    seed: int = 0, **kw: Any) -> None:
    """Quantize the HF model saved in `folder` in place (its linear layers; lm_head and
    embeddings stay float) and write its dequantized float twin to `twin_folder`.
    gptq `shared_order=True` (with desc_act): projections of one input share their act-order
    column order, as GPTQ writes them; without it each has its own (the unfusable case)."""
    from safetensors.torch import load_file, save_file

    path = os.path.join(folder, "model.safetensors")
    state = load_file(path)
    twin = dict(state)
    out: dict[str, torch.Tensor] = {}
    for index, (name, tensor) in enumerate(sorted(state.items())):
        module = name.removesuffix(".weight")
        if not (name.endswith(".weight") and module.rsplit(".", 1)[-1] in LINEAR_SUFFIXES):
            out[name] = tensor
            continue
        n, k = tensor.shape
        if method == "awq":
            packed = awq_pack(n, k, group, seed + index)
        elif method == "gptq":
            packed = gptq_pack(n, k, group, seed + index, desc_act=kw.get("desc_act", False),
                               v2=kw.get("v2", False), sym=kw.get("sym", False),
                               order_seed=_order_seed(module) if kw.get("shared_order")
                               else None)
        else:
            packed = fp8_pack(tensor, per_tensor=kw.get("per_tensor", False))
        for suffix, value in packed.tensors.items():
            out[f"{module}.{suffix}"] = value
        twin[name] = packed.dequantized.to(tensor.dtype)
    os.makedirs(twin_folder, exist_ok=True)
    for other in os.listdir(folder):
        if other != "model.safetensors" and os.path.isfile(os.path.join(folder, other)):
            with open(os.path.join(folder, other), "rb") as src, \
                    open(os.path.join(twin_folder, other), "wb") as dst:
                dst.write(src.read())
    save_file({k: v.contiguous() for k, v in twin.items()},
              os.path.join(twin_folder, "model.safetensors"))
    os.remove(path)
    save_file({k: v.contiguous() for k, v in out.items()}, path)
    config_path = os.path.join(folder, "config.json")
    with open(config_path, encoding="utf-8") as f:
        config = json.load(f)
    config["quantization_config"] = quantization_config(method, group, **kw)
    with open(config_path, "w", encoding="utf-8") as f:
        json.dump(config, f)
