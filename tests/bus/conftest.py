from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator

import pytest
import zmq


@pytest.fixture
def zmq_pair() -> Iterator[tuple[zmq.Socket, zmq.Socket]]:
    """A connected PUSH/PULL pair over ipc://, for codec tests on real frames."""
    ctx = zmq.Context.instance()
    path = os.path.join(tempfile.mkdtemp(prefix="tsr-"), "pair.sock")
    pull = ctx.socket(zmq.PULL)
    pull.bind(f"ipc://{path}")
    push = ctx.socket(zmq.PUSH)
    push.connect(f"ipc://{path}")
    pull.setsockopt(zmq.RCVTIMEO, 5000)
    yield push, pull
    push.close(linger=0)
    pull.close(linger=0)
    os.unlink(path)
    os.rmdir(os.path.dirname(path))
