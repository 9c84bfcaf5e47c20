"""A streaming client that never reads: its request is aborted in the engine and its
generation slot freed, instead of the engine working for nobody and the server buffering."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator

import pytest

from tests.server.harness import ServerUnderTest

CHAT = "/v1/chat/completions"


def open_unread_stream(srv: ServerUnderTest, **fields: object) -> socket.socket:
    """Send a streaming chat request on a socket with a tiny receive buffer, and never read."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect((srv.host, srv.port))
    body = json.dumps({"messages": [{"role": "user", "content": "hi"}], "stream": True,
                       **fields}).encode()
    sock.sendall(b"POST " + CHAT.encode() + b" HTTP/1.1\r\nHost: x\r\n"
                 b"Content-Type: application/json\r\nContent-Length: "
                 + str(len(body)).encode() + b"\r\n\r\n" + body)
    return sock


def wait_until(predicate, timeout: float) -> bool:  # noqa: ANN001
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


def slot_is_free(srv: ServerUnderTest) -> bool:
    status, _, _ = srv.request("POST", CHAT, {"messages": [{"role": "user", "content": "x"}],
                                              "max_tokens": 2})
    return status == 200


@pytest.fixture
def one_slot_server() -> Iterator[ServerUnderTest]:
    srv = ServerUnderTest(token_delay_s=0.0005, max_concurrent_requests=1,
                          stream_stall_timeout_s=1.0, stream_buffer_outputs=256)
    yield srv
    srv.stop()


def test_an_unread_stream_is_aborted_in_the_engine(one_slot_server: ServerUnderTest) -> None:
    srv = one_slot_server
    sock = open_unread_stream(srv, n=16, logprobs=True, top_logprobs=20, max_tokens=100_000,
                              ignore_eos=True)
    try:
        assert wait_until(lambda: srv.engine.requests[-1].sampling.n == 16, 10.0)
        rid = srv.engine.requests[-1].rid
        # Aborted long before its 1.6 million outputs: the engine does not work for nobody.
        assert wait_until(lambda: any(a.rid == rid for a in srv.engine.aborts), 20.0)
        assert srv.engine.in_flight == 0
        # ... and the one generation slot is free again while the client is still connected.
        assert wait_until(lambda: slot_is_free(srv), 20.0)
    finally:
        sock.close()


def test_a_stalled_stream_frees_its_slot_after_the_stall_timeout() -> None:
    """Outputs the client library may buffer whole (the engine finishes), megabytes of SSE
    the client never reads: the server's write waits, and gives up after
    stream_stall_timeout_s. The timeout is 4 s here, not 1: the check that the slot is held
    comes after two polls and a request, and on a loaded 2-core machine those took more than
    a second of the stall (CI, stop 36)."""
    srv = ServerUnderTest(token_delay_s=0.0005, max_concurrent_requests=1,
                          stream_stall_timeout_s=4.0, stream_buffer_outputs=100_000)
    sock = open_unread_stream(srv, n=16, logprobs=True, top_logprobs=20, max_tokens=200,
                              ignore_eos=True)
    try:
        assert wait_until(lambda: srv.engine.requests[-1].sampling.max_tokens == 200, 10.0)
        assert wait_until(lambda: srv.engine.in_flight == 0, 10.0)  # the engine is done
        assert not slot_is_free(srv)  # held while the server writes to it
        assert wait_until(lambda: slot_is_free(srv), 30.0)
    finally:
        sock.close()
        srv.stop()


def test_the_kernel_does_not_buffer_megabytes_for_a_client_that_never_reads() -> None:
    """The stall timer starts only once the server's writes wait. The kernel's send buffer
    grows by itself to megabytes, and would take minutes of a slow engine's output before
    anything waits; the server keeps it to a few pages of unsent data, so a client that
    reads nothing is cut off after little more than the stall timeout of output."""
    srv = ServerUnderTest(token_delay_s=0.004, max_concurrent_requests=1,
                          stream_stall_timeout_s=1.0, stream_buffer_outputs=1_000_000)
    fields = dict(logprobs=True, top_logprobs=20, max_tokens=1_000_000, ignore_eos=True)
    try:
        status, _, body = srv.request("POST", CHAT, {
            "messages": [{"role": "user", "content": "hi"}], "stream": True,
            **{**fields, "max_tokens": 3}})
        assert status == 200
        event_bytes = len(body) / 4  # three tokens and a last chunk
        sock = open_unread_stream(srv, **fields)
        try:
            assert wait_until(lambda: srv.engine.requests[-1].sampling.max_tokens == 1_000_000,
                              10.0)
            rid = srv.engine.requests[-1].rid
            assert wait_until(lambda: rid in srv.engine.emitted_at_abort, 60.0)
            produced = srv.engine.emitted_at_abort[rid] * event_bytes
            # Unsent data (64 KiB), what the client's window took, and the outputs produced
            # during the 1 s stall (250 tokens): far below the megabytes of an autotuned
            # send buffer.
            assert produced < 1_000_000, f"{produced / 1e6:.1f} MB produced for nobody"
            assert wait_until(lambda: slot_is_free(srv), 20.0)
        finally:
            sock.close()
    finally:
        srv.stop()
