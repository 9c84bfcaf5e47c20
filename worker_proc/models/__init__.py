"""Model implementations by architecture. One class serves the whole Llama family."""

from __future__ import annotations

from typing import Any

from tessera.formats.config import SUPPORTED_ARCHS


def model_class(arch: str) -> Any:
    """The model class for `arch` (a ModelConfig.arch)."""
    if arch not in SUPPORTED_ARCHS:
        raise ValueError(f"no model implementation for {arch!r}; have "
                         f"{', '.join(sorted(SUPPORTED_ARCHS))}")
    from tessera.worker_proc.models.llama import LlamaForCausalLM

    return LlamaForCausalLM
