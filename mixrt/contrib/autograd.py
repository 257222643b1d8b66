"""MXNet's ``mx.contrib.autograd``: the imperative autograd API MXNet had before
``mx.autograd``, as thin functions over :mod:`mixrt.autograd`.

    x = nd.ones((2, 2)); dx = nd.zeros_like(x)
    mark_variables([x], [dx])
    with train_section():                # records and trains, as autograd.record() does
        y = x * x
    backward([y])                        # dx == 2 * x
    grads, loss = grad_and_loss(lambda a: (a * a).sum())(x)

In this API one switch covers both recording and training mode: ``train_section`` turns
both on, ``test_section`` both off. ``set_is_training`` returns what recording was before, as
MXNet's does (it sets training, then recording, and keeps the second call's previous state).
"""

from __future__ import annotations

import functools

from mixrt import autograd
from mixrt.base.errors import InputError
from mixrt.nd import NDArray, zeros_like


def set_is_training(is_train: bool) -> bool:
    """Switch recording and training mode together; returns whether recording was on."""
    autograd.set_training(is_train)
    return autograd.set_recording(is_train)


class TrainingStateScope:
    """Sets the training state on entry and restores what it was on exit."""

    def __init__(self, enter_state: bool):
        self._enter_state = bool(enter_state)
        self._previous = None

    def __enter__(self):
        self._previous = set_is_training(self._enter_state)

    def __exit__(self, *exc_info):
        if self._previous != self._enter_state:
            set_is_training(self._previous)


def train_section() -> TrainingStateScope:
    """Record operations and run them in training mode inside the ``with`` block."""
    return TrainingStateScope(True)


def test_section() -> TrainingStateScope:
    """Stop recording and run in inference mode inside the ``with`` block."""
    return TrainingStateScope(False)



def mark_variables(variables, gradients, grad_reqs="write") -> None:
    """Make ``variables`` leaves whose gradients land in ``gradients`` ("write", "add" or
    "null" per ``grad_reqs``)."""
    if isinstance(variables, NDArray):
        variables, gradients = [variables], [gradients]
    autograd.mark_variables(variables, gradients, grad_reqs)


def backward(outputs, out_grads=None, retain_graph: bool = False) -> None:
    """Gradients of ``outputs`` (weighted by ``out_grads``; ones where an entry is None)
    into the marked variables' gradient arrays."""
    if isinstance(outputs, NDArray):
        outputs = [outputs]
    if out_grads is not None and not isinstance(out_grads, (list, tuple)):
        out_grads = [out_grads]
    autograd.backward(outputs, out_grads, retain_graph)


def compute_gradient(outputs) -> None:
    """``backward(outputs)``: MXNet's older name."""
    backward(outputs)


def grad_and_loss(func, argnum=None):
    """A function that runs ``func`` and returns ``(gradients of its output with respect to
    the chosen arguments, the output)``. ``argnum`` (an int or a list of them) picks the
    arguments to differentiate; by default all, which must then all be NDArrays."""
    @functools.wraps(func)
    def wrapped(*args):
        variables = _chosen(args, argnum)
        grads = [zeros_like(x) for x in variables]
        mark_variables(variables, grads)
        with train_section():
            outputs = func(*args)
        compute_gradient([outputs] if isinstance(outputs, NDArray) else outputs)
        return grads, outputs
    return wrapped


def grad(func, argnum=None):
    """Like :func:`grad_and_loss`, returning only the gradients."""
    with_loss = grad_and_loss(func, argnum)

    @functools.wraps(func)
    def wrapped(*args):
        return with_loss(*args)[0]
    return wrapped


def _chosen(args: tuple, argnum) -> list:
    if argnum is None:
        chosen = list(range(len(args)))
    else:
        chosen = [argnum] if isinstance(argnum, int) else list(argnum)
    for index in chosen:
        if not -len(args) <= index < len(args):
            raise InputError(f"grad_and_loss: argnum {index} is out of range for "
                             f"{len(args)} arguments")
        if not isinstance(args[index], NDArray):
            raise InputError(f"grad_and_loss: argument {index} must be an NDArray to be "
                             f"differentiated, got {type(args[index]).__name__}")
    return [args[index] for index in chosen]


# MXNet's module has no __all__, so ``import *`` also gives the array names it imports
__all__ = ["NDArray", "zeros_like", "set_is_training", "TrainingStateScope", "train_section",
           "test_section", "mark_variables", "backward", "compute_gradient", "grad_and_loss",
           "grad"]
