"""Who may talk to the parameter server: loopback by default, CURVE when told otherwise.

A process binds to loopback unless the job's addresses say otherwise. Binding anywhere else
needs authentication and is refused without it: with ``MIXRT_KV_SECRET`` set, every socket
uses ZeroMQ CURVE (encrypted and authenticated), with the server and client key pairs
derived from the secret, and a ZAP handler that admits only the client key of that secret.
A peer without the secret cannot finish the handshake, so it delivers nothing and gets no
reply. Setting the secret turns CURVE on for loopback jobs too.
"""

from __future__ import annotations

import hashlib
import threading

import zmq
import zmq.auth.thread
from zmq.utils import z85

from mixrt.errors import KVStoreError
from mixrt.kvstore.dist.config import is_loopback

_authenticators: dict[int, object] = {}
_lock = threading.Lock()


def key_pair(secret: str, role: str) -> tuple[bytes, bytes]:
    """(public, secret) Z85 CURVE keys for ``role`` ("server" or "client") from the secret."""
    seed = hashlib.sha256(f"mixrt-kv/{role}/{secret}".encode()).digest()
    secret_key = z85.encode(seed)
    return zmq.curve_public(secret_key), secret_key


def check_bind(host: str, secret: str | None, what: str) -> None:
    if secret is None and not is_loopback(host):
        raise KVStoreError(
            f"refusing to bind the {what} to {host}: outside loopback the KVStore needs "
            f"authentication. Set MIXRT_KV_SECRET to the same secret in every process of "
            f"the job (ZeroMQ CURVE keys are derived from it), or keep the job on 127.0.0.1")


def secure_server(socket: zmq.Socket, secret: str | None) -> None:
    """Make a binding socket CURVE-authenticated (before bind) when a secret is set."""
    if secret is None:
        return
    if not zmq.has("curve"):
        raise KVStoreError("MIXRT_KV_SECRET is set but this libzmq has no CURVE support")
    _start_authenticator(socket.context, secret)
    public, secret_key = key_pair(secret, "server")
    socket.curve_secretkey = secret_key
    socket.curve_publickey = public
    socket.curve_server = True


def secure_client(socket: zmq.Socket, secret: str | None) -> None:
    """Give a connecting socket the client keys and the server's public key."""
    if secret is None:
        return
    public, secret_key = key_pair(secret, "client")
    socket.curve_publickey = public
    socket.curve_secretkey = secret_key
    socket.curve_serverkey = key_pair(secret, "server")[0]


class _AllowSecretHolders:
    def __init__(self, secret: str):
        self.allowed = key_pair(secret, "client")[0]

    def callback(self, domain, client_key) -> bool:
        return client_key == self.allowed


def _start_authenticator(context: zmq.Context, secret: str) -> None:
    """One ZAP handler per context (ZeroMQ asks it about every CURVE handshake)."""
    with _lock:
        if id(context) in _authenticators:
            return
        authenticator = zmq.auth.thread.ThreadAuthenticator(context)
        authenticator.start()
        authenticator.configure_curve_callback("*", _AllowSecretHolders(secret))
        _authenticators[id(context)] = authenticator
