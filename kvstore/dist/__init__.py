"""The parameter server over ZeroMQ: protocol, scheduler, servers, workers (the store).

``python -m mixrt.kvstore.dist`` runs the scheduler or a server, whichever ``DMLC_ROLE``
says (``mixrt launch`` starts them so).
"""

from __future__ import annotations

import logging
import sys

from mixrt.base.errors import KVStoreError
from mixrt.kvstore.dist.config import Config, from_env
from mixrt.kvstore.dist.scheduler import run_scheduler
from mixrt.kvstore.dist.server import run_server


def run_role(config: Config | None = None) -> int:
    """Serve as the scheduler or a server until the job ends; returns the exit status."""
    config = config or from_env()
    if config.role == "scheduler":
        return run_scheduler(config)
    if config.role == "server":
        return run_server(config)
    raise KVStoreError("run_role serves the scheduler and server roles; a worker creates "
                       "its store with mixrt.kv.create('dist_sync')")


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    try:
        return run_role()
    except KVStoreError as exc:
        print(f"mixrt.kvstore: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        return 1
    except KeyboardInterrupt:
        return 130
