"""A Hugging Face checkpoint's `quantization_config`: which method, which runtime scheme.

    awq                  4-bit, group-wise, zero points (AutoAWQ "gemm" packing)      -> int4
    gptq                 4-bit, group-wise, symmetric or zero points, act-order        -> int4
    compressed-tensors   fp8 weights per channel or per tensor ("float-quantized")     -> fp8
    modelopt             fp8 per tensor (quant_algo FP8; also hf_quant_config.json)    -> fp8
    fbgemm_fp8           fp8 per channel                                               -> fp8

Static activation scales of fp8 checkpoints (`input_scale`) are not used: activations are
scaled per token at run time, which is at least as accurate. Anything else is refused with a
message naming what was found, rather than loaded wrongly.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

from tessera.formats.errors import UnsupportedModelError


@dataclass(frozen=True)
class CheckpointQuant:
    method: str  # awq | gptq | fp8
    scheme: str  # the runtime scheme (hal/quant): int4 | fp8
    group_size: int = -1  # -1: one group per row
    desc_act: bool = False  # gptq act-order: groups follow g_idx
    zeros_offset: int = 0  # gptq v1 stores zero points minus one
    ignored: tuple[str, ...] = ()  # module names (or name suffixes) left unquantized
    kv_cache_fp8: bool = False  # the checkpoint carries fp8 KV cache scales

    def describe(self) -> str:
        group = f" group {self.group_size}" if self.group_size > 0 else ""
        return f"{self.method} {self.scheme}{group}"

    def is_ignored(self, module: str) -> bool:
        return any(module == i or module.endswith("." + i) or i.endswith("." + module)
                   for i in self.ignored)


def _refuse(what: str) -> UnsupportedModelError:
    return UnsupportedModelError(f"{what}; tessera loads AWQ (gemm) and GPTQ 4-bit, and fp8 "
                                 f"checkpoints (compressed-tensors, modelopt, fbgemm_fp8)")


def _parse_awq(q: dict[str, Any]) -> CheckpointQuant:
    bits, version = int(q.get("bits", q.get("w_bit", 4))), str(q.get("version", "gemm")).lower()
    if bits != 4:
        raise _refuse(f"AWQ with {bits} bits")
    if version != "gemm":
        raise _refuse(f"AWQ packing version {version!r} (only 'gemm')")
    if not q.get("zero_point", True):
        raise _refuse("AWQ without zero points")
    return CheckpointQuant("awq", "int4", int(q.get("group_size", q.get("q_group_size", 128))),
                           ignored=tuple(q.get("modules_to_not_convert") or ()))


def _parse_gptq(q: dict[str, Any]) -> CheckpointQuant:
    bits = int(q.get("bits", 4))
    if bits != 4:
        raise _refuse(f"GPTQ with {bits} bits")
    fmt = str(q.get("checkpoint_format", "gptq")).lower()
    if fmt not in ("gptq", "gptq_v2"):
        raise _refuse(f"GPTQ checkpoint format {fmt!r}")
    return CheckpointQuant("gptq", "int4", int(q.get("group_size", 128)),
                           desc_act=bool(q.get("desc_act", False)),
                           zeros_offset=1 if fmt == "gptq" else 0,
                           ignored=tuple(q.get("modules_to_not_convert") or ()))


def _fp8_weights(spec: dict[str, Any], where: str) -> None:
    if spec.get("type", "float") != "float" or int(spec.get("num_bits", 8)) != 8:
        raise _refuse(f"{where}: weights {spec.get('type')} {spec.get('num_bits')}-bit")
    if spec.get("strategy", "tensor") not in ("tensor", "channel"):
        raise _refuse(f"{where}: fp8 weight strategy {spec.get('strategy')!r} (block or group "
                      f"scales)")


def _parse_compressed_tensors(q: dict[str, Any]) -> CheckpointQuant:
    fmt = q.get("format")
    if fmt not in ("float-quantized", "naive-quantized", None):
        raise _refuse(f"compressed-tensors format {fmt!r}")
    groups = q.get("config_groups") or {}
    if not groups:
        raise _refuse("compressed-tensors without config_groups")
    for name, group in groups.items():
        _fp8_weights(group.get("weights") or {}, f"compressed-tensors group {name}")
    kv = q.get("kv_cache_scheme")
    return CheckpointQuant("fp8", "fp8", ignored=tuple(q.get("ignore") or ()),
                           kv_cache_fp8=bool(kv and kv.get("type") == "float"))


def _parse_modelopt(q: dict[str, Any]) -> CheckpointQuant:
    q = q.get("quantization", q)
    algo = str(q.get("quant_algo", "")).upper()
    if algo != "FP8":
        raise _refuse(f"modelopt quant_algo {algo or None!r}")
    kv = str(q.get("kv_cache_quant_algo") or "").upper()
    return CheckpointQuant("fp8", "fp8",
                           ignored=tuple(q.get("exclude_modules") or q.get("ignore") or ()),
                           kv_cache_fp8=kv == "FP8")


def _parse_fbgemm_fp8(q: dict[str, Any]) -> CheckpointQuant:
    return CheckpointQuant("fp8", "fp8", ignored=tuple(q.get("modules_to_not_convert") or ()))


_PARSERS = {"awq": _parse_awq, "gptq": _parse_gptq,
            "compressed-tensors": _parse_compressed_tensors, "modelopt": _parse_modelopt,
            "fbgemm_fp8": _parse_fbgemm_fp8}


def parse_quantization_config(config: dict[str, Any], folder: str | None = None
                              ) -> CheckpointQuant | None:
    """The checkpoint's quantization from config.json (or modelopt's hf_quant_config.json
    beside it); None for a floating-point checkpoint."""
    q = config.get("quantization_config") or config.get("compression_config")
    if q is None and folder is not None:
        path = os.path.join(folder, "hf_quant_config.json")
        if os.path.isfile(path):
            with open(path, encoding="utf-8") as f:
                q = {"quant_method": "modelopt", **json.load(f)}
    if q is None:
        return None
    if not isinstance(q, dict):
        raise UnsupportedModelError("quantization_config must be a JSON object")
    method = str(q.get("quant_method", "")).lower()
    parser = _PARSERS.get(method)
    if parser is None:
        raise _refuse(f"quantization method {method or None!r}")
    return parser(q)
