"""Trainer: applies an optimizer to a set of Parameters from their gradients (Gluon's shape).

    trainer = Trainer(params, "sgd", {"learning_rate": 0.1, "momentum": 0.9})
    ... backward fills each parameter's grad ...
    trainer.step(batch_size)        # gradients are divided by batch_size, then applied

Its optimizer state saves to a ``.npz`` (no pickle) with ``save_states``/``load_states``.

Mixed precision needs no option here: the Parameters are the float32 master weights, and a
``TrainingProgram(precision="float16")`` hands back float32 gradients already unscaled, or
None for a step whose gradients overflowed, which the caller skips instead of calling
``step`` (``Module.train_step`` does), so the optimizer and its state stay float32.

With ``kvstore=`` (a store or a kind name, ``"local"``, ``"dist_sync"``, ...) the gradients
go through the store: on the first step every parameter is initialized there (worker 0's
values win, so every worker starts from the same weights) and, with
``update_on_kvstore=True`` (the default when there is a store), the optimizer runs in the
store (on the servers for ``dist_*``): each step pushes the gradients and pulls the updated
weights. With ``update_on_kvstore=False`` the summed gradients are pulled back and every
worker applies the optimizer itself. In ``dist_sync`` the servers sum the workers'
gradients, so the Trainer divides by the number of workers (as MXNet's Module does): each
worker's loss is a mean over its own shard, and the update equals one on the global batch.

MXNet's Gluon Trainer is the model (``mx.gluon.Trainer``, same arguments and attributes):
the parameters are taken in sorted name order from a dict (``_params``, ``_param2idx``), an
optimizer named as MXNet names one is ``mixrt.optimizer``'s with ``param_dict`` mapping each
index to its Parameter (so a Parameter's ``lr_mult`` set later still counts), and it updates
through one MXNet ``Updater`` per context (``_updaters``) keyed by the parameter's index. A
name only the engine knows (``adamw``) gets the engine's optimizer. ``step`` is
``allreduce_grads`` then ``update``, and either may be called alone when the optimizer runs
here. A store of a class registered with ``mixrt.kv.KVStoreBase.register`` sums gradients
through its ``pushpull``; one that cannot run an optimizer makes ``update_on_kvstore=True`` a
ValueError, as MXNet's does. With no store named, as with one device and MXNet's default
``'device'``, there is no store (``_kvstore`` and ``_update_on_kvstore`` are None); mixrt's
``kvstore=None`` means the same.
"""

from __future__ import annotations

import functools
import warnings

import numpy as np

from mixrt.base.errors import GradientError, InputError, KVStoreError, OptimizerError
from mixrt.gluon.parameter import Parameter
from mixrt import kv as _kv  # noqa: F401  (the stores take NDArrays: row_sparse_data's)
from mixrt.kv_base import KVStoreBase, registered
from mixrt.kvstore import create
from mixrt.kvstore.base import KVStore
from mixrt.optimizers import Optimizer as MXNetOptimizer, create as create_mxnet, get_updater
from mixrt.runtime import engine, optimizer as optim
from mixrt.runtime.npz import read_npz, write_npz


class TrainerConfigError(InputError, ValueError):
    """A Trainer setting MXNet refuses with a ValueError (a store that cannot run the
    optimizer asked to, Parameters that are not Parameters)."""


