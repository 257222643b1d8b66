"""Trainer: applies an optimizer to a set of Parameters from their gradients (Gluon's shape).

    trainer = Trainer(params, "sgd", {"learning_rate": 0.1, "momentum": 0.9})
    ... backward fills each parameter's grad ...
    trainer.step(batch_size)        # gradients are divided by batch_size, then applied

Its optimizer state saves to a ``.npz`` (no pickle) with ``save_states``/``load_states``.
``kvstore`` is accepted for the KVStore issue's stores; without one, updates run locally.

Mixed precision needs no option here: the Parameters are the float32 master weights, and a
``TrainingProgram(precision="float16")`` hands back float32 gradients already unscaled, or
None for a step whose gradients overflowed, which the caller skips instead of calling
``step`` (``Module.train_step`` does), so the optimizer and its state stay float32.
"""

from __future__ import annotations

import numpy as np

from mixrt.errors import InputError
from mixrt.gluon.parameter import Parameter
from mixrt.runtime import optimizer as optim


class Trainer:
    def __init__(self, params, optimizer="sgd", optimizer_params: dict | None = None, *,
                 kvstore=None):
        params = list(params.values()) if isinstance(params, dict) else list(params)
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
        self.kvstore = kvstore

    @property
    def learning_rate(self) -> float:
        return self.optimizer.learning_rate

    def set_learning_rate(self, learning_rate: float) -> None:
        self.optimizer.set_learning_rate(learning_rate)

    def step(self, batch_size: int = 1) -> None:
        """One update of every trainable parameter from its gradient / ``batch_size``."""
        self.optimizer.rescale_grad = self._scale / batch_size
        for param in self.params:
            if param.grad_req == "null":
                continue
            if param.grad() is None:
                raise InputError(f"parameter {param.name!r} has no gradient yet; run a "
                                 f"backward pass before Trainer.step")
            self.optimizer.step(param.name, param.data(), param.grad())

    def save_states(self, path) -> None:
        np.savez(path, **self.optimizer.state_dict())

    def load_states(self, path) -> None:
        with np.load(path, allow_pickle=False) as arrays:
            self.optimizer.load_state_dict(arrays)
