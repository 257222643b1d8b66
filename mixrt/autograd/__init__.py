"""Imperative automatic differentiation, in MXNet's words.

    x = nd.array([[1.0, 2.0]]); x.attach_grad()
    with autograd.record():              # ops on x are taped
        y = (x * x).sum()
    y.backward()                         # x.grad == 2 * x

The gradients are the registry's (``@op.grad``), compiled per call signature
(``mixrt/autograd/opgrad.py``); the tape is in ``mixrt/autograd/tape.py``. ``Function`` lets
Python code define its own forward and backward. Recording and training mode are per thread.
"""

from __future__ import annotations

import contextlib
import importlib
import threading
from contextlib import contextmanager

from mixrt import dispatch
from mixrt.autograd import opgrad, tape
from mixrt.autograd.arrays import new_array
from mixrt.base.errors import GradientError, InputError


class _State(threading.local):
    recording = False
    training = False


_state = _State()


# -- modes ----------------------------------------------------------------------------------

def is_recording() -> bool:
    return _state.recording


def is_training() -> bool:
    return _state.training


def set_recording(is_recording: bool) -> bool:
    previous, _state.recording = _state.recording, bool(is_recording)
    return previous


def set_training(train_mode: bool) -> bool:
    previous, _state.training = _state.training, bool(train_mode)
    return previous


@contextmanager
def _scope(recording: bool | None, training: bool | None):
    previous = (_state.recording, _state.training)
    if recording is not None:
        _state.recording = recording
    if training is not None:
        _state.training = training
    try:
        yield
    finally:
        _state.recording, _state.training = previous


def record(train_mode: bool = True):
    """Tape the ops run inside; ``train_mode`` switches Dropout and BatchNorm to training."""
    return _scope(True, train_mode)


def pause(train_mode: bool = False):
    return _scope(False, train_mode)


def train_mode():
    return _scope(None, True)


def predict_mode():
    return _scope(None, False)


# -- variables and backward -----------------------------------------------------------------

def mark_variables(variables, gradients, grad_reqs="write") -> None:
    """Make ``variables`` leaves whose gradients land in ``gradients`` (same shapes)."""
    variables, gradients = _as_list(variables), _as_list(gradients)
    reqs = [grad_reqs] * len(variables) if isinstance(grad_reqs, str) else list(grad_reqs)
    if not len(variables) == len(gradients) == len(reqs):
        raise InputError(f"mark_variables: {len(variables)} variables, {len(gradients)} "
                         f"gradients and {len(reqs)} grad_reqs must match")
    for variable, gradient, req in zip(variables, gradients, reqs):
        if gradient.shape != variable.shape:
            raise InputError(f"mark_variables: gradient shape {gradient.shape} does not match "
                             f"the variable's {variable.shape}")
        variable.attach_grad(req)
        variable._grad = gradient


def backward(heads, head_grads=None, retain_graph: bool = False,
             train_mode: bool = True) -> None:
    """Compute the gradients of ``heads`` and write (or add, per ``grad_req``) them into the
    ``.grad`` of every variable they were computed from."""
    del train_mode  # the recorded ops already ran in the mode they were recorded in
    heads = _as_list(heads)
    tape.run_backward(heads, _seeds(heads, head_grads), retain_graph, on_leaf=_store_grad)


def grad(heads, variables, head_grads=None, retain_graph: bool | None = None,
         create_graph: bool = False, train_mode: bool = True) -> list:
    """The gradients of ``heads`` with respect to ``variables``, returned (``.grad`` is left
    alone). With ``create_graph=True`` the gradients are recorded as they are computed, so
    they can be differentiated again (``(g * g).sum().backward()`` for a gradient
    penalty); the graph is then kept unless ``retain_graph=False``."""
    del train_mode
    heads, variables = _as_list(heads), _as_list(variables)
    seeds = _seeds(heads, head_grads)
    if create_graph:
        seeds = [new_array(seed, head.ctx) for seed, head in zip(seeds, heads)]
        keep = True if retain_graph is None else bool(retain_graph)
        with _scope(True, None):
            leaf_grads = tape.run_backward(heads, seeds, keep, create_graph=True)
    else:
        leaf_grads = tape.run_backward(heads, seeds, bool(retain_graph))
    results = []
    for index, variable in enumerate(variables):
        found = leaf_grads.get(id(variable))
        if found is None:
            raise GradientError(
                f"grad: variable {index} (shape {variable.shape}) does not influence the "
                f"heads: it was not used under autograd.record(), or it was not marked with "
                f"attach_grad() before use, or the path to it went through .detach()")
        if not create_graph:
            results.append(new_array(found[1], variable.ctx))
        elif found[1]._entry is None:
            results.append(_constant_of(variable, found[1]))
        else:
            results.append(found[1])
    return results


