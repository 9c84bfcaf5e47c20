"""A Hugging Face model folder: config.json + one or many *.safetensors (+ tokenizer files)."""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Any

from tessera.formats.config import ModelConfig
from tessera.formats.errors import ModelFormatError
from tessera.formats.model_files import ModelFiles

if TYPE_CHECKING:
    import torch

_TENSOR_SKIP_SUFFIXES = ("rotary_emb.inv_freq",)  # buffers some old checkpoints carry


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


class HFFolderFiles(ModelFiles):
    kind = "safetensors"

    def __init__(self, folder: str) -> None:
        super().__init__(folder, ModelConfig.from_hf_dict(read_config_json(folder)))
        self._where = self._index_tensors(folder)
        self._handles: dict[str, Any] = {}

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

    def tensor_names(self) -> list[str]:
        # Grouped by file so that each shard is opened once, in order.
        return sorted(self._where, key=lambda k: (self._where[k], k))

    def _load(self, name: str, dtype: torch.dtype) -> torch.Tensor:
        from safetensors import safe_open

        path = self._where[name]
        handle = self._handles.get(path)
        if handle is None:
            # One shard open at a time: a 100-shard model must not hold 100 maps.
            self._handles.clear()
            handle = self._handles[path] = safe_open(path, framework="pt")
        return handle.get_tensor(name).to(dtype)

    def release(self) -> None:
        self._handles.clear()

    @property
    def tokenizer_dir(self) -> str | None:
        return self.path
