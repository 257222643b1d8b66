"""Where a distributed process stands: its role, the scheduler's address, the job's size and
the timeouts, all from the environment as MXNet's ps-lite reads it.

    DMLC_ROLE           scheduler | server | worker
    DMLC_PS_ROOT_URI    the scheduler's address (default 127.0.0.1)
    DMLC_PS_ROOT_PORT   the scheduler's port
    DMLC_NUM_SERVER     servers in the job
    DMLC_NUM_WORKER     workers in the job
    DMLC_NODE_HOST      the address this process binds and advertises (servers; default:
                        the interface that reaches the scheduler)

mixrt's own knobs (seconds unless said otherwise):

    MIXRT_KV_ROLE_INDEX         rank hint (``mixrt launch`` sets it; else order of arrival)
    MIXRT_KV_HEARTBEAT          heartbeat interval (0.5)
    MIXRT_KV_HEARTBEAT_TIMEOUT  a peer silent this long is lost (5)
    MIXRT_KV_TIMEOUT            the longest any wait (init, pull, barrier) may take (300)
    MIXRT_KV_BIGARRAY_BOUND     arrays above this many elements are split over all servers
                                (1,000,000, as MXNET_KVSTORE_BIGARRAY_BOUND)
    MIXRT_KV_MAX_MESSAGE        bytes; a larger frame is dropped (4 GiB)
    MIXRT_KV_MESSAGE_BYTES      pushes and pull replies travel in messages of at most this
                                many bytes (8 MiB; the same on every worker)
    MIXRT_KV_SECRET             shared secret: CURVE keys are derived from it (security.py)
    MIXRT_KV_TOKEN              the job's token for loopback jobs (``mixrt launch`` makes a
                                fresh one per job; security.py)
    MIXRT_KV_VERBOSE            1: log push/pull latencies and stragglers
"""

from __future__ import annotations

import ipaddress
import os
import socket
from dataclasses import dataclass

from mixrt.base.errors import KVStoreError

ROLES = ("scheduler", "server", "worker")


@dataclass(frozen=True)
class Config:
    role: str
    root_uri: str
    root_port: int
    num_servers: int
    num_workers: int
    role_index: int | None = None
    node_host: str | None = None
    heartbeat: float = 0.5
    heartbeat_timeout: float = 5.0
    timeout: float = 300.0
    bigarray_bound: int = 1_000_000
    max_message: int = 4 << 30
    message_bytes: int = 8 << 20
    secret: str | None = None
    token: str | None = None
    verbose: bool = False

    @property
    def root_address(self) -> str:
        return f"tcp://{_bracketed(self.root_uri)}:{self.root_port}"

    @property
    def bind_host(self) -> str:
        """The host this process binds its own sockets to (servers; the scheduler binds
        the root address)."""
        if self.node_host:
            return self.node_host
        if is_loopback(self.root_uri):
            return "127.0.0.1"
        return interface_towards(self.root_uri, self.root_port)


def from_env(environ=None, **overrides) -> Config:
    env = os.environ if environ is None else environ
    role = overrides.pop("role", None) or env.get("DMLC_ROLE", "worker")
    if role not in ROLES:
        raise KVStoreError(f"DMLC_ROLE={role!r}; expected one of {ROLES}")
    if "DMLC_PS_ROOT_PORT" not in env and "root_port" not in overrides:
        raise KVStoreError("a distributed KVStore needs DMLC_PS_ROOT_PORT (and "
                           "DMLC_PS_ROOT_URI, DMLC_NUM_SERVER, DMLC_NUM_WORKER); start the job "
                           "with `mixrt launch -n W -s S -- CMD` or set them")
    values = dict(
        role=role,
        root_uri=env.get("DMLC_PS_ROOT_URI", "127.0.0.1"),
        root_port=_int(env, "DMLC_PS_ROOT_PORT", None, 1, 65535),
        num_servers=_int(env, "DMLC_NUM_SERVER", 1, 1, 4096),
        num_workers=_int(env, "DMLC_NUM_WORKER", 1, 1, 65536),
        role_index=_int(env, "MIXRT_KV_ROLE_INDEX", None, 0, 65536),
        node_host=env.get("DMLC_NODE_HOST") or None,
        heartbeat=_float(env, "MIXRT_KV_HEARTBEAT", 0.5),
        heartbeat_timeout=_float(env, "MIXRT_KV_HEARTBEAT_TIMEOUT", 5.0),
        timeout=_float(env, "MIXRT_KV_TIMEOUT", 300.0),
        bigarray_bound=_int(env, "MIXRT_KV_BIGARRAY_BOUND", 1_000_000, 1, 1 << 40),
        max_message=_int(env, "MIXRT_KV_MAX_MESSAGE", 4 << 30, 1024, 1 << 40),
        message_bytes=_int(env, "MIXRT_KV_MESSAGE_BYTES", 8 << 20, 64, 1 << 40),
        secret=env.get("MIXRT_KV_SECRET") or None,
        token=env.get("MIXRT_KV_TOKEN") or None,
        verbose=env.get("MIXRT_KV_VERBOSE", "0") not in ("", "0", "false", "no"),
    )
    values.update(overrides)
    config = Config(**values)
    if config.heartbeat_timeout <= config.heartbeat:
        raise KVStoreError(f"MIXRT_KV_HEARTBEAT_TIMEOUT ({config.heartbeat_timeout}) must be "
                           f"longer than MIXRT_KV_HEARTBEAT ({config.heartbeat})")
    return config


def is_loopback(host: str) -> bool:
    if host in ("localhost", "ip6-localhost"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        try:
            return ipaddress.ip_address(socket.gethostbyname(host)).is_loopback
        except (OSError, ValueError):
            return False


def interface_towards(host: str, port: int) -> str:
    """This machine's address on the route to ``host`` (a UDP connect sends nothing)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect((host, port))
            return probe.getsockname()[0]
        except OSError as exc:
            raise KVStoreError(f"cannot find a route to the scheduler {host}:{port}: {exc}; "
                               f"set DMLC_NODE_HOST to this machine's address") from None


def _bracketed(host: str) -> str:
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def _int(env, name, default, low, high):
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise KVStoreError(f"{name}={raw!r} is not an integer") from None
    if not low <= value <= high:
        raise KVStoreError(f"{name}={value} is outside [{low}, {high}]")
    return value


def _float(env, name, default):
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise KVStoreError(f"{name}={raw!r} is not a number") from None
    if not 0 < value < 1e7:
        raise KVStoreError(f"{name}={value} must be a positive number of seconds")
    return value