class Trainer:
    def __init__(self, params, optimizer="sgd", optimizer_params: dict | None = None,
                 kvstore="device", compression_params: dict | None = None,
                 update_on_kvstore: bool | None = None, *, key_prefix: str = ""):
        self._params = _parameter_list(params)
        self._param2idx = {param.name: index for index, param in enumerate(self._params)}
        for param in self._params:  # row_sparse_data fetches its rows through this Trainer
            param._set_trainer(self)
        self._compression_params = compression_params
        self._init_optimizer(optimizer, optimizer_params)
        self._scale = self.optimizer.rescale_grad
        # MXNet's rule: sparse weights live in a store, even for one device
        self._kvstore_asked = kvstore  # a store dropped by _reset_kvstore is made again
        self._store_dropped = False
        self.kvstore = _store(kvstore, len(self._contexts or [None]),
                              needed=self._contains_sparse_weight)
        if self.kvstore is not None and compression_params:
            self.kvstore.set_gradient_compression(compression_params)
        self._asked_update_on_kvstore = update_on_kvstore
        self.update_on_kvstore = self._choose_update_on_kvstore(update_on_kvstore)
        self.key_prefix = str(key_prefix)  # two Trainers sharing one store keep apart
        self._kv_ready = False
        self._pending: list = []  # deferred parameters the store gets once they are set
        self._reduced_early: set = set()

    def _init_optimizer(self, optimizer, optimizer_params) -> None:
        """MXNet's optimizer of that name (or the given one) with ``param_dict`` over the
        parameters' indices; a name only the engine has gets the engine's optimizer."""
        param_dict = {index: param for index, param in enumerate(self._params)}
        self._requested = None  # (name, options) of an optimizer asked for by name
        if isinstance(optimizer, optim.Optimizer):
            if optimizer_params:
                raise TrainerConfigError("optimizer_params must be None if optimizer is an "
                                         "instance of Optimizer instead of str")
            self.optimizer = optimizer
        elif isinstance(optimizer, str) and optimizer.lower() in MXNetOptimizer.opt_registry:
            self._requested = (optimizer, dict(optimizer_params or {}))
            self.optimizer = create_mxnet(optimizer, param_dict=param_dict,
                                          **dict(optimizer_params or {}))
        else:
            self.optimizer = optim.create(optimizer, **self._engine_options(optimizer_params))
        if isinstance(self.optimizer, MXNetOptimizer):
            # not copied: a Parameter's lr_mult or wd_mult changed later takes effect
            self.optimizer.param_dict = param_dict
            self._updaters = [self.optimizer._updater()] + [
                get_updater(self.optimizer) for _ in (self._contexts or [None])[1:]]
        else:
            self._updaters = []

    def _engine_options(self, optimizer_params) -> dict:
        """Options for the engine's optimizer, with the Parameters' multipliers by name."""
        options = dict(optimizer_params or {})
        options.setdefault("lr_mult", {p.name: p.lr_mult for p in self._params
                                       if p.lr_mult != 1})
        options.setdefault("wd_mult", {p.name: p.wd_mult for p in self._params
                                       if p.wd_mult != 1})
        return options

    def _engine_spec(self) -> dict:
        """The optimizer a parameter server runs, as a spec: for one asked for by name, the
        engine's optimizer of that name with the same options and the Parameters'
        multipliers (MXNet's optimizers run in this process only; the store's processes
        rebuild the engine's from its spec, without pickle); else the optimizer's own."""
        if isinstance(self.optimizer, MXNetOptimizer) and self._requested is not None:
            name, options = self._requested
            engine_options = self._engine_options(options)
            try:  # MXNet's own rule, where the engine has it: the same steps, bit for bit
                spec = create_mxnet(name, **options).spec()
            except OptimizerError:
                warnings.warn(f"the parameter server runs the engine's {name!r} "
                              f"(mixrt.runtime.optimizer), whose rule is not MXNet's: its "
                              f"steps differ from this process's", RuntimeWarning,
                              stacklevel=3)
                return optim.create(name, **engine_options).spec()
            spec["params"].update(lr_mult=engine_options["lr_mult"],
                                  wd_mult=engine_options["wd_mult"])
            return spec
        return self.optimizer.spec()

    def _choose_update_on_kvstore(self, asked: bool | None):
        """MXNet's rule: None without a store; with one, the store updates unless told
        otherwise or unable to (a custom store that runs no optimizer)."""
        if self.kvstore is None:
            if asked:
                raise InputError("update_on_kvstore=True needs a kvstore")
            return None
        if self._contains_sparse_weight:
            return True  # the store keeps the full weights (asked False: refused at first use)
        if self._contains_sparse_grad and not self._is_dist:
            # MXNet's choice for dense weights and sparse gradients on one machine: the
            # gradients are summed in the store and the optimizer runs here
            return False if asked is None else bool(asked)
        if self._is_dist and self.kvstore.type == "dist_async":
            if asked is False:
                raise TrainerConfigError("Please set update_on_kvstore=True when training "
                                         "in async mode.")
            return True
        capable = _can_run_optimizer(self.kvstore)
        return capable if asked is None else bool(asked)

    # -- MXNet's attribute names ----------------------------------------------------------

    @property
    def params(self) -> list:
        return self._params

    @property
    def _optimizer(self):
        return self.optimizer

    @property
    def _kvstore(self):
        return self.kvstore

    @property
    def _update_on_kvstore(self):
        return self.update_on_kvstore

    @property
    def _kv_initialized(self) -> bool:
        return self._kv_ready

    @property
    def _contains_sparse_weight(self) -> bool:
        return any(param.stype != "default" for param in self._params)

    @property
    def _contains_sparse_grad(self) -> bool:
        return any(param.grad_stype != "default" for param in self._params)

    @property
    def _params_to_init(self) -> list:
        """The parameters the store has not been given yet (all of them before the first
        step; after it, those whose initialization was still deferred then)."""
        if self.kvstore is None:
            return []
        return list(self._pending) if self._kv_ready else list(self._params)

    @property
    def _contexts(self):
        """The contexts every parameter lives on (None while one is not initialized)."""
        contexts = None
        for param in self._params:
            if not param.is_initialized():
                return None
            found = param.list_ctx()
            if contexts is not None and found != contexts:
                raise InputError(f"All Parameters must be initialized on the same set of "
                                 f"contexts, but Parameter {param.name!r} is initialized on "
                                 f"{found} while previous Parameters are on {contexts}")
            contexts = found
        return contexts

    @property
    def learning_rate(self) -> float:
        """The current rate; with the store updating, after the updates queued so far (a
        schedule reads the update count they advance)."""
        if self.update_on_kvstore and isinstance(self.kvstore, KVStore):
            self.kvstore.wait_queued()
        return self.optimizer.learning_rate

    def set_learning_rate(self, learning_rate: float) -> None:
        if self.update_on_kvstore and self._is_dist:
            raise KVStoreError("the learning rate lives on the parameter servers "
                               "(update_on_kvstore=True); give the optimizer an lr_scheduler, "
                               "or make the Trainer with update_on_kvstore=False")
        self.optimizer.set_learning_rate(learning_rate)
        store_optimizer = getattr(self.kvstore, "optimizer", None)
        if self.update_on_kvstore and self._kv_ready and store_optimizer is not None and \
                store_optimizer is not self.optimizer:
            store_optimizer.set_learning_rate(learning_rate)

    def _update(self, param) -> None:
        """The optimizer's step of one parameter on each of its contexts (states are made
        there): MXNet's optimizers through the context's Updater under the parameter's
        index, the engine's under its name."""
        if not self._updaters:
            with param.data().ctx.device.active():
                self.optimizer.step(param.name, param.raw(), param.raw_grad())
            return
        index = self._param2idx[param.name]
        for updater, weight, grad in zip(self._updaters, param.list_data(),
                                         param.list_grad()):
            with weight.ctx.device.active():
                updater(index, grad, weight)

    def _update_together(self, params) -> None:
        """Each context's updater called once with every parameter's index, gradient and
        weight there, as MXNet's Trainer does: its optimizer may update them together (on a
        GPU, SGD in one launch)."""
        entries: list[list] = [[] for _ in self._updaters]
        for param in params:
            index = self._param2idx[param.name]
            for found, weight, grad in zip(entries, param.list_data(), param.list_grad()):
                found.append((index, grad, weight))
        for updater, found in zip(self._updaters, entries):
            if found:
                indices, grads, weights = (list(column) for column in zip(*found))
                with weights[0].ctx.device.active():
                    updater(indices, grads, weights)

    def step(self, batch_size: int = 1, ignore_stale_grad: bool = False) -> None:
        """One update of every trainable parameter from its gradient / ``batch_size``.

        A parameter whose gradient no backward pass wrote since the last step is an error
        (a model that uses only some of its parameters is usually a bug), unless
        ``ignore_stale_grad=True``, which skips those parameters for this step.

        With a store the communication runs on the dependency engine: with
        ``update_on_kvstore=False`` each gradient is summed across workers as soon as
        backward has finished it (while backward goes on with the other layers), and with
        ``update_on_kvstore=True`` each parameter's push and pull are queued here and the
        next forward waits only for the parameters it reads."""
        trainable = self._trainable(ignore_stale_grad)
        first = not self._kv_ready
        self._init_kvstore()
        if self.update_on_kvstore:
            for param in trainable:
                self._queue_update(param, batch_size)
        else:
            self._reduce(trainable, everything=first)
            self._update_all(trainable, batch_size)
        self._mark_stepped(trainable)

    def allreduce_grads(self) -> None:
        """Sum each parameter's gradients across contexts and workers, in place (MXNet's
        first half of ``step``; only while the optimizer runs here)."""
        self._init_kvstore()
        self._require_local_updates("allreduce_grads")
        self._reduce([p for p in self._params if p.grad_req != "null"], everything=True)

    def update(self, batch_size: int, ignore_stale_grad: bool = False) -> None:
        """Apply the optimizer to the (already reduced) gradients / ``batch_size`` (MXNet's
        second half of ``step``; only while the optimizer runs here)."""
        self._init_kvstore()
        self._require_local_updates("update")
        trainable = self._trainable(ignore_stale_grad)
        self._update_all(trainable, batch_size)
        self._mark_stepped(trainable)

    def _require_local_updates(self, what: str) -> None:
        # an AssertionError, as MXNet raises: calling these is a bug in the training loop
        assert not self.update_on_kvstore, (
            f"{what}() when parameters are updated on kvstore is not supported. Try setting "
            f"`update_on_kvstore` to False when creating trainer.")

    def _reduce(self, params, everything: bool) -> None:
        """The store's sum of each gradient, except those backward already queued."""
        if self.kvstore is None:
            return
        for param in params:
            if everything or id(param) not in self._reduced_early:
                self._queue_reduce(param)
        self._reduced_early.clear()

    def _update_all(self, params, batch_size: int) -> None:
        workers = self._sync_workers if self.kvstore is not None else 1
        self.optimizer.rescale_grad = self._scale / (workers * batch_size)
        if self._updaters:
            self._update_together(params)
            return
        # the engine's optimizer takes each device's parameters together (on a GPU, one
        # launch for all of them: Optimizer.step_many)
        by_device: dict = {}
        for param in params:
            by_device.setdefault(param.data().ctx, []).append(param)
        for ctx, group in by_device.items():
            with ctx.device.active():
                self.optimizer.step_many([(p.name, p.raw(), p.raw_grad()) for p in group])

    # -- communication on the engine ------------------------------------------------------

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

    def zero_grad(self) -> None:
        for param in self._params:
            param.zero_grad()

    def _trainable(self, ignore_stale_grad: bool) -> list[Parameter]:
        trainable = [param for param in self._params if param.grad_req != "null"]
        stale = [param.name for param in trainable if not param.grad_is_fresh()]
        if stale and not ignore_stale_grad:
            raise GradientError(
                f"Trainer.step: no backward pass wrote the gradient of {len(stale)} "
                f"parameter(s) since the last step: {stale[:5]}{' ...' if len(stale) > 5 else ''}"
                f". Either they are not used to compute the loss (a bug in the model, or "
                f"a forward that skipped them), or backward was not called; call "
                f"step(batch_size, ignore_stale_grad=True) to update only the fresh ones")
        return [param for param in trainable if param.grad_is_fresh()]

    @staticmethod
    def _mark_stepped(params) -> None:
        for param in params:
            param.mark_stepped()

    # -- the store ------------------------------------------------------------------------

    @property
    def _is_dist(self) -> bool:
        return self.kvstore is not None and self.kvstore.type.startswith("dist")

    @property
    def _sync_workers(self) -> int:
        """How many gradients the store sums per update."""
        sync = self._is_dist and self.kvstore.type != "dist_async"
        return self.kvstore.num_workers if sync else 1

    def _reset_kvstore(self) -> None:
        """MXNet's: values were set into the parameters after the store took them, so its
        copies are stale; the store is dropped and the next step makes a fresh one (the
        optimizer's states in it go too, as in MXNet)."""
        if self._is_dist:
            raise KVStoreError("Cannot reset distributed KVStore.")
        self.kvstore, self.update_on_kvstore = None, None
        self._kv_ready, self._pending = False, []
        self._store_dropped = True

    def _init_kvstore(self) -> None:
        if self._store_dropped:
            self._remake_store()
        if self._kv_ready and self._pending:
            self._give_store([p for p in self._pending if p.is_initialized()])
        if self._kv_ready or self.kvstore is None:
            return
        if self._contains_sparse_weight and self._asked_update_on_kvstore is False:
            raise TrainerConfigError("Cannot set update_on_kvstore=False when sparse weights "
                                     "are present.")
        if self.update_on_kvstore and not _can_run_optimizer(self.kvstore):
            raise TrainerConfigError(f"Please set update_on_kvstore=False when training with "
                                     f"{type(self.kvstore).__name__}: it runs no optimizer")
        if not isinstance(self.kvstore, KVStore):
            self._init_custom_store()
            return
        if not self.update_on_kvstore and self._is_dist and \
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
        self._pending = [param for param in self._params if not param.is_initialized()]
        self._give_store([param for param in self._params if param.is_initialized()])
        self._kv_ready = True

    def _remake_store(self) -> None:
        """The store ``_reset_kvstore`` dropped, made again from the Trainer's settings."""
        self._store_dropped = False
        self.kvstore = _store(self._kvstore_asked, len(self._contexts or [None]),
                              needed=self._contains_sparse_weight)
        if self.kvstore is not None and self._compression_params:
            self.kvstore.set_gradient_compression(self._compression_params)
        self.update_on_kvstore = self._choose_update_on_kvstore(self._asked_update_on_kvstore)

    def _give_store(self, params) -> None:
        """Initialize ``params``' keys with their values (every copy pulls them)."""
        if not params:
            return
        names = self._keys(params)
        self.kvstore.init(names, [param.raw() for param in params])
        self.kvstore.pull(names, out=[[copy._read() for copy in param._data]
                                      for param in params], ignore_sparse=False)
        if not self.update_on_kvstore:
            for param in params:
                param._data[0]._on_grad = functools.partial(self._gradient_ready, param)
        self._pending = [param for param in self._pending if param not in params]

    def _init_custom_store(self) -> None:
        """A store registered with KVStoreBase: rank 0's first copy of every parameter
        goes to all copies (MXNet's broadcast); the optimizer, if it runs there, is set."""
        for param in self._params:
            copies = param.list_data()
            self.kvstore.broadcast(self._param2idx[param.name], copies[0], copies)
        if self.update_on_kvstore:
            self.kvstore.set_optimizer(self.optimizer)
        self._kv_ready = True

    def _keys(self, params) -> list[str]:
        return [self.key_prefix + param.name for param in params]

    def _store_optimizer(self) -> optim.Optimizer:
        """A copy of the optimizer for the store, keyed as the store's keys are and with a
        gradient scale that divides by the workers the store sums. A local store runs
        MXNet's optimizer itself (as MXNet's does), told which Parameter each store key
        is, so that the Parameters' multipliers still count."""
        if isinstance(self.optimizer, MXNetOptimizer) and not self._is_dist:
            for param in self._params:
                self.optimizer.param_dict[self.key_prefix + param.name] = param
            self.optimizer.rescale_grad = self._scale  # the push is divided by the batch
            return self.optimizer
        spec = self._engine_spec()
        params = spec["params"]
        params["rescale_grad"] = self._scale / self._sync_workers
        for multipliers in ("lr_mult", "wd_mult"):
            params[multipliers] = {self.key_prefix + name: value
                                   for name, value in params[multipliers].items()}
        return optim.from_spec(spec)

    # -- optimizer state ------------------------------------------------------------------

    def optimizer_state_dict(self) -> dict:
        """The optimizer's state (from the store when it runs there)."""
        if self.update_on_kvstore:
            self._init_kvstore()
            updater = self._store_updater()
            return updater.state_arrays() if updater is not None else \
                self.kvstore._optimizer_state_dict()
        return self.optimizer.state_dict()

    def _store_updater(self):
        """The MXNet Updater a local store runs this Trainer's MXNet optimizer through, or
        None (the store runs an engine optimizer of its own)."""
        return getattr(self.kvstore, "_front_updater", None)

    def load_optimizer_state_dict(self, arrays: dict) -> None:
        """Restore ``optimizer_state_dict()``'s arrays: every key must be one of this
        Trainer's parameters and every state array its shape (else an OptimizerError)."""
        self._check_state_keys(arrays)
        if self.update_on_kvstore:
            self._init_kvstore()
            updater = self._store_updater()
            if updater is not None:
                updater.load_state_arrays(dict(arrays))
            else:
                self.kvstore._load_optimizer_state_dict(dict(arrays))
            return
        self.optimizer.load_state_dict(arrays)

    def _check_state_keys(self, arrays) -> None:
        """The optimizer checks the state's layout; only the Trainer knows the weights it
        must fit, so a state saved for another model fails here, not at a later step."""
        prefix = self.key_prefix if self.update_on_kvstore else ""
        params = {prefix + param.name: param for param in self._params}
        if self._updaters and not self.update_on_kvstore:  # MXNet's Updater keys: indices
            params = {str(index): param for index, param in enumerate(self._params)}
        for index, key in enumerate(optim.read_meta(arrays)["keys"]):
            if key not in params:
                raise OptimizerError(f"the optimizer state is for {key!r}, which is not one "
                                     f"of this Trainer's {len(params)} parameters "
                                     f"{sorted(params)[:8]}{' ...' if len(params) > 8 else ''}")
            shape = params[key].shape
            for name in (n for n in arrays if n.startswith(f"state{index}.")):
                found = tuple(np.shape(arrays[name]))
                if shape is not None and 0 not in shape and found != tuple(shape):
                    raise OptimizerError(f"the optimizer state {name!r} of {key!r} has shape "
                                         f"{found}; the parameter's is {tuple(shape)}")

    def save_states(self, path) -> None:
        """The optimizer state as an ``.npz`` at exactly ``path`` (``load_states`` reads it)."""
        write_npz(path, self.optimizer_state_dict(), f"save_states {str(path)!r}")

    def load_states(self, path) -> None:
        arrays = read_npz(path, "optimizer state file")
        try:
            self.load_optimizer_state_dict(arrays)
        except OptimizerError as exc:  # the optimizer does not know which file it read
            raise OptimizerError(f"optimizer state file {str(path)!r}: {exc}") from exc


