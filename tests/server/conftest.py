"""One server shared by the tests of this folder (start-up costs a second or two); tests
that break or stop a server make their own."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.server.harness import ServerUnderTest


@pytest.fixture(scope="package")
def server() -> Iterator[ServerUnderTest]:
    srv = ServerUnderTest()
    yield srv
    srv.stop()
