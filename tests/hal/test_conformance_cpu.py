"""The conformance suite (tessera.hal.conformance) run against the reference cpu plugin."""

import pytest

from tessera.hal.conformance import *  # noqa: F403  (the suite's tests and fixtures)


@pytest.fixture(scope="session")
def hal_plugin_name() -> str:
    return "cpu"
