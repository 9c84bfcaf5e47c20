from __future__ import annotations

import pytest

from tessera.formats.tokenizer import ModelTokenizer, load_tokenizer


@pytest.fixture(scope="session")
def tokenizer() -> ModelTokenizer:
    return load_tokenizer("default")
