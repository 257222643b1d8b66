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

This module holds the Trainer's own concern, the optimizer and the update step; the rest
comes from mixins, one module each: the KVStore's wiring (``trainer_store.py``: which
store, whether it runs the optimizer, filling it), the traffic with it on each step
(``trainer_comm.py``) and the optimizer state's saving and loading
(``trainer_states.py``).
"""

from __future__ import annotations

import warnings

from mixrt.base.errors import GradientError, InputError, KVStoreError, OptimizerError
from mixrt.gluon.parameter import Parameter
from mixrt.gluon.trainer_comm import StoreTraffic
from mixrt.gluon.trainer_states import OptimizerStates
from mixrt.gluon.trainer_store import make_store, StoreWiring, TrainerConfigError
from mixrt.kvstore.base import KVStore
from mixrt.optimizers import Optimizer as MXNetOptimizer, create as create_mxnet, get_updater
from mixrt.runtime.training import optimizer as optim


class Trainer(StoreWiring, StoreTraffic, OptimizerStates):
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
        self.kvstore = make_store(kvstore, len(self._contexts or [None]),
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


