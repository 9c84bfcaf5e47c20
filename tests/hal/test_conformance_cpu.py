"""The conformance suite (tessera.hal.conformance) run against the reference cpu plugin."""

from tessera.hal.conformance import *  # noqa: F403  (the suite's tests, fixtures and hooks)

HAL_PLUGIN = "cpu"
