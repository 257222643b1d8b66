"""KVStore: how workers share parameters (paper §2.3, §3.3).

    import mixrt
    kv = mixrt.kv.create("dist_sync")        # local | device | nccl | dist_sync | dist_async
    kv.init("w", weight)                     #   | dist_device_sync
    kv.set_optimizer(mixrt.optimizer.create("sgd", learning_rate=0.1))
    kv.push("w", gradient)                   # a list of per-device arrays is summed first
    kv.pull("w", out=weight)

The ``dist_*`` kinds talk to a parameter server (``kvstore/dist/``) started by
``mixrt launch``. In a process whose ``DMLC_ROLE`` is ``scheduler`` or ``server``,
``create`` serves that role and exits when the job ends, as ``import mxnet`` does, so one
script can be launched for every role.
"""

from __future__ import annotations

import os
import sys

from mixrt.base.errors import KVStoreError
from mixrt.kvstore.base import KVStore
from mixrt.kvstore.local import AGGREGATE_ON, LocalStore
from mixrt.kvstore.nccl import NCCLStore

KINDS = ("local", "device", "nccl", "dist_sync", "dist_async", "dist_device_sync",
         "local_update_cpu", "local_allreduce_cpu", "local_allreduce_device")


def create(kind: str = "local", **options) -> KVStore:
    """A store of ``kind``; see the module docstring."""
    if not isinstance(kind, str) or kind not in KINDS:
        raise KVStoreError(f"unknown KVStore kind {kind!r}; choose one of {KINDS}")
    if kind in AGGREGATE_ON:
        return LocalStore(kind, **options)
    if kind == "nccl":
        return NCCLStore(**options)
    if os.environ.get("DMLC_ROLE", "worker") in ("scheduler", "server"):
        from mixrt.kvstore.dist import main  # noqa: PLC0415 (pyzmq)
        sys.exit(main())
    from mixrt.kvstore.dist.worker import DistStore  # noqa: PLC0415 (pyzmq)
    return DistStore(kind, **options)


__all__ = ["KINDS", "KVStore", "create"]
