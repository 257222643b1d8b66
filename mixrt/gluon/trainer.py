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
"""

from __future__ import annotations

import functools

import numpy as np

from mixrt.base.errors import GradientError, InputError, KVStoreError, OptimizerError
from mixrt.gluon.parameter import Parameter
from mixrt.kvstore import create
from mixrt.kvstore.base import KVStore
from mixrt.runtime import engine, optimizer as optim
from mixrt.runtime.npz import read_npz, write_npz


class Trainer:
    def __init__(self, params, optimizer="sgd", optimizer_params: dict | None = None, *,
                 kvstore=None, update_on_kvstore: bool | None = None, key_prefix: str = ""):
        params = list(params.values()) if isinstance(params, dict) else list(params)
        params = list({id(p): p for p in params}.values())  # shared parameters once
        if not all(isinstance(p, Parameter) for p in params):
            raise InputError("Trainer takes Parameters (a ParameterDict or a list of them)")
        self.params = params
        self._scale = 1.0
        if isinstance(optimizer, optim.Optimizer):
            self.optimizer = optimizer
        else:
            options = dict(optimizer_params or {})
            options.setdefault("lr_mult", {p.name: p.lr_mult for p in params if p.lr_mult != 1})
            options.setdefault("wd_mult", {p.name: p.wd_mult for p in params if p.wd_mult != 1})
            self.optimizer = optim.create(optimizer, **options)
        self._scale = self.optimizer.rescale_grad
        self.kvstore = _store(kvstore)
        self.update_on_kvstore = self.kvstore is not None if update_on_kvstore is None \
            else bool(update_on_kvstore)
        if self.update_on_kvstore and self.kvstore is None:
            raise InputError("update_on_kvstore=True needs a kvstore")
        self.key_prefix = str(key_prefix)  # two Trainers sharing one store keep apart
        self._kv_ready = False
        self._reduced_early: set = set()

    @property
    def learning_rate(self) -> float:
        return self.optimizer.learning_rate

    def set_learning_rate(self, learning_rate: float) -> None:
        if self.update_on_kvstore and self._is_dist:
            raise KVStoreError("the learning rate lives on the parameter servers "
                               "(update_on_kvstore=True); give the optimizer an lr_scheduler, "
                               "or make the Trainer with update_on_kvstore=False")
        self.optimizer.set_learning_rate(learning_rate)
        if self.update_on_kvstore and self._kv_ready:
            self.kvstore.optimizer.set_learning_rate(learning_rate)

    def _update(self, param) -> None:
        """The optimizer's step of one parameter, on its device (states are made there)."""
        with param.data().ctx.device.active():
            self.optimizer.step(param.name, param.raw(), param.raw_grad())

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
        if self.kvstore is None:
            self.optimizer.rescale_grad = self._scale / batch_size
            for param in trainable:
                self._update(param)
            self._mark_stepped(trainable)
            return
        first = not self._kv_ready
        self._init_kvstore()
        if self.update_on_kvstore:
            for param in trainable:
                self._queue_update(param, batch_size)
        else:
            for param in trainable:
                if first or id(param) not in self._reduced_early:
                    self._queue_reduce(param)
            self.optimizer.rescale_grad = self._scale / (self._sync_workers * batch_size)
            for param in trainable:
                self._update(param)
            self._reduced_early.clear()
        self._mark_stepped(trainable)

    # -- communication on the engine ------------------------------------------------------

    def _queue_reduce(self, param) -> None:
        """Sum ``param``'s gradient over the workers, in place, as engine work."""
        key, grad = self.key_prefix + param.name, param.grad()
        raw = grad._data
        engine.get_engine().push(lambda: self.kvstore.pushpull(key, raw), writes=(
            grad.engine_var(), self.kvstore.engine_var), name=f"kvstore pushpull {key!r}")

    def _queue_update(self, param, batch_size: int) -> None:
        """Push ``param``'s gradient and pull its updated value, as engine work."""
        key, grad, value = self.key_prefix + param.name, param.grad(), param.data()
        raw_grad, raw_value = grad._data, value._data

        def update():
            self.kvstore.push(key, raw_grad if batch_size == 1 else raw_grad / batch_size)
            self.kvstore.pull(key, out=raw_value)
        engine.get_engine().push(update, reads=(grad.engine_var(),), writes=(
            value.engine_var(), self.kvstore.engine_var), name=f"kvstore push+pull {key!r}")

    def _gradient_ready(self, param, _array) -> None:
        """Called by backward the moment ``param``'s gradient is complete."""
        if self._kv_ready and not self.update_on_kvstore and param.grad_req == "write":
            self._reduced_early.add(id(param))
            self._queue_reduce(param)

    def zero_grad(self) -> None:
        for param in self.params:
            param.zero_grad()

    def _trainable(self, ignore_stale_grad: bool) -> list[Parameter]:
        trainable = [param for param in self.params if param.grad_req != "null"]
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

    def _init_kvstore(self) -> None:
        if self._kv_ready:
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
        names = self._keys(self.params)
        self.kvstore.init(names, [param.raw() for param in self.params])
        self.kvstore.pull(names, out=[param.raw() for param in self.params])
        if self.update_on_kvstore:
            self.kvstore.set_optimizer(self._store_optimizer())
        else:
            for param in self.params:
                param.data()._on_grad = functools.partial(self._gradient_ready, param)
        self._kv_ready = True

    def _keys(self, params) -> list[str]:
        return [self.key_prefix + param.name for param in params]

    def _store_optimizer(self) -> optim.Optimizer:
        """A copy of the optimizer for the store, keyed as the store's keys are and with a
        gradient scale that divides by the workers the store sums."""
        spec = self.optimizer.spec()
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
            return self.kvstore._optimizer_state_dict()
        return self.optimizer.state_dict()

    def load_optimizer_state_dict(self, arrays: dict) -> None:
        """Restore ``optimizer_state_dict()``'s arrays: every key must be one of this
        Trainer's parameters and every state array its shape (else an OptimizerError)."""
        self._check_state_keys(arrays)
        if self.update_on_kvstore:
            self._init_kvstore()
            self.kvstore._load_optimizer_state_dict(dict(arrays))
            return
        self.optimizer.load_state_dict(arrays)

    def _check_state_keys(self, arrays) -> None:
        """The optimizer checks the state's layout; only the Trainer knows the weights it
        must fit, so a state saved for another model fails here, not at a later step."""
        prefix = self.key_prefix if self.update_on_kvstore else ""
        params = {prefix + param.name: param for param in self.params}
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


def _store(kvstore):
    if kvstore is None or isinstance(kvstore, KVStore):
        return kvstore
    if isinstance(kvstore, str):
        return create(kvstore)
    raise InputError(f"kvstore must be a KVStore or a kind name, got {type(kvstore).__name__}")
