"""The Trainer's KVStore: which store, whether it runs the optimizer, and filling it.

With ``kvstore=`` (a store or a kind name, ``"local"``, ``"dist_sync"``, ...) the gradients
go through the store: on the first step every parameter is initialized there (worker 0's
values win, so every worker starts from the same weights) and, with
``update_on_kvstore=True`` (the default when there is a store), the optimizer runs in the
store (on the servers for ``dist_*``): each step pushes the gradients and pulls the updated
weights. With ``update_on_kvstore=False`` the summed gradients are pulled back and every
worker applies the optimizer itself. In ``dist_sync`` the servers sum the workers'
gradients, so the Trainer divides by the number of workers (as MXNet's Module does): each
worker's loss is a mean over its own shard, and the update equals one on the global batch.

A store of a class registered with ``mixrt.kv.KVStoreBase.register`` sums gradients
through its ``pushpull``; one that cannot run an optimizer makes ``update_on_kvstore=True`` a
ValueError, as MXNet's does. With no store named, as with one device and MXNet's default
``'device'``, there is no store (``_kvstore`` and ``_update_on_kvstore`` are None); mixrt's
``kvstore=None`` means the same. A kind name is made by ``mixrt.kv.create``, the function
MXNet's Module makes its stores with.

This module holds the wiring, decided once and redone only when ``_reset_kvstore`` drops
the store: choosing the store and ``update_on_kvstore``, giving it the parameters (those
whose shape waits for the first forward later), the optimizer it runs. The traffic of each
step is ``trainer_comm.py``'s. :class:`TrainerStore` is a part of
:class:`~mixrt.gluon.Trainer` (its ``_store``): it owns the store and what was decided
about it, and reads the parameters and the optimizer from the Trainer it serves.
"""

from __future__ import annotations

import functools

from mixrt.base.errors import InputError, KVStoreError
# mixrt.kv's stores take NDArrays (row_sparse_data's)
from mixrt.kv import create as create_store, summed_workers
from mixrt.kv_base import KVStoreBase
from mixrt.kvstore.base import KVStore
from mixrt.optimizers import Optimizer as MXNetOptimizer
from mixrt.runtime.training import optimizer as optim


class TrainerConfigError(InputError, ValueError):
    """A Trainer setting MXNet refuses with a ValueError (a store that cannot run the
    optimizer asked to, Parameters that are not Parameters)."""



