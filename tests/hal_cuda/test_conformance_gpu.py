"""The HAL conformance suite (tessera.hal.conformance) run against the cuda plugin."""

import pytest
import torch

from tessera.hal.conformance import *  # noqa: F403  (the suite's tests and fixtures)

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")]


@pytest.fixture(scope="session")
def hal_plugin_name() -> str:
    return "cuda"
