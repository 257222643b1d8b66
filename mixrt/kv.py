"""MXNet's ``mx.kv``: ``create(name)`` and the KVStore (``mixrt.kvstore`` does the work).

    kv = mixrt.kv.create("local")            # local | device | local_allreduce_cpu | ...
    kv.init(3, nd.ones((2, 3)))              # NDArrays, NumPy or CuPy arrays; int or str keys
    kv.push(3, [nd.ones((2, 3), ctx=c) for c in ctxs])   # a list per key is summed
    kv.pull(3, out=a)                        # sparse outs are skipped (ignore_sparse=True)
    kv.row_sparse_pull(3, out=rsp, row_ids=nd.array([0, 1]))   # rsp: a RowSparseNDArray
    kv.set_optimizer(mixrt.optimizer.SGD(learning_rate=0.1))
    kv._set_updater(lambda key, merged, stored: stored.__iadd__(merged))

The stores sit below the frontends; this module hands them, as it loads, how NDArrays open
to their NumPy/CuPy data, how an MXNet updater (NDArrays, int keys) is called, and how an
MXNet optimizer becomes its ``Updater``.
"""

from __future__ import annotations

import numpy as np

from mixrt import autograd
from mixrt.context import cpu, gpu
from mixrt.kvstore import KINDS, KVStore, create as _create
from mixrt.kvstore.base import ArrayFront, set_array_front, user_key
from mixrt.nd.ndarray import NDArray
from mixrt.nd.sparse_arrays import RowSparseNDArray
from mixrt.ops.device import array_module
from mixrt.optimizers import Optimizer as _MXNetOptimizer, get_updater

from mixrt.kv_base import KVStoreBase, TestStore, registered  # noqa: E402,F401


def create(name: str = "local", **options) -> KVStore:
    """A store of kind ``name`` (MXNet's: ``local``, ``device``, ``local_update_cpu``,
    ``local_allreduce_cpu``, ``local_allreduce_device``, ``nccl``, ``dist_sync``,
    ``dist_device_sync``, ``dist_async``), or of a class registered with
    ``KVStoreBase.register`` (``teststore``, MXNet's, is one)."""
    custom = registered(name) if isinstance(name, str) else None
    return custom if custom is not None else _create(name, **options)


def summed_workers(store) -> int:
    """How many workers' gradients ``store`` sums into one update, so the optimizer scales
    by 1 / (batch x workers): a synchronous dist store's workers; 1 for no store, a local or
    device store (its devices' rows are in the batch already) and dist_async (each worker's
    gradient is applied alone)."""
    kind = getattr(store, "type", "")
    return store.num_workers if kind.startswith("dist") and "async" not in kind else 1


def _open(value, write: bool):
    if not isinstance(value, NDArray):
        return None
    if not write:
        return value._read()
    with autograd.pause():  # a pull is no recorded op: it may fill a recorded leaf
        return value._write()


def _as_ndarray(raw) -> NDArray:
    if array_module(raw) is np:
        return NDArray(raw, cpu())
    return NDArray(raw, gpu(raw.device.id))


class _NDArrayUpdater:
    """An MXNet updater (``key, merged, stored`` as NDArrays, int keys) as the stores call
    it (raw arrays, str keys). Its attributes are the updater's: MXNet code reads
    ``kv._updater.optimizer`` and ``kv._updater.states``."""

    def __init__(self, updater):
        self.updater = updater

    def __call__(self, name: str, merged, stored) -> None:
        self.updater(user_key(name), _as_ndarray(merged), _as_ndarray(stored))

    def __getattr__(self, attribute: str):
        return getattr(self.updater, attribute)


def _wrap_updater(updater):
    return _NDArrayUpdater(updater)


def _optimizer_updater(optimizer):
    return get_updater(optimizer) if isinstance(optimizer, _MXNetOptimizer) else None


def _stype(value):
    return value.stype if isinstance(value, NDArray) else None


def _stored_rows(value, rows) -> None:
    """A row_sparse_pull's ``out`` stores exactly the rows asked for (zero or not)."""
    if isinstance(value, RowSparseNDArray):
        value._keep_structure(rows.astype(np.int64))


set_array_front(ArrayFront(open=_open, wrap_updater=_wrap_updater,
                           optimizer_updater=_optimizer_updater, stype=_stype,
                           stored_rows=_stored_rows))

__all__ = ["KINDS", "KVStore", "KVStoreBase", "create"]
