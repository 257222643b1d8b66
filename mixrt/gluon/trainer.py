"""Trainer: applies an optimizer to a set of Parameters from their gradients (Gluon's shape).

    trainer = Trainer(params, "sgd", {"learning_rate": 0.1, "momentum": 0.9})
    ... backward fills each parameter's grad ...
    trainer.step(batch_size)        # gradients are divided by batch_size, then applied

Its optimizer state saves to a ``.npz`` (no pickle) with ``save_states``/``load_states``.

Mixed precision needs no option here: the Parameters are the float32 master weights, and a
``TrainingProgram(precision="float16")`` hands back float32 gradients already unscaled, or
None for a step whose gradients overflowed, which the caller skips instead of calling
``step`` (``Module.train_step`` does), so the optimizer and its state stay float32.

MXNet's Gluon Trainer is the model (``mx.gluon.Trainer``, same arguments and attributes):
the parameters are taken in sorted name order from a dict (``_params``, ``_param2idx``), an
optimizer named as MXNet names one is ``mixrt.optimizer``'s with ``param_dict`` mapping each
index to its Parameter (so a Parameter's ``lr_mult`` set later still counts), and it updates
through one MXNet ``Updater`` per context (``_updaters``) keyed by the parameter's index. A
name only the engine knows (``adamw``) gets the engine's optimizer. ``step`` is
``allreduce_grads`` then ``update``, and either may be called alone when the optimizer runs
here.

This module holds the Trainer's own concern, the optimizer and the update step; it hands
the rest to three parts with names of their own, one module each, and says so where it
does: the KVStore's wiring (``_store``, ``trainer_store.TrainerStore``: which store,
whether it runs the optimizer, filling it), the traffic with it on each step
(``_traffic``, ``trainer_comm.StoreTraffic``) and the optimizer state's saving and loading
(``_states``, ``trainer_states.OptimizerStates``). MXNet's attribute names for the store
(``_kvstore``, ``_update_on_kvstore``, ``_init_kvstore``, ...) read the parts.
"""

from __future__ import annotations

import warnings

from mixrt.base.errors import GradientError, InputError, KVStoreError, OptimizerError
from mixrt.gluon.parameter import Parameter
from mixrt.gluon.trainer_comm import StoreTraffic
from mixrt.gluon.trainer_states import OptimizerStates
from mixrt.gluon.trainer_store import TrainerConfigError, TrainerStore
from mixrt.kvstore.base import KVStore
from mixrt.optimizers import Optimizer as MXNetOptimizer, create as create_mxnet, get_updater
from mixrt.runtime.training import optimizer as optim