class TrainerStore:
    """The Trainer's store: made, told what it runs, and given the parameters. ``asked``
    is the Trainer's ``kvstore`` argument (a store dropped by :meth:`reset` is made again
    from it), ``asked_update`` its ``update_on_kvstore``."""

    def __init__(self, trainer, asked, compression_params, asked_update, key_prefix: str):
        self.trainer = trainer
        self.asked, self.compression, self.asked_update = asked, compression_params, asked_update
        self.key_prefix = str(key_prefix)  # two Trainers sharing one store keep apart
        self.ready = False  # every parameter set so far was given to the store
        self.pending: list = []  # deferred parameters the store gets once they are set
        self.dropped = False
        self.kvstore = self.update_on_kvstore = None
        self._make()

    def _make(self) -> None:
        """The store the Trainer asked for, and whether it runs the optimizer."""
        trainer = self.trainer
        # MXNet's rule: sparse weights live in a store, even for one device
        self.kvstore = make_store(self.asked, len(trainer._contexts or [None]),
                                  needed=trainer._contains_sparse_weight)
        if self.kvstore is not None and self.compression:
            self.kvstore.set_gradient_compression(self.compression)
        self.update_on_kvstore = self._choose_update_on_kvstore(self.asked_update)

    def _choose_update_on_kvstore(self, asked: bool | None):
        """MXNet's rule: None without a store; with one, the store updates unless told
        otherwise or unable to (a custom store that runs no optimizer)."""
        if self.kvstore is None:
            if asked:
                raise InputError("update_on_kvstore=True needs a kvstore")
            return None
        if self.trainer._contains_sparse_weight:
            return True  # the store keeps the full weights (asked False: refused at first use)
        if self.trainer._contains_sparse_grad and not self.is_dist:
            # MXNet's choice for dense weights and sparse gradients on one machine: the
            # gradients are summed in the store and the optimizer runs here
            return False if asked is None else bool(asked)
        if self.is_dist and self.kvstore.type == "dist_async":
            if asked is False:
                raise TrainerConfigError("Please set update_on_kvstore=True when training "
                                         "in async mode.")
            return True
        capable = _can_run_optimizer(self.kvstore)
        return capable if asked is None else bool(asked)

    @property
    def is_dist(self) -> bool:
        return self.kvstore is not None and self.kvstore.type.startswith("dist")

    @property
    def sync_workers(self) -> int:
        """How many gradients the store sums per update."""
        return summed_workers(self.kvstore)

    @property
    def params_to_init(self) -> list:
        """The parameters the store has not been given yet (all of them before the first
        step; after it, those whose initialization was still deferred then)."""
        if self.kvstore is None:
            return []
        return list(self.pending) if self.ready else list(self.trainer._params)

    def reset(self) -> None:
        """MXNet's ``_reset_kvstore``: values were set into the parameters after the store
        took them, so its copies are stale; the store is dropped and the next step makes a
        fresh one (the optimizer's states in it go too, as in MXNet)."""
        if self.is_dist:
            raise KVStoreError("Cannot reset distributed KVStore.")
        self.kvstore, self.update_on_kvstore = None, None
        self.ready, self.pending = False, []
        self.dropped = True

    def init(self) -> None:
        """MXNet's ``_init_kvstore``: the store given the parameters and, where it runs the
        optimizer, the optimizer (once; later, the parameters that were deferred)."""
        if self.dropped:
            self.dropped = False
            self._make()
        if self.ready and self.pending:
            self.give([p for p in self.pending if p.is_initialized()])
        if self.ready or self.kvstore is None:
            return
        if self.trainer._contains_sparse_weight and self.asked_update is False:
            raise TrainerConfigError("Cannot set update_on_kvstore=False when sparse weights "
                                     "are present.")
        if self.update_on_kvstore and not _can_run_optimizer(self.kvstore):
            raise TrainerConfigError(f"Please set update_on_kvstore=False when training with "
                                     f"{type(self.kvstore).__name__}: it runs no optimizer")
        if not isinstance(self.kvstore, KVStore):
            self._init_custom_store()
            return
        if not self.update_on_kvstore and self.is_dist and \
                self.kvstore._optimizer is not None:
            # the servers' optimizer updates every key they hold, these gradients too
            raise KVStoreError(
                f"this {self.kvstore.type!r} store already runs an optimizer on its servers "
                f"(set by set_optimizer or a Trainer with update_on_kvstore=True), which "
                f"would update the gradients a Trainer with update_on_kvstore=False sums "
                f"there; make this Trainer first, or give every Trainer on the store "
                f"update_on_kvstore=True")
        if self.update_on_kvstore:
            self.kvstore.set_optimizer(self._store_optimizer())
        # a parameter whose shape waits for the first forward joins the store later (a
        # sparse layer's row_sparse_data may start the store before that forward)
        params = self.trainer._params
        self.pending = [param for param in params if not param.is_initialized()]
        self.give([param for param in params if param.is_initialized()])
        self.ready = True

    def give(self, params) -> None:
        """Initialize ``params``' keys with their values (every copy pulls them); where the
        optimizer runs here, each gradient is summed as soon as backward finishes it (the
        Trainer's ``_gradient_ready``)."""
        if not params:
            return
        names = self.keys(params)
        self.kvstore.init(names, [param.raw() for param in params])
        self.kvstore.pull(names, out=[[copy._read() for copy in param._data]
                                      for param in params], ignore_sparse=False)
        if not self.update_on_kvstore:
            for param in params:
                param._data[0]._on_grad = functools.partial(self.trainer._gradient_ready,
                                                             param)
        self.pending = [param for param in self.pending if param not in params]

    def _init_custom_store(self) -> None:
        """A store registered with KVStoreBase: rank 0's first copy of every parameter
        goes to all copies (MXNet's broadcast); the optimizer, if it runs there, is set."""
        trainer = self.trainer
        for param in trainer._params:
            copies = param.list_data()
            self.kvstore.broadcast(trainer._param2idx[param.name], copies[0], copies)
        if self.update_on_kvstore:
            self.kvstore.set_optimizer(trainer.optimizer)
        self.ready = True

    def keys(self, params) -> list[str]:
        return [self.key_prefix + param.name for param in params]

    def key(self, param) -> str:
        return self.key_prefix + param.name

    def _store_optimizer(self) -> optim.Optimizer:
        """A copy of the optimizer for the store, keyed as the store's keys are and with a
        gradient scale that divides by the workers the store sums. A local store runs
        MXNet's optimizer itself (as MXNet's does), told which Parameter each store key
        is, so that the Parameters' multipliers still count."""
        trainer = self.trainer
        if isinstance(trainer.optimizer, MXNetOptimizer) and not self.is_dist:
            for param in trainer._params:
                trainer.optimizer.param_dict[self.key(param)] = param
            trainer.optimizer.rescale_grad = trainer._scale  # the push is divided by the batch
            return trainer.optimizer
        spec = trainer._engine_spec()
        params = spec["params"]
        params["rescale_grad"] = trainer._scale / self.sync_workers
        for multipliers in ("lr_mult", "wd_mult"):
            params[multipliers] = {self.key_prefix + name: value
                                   for name, value in params[multipliers].items()}
        return optim.from_spec(spec)


def make_store(kvstore, num_devices: int, needed: bool = False):
    """The store named or given. MXNet's default, ``'device'``, makes none for a single
    device (there is nothing to sum) unless one is ``needed`` (row_sparse weights live
    there); a kind named explicitly is made even then (mixrt keeps it: a one-device job
    may still train through a store's optimizer)."""
    if kvstore is None or isinstance(kvstore, (KVStore, KVStoreBase)):
        return kvstore
    if isinstance(kvstore, str):
        if kvstore == "device" and num_devices == 1 and not needed:
            return None
        return create_store(kvstore)
    raise InputError(f"kvstore must be a KVStore or a kind name, got {type(kvstore).__name__}")


def _can_run_optimizer(kvstore) -> bool:
    return bool(kvstore.is_capable(KVStoreBase.OPTIMIZER))