def _parameter_list(params) -> list:
    """The Parameters in MXNet's order: a dict's by sorted name (so that every worker
    numbers them alike, whatever order its blocks were built in), a list's as given;
    a Parameter shared under two names once."""
    if isinstance(params, dict):
        params = [params[name] for name in sorted(params)]
    elif isinstance(params, (list, tuple)):
        params = list(params)
    else:
        raise TrainerConfigError(f"First argument must be a list or dict of Parameters, "
                                 f"got {type(params).__name__}")
    for param in params:
        if not isinstance(param, Parameter):
            raise TrainerConfigError(f"First argument must be a list or dict of Parameters, "
                                     f"got a list holding a {type(param).__name__}")
    return list({id(p): p for p in params}.values())


def _store(kvstore, num_devices: int, needed: bool = False):
    """The store named or given. MXNet's default, ``'device'``, makes none for a single
    device (there is nothing to sum) unless one is ``needed`` (row_sparse weights live
    there); a kind named explicitly is made even then (mixrt keeps it: a one-device job
    may still train through a store's optimizer)."""
    if kvstore is None or isinstance(kvstore, (KVStore, KVStoreBase)):
        return kvstore
    if isinstance(kvstore, str):
        if kvstore == "device" and num_devices == 1 and not needed:
            return None
        return registered(kvstore) or create(kvstore)
    raise InputError(f"kvstore must be a KVStore or a kind name, got {type(kvstore).__name__}")


def _can_run_optimizer(kvstore) -> bool:
    return bool(kvstore.is_capable(KVStoreBase.OPTIMIZER))
