"""Fixtures for the client library: a run directory with a FakeEngine bound to it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tessera.bus.run_paths import RunPaths
from tessera.client import Client
from tessera.client.testing import FakeEngine
from tessera.config import EngineConfig


@pytest.fixture
def paths(run_root: Path) -> RunPaths:
    return RunPaths.create()


@pytest.fixture
def config() -> EngineConfig:
    return EngineConfig(heartbeat_interval_s=0.1, heartbeat_timeout_s=1.0,
                        request_timeout_s=5.0, breaker_failures=2, breaker_cooldown_s=0.5)


@pytest.fixture
def engine(paths: RunPaths) -> Iterator[FakeEngine]:
    with FakeEngine(paths) as eng:
        yield eng


@pytest.fixture
def client(paths: RunPaths, config: EngineConfig, engine: FakeEngine) -> Iterator[Client]:
    with Client(paths, config) as c:
        yield c
