"""What one file of ``runtime/training/optimizers/`` declares about an MXNet optimizer, once:
its hyper-parameters (MXNet's defaults and the range each may take), its state slots, the
step a parameter server's engine kind takes, its multi-tensor GPU launch where it has one,
and its nd update operators (each operator's MXNet signature and the step it runs).

From a ``Definition`` the rest is made, not written again: the engine's ``mxnet_<name>``
kind (``engine_kind.py``), the NDArray operators of ``mixrt.optimizer_ops`` and the state
and spec of MXNet's optimizer class in ``mixrt/optimizers/``.

Two spellings of "no clipping" meet here: MXNet's operators take ``clip_gradient`` -1 (any
value < 0), the engine's kinds take None. A step sees the operators' spelling (``clips``).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Callable

from mixrt.runtime.training.lr_scheduler import real_param
from mixrt.runtime.training.optimizer_base import _flag

REQUIRED = inspect.Parameter.empty  # an operator parameter without a default (``lr``)


@dataclass(frozen=True)
class Hyper:
    """One hyper-parameter of an engine kind: its name, MXNet's default, and ``check``,
    which takes (owner, name, value) and returns the value kept or raises
    OptimizerError."""

    name: str
    default: object
    check: Callable

    @classmethod
    def real(cls, name: str, default: float, **bounds) -> "Hyper":
        """A finite float within ``bounds`` (``real_param``'s low, high, low_open,
        high_open)."""
        return cls(name, default,
                   lambda owner, key, value: real_param(owner, key, value, **bounds))

    @classmethod
    def flag(cls, name: str, default: bool) -> "Hyper":
        return cls(name, default, _flag)

    @classmethod
    def optional(cls, name: str, zero_is_none: bool = False, **bounds) -> "Hyper":
        """None, else a float within ``bounds``; with ``zero_is_none`` 0 is None too (where
        MXNet's Python passes nothing for it)."""
        def check(owner, key, value):
            if value is None or (zero_is_none and not value):
                return None
            return real_param(owner, key, value, **bounds)
        return cls(name, None, check)


@dataclass(frozen=True)
class Operator:
    """An nd update operator as MXNet declares it: ``name(weight, *reads, *states,
    [weight32], *params, [lazy_update], out=None, name=None)``.

    ``step(xp, weight, reads, states, params, in_place)`` returns the new weight (or, with
    ``returns`` "direction", the value the operator returns) from the arrays' data (``reads``
    and ``states`` by name; the states are updated in place) and the parameters by name.
    ``master``: a float32 copy ``weight32`` is what the step updates (MXNet's ``mp_``
    forms). ``lazy``: with a row_sparse gradient only its rows are updated ("flag": as
    ``lazy_update`` says; "always"). ``state_shape``: "weight", or "rows" (one value per
    row). ``multi``: the name of MXNet's list form over this one (``multi_sgd_update``)."""

    name: str
    states: tuple[str, ...]
    params: tuple[tuple[str, object], ...]
    step: Callable
    reads: tuple[str, ...] = ("grad",)
    master: bool = False
    returns: str = "weight"
    lazy: str | None = None
    state_shape: str = "weight"
    multi: str | None = None

    def signature(self) -> inspect.Signature:
        """MXNet's signature of this operator, positional order included."""
        arrays = ("weight", *self.reads, *self.states, *(("weight32",) if self.master else ()))
        positional = inspect.Parameter.POSITIONAL_OR_KEYWORD
        parameters = [inspect.Parameter(name, positional) for name in arrays]
        parameters += [inspect.Parameter(name, positional, default=default)
                       for name, default in self.params]
        if self.lazy == "flag":
            parameters.append(inspect.Parameter("lazy_update", positional, default=True))
        parameters += [inspect.Parameter("out", positional, default=None),
                       inspect.Parameter("name", positional, default=None)]
        return inspect.Signature(parameters)


@dataclass(frozen=True)
class Definition:
    """One MXNet optimizer (see the module's docstring). ``name`` is MXNet's (``adam``); the
    engine kind, where ``step`` is given, is ``mxnet_<name>``, which
    ``step(kind, xp, weight, grad, state, lr, wd, t)`` runs (``kind`` holds the
    hyper-parameters as attributes, and ``rescale_grad`` and ``clip_gradient``), and
    ``step_many(kind, xp, weights, grads, states, lrs, wds, counts)``, where given, runs on
    every weight of a GPU at once for the kinds ``takes_many(kind)`` accepts."""

    name: str
    hyper: tuple[Hyper, ...] = ()
    slots: Callable = lambda hyper: ()
    step: Callable | None = None
    step_many: Callable | None = None
    takes_many: Callable = lambda kind: True
    default_learning_rate: float = 0.01
    operators: tuple[Operator, ...] = ()

    @property
    def engine_name(self) -> str | None:
        return None if self.step is None else f"mxnet_{self.name}"

    def take_hyper(self, owner: str, params: dict) -> dict:
        """The hyper-parameters taken out of ``params`` (their defaults where absent), each
        checked against its range; OptimizerError names ``owner`` and the parameter."""
        return {hyper.name: hyper.check(owner, hyper.name, params.pop(hyper.name, hyper.default))
                for hyper in self.hyper}

    def operator(self, name: str) -> Operator:
        return next(op for op in self.operators if op.name == name)


# -- what steps share ----------------------------------------------------------------------

def clips(params, name: str = "clip_gradient") -> bool:
    """Whether an operator's ``clip_gradient`` (or another bound ``name``: RMSProp's
    ``clip_weights``, FTML's ``clip_grad``) clips (MXNet: when >= 0)."""
    bound = params.get(name)
    return bound is not None and bound >= 0


def common(kind) -> dict:
    """An engine kind's rescale and clip in the operators' spelling."""
    return {"rescale_grad": kind.rescale_grad,
            "clip_gradient": -1.0 if kind.clip_gradient is None else kind.clip_gradient}


# MXNet's operators end their parameters with these (most after ``wd``)
GRADIENT = (("rescale_grad", 1.0), ("clip_gradient", -1.0))


__all__ = ["Definition", "Hyper", "Operator", "REQUIRED", "GRADIENT", "clips", "common"]
