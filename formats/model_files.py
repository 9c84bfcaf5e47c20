"""ModelFiles: the one interface over every model source (HF folder, GGUF file, dummy weights).

    files = open_model("default")            # or a folder, a .gguf path, a config .json
    files.config                             # ModelConfig
    for name, tensor in files.iter_tensors(torch.float32): ...   # HF names, one at a time
"""

from __future__ import annotations

import sys
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from tessera.formats.config import ModelConfig

if TYPE_CHECKING:
    import torch

    from tessera.hal.quant.weight import QuantizedWeight


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

    def _load_quantized(self, name: str) -> QuantizedWeight | None:
        """The checkpoint's own quantized form of a linear weight, or None where it stores
        the tensor in floating point (or in a form without a runtime scheme)."""
        return None

    def quant_schemes(self) -> set[str]:
        """The runtime schemes (hal/quant) of the linear weights kept quantized by
        iter_tensors(keep_quantized=True); empty for a floating-point checkpoint."""
        return set()

    def kv_cache_scales(self) -> dict[int, tuple[float, float]]:
        """layer -> (k_scale, v_scale) for an fp8 KV cache, where the checkpoint has them."""
        return {}

    @property
    def quantization(self) -> str | None:
        """How the checkpoint's linear weights are quantized ("gguf Q4_1, Q8_0", "awq int4
        group 128", ...), or None for a floating-point checkpoint."""
        return None

    def iter_tensors(self, dtype: torch.dtype | None = None, *, progress: bool = True,
                     keep_quantized: bool = False, only: Callable[[str], bool] | None = None
                     ) -> Iterator[tuple[str, torch.Tensor | QuantizedWeight]]:
        """Yield (hf_name, cpu tensor in dtype) one at a time, with a progress bar on stderr,
        so that a model never needs two copies of its weights in memory. With keep_quantized,
        a linear weight the checkpoint stores quantized comes as a QuantizedWeight (hal/quant)
        instead; everything else is dequantized to dtype. `only`: the names to read (a
        pipeline stage reads its own layers only)."""
        import torch

        dtype = dtype or torch.float32
        names = [n for n in self.tensor_names() if only is None or only(n)]
        bar = _progress(len(names), f"Loading {self.kind} weights", progress)
        try:
            for name in names:
                quantized = self._load_quantized(name) if keep_quantized else None
                yield name, quantized if quantized is not None else self._load(name, dtype)
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
