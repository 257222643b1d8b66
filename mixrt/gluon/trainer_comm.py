"""The Trainer's traffic with its KVStore on each step, run on the dependency engine.

With ``update_on_kvstore=False`` each gradient is summed across contexts and workers in
place (``_queue_reduce``), as soon as backward has finished it where one context holds it
(``_gradient_ready``, the hook ``StoreWiring._give_store`` installs), else in ``step``; with
``update_on_kvstore=True`` each parameter's push and pull are queued (``_queue_update``) and
the next forward waits only for the parameters it reads. A row_sparse parameter's rows are
pulled from the store when it asks (``_row_sparse_pull``, what
``Parameter.row_sparse_data`` calls). Kept apart from the wiring (``trainer_store.py``):
this is what moves per step, not how the store was set up. :class:`StoreTraffic` is a
mixin of :class:`~mixrt.gluon.Trainer`.
"""

from __future__ import annotations

from mixrt.gluon.trainer_store import TrainerConfigError
from mixrt.kvstore.base import KVStore
from mixrt.runtime import engine


class StoreTraffic:
    """Gradients summed and weights updated through the store, as engine work."""

    def _reduce(self, params, everything: bool) -> None:
        """The store's sum of each gradient, except those backward already queued."""
        if self.kvstore is None:
            return
        for param in params:
            if everything or id(param) not in self._reduced_early:
                self._queue_reduce(param)
        self._reduced_early.clear()

    def _queue_reduce(self, param) -> None:
        """Sum ``param``'s gradient over the workers, in place, as engine work (a custom
        store's ``pushpull`` of the NDArrays of every context, here and now)."""
        if not isinstance(self.kvstore, KVStore):
            grads = param.list_grad()
            self.kvstore.pushpull(self._param2idx[param.name], grads, out=grads)
            return
        key, grads = self.key_prefix + param.name, param.list_grad()
        raws = [grad._data for grad in grads]  # one per context: summed, the sum in each
        engine.get_engine().push(
            lambda: self.kvstore.pushpull(key, raws, out=raws),
            writes=(*(grad.engine_var() for grad in grads), self.kvstore.engine_var),
            name=f"kvstore pushpull {key!r}")

    def _queue_update(self, param, batch_size: int) -> None:
        """Push ``param``'s gradient and pull its updated value, as engine work. A
        row_sparse weight is not pulled: ``row_sparse_data`` fetches the rows it needs."""
        key, grads, copies = self.key_prefix + param.name, param.list_grad(), param._data
        raw_grads, raw_values = [g._data for g in grads], [c._data for c in copies]
        pull = param.stype == "default"

        def update():  # the store sums the contexts' gradients, then updates once
            self.kvstore.push(key, raw_grads if batch_size == 1 else
                              [raw / batch_size for raw in raw_grads])
            if pull:
                self.kvstore.pull(key, out=raw_values)
        engine.get_engine().push(
            update, reads=tuple(grad.engine_var() for grad in grads),
            writes=(*(copy.engine_var() for copy in copies), self.kvstore.engine_var),
            name=f"kvstore push+pull {key!r}")

    def pull_weights(self) -> None:
        """Set every (dense) parameter to the value the store holds now, and wait for it.

        Where the store runs the optimizer, a worker's copy is what it pulled after its own
        last push; under dist_async that misses the other workers' later updates. Called
        after a barrier (``Module.fit`` ends each epoch at one), it gives every worker the
        model the job trained. Where the optimizer runs here, the copies already agree and
        nothing moves."""
        if self.kvstore is None or not self.update_on_kvstore or not self._kv_ready:
            return
        if not isinstance(self.kvstore, KVStore):
            raise TrainerConfigError(f"pull_weights needs a mixrt KVStore, got "
                                     f"{type(self.kvstore).__name__}")
        for param in self._params:
            if param.stype == "default":
                self._queue_pull(param)
        self.kvstore.wait_queued()

    def _queue_pull(self, param) -> None:
        key, copies = self.key_prefix + param.name, param._data
        raw_values = [copy._data for copy in copies]
        engine.get_engine().push(
            lambda: self.kvstore.pull_settled(key, out=raw_values),
            writes=(*(copy.engine_var() for copy in copies), self.kvstore.engine_var),
            name=f"kvstore pull {key!r}")

    def _row_sparse_pull(self, parameter, out, row_id, full_idx: bool = False) -> None:
        """Fill ``out`` (one array or a list, a row_sparse parameter's copies) with the
        rows ``row_id`` names of the weights the store holds (MXNet's; what
        ``Parameter.row_sparse_data`` calls). ``full_idx``: every row, as a checkpoint
        wants them."""
        if self.kvstore is None:
            raise TrainerConfigError(f"parameter {parameter.name!r} is row_sparse: its "
                                     f"weights live in a kvstore, and this Trainer has none "
                                     f"(kvstore=None)")
        self._init_kvstore()
        self.kvstore.wait_queued()  # the pushes of earlier steps have updated the rows
        key = self.key_prefix + parameter.name
        if full_idx and not self.update_on_kvstore:
            self.kvstore.pull(key, out=out, ignore_sparse=False)
        else:
            self.kvstore.row_sparse_pull(key, out=out, row_ids=row_id)

    def _gradient_ready(self, param, _array) -> None:
        """Called by backward the moment ``param``'s gradient is complete."""
        # with several contexts the sum waits for step(): the other copies' gradients
        # may not be written yet
        if self._kv_ready and not self.update_on_kvstore and param.grad_req == "write" \
                and len(param.list_ctx()) == 1:
            self._reduced_early.add(id(param))
            self._queue_reduce(param)

