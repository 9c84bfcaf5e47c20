from __future__ import annotations

import os
import subprocess
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


@pytest.fixture(autouse=True)
def stop_leftover_supervisors() -> Iterator[None]:
    """A test that fails half-way must not leave its supervisor (and children) running."""
    from tests.bus.test_supervisor import Run

    yield
    while Run.started:
        proc = Run.started.pop().proc
        if proc.poll() is None:
            proc.terminate()  # the supervisor stops its children in order
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()  # orphaned children notice and stop
                proc.wait()
