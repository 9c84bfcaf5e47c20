"""A Hugging Face model folder: config.json + one or many *.safetensors (+ tokenizer files)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from tessera.formats.config import MULTIMODAL_TEXT_MODELS, ModelConfig
from tessera.formats.errors import ModelFormatError
from tessera.formats.model_files import ModelFiles
from tessera.formats.quant_config import CheckpointQuant, parse_quantization_config

if TYPE_CHECKING:
    import torch

    from tessera.hal.quant.weight import QuantizedWeight

_TENSOR_SKIP_SUFFIXES = ("rotary_emb.inv_freq",)  # buffers some old checkpoints carry
# Tensors of a quantized linear "<module>.<suffix>" other than its weight: read together with
# it (AWQ/GPTQ qweight + qzeros + scales + g_idx; fp8 weight + weight_scale). input_scale
# (static fp8 activation scales) is not used; k_scale / v_scale belong to the KV cache.
_QUANT_PARTS = ("qweight", "qzeros", "scales", "g_idx", "weight_scale", "input_scale")
_KV_SCALE_SUFFIXES = ("k_scale", "v_scale")


def read_config_json(folder: str) -> dict[str, Any]:
    path = os.path.join(folder, "config.json")
    if not os.path.isfile(path):
        raise ModelFormatError(f"{folder} has no config.json: a Hugging Face model folder "
                               f"needs config.json next to its *.safetensors files")
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except json.JSONDecodeError as exc:
        raise ModelFormatError(f"{path} is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ModelFormatError(f"{path} must hold a JSON object")
    return data


# Where a multimodal checkpoint keeps its language model (transformers 4 and 5 layouts)
_TEXT_PREFIXES = (("language_model.model.", "model."), ("model.language_model.", "model."),
                  ("language_model.lm_head.", "lm_head."), ("lm_head.", "lm_head."))


def text_model_tensors(config: dict[str, Any], names: Iterable[str]) -> dict[str, str]:
    """Our tensor name -> the stored one: the same names for a text model; for a multimodal
    one (MULTIMODAL_TEXT_MODELS) the language model's tensors renamed to a text model's,
    and the vision tower's and projector's left out (the text is served alone)."""
    if config.get("model_type") not in MULTIMODAL_TEXT_MODELS:
        return {n: n for n in names}
    out = {}
    for name in names:
        for prefix, ours in _TEXT_PREFIXES:
            if name.startswith(prefix):
                out[ours + name[len(prefix):]] = name
                break
    return out


class HFFolderFiles(ModelFiles):
    kind = "safetensors"

    def __init__(self, folder: str) -> None:
        raw = read_config_json(folder)
        super().__init__(folder, ModelConfig.from_hf_dict(raw))
        self.checkpoint_quant: CheckpointQuant | None = parse_quantization_config(raw, folder)
        stored = self._index_tensors(folder)
        # our name -> the name in the file (they differ inside a multimodal checkpoint)
        self._stored = text_model_tensors(raw, stored)
        self._where = {ours: stored[name] for ours, name in self._stored.items()}
        self._handles: dict[str, Any] = {}
        self._names = self._logical_names()
        # Where tensors are read to. The worker sets its device: safetensors then copies each
        # tensor from the mapped file straight to it (no torch tensor on the host, and the
        # dtype cast runs on the device). Quantized checkpoints are read on the host, where
        # their unpacking runs.
        self.device: str | torch.device = "cpu"

    @staticmethod
    def _index_tensors(folder: str) -> dict[str, str]:
        """tensor name -> the safetensors file holding it."""
        from safetensors import safe_open

        files = sorted(f for f in os.listdir(folder) if f.endswith(".safetensors"))
        if not files:
            hint = " (only PyTorch .bin files, which tessera does not load: convert them " \
                   "with save_pretrained(..., safe_serialization=True))" if any(
                       f.endswith(".bin") for f in os.listdir(folder)) else ""
            raise ModelFormatError(f"{folder} has no *.safetensors weight files{hint}")
        index_path = os.path.join(folder, "model.safetensors.index.json")
        if os.path.isfile(index_path):
            with open(index_path, encoding="utf-8") as f:
                weight_map = json.load(f).get("weight_map", {})
            missing = sorted({v for v in weight_map.values()} - set(files))
            if missing:
                raise ModelFormatError(f"{index_path} names shard(s) that are missing: "
                                       f"{', '.join(missing)}; download them again")
            where = {k: os.path.join(folder, v) for k, v in weight_map.items()}
        else:
            where = {}
            for name in files:
                path = os.path.join(folder, name)
                with safe_open(path, framework="pt") as handle:
                    for key in handle.keys():  # noqa: SIM118 (safe_open is not a dict)
                        where[key] = path
        return {k: v for k, v in where.items() if not k.endswith(_TENSOR_SKIP_SUFFIXES)}

    def _logical_names(self) -> list[str]:
        """The model's tensor names: a quantized linear's parts appear as one
        "<module>.weight"; KV cache scales are read apart (kv_cache_scales)."""
        names = set()
        for name in self._where:
            module, _, suffix = name.rpartition(".")
            if suffix == "qweight":
                names.add(f"{module}.weight")
            elif suffix not in _QUANT_PARTS and suffix not in _KV_SCALE_SUFFIXES:
                names.add(name)
        # Grouped by file so that each shard is opened once, in order.
        def where(n: str) -> str:
            return self._where.get(n) or self._where[n.removesuffix("weight") + "qweight"]
        return sorted(names, key=lambda n: (where(n), n))

    def tensor_names(self) -> list[str]:
        return list(self._names)

    def _tensor(self, name: str) -> torch.Tensor:
        from safetensors import safe_open

        path = self._where[name]
        handle = self._handles.get(path)
        if handle is None:
            # One shard open at a time: a 100-shard model must not hold 100 maps.
            self._handles.clear()
            device = "cpu" if self.checkpoint_quant is not None else str(self.device)
            handle = self._handles[path] = safe_open(path, framework="pt", device=device)
        return handle.get_tensor(self._stored[name])  # type: ignore[no-any-return]

    def _load_quantized(self, name: str) -> QuantizedWeight | None:
        module = name.removesuffix(".weight")
        if not name.endswith(".weight"):
            return None
        if f"{module}.qweight" in self._where:
            return self._int4(module)
        if f"{module}.weight_scale" in self._where:
            from tessera.formats.hf_quant import fp8_weight

            return fp8_weight(name, self._tensor(name), self._tensor(f"{module}.weight_scale"))
        return None

    def _int4(self, module: str) -> QuantizedWeight:
        from tessera.formats.hf_quant import awq_weight, gptq_weight

        quant = self.checkpoint_quant
        if quant is None or quant.scheme != "int4":
            raise ModelFormatError(f"{self.path}: {module}.qweight is packed 4-bit but "
                                   f"config.json has no AWQ or GPTQ quantization_config")
        qweight, qzeros, scales = (self._tensor(f"{module}.{p}")
                                   for p in ("qweight", "qzeros", "scales"))
        if quant.method == "awq":
            return awq_weight(module, qweight, qzeros, scales, quant.group_size)
        g_idx = self._tensor(f"{module}.g_idx") if f"{module}.g_idx" in self._where else None
        return gptq_weight(module, qweight, qzeros, scales, g_idx, quant.group_size,
                           quant.zeros_offset)

    def _load(self, name: str, dtype: torch.dtype) -> torch.Tensor:
        quantized = self._load_quantized(name)
        if quantized is not None:
            return quantized.dequantize(dtype)
        return self._tensor(name).to(dtype)

    @property
    def quantization(self) -> str | None:
        return None if self.checkpoint_quant is None else self.checkpoint_quant.describe()

    def quant_schemes(self) -> set[str]:
        return set() if self.checkpoint_quant is None else {self.checkpoint_quant.scheme}

    def kv_cache_scales(self) -> dict[int, tuple[float, float]]:
        """layer -> (k_scale, v_scale) of an fp8 KV cache, where the checkpoint has them
        ("model.layers.N.self_attn.k_scale", or modelopt's "...k_proj.k_scale")."""
        scales: dict[int, list[float]] = {}
        for name in self._where:
            module, _, suffix = name.rpartition(".")
            parts = module.split(".")
            if suffix in _KV_SCALE_SUFFIXES and len(parts) > 2 and parts[1] == "layers":
                layer = scales.setdefault(int(parts[2]), [1.0, 1.0])
                layer[_KV_SCALE_SUFFIXES.index(suffix)] = float(self._tensor(name).float().item())
        return {i: (k, v) for i, (k, v) in scales.items()}

    def release(self) -> None:
        self._handles.clear()

    @property
    def tokenizer_dir(self) -> str | None:
        return self.path
