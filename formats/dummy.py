"""--load-format dummy: seeded random weights of the shapes a config implies (benchmarks,
tests). The config comes from a HF folder's config.json, a JSON file of HF keys, or any other
model source (only its config is read)."""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING

from tessera.formats.config import ModelConfig
from tessera.formats.errors import ModelFormatError
from tessera.formats.layout import hf_tensor_shapes, is_norm_weight
from tessera.formats.model_files import ModelFiles

if TYPE_CHECKING:
    import torch

DUMMY_STD = 0.02  # small enough that logits stay in a sane range for any depth


def read_config_file(path: str) -> ModelConfig:
    """A ModelConfig from a JSON file of Hugging Face config keys (a benchmark config may add
    keys of its own; they are ignored)."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except FileNotFoundError:
        raise ModelFormatError(f"model config {path} does not exist") from None
    except json.JSONDecodeError as exc:
        raise ModelFormatError(f"{path} is not valid JSON: {exc}") from None
    if isinstance(data, dict) and isinstance(data.get("hf_config"), dict):
        data = data["hf_config"]
    if not isinstance(data, dict):
        raise ModelFormatError(f"{path} must hold a JSON object of Hugging Face config keys")
    return ModelConfig.from_hf_dict(data)


class DummyFiles(ModelFiles):
    kind = "dummy"

    def __init__(self, path: str, config: ModelConfig, seed: int = 0) -> None:
        super().__init__(path, config)
        self.seed = seed
        self._shapes = hf_tensor_shapes(config)
        # Where the random values are drawn. The worker sets its own device, so that an 8B
        # shape is generated on the GPU in a second instead of on the CPU in a minute. The
        # values depend on the device kind, not on the rank: TP ranks still agree.
        self.device: str | torch.device = "cpu"

    def tensor_names(self) -> list[str]:
        return list(self._shapes)

    def _load(self, name: str, dtype: torch.dtype) -> torch.Tensor:
        import torch

        shape = self._shapes[name]
        if is_norm_weight(name):
            return torch.ones(shape, dtype=dtype, device=self.device)
        # One generator per tensor, seeded by its position, so a tensor's values do not depend
        # on which other tensors were read (TP ranks read the same values).
        index = list(self._shapes).index(name)
        gen = torch.Generator(device=self.device).manual_seed(self.seed * 1_000_003 + index)
        values = torch.randn(shape, generator=gen, device=self.device)
        return (values * DUMMY_STD).to(dtype)


def dummy_from_path(path: str, seed: int, config: ModelConfig | None = None) -> DummyFiles:
    if config is None:
        if os.path.isdir(path):
            config = read_config_file(os.path.join(path, "config.json"))
        else:
            config = read_config_file(path)
    return DummyFiles(path, config, seed)
