"""ModelFiles: the one interface over every model source (HF folder, GGUF file, dummy weights).

    files = open_model("default")            # or a folder, a .gguf path, a config .json
    files.config                             # ModelConfig
    for name, tensor in files.iter_tensors(torch.float32): ...   # HF names, one at a time
"""

from __future__ import annotations

import sys
from abc import ABC, abstractmethod
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from tessera.formats.config import ModelConfig

if TYPE_CHECKING:
    import torch


class ModelFiles(ABC):
    """A model on disk (or a dummy one). `kind` is "safetensors", "gguf" or "dummy"."""

    kind: str = ""

    def __init__(self, path: str, config: ModelConfig) -> None:
        self.path = path
        self.config = config

    @abstractmethod
    def tensor_names(self) -> list[str]:
        """The HF-style names iter_tensors will yield, in order."""

    @abstractmethod
    def _load(self, name: str, dtype: torch.dtype) -> torch.Tensor:
        """One tensor, by HF name, on the CPU in `dtype`."""

    def iter_tensors(self, dtype: torch.dtype | None = None, *,
                     progress: bool = True) -> Iterator[tuple[str, torch.Tensor]]:
        """Yield (hf_name, cpu tensor in dtype) one at a time, with a progress bar on stderr,
        so that a model never needs two copies of its weights in memory."""
        import torch

        dtype = dtype or torch.float32
        names = self.tensor_names()
        bar = _progress(len(names), f"Loading {self.kind} weights", progress)
        try:
            for name in names:
                yield name, self._load(name, dtype)
                bar.update(1)
        finally:
            bar.close()
            self.release()

    def release(self) -> None:
        """Drop open file handles after a full pass (the files can be read again later)."""
        return None  # nothing held by default

    @property
    def gguf_metadata(self) -> dict[str, Any] | None:
        """The raw GGUF key/values (tokenizer.ggml.*, tokenizer.chat_template, ...), or None
        for a model that is not a GGUF file."""
        return None

    @property
    def tokenizer_dir(self) -> str | None:
        """The folder holding tokenizer.json / tokenizer_config.json, if there is one."""
        return None

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.path!r}, arch={self.config.arch})"


def _progress(total: int, desc: str, enabled: bool) -> Any:
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit="tensor", file=sys.stderr, disable=not enabled,
                mininterval=0.5, leave=False)