class _ConstantGradient:
    """The tape's node for a gradient that does not depend on its variable (that of a
    function linear in it): differentiating it again gives zeros, as in MXNet, where the
    gradient stays in the recorded graph, instead of a head that is in no graph."""

    def __init__(self, variable):
        self.shape, self.dtype, self.ctx = variable.shape, variable.dtype, variable.ctx

    def backward(self, _dy):
        with self.ctx.device.active():
            return new_array(self.ctx.xp.zeros(self.shape, dtype=self.dtype), self.ctx)


def _constant_of(variable, gradient):
    """``gradient`` recorded as a constant function of ``variable``."""
    node = tape.FunctionNode(_ConstantGradient(variable), [variable], gradient.ctx,
                             [(gradient.shape, gradient.dtype)])
    node.name = "constant gradient"
    gradient._entry = (node, 0)
    return gradient


def _seeds(heads, head_grads) -> list:
    if head_grads is not None:
        head_grads = _as_list(head_grads)
        if len(head_grads) != len(heads):
            raise InputError(f"backward: {len(heads)} heads but {len(head_grads)} head_grads")
    seeds = []
    for index, head in enumerate(heads):
        if head._entry is None and head._grad is None:
            raise GradientError(
                f"backward: head {index} (shape {head.shape}) was not computed under "
                f"autograd.record() from any array with a gradient attached; call "
                f"x.attach_grad() on the inputs and compute the head inside "
                f"`with autograd.record():` (a gradient from grad(create_graph=True) of "
                f"a function linear in the variables is a constant, with nothing to "
                f"differentiate)")
        given = None if head_grads is None else head_grads[index]
        with head.ctx.device.active():  # the seed goes to the head's GPU
            seeds.append(head.ctx.xp.ones(head.shape, dtype=head.dtype) if given is None
                         else _seed_array(given, head))
    return seeds


def _seed_array(given, head):
    raw = given._read() if hasattr(given, "_read") else head.ctx.xp.asarray(given)
    if tuple(raw.shape) != head.shape:
        raise InputError(f"backward: head gradient shape {tuple(raw.shape)} does not match "
                         f"the head's {head.shape}")
    return raw.astype(head.dtype, copy=False)


def _store_grad(variable, grad) -> None:
    if variable._grad is None or variable._grad_req == "null":
        return
    target = variable._grad._write()  # waits for engine work still reading it
    with variable.ctx.device.active():
        if variable._grad_req == "add":
            target += grad
        else:
            target[...] = grad
    # _write counted one version; a Trainer tells a fresh gradient from a stale one by it
    if variable._on_grad is not None:
        variable._on_grad(variable)


def _as_list(values) -> list:
    return list(values) if isinstance(values, (list, tuple)) else [values]


# -- what the imperative dispatcher calls (mixrt/dispatch.py) -----------------------------

def needs_tape(inputs) -> bool:
    if not _state.recording:
        return False
    for value in inputs:
        if getattr(value, "_entry", None) is not None or getattr(value, "_grad", None) \
                is not None:
            return True
    return False


def _wanted(inputs, raw) -> list:
    return [tape._parent_of(x) is not None and opgrad.differentiable(r)
            for x, r in zip(inputs, raw)]


def forward_outputs(spec, attributes, raw, inputs, count, ctx) -> int:
    """How many outputs the kernel must produce for this call's backward."""
    wants = _wanted(inputs, raw)
    if not any(wants):
        return count
    sig = opgrad.signature(spec, attributes, raw, wants, count, str(ctx.device))
    return opgrad.forward_plan(sig, attributes).produced


