"""Who may talk to the parameter server: the job's own processes, proven at the handshake.

Two credentials, one per kind of job:

* ``MIXRT_KV_TOKEN``: the job's token. ``mixrt launch`` makes a fresh one for every job and
  hands it to the job's processes in their environment (another user's processes cannot read
  it there). Every socket that binds asks for it with ZeroMQ's PLAIN mechanism, checked by a
  ZAP handler, so a connection without it is closed at the handshake and delivers nothing.
  PLAIN does not encrypt: the token is for loopback, where only this host's root could read
  the traffic, and pushes keep the speed of raw ZeroMQ.
* ``MIXRT_KV_SECRET``: a secret the user shares between machines. Every socket uses ZeroMQ
  CURVE (encrypted and authenticated) with key pairs derived from the secret; the ZAP
  handler admits only the secret's client key. It wins over a token.

A process binds to loopback unless the job's addresses say otherwise; binding anywhere else
without the secret is refused. A job started by hand (the ``DMLC_*`` variables, no token, no
secret) on loopback admits any local process; what such a process can send is then limited
by the per-rank tickets and the checks of every frame (``protocol.py``, ``server.py``,
``scheduler.py``).
"""

from __future__ import annotations

import hashlib
import hmac
import threading

import zmq
import zmq.auth.thread
from zmq.utils import z85

from mixrt.base.errors import KVStoreError
from mixrt.kvstore.dist.config import Config, is_loopback

PLAIN_USER = "mixrt-kv"
_authenticators: dict[int, object] = {}
_lock = threading.Lock()


def key_pair(secret: str, role: str) -> tuple[bytes, bytes]:
    """(public, secret) Z85 CURVE keys for ``role`` ("server" or "client") from the secret."""
    seed = hashlib.sha256(f"mixrt-kv/{role}/{secret}".encode()).digest()
    secret_key = z85.encode(seed)
    return zmq.curve_public(secret_key), secret_key


def mechanism(config: Config) -> str:
    """"curve" (the shared secret), "plain" (the job's token) or "none"."""
    return "curve" if config.secret else "plain" if config.token else "none"


def check_bind(host: str, config: Config, what: str) -> None:
    if config.secret is None and not is_loopback(host):
        raise KVStoreError(
            f"refusing to bind the {what} to {host}: outside loopback the KVStore needs "
            f"authentication with encryption. Set MIXRT_KV_SECRET to the same secret in "
            f"every process of the job (ZeroMQ CURVE keys are derived from it), or keep the "
            f"job on 127.0.0.1")


def secure_server(socket: zmq.Socket, config: Config) -> None:
    """Make a binding socket ask for the job's credential (before bind)."""
    kind = mechanism(config)
    if kind == "none":
        return
    _start_authenticator(socket.context, config)
    if kind == "curve":
        public, secret_key = key_pair(config.secret, "server")
        socket.curve_secretkey = secret_key
        socket.curve_publickey = public
        socket.curve_server = True
    else:
        socket.plain_server = True


def secure_client(socket: zmq.Socket, config: Config) -> None:
    """Give a connecting socket the job's credential (before connect)."""
    kind = mechanism(config)
    if kind == "curve":
        public, secret_key = key_pair(config.secret, "client")
        socket.curve_publickey = public
        socket.curve_secretkey = secret_key
        socket.curve_serverkey = key_pair(config.secret, "server")[0]
    elif kind == "plain":
        socket.plain_username = PLAIN_USER.encode()
        socket.plain_password = config.token.encode()


class _JobAuthenticator(zmq.auth.thread.ThreadAuthenticator):
    """Admits the secret's client key (CURVE) or the job's token (PLAIN), compared in
    constant time, and nothing else."""

    def __init__(self, context: zmq.Context, config: Config):
        super().__init__(context)
        self.allowed_key = key_pair(config.secret, "client")[0] if config.secret else None
        self.token = (config.token or "").encode()

    def curve_user_id(self, client_public_key: bytes) -> str:
        return "mixrt-kv-peer"

    async def _authenticate_curve(self, domain, client_key):
        # ZeroMQ hands over the raw 32-byte key; the allowed one is Z85 text
        allowed = self.allowed_key is not None and hmac.compare_digest(
            z85.encode(client_key), self.allowed_key)
        return allowed, b"OK" if allowed else b"not the job's key"

    def _authenticate_plain(self, domain, username, password):
        allowed = bool(self.token) and username == PLAIN_USER and \
            hmac.compare_digest(password.encode(), self.token)
        return allowed, b"OK" if allowed else b"not the job's token"


def _start_authenticator(context: zmq.Context, config: Config) -> None:
    """One ZAP handler per context (ZeroMQ asks it about every handshake)."""
    with _lock:
        if id(context) in _authenticators:
            return
        authenticator = _JobAuthenticator(context, config)
        authenticator.start()
        if config.secret:
            authenticator.configure_curve(domain="*", location=zmq.auth.CURVE_ALLOW_ANY)
        else:
            authenticator.configure_plain(domain="*", passwords={PLAIN_USER: config.token})
        _authenticators[id(context)] = authenticator
