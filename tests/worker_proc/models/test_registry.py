"""The model registry: every model_type formats can read has a registered implementation,
and an unknown one is refused with the list of those that exist."""

from __future__ import annotations

import pytest

from tessera.formats.config import SUPPORTED_ARCHS
from tessera.worker_proc.models import model_class, registered_models
from tessera.worker_proc.models.base import CausalLM


def test_every_supported_model_type_has_an_implementation():
    models = registered_models()
    assert set(models) == set(SUPPORTED_ARCHS)
    assert all(issubclass(cls, CausalLM) for cls in models.values())


def test_unknown_model_type_names_the_known_ones():
    with pytest.raises(ValueError, match="no model implementation for 'gpt2'; have .*llama"):
        model_class("gpt2")