def record_op(spec, attributes, inputs, raw, results, outputs) -> None:
    wants = _wanted(inputs, raw)
    if not any(wants):
        return
    ctx = outputs[0].ctx
    sig = opgrad.signature(spec, attributes, raw, wants, len(outputs), str(ctx.device))
    plan = opgrad.forward_plan(sig, attributes)
    if not any(j < len(outputs) for j in plan.float_outputs):
        return  # integer or boolean results: nothing flows back through them
    meta = [(r.shape, r.dtype) if r is not None else ((), None) for r in results]
    node = tape.OpNode(spec, attributes, sig, inputs, raw, results, ctx, meta)
    if plan.error is not None:
        node.pushed_at = tape.call_site()
    node.watch_outputs(outputs)
    for index, output in enumerate(outputs):
        if index in plan.float_outputs:
            output._entry = (node, index)


class Function:
    """A differentiable operation written in Python (MXNet's ``autograd.Function``).

        class Sigmoid(autograd.Function):
            def forward(self, x):
                y = 1 / (1 + nd.exp(-x)); self.save_for_backward(y); return y
            def backward(self, dy):
                y, = self.saved_tensors; return dy * y * (1 - y)

    ``forward`` and ``backward`` take and return NDArrays and run unrecorded; an instance
    is used for one call.
    """

    def __init__(self):
        self.saved_tensors = ()

    def save_for_backward(self, *arrays) -> None:
        self.saved_tensors = arrays

    def forward(self, *inputs):
        raise NotImplementedError

    def backward(self, *output_grads):
        raise NotImplementedError

    def __call__(self, *inputs):
        recording = needs_tape(inputs)
        ctx = next((x.ctx for x in inputs if hasattr(x, "ctx")), None)
        with pause(train_mode=is_training()), \
                (ctx.device.active() if ctx is not None else contextlib.nullcontext()):
            outputs = self.forward(*inputs)
        single = not isinstance(outputs, (tuple, list))
        outputs = [outputs] if single else list(outputs)
        if recording:
            # an input returned as is must not become this node's output: it would stop
            # being a leaf (or move off its own node) for every later use
            outputs = [_fresh(o) if any(o is x for x in inputs) else o for o in outputs]
            meta = [(o.shape, o.dtype) for o in outputs]
            node = tape.FunctionNode(self, inputs, outputs[0].ctx, meta)
            for index, output in enumerate(outputs):
                output._entry = (node, index)
        return outputs[0] if single else tuple(outputs)


def get_symbol(x):
    """The recorded computation of ``x`` as a Symbol (``mixrt/autograd/symbolize.py``);
    loaded on first use, since the symbol frontend is built on this module."""
    return importlib.import_module("mixrt.autograd.symbolize").symbol_of(x)


def _fresh(array):
    return type(array)(array._read(), array.ctx)  # same memory, no autograd history


def _connect_dispatcher() -> None:
    dispatch._autograd = __import__(__name__, fromlist=["needs_tape"])


# MXNet's autograd module has no __all__, so ``from mxnet.autograd import *`` also gives the
# names it imports: the array and symbol classes, and the standard library's. They are
# loaded on first use (the frontends are built on this module). Its C API names
# (check_call, NDArrayHandle, ...) have nothing to stand for here.
_MXNET_IMPORTS = {"NDArray": ("mixrt.nd.ndarray", "NDArray"),
                  "Symbol": ("mixrt.sym.symbol", "Symbol"),
                  "array": ("array", "array"), "Lock": ("threading", "Lock"),
                  "traceback": ("traceback", None), "ctypes": ("ctypes", None),
                  **{name: ("ctypes", name) for name in
                     ("c_int", "c_void_p", "CFUNCTYPE", "POINTER", "cast")}}


def __getattr__(name: str):
    if name not in _MXNET_IMPORTS:
        raise AttributeError(f"module 'mixrt.autograd' has no attribute {name!r}")
    module_name, attribute = _MXNET_IMPORTS[name]
    module = importlib.import_module(module_name)
    return module if attribute is None else getattr(module, attribute)


__all__ = ["record", "pause", "train_mode", "predict_mode", "is_recording", "is_training",
           "set_recording", "set_training", "mark_variables", "backward", "grad", "Function",
           "get_symbol", *_MXNET_IMPORTS]
