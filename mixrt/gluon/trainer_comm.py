"""The Trainer's traffic with its KVStore on each step, run on the dependency engine.

With ``update_on_kvstore=False`` each gradient is summed across contexts and workers in
place (:meth:`StoreTraffic.queue_reduce`), as soon as backward has finished it where one
context holds it (:meth:`StoreTraffic.gradient_ready`, the hook ``TrainerStore.give``
installs), else in ``step``; with ``update_on_kvstore=True`` each parameter's push and pull
are queued (:meth:`StoreTraffic.queue_update`) and the next forward waits only for the
parameters it reads. A row_sparse parameter's rows are pulled from the store when it asks
(:meth:`StoreTraffic.row_sparse_pull`, what ``Parameter.row_sparse_data`` reaches through
its Trainer). Kept apart from the wiring (``trainer_store.py``): this is what moves per
step, not how the store was set up. :class:`StoreTraffic` is a part of
:class:`~mixrt.gluon.Trainer` (its ``_traffic``), over the Trainer's :class:`TrainerStore`.
"""

from __future__ import annotations

from mixrt.gluon.trainer_store import TrainerConfigError, TrainerStore
from mixrt.kvstore.base import KVStore
from mixrt.runtime import engine


class StoreTraffic:
    """Gradients summed and weights updated through ``store``, as engine work."""

    def __init__(self, trainer, store: TrainerStore):
        self.trainer, self.store = trainer, store
        self.reduced_early: set = set()  # ids of the parameters backward already queued

    def reduce(self, params, everything: bool) -> None:
        """The store's sum of each gradient, except those backward already queued."""
        if self.store.kvstore is None:
            return
        for param in params:
            if everything or id(param) not in self.reduced_early:
                self.queue_reduce(param)
        self.reduced_early.clear()

    def queue_reduce(self, param) -> None:
        """Sum ``param``'s gradient over the workers, in place, as engine work (a custom
        store's ``pushpull`` of the NDArrays of every context, here and now)."""
        kvstore = self.store.kvstore
        if not isinstance(kvstore, KVStore):
            grads = param.list_grad()
            kvstore.pushpull(self.trainer._param2idx[param.name], grads, out=grads)
            return
        key, grads = self.store.key(param), param.list_grad()
        raws = [grad._data for grad in grads]  # one per context: summed, the sum in each
        engine.get_engine().push(
            lambda: kvstore.pushpull(key, raws, out=raws),
            writes=(*(grad.engine_var() for grad in grads), kvstore.engine_var),
            name=f"kvstore pushpull {key!r}")

    def queue_update(self, param, batch_size: int) -> None:
        """Push ``param``'s gradient and pull its updated value, as engine work. A
        row_sparse weight is not pulled: ``row_sparse_data`` fetches the rows it needs."""
        kvstore = self.store.kvstore
        key, grads, copies = self.store.key(param), param.list_grad(), param._data
        raw_grads, raw_values = [g._data for g in grads], [c._data for c in copies]
        pull = param.stype == "default"

        def update():  # the store sums the contexts' gradients, then updates once
            kvstore.push(key, raw_grads if batch_size == 1 else
                         [raw / batch_size for raw in raw_grads])
            if pull:
                kvstore.pull(key, out=raw_values)
        engine.get_engine().push(
            update, reads=tuple(grad.engine_var() for grad in grads),
            writes=(*(copy.engine_var() for copy in copies), kvstore.engine_var),
            name=f"kvstore push+pull {key!r}")

    def pull_weights(self) -> None:
        """The Trainer's ``pull_weights``: every dense parameter set to what the store
        holds now, waited for (nothing where the optimizer runs here)."""
        store = self.store
        if store.kvstore is None or not store.update_on_kvstore or not store.ready:
            return
        if not isinstance(store.kvstore, KVStore):
            raise TrainerConfigError(f"pull_weights needs a mixrt KVStore, got "
                                     f"{type(store.kvstore).__name__}")
        for param in self.trainer._params:
            if param.stype == "default":
                self._queue_pull(param)
        store.kvstore.wait_queued()

    def _queue_pull(self, param) -> None:
        kvstore = self.store.kvstore
        key, copies = self.store.key(param), param._data
        raw_values = [copy._data for copy in copies]
        engine.get_engine().push(
            lambda: kvstore.pull_settled(key, out=raw_values),
            writes=(*(copy.engine_var() for copy in copies), kvstore.engine_var),
            name=f"kvstore pull {key!r}")

    def row_sparse_pull(self, parameter, out, row_id, full_idx: bool = False) -> None:
        """Fill ``out`` (one array or a list, a row_sparse parameter's copies) with the
        rows ``row_id`` names of the weights the store holds (MXNet's ``_row_sparse_pull``).
        ``full_idx``: every row, as a checkpoint wants them."""
        store = self.store
        if store.kvstore is None:
            raise TrainerConfigError(f"parameter {parameter.name!r} is row_sparse: its "
                                     f"weights live in a kvstore, and this Trainer has none "
                                     f"(kvstore=None)")
        store.init()
        store.kvstore.wait_queued()  # the pushes of earlier steps have updated the rows
        key = store.key(parameter)
        if full_idx and not store.update_on_kvstore:
            store.kvstore.pull(key, out=out, ignore_sparse=False)
        else:
            store.kvstore.row_sparse_pull(key, out=out, row_ids=row_id)

    def gradient_ready(self, param) -> None:
        """Backward has just finished ``param``'s gradient: where one context holds it, its
        sum is queued now, while backward goes on with the other layers (with several, the
        sum waits for ``step``: the other copies' gradients may not be written yet)."""
        store = self.store
        if store.ready and not store.update_on_kvstore and param.grad_req == "write" \
                and len(param.list_ctx()) == 1:
            self.reduced_early.add(id(param))
            self.queue_reduce(param)
