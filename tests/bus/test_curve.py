"""The bus link between nodes is CURVE-encrypted and admits only holders of the engine's key
pair: a plaintext peer and a peer with another key fail the handshake (seen on the server's
socket monitor) and deliver nothing; the right key gets through."""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterator
from typing import Any

import pytest
import zmq
from zmq.utils.monitor import recv_monitor_message

from tessera.bus.curve import (
    KeyFileError,
    KeyPair,
    connect_curve,
    ensure_keys,
    read_keys,
    serve_curve,
)

pytestmark = pytest.mark.skipif(not zmq.has("curve"), reason="libzmq without CURVE")

WAIT_MS = 5000  # bounds each wait; the checks are on events, not on time


@pytest.fixture()
def keys(tmp_path) -> KeyPair:
    return ensure_keys(str(tmp_path / "bus-key.json"))


@pytest.fixture()
def server(keys: KeyPair) -> Iterator[tuple[zmq.Socket[Any], zmq.Socket[Any], str]]:
    ctx = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    auth = serve_curve(sock, keys, ctx)
    monitor = sock.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED
                                      | zmq.EVENT_HANDSHAKE_FAILED_AUTH
                                      | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
                                      | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL)
    port = sock.bind_to_random_port("tcp://127.0.0.1")
    yield sock, monitor, f"tcp://127.0.0.1:{port}"
    sock.disable_monitor()
    monitor.close(0)
    sock.close(0)
    auth.stop()
    ctx.term()


def handshake_event(monitor: zmq.Socket[Any]) -> int:
    assert monitor.poll(WAIT_MS), "no handshake event on the server"
    return int(recv_monitor_message(monitor)["event"])


def client(ctx: zmq.Context[Any], url: str, keys: KeyPair | None) -> zmq.Socket[Any]:
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    if keys is not None:
        connect_curve(sock, keys)
    sock.connect(url)
    sock.send(b"hello")
    return sock


def test_the_engine_key_gets_through(server, keys) -> None:
    sock, monitor, url = server
    ctx = zmq.Context()
    peer = client(ctx, url, keys)
    assert handshake_event(monitor) == zmq.EVENT_HANDSHAKE_SUCCEEDED
    assert sock.poll(WAIT_MS)
    assert sock.recv_multipart()[1] == b"hello"
    peer.close()
    ctx.term()


def test_a_plaintext_peer_is_refused(server) -> None:
    sock, monitor, url = server
    ctx = zmq.Context()
    peer = client(ctx, url, None)
    assert handshake_event(monitor) in (zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL,
                                        zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL)
    assert not sock.poll(0)  # the handshake failed: its message can never be delivered
    peer.close()
    ctx.term()


def test_a_peer_with_another_key_is_refused(server, keys) -> None:
    sock, monitor, url = server
    public, secret = zmq.curve_keypair()
    ctx = zmq.Context()
    # Knows the server's public key (it is no secret) but holds another key pair.
    peer = ctx.socket(zmq.DEALER)
    peer.setsockopt(zmq.LINGER, 0)
    peer.curve_publickey, peer.curve_secretkey, peer.curve_serverkey = public, secret, keys.public
    peer.connect(url)
    peer.send(b"hello")
    assert handshake_event(monitor) == zmq.EVENT_HANDSHAKE_FAILED_AUTH
    assert not sock.poll(0)
    peer.close()
    ctx.term()


def test_key_file_written_private_and_read_back(tmp_path) -> None:
    path = str(tmp_path / "k" / "bus-key.json")
    first = ensure_keys(path)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert ensure_keys(path) == first == read_keys(path)  # kept, not rewritten


def test_missing_or_bad_key_file_is_a_clear_error(tmp_path) -> None:
    with pytest.raises(KeyFileError, match="copy node 0's key file"):
        read_keys(str(tmp_path / "none.json"))
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"public": "x", "secret": "y"}))
    with pytest.raises(KeyFileError, match="z85"):
        read_keys(str(bad))
