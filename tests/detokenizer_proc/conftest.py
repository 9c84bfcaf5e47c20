from __future__ import annotations

import pytest

from tessera.formats.tokenizer import ModelTokenizer, load_tokenizer


@pytest.fixture(scope="session")
def tokenizer() -> ModelTokenizer:
    return load_tokenizer("default")


@pytest.fixture(scope="session")
def spm_tokenizer(tmp_path_factory) -> ModelTokenizer:
    """A SentencePiece-style tokenizer (▁ spaces, byte fallback) from a tiny GGUF."""
    from tests.formats.spm_helpers import write_spm_gguf

    pytest.importorskip("gguf")
    path = write_spm_gguf(tmp_path_factory.mktemp("spm") / "tiny-spm.gguf")
    return load_tokenizer(str(path))
