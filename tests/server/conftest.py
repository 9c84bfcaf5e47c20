"""A server shared by the tests of a module (start-up costs about a second)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.server.harness import ServerUnderTest


@pytest.fixture(scope="module")
def server() -> Iterator[ServerUnderTest]:
    srv = ServerUnderTest()
    yield srv
    srv.stop()