class Trainer:
    def __init__(self, params, optimizer="sgd", optimizer_params: dict | None = None,
                 kvstore="device", compression_params: dict | None = None,
                 update_on_kvstore: bool | None = None, *, key_prefix: str = ""):
        self._params = _parameter_list(params)
        self._param2idx = {param.name: index for index, param in enumerate(self._params)}
        for param in self._params:  # row_sparse_data fetches its rows through this Trainer
            param._set_trainer(self)
        self._init_optimizer(optimizer, optimizer_params)
        self._scale = self.optimizer.rescale_grad
        self._store = TrainerStore(self, kvstore, compression_params, update_on_kvstore,
                                   key_prefix)
        self._traffic = StoreTraffic(self, self._store)
        self._states = OptimizerStates(self, self._store)

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
                              f"(mixrt.runtime.training.optimizer), whose rule is not "
                              f"MXNet's: its steps differ from this process's", RuntimeWarning,
                              stacklevel=3)
                return optim.create(name, **engine_options).spec()
            spec["params"].update(lr_mult=engine_options["lr_mult"],
                                  wd_mult=engine_options["wd_mult"])
            return spec
        return self.optimizer.spec()

    # -- MXNet's attribute names ----------------------------------------------------------

    @property
    def params(self) -> list:
        return self._params

    @property
    def _optimizer(self):
        return self.optimizer

    # the store and whether it runs the optimizer live in the store part; they stay
    # writable, as MXNet's attributes are (a subclass that sums gradients itself, as
    # Horovod's DistributedTrainer does, sets ``_kvstore = None`` and
    # ``_update_on_kvstore = False`` after ``__init__``)
    @property
    def kvstore(self):
        return self._store.kvstore

    @kvstore.setter
    def kvstore(self, store) -> None:
        self._store.kvstore = store

    @property
    def update_on_kvstore(self):
        return self._store.update_on_kvstore

    @update_on_kvstore.setter
    def update_on_kvstore(self, value) -> None:
        self._store.update_on_kvstore = value

    @property
    def key_prefix(self) -> str:
        return self._store.key_prefix

    _kvstore, _update_on_kvstore = kvstore, update_on_kvstore

    @property
    def _kv_initialized(self) -> bool:
        return self._store.ready

    @property
    def _contains_sparse_weight(self) -> bool:
        return any(param.stype != "default" for param in self._params)

    @property
    def _contains_sparse_grad(self) -> bool:
        return any(param.grad_stype != "default" for param in self._params)

    @property
    def _params_to_init(self) -> list:
        return self._store.params_to_init

    def _init_kvstore(self) -> None:
        self._store.init()

    def _reset_kvstore(self) -> None:
        self._store.reset()

    def _row_sparse_pull(self, parameter, out, row_id, full_idx: bool = False) -> None:
        self._traffic.row_sparse_pull(parameter, out, row_id, full_idx)

    def _gradient_ready(self, param, _array) -> None:
        """Called by backward the moment ``param``'s gradient is complete."""
        self._traffic.gradient_ready(param)

    def pull_weights(self) -> None:
        """Set every (dense) parameter to the value the store holds now, and wait for it.

        Where the store runs the optimizer, a worker's copy is what it pulled after its own
        last push; under dist_async that misses the other workers' later updates. Called
        after a barrier (``Module.fit`` ends each epoch at one), it gives every worker the
        model the job trained. Where the optimizer runs here, the copies already agree and
        nothing moves."""
        self._traffic.pull_weights()

    def optimizer_state_dict(self) -> dict:
        """The optimizer's state (from the store when it runs there)."""
        return self._states.state_dict()

    def load_optimizer_state_dict(self, arrays: dict) -> None:
        """Restore ``optimizer_state_dict()``'s arrays: every key must be one of this
        Trainer's parameters and every state array its shape (else an OptimizerError)."""
        self._states.load_state_dict(arrays)

    def save_states(self, path) -> None:
        """The optimizer state as an ``.npz`` at exactly ``path`` (``load_states`` reads it)."""
        self._states.save(path)

    def load_states(self, path) -> None:
        self._states.load(path)

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
        if self.update_on_kvstore and self._store.is_dist:
            raise KVStoreError("the learning rate lives on the parameter servers "
                               "(update_on_kvstore=True); give the optimizer an lr_scheduler, "
                               "or make the Trainer with update_on_kvstore=False")
        self.optimizer.set_learning_rate(learning_rate)
        store_optimizer = getattr(self.kvstore, "optimizer", None)
        if self.update_on_kvstore and self._store.ready and store_optimizer is not None and \
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
        first = not self._store.ready
        self._store.init()
        if self.update_on_kvstore:
            for param in trainable:
                self._traffic.queue_update(param, batch_size)
        else:
            self._traffic.reduce(trainable, everything=first)
            self._update_all(trainable, batch_size)
        self._mark_stepped(trainable)

    def allreduce_grads(self) -> None:
        """Sum each parameter's gradients across contexts and workers, in place (MXNet's
        first half of ``step``; only while the optimizer runs here)."""
        self._store.init()
        self._require_local_updates("allreduce_grads")
        self._traffic.reduce([p for p in self._params if p.grad_req != "null"],
                             everything=True)

    def update(self, batch_size: int, ignore_stale_grad: bool = False) -> None:
        """Apply the optimizer to the (already reduced) gradients / ``batch_size`` (MXNet's
        second half of ``step``; only while the optimizer runs here)."""
        self._store.init()
        self._require_local_updates("update")
        trainable = self._trainable(ignore_stale_grad)
        self._update_all(trainable, batch_size)
        self._mark_stepped(trainable)

    def _require_local_updates(self, what: str) -> None:
        # an AssertionError, as MXNet raises: calling these is a bug in the training loop
        assert not self.update_on_kvstore, (
            f"{what}() when parameters are updated on kvstore is not supported. Try setting "
            f"`update_on_kvstore` to False when creating trainer.")

    def _update_all(self, params, batch_size: int) -> None:
        workers = self._store.sync_workers if self.kvstore is not None else 1
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


