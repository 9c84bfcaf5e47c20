"""ZeroMQ CURVE for the bus link between the nodes of a multi-host engine: every byte is
encrypted, and only a peer holding the engine's key pair is let in.

All nodes share one key pair (a JSON file {"public": z85, "secret": z85}, mode 0600): node 0
writes it when the file does not exist yet, the operator copies it to the other nodes. The
server socket (node 0) checks each client's public key against it through ZAP; a client
proves it holds the secret in the CURVE handshake. A peer without CURVE, or with another key,
fails the handshake and never delivers a message.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

import zmq
import zmq.auth.thread


@dataclass(frozen=True)
class KeyPair:
    public: bytes
    secret: bytes


class KeyFileError(ValueError):
    pass


def read_keys(path: str) -> KeyPair:
    try:
        with open(path) as f:
            data = json.load(f)
        keys = KeyPair(public=data["public"].encode(), secret=data["secret"].encode())
    except FileNotFoundError:
        raise KeyFileError(f"the bus key file {path} does not exist: copy node 0's key file "
                           f"to this host (--dist-key-file)") from None
    except (OSError, ValueError, KeyError, AttributeError, TypeError) as exc:
        raise KeyFileError(f"the bus key file {path} is not a CURVE key pair ({exc})") from None
    if len(keys.public) != 40 or len(keys.secret) != 40:
        raise KeyFileError(f"the bus key file {path} does not hold z85 CURVE keys")
    return keys


def ensure_keys(path: str) -> KeyPair:
    """The key pair of `path`, written first (mode 0600) if the file does not exist."""
    if not os.path.exists(path):
        public, secret = zmq.curve_keypair()
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump({"public": public.decode(), "secret": secret.decode()}, f)
    return read_keys(path)


class _SameKey:
    """ZAP credentials check: the client's public key must be the engine's."""

    def __init__(self, public: bytes) -> None:
        self.public = public

    def callback(self, domain: str, key: bytes) -> bool:
        return key == self.public  # both z85, as pyzmq's authenticator passes the key


def serve_curve(sock: zmq.Socket[Any], keys: KeyPair, ctx: zmq.Context[Any]
                ) -> zmq.auth.thread.ThreadAuthenticator:
    """Make `sock` (before bind) a CURVE server that admits only the holders of `keys`.
    The returned authenticator must be stopped when the socket is closed."""
    auth = zmq.auth.thread.ThreadAuthenticator(ctx)
    auth.start()
    auth.configure_curve_callback(domain="*", credentials_provider=_SameKey(keys.public))
    sock.curve_secretkey = keys.secret
    sock.curve_publickey = keys.public
    sock.curve_server = True
    return auth


def connect_curve(sock: zmq.Socket[Any], keys: KeyPair) -> None:
    """Make `sock` (before connect) a CURVE client of a server holding `keys`."""
    sock.curve_secretkey = keys.secret
    sock.curve_publickey = keys.public
    sock.curve_serverkey = keys.public
