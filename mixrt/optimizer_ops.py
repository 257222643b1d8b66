"""MXNet's optimizer update operators on NDArrays (``nd.sgd_update``, ``nd.adam_update``, ...),
made from the optimizer definitions of ``runtime/training/optimizers/`` (each declares its
operators' MXNet signatures and the step each runs), and the helpers MXNet's optimizers use
beside them (``multi_sum_sq``, ``all_finite``, ``reset_arrays``).

Each operator takes the arrays and hyper-parameters MXNet's operator of that name takes and
updates its state arrays (``mom``, ``mean``, ``weight32``, ...) in place, as MXNet's do. The
new weight goes to ``out`` (in MXNet's optimizers always the weight itself) or, without
``out``, into a new array that is returned. ``clip_gradient`` < 0 means no clipping, MXNet's
default. With a row_sparse gradient, the operators MXNet updates lazily update only the
rows it stores.

The arithmetic runs on the arrays' own NumPy/CuPy data in their dtype, with MXNet's
hyper-parameters rounded to float32 first (MXNet's operators take them as C floats), so a
float32 weight takes the same steps as under MXNet to within a few ulps.
``mixrt.optimizer``'s classes call these. This module imports nothing from ``mixrt.nd`` (it
makes arrays through autograd's hand-in, as the op dispatcher does), so ``mixrt.nd`` may
import it to offer these functions under its own name.
"""

from __future__ import annotations

import functools

import numpy as np

from mixrt.tape.arrays import new_array
from mixrt.base.errors import InputError, ShapeError
from mixrt.ops.device import array_module
from mixrt.runtime.training.optimizers import definitions


# -- reading and writing NDArrays ----------------------------------------------------------

def _is_ndarray(value) -> bool:
    return hasattr(value, "_read") and hasattr(value, "_write") and hasattr(value, "ctx")


def _data(array, name: str, op: str):
    if not _is_ndarray(array):
        raise InputError(f"{op}: {name} must be an NDArray, got {type(array).__name__}")
    return array._read()


def _state(array, name: str, op: str, like, shape: str = "weight"):
    """A state array MXNet's operator updates in place: its data, ready to be written;
    ``shape`` "weight" (the weight's) or "rows" (one value per row of the weight)."""
    _data(array, name, op)
    if shape == "rows":
        if array.shape[:1] != like.shape[:1]:
            raise ShapeError(f"{op}: {name} must be an NDArray with {like.shape[0]} rows")
    elif array.shape != like.shape:
        raise ShapeError(f"{op}: {name} has shape {array.shape}, the weight {like.shape}")
    return array._write()


def _result(value, weight, out, op: str):
    """``value`` into ``out`` (in place), or a new NDArray beside ``weight``."""
    if out is None:
        return new_array(value.astype(weight.dtype, copy=True), weight.ctx)
    if not _is_ndarray(out) or out.shape != weight.shape:
        raise InputError(f"{op}: out must be an NDArray of the weight's shape "
                         f"{weight.shape}")
    target = out._write()
    target[...] = value
    return out


# -- an operator from its declaration --------------------------------------------------------

def _operator(declared):
    """The NDArray function of ``declared`` (a ``definition.Operator``), with MXNet's
    signature written out as a ``def`` (as dataclasses writes its ``__init__``): binding
    arguments through ``inspect.Signature`` cost ~10 us a call, a step's update per weight."""
    signature = declared.signature()
    names = list(signature.parameters)
    defaults = {f"_default_{i}": p.default for i, p in enumerate(signature.parameters.values())
                if p.default is not p.empty}
    parameters = ", ".join(name if f"_default_{i}" not in defaults else f"{name}=_default_{i}"
                           for i, name in enumerate(names))
    arguments = ", ".join(f"{name!r}: {name}" for name in names)
    namespace = {"_run": _run, "_declared": declared, **defaults}
    exec(f"def {declared.name}({parameters}):\n"  # noqa: S102 (this module's own text)
         f"    return _run(_declared, {{{arguments}}})\n", namespace)
    run = namespace[declared.name]
    run.__doc__ = (f"MXNet's ``{declared.name}`` (runtime/training/optimizers/: the step "
                   f"``{declared.step.__module__}.{declared.step.__name__}``).")
    run.__module__ = __name__
    return run


def _run(declared, arguments: dict):
    op, weight, out = declared.name, arguments["weight"], arguments["out"]
    reads = {name: _data(arguments[name], name, op) for name in declared.reads}
    states = {name: _state(arguments[name], name, op, weight, declared.state_shape)
              for name in declared.states}
    params = {name: arguments[name] for name, _ in declared.params}
    if not declared.master:
        w = _data(weight, "weight", op)
        value = declared.step(array_module(w), w, reads, states, params, out is weight)
        return _returned(declared, value, weight, out)
    if declared.returns != "weight":  # the master copy is read, not written
        w32 = _data(arguments["weight32"], "weight32", op)
        return _returned(declared, declared.step(array_module(w32), w32, reads, states,
                                                 params, True), arguments["weight32"], out)
    w32 = _state(arguments["weight32"], "weight32", op, weight)
    w32[...] = declared.step(array_module(w32), w32, reads, states, params, True)
    return _result(w32, weight, out, op)


def _returned(declared, value, weight, out):
    """The new weight into ``out`` or a new array of the weight's dtype; a value of its own
    (LAMB's direction) as it is, into ``out`` where given."""
    if declared.returns != "weight" and out is None:
        return new_array(value, weight.ctx)
    return _result(value, weight, out, declared.name)


# -- the multi-tensor forms (the same steps, one weight after the other) --------------------

def _groups(data, per_weight: int, num_weights: int, op: str) -> list:
    data = list(data)
    if len(data) != per_weight * int(num_weights):
        raise InputError(f"{op}: {num_weights} weights need {per_weight * int(num_weights)} "
                         f"arrays, got {len(data)}")
    return [data[i:i + per_weight] for i in range(0, len(data), per_weight)]


def _outs(out, count: int, op: str) -> list:
    if out is None:
        return [None] * count
    outs = list(out) if isinstance(out, (list, tuple)) else [out]
    if len(outs) != count:
        raise InputError(f"{op}: {count} weights need {count} outputs, got {len(outs)}")
    return outs


def _multi(step, per_weight: int, op: str, with_momentum: bool):
    def run(*data, lrs, wds, momentum=0.0, rescale_grad=1.0, clip_gradient=-1.0,
            num_weights=1, out=None, name=None):
        groups = _groups(data, per_weight, num_weights, op)
        outs = _outs(out, len(groups), op)
        extra = {"momentum": momentum} if with_momentum else {}
        results = [step(*arrays, lr=lr, wd=wd, rescale_grad=rescale_grad,
                        clip_gradient=clip_gradient, out=target, **extra)
                   for arrays, lr, wd, target in zip(groups, lrs, wds, outs)]
        return results if len(results) > 1 else results[0]
    run.__name__ = op
    run.__doc__ = f"MXNet's {op}: {step.__name__} on each of ``num_weights`` weights."
    return run


def _host_values(values, ctx):
    """Float32 ``values`` as an NDArray on ``ctx``."""
    result = np.asarray(values, np.float32)
    return new_array(ctx.device.put(result) if ctx.device.kind != "cpu" else result, ctx)


def multi_sum_sq(*data, num_arrays, out=None, name=None):
    """The sum of squares of each array, as one float32 NDArray of ``num_arrays`` values."""
    arrays = list(data)
    if not arrays or len(arrays) != int(num_arrays):
        raise InputError(f"multi_sum_sq: num_arrays={num_arrays} but {len(arrays)} given")
    return _host_values([float((_data(a, "data", "multi_sum_sq").astype(np.float32) ** 2)
                               .sum()) for a in arrays], arrays[0].ctx)


def _finite(array) -> bool:
    raw = _data(array, "data", "all_finite")
    return bool(array_module(raw).isfinite(raw).all())


def all_finite(data, init_output=True, out=None, name=None):
    """1.0 (float32, shape (1,)) when every element of ``data`` is finite, else 0.0."""
    return _host_values([1.0 if _finite(data) else 0.0], data.ctx)


def multi_all_finite(*data, num_arrays=1, init_output=True, out=None, name=None):
    finite = all(_finite(array) for array in data[:int(num_arrays)])
    return _host_values([1.0 if finite else 0.0], data[0].ctx)


def reset_arrays(*data, num_arrays, out=None, name=None):
    """Set every array to zero (in place)."""
    for array in data[:int(num_arrays)]:
        array._write()[...] = 0


# -- row_sparse gradients: MXNet's lazy updates ----------------------------------------------

def _stored_rows(grad):
    """The row indices a row_sparse gradient stores (a host int64 array), else None."""
    if getattr(grad, "stype", "default") != "row_sparse":
        return None
    return np.asarray(grad._structure(), dtype=np.int64)


def _lazy_for_row_sparse(function, declared):
    """``function`` as MXNet runs it on a row_sparse gradient: only the rows the gradient
    stores are updated (weight decay, momentum and moments included), the others keep
    their weight and states; where the operator has ``lazy_update``, as it says (False:
    the dense update). The FTRL operator is always lazy."""
    signature = declared.signature()
    written = ("weight", *declared.states, *(("weight32",) if declared.master else ()))

    @functools.wraps(function)
    def run(*args, **kwargs):
        rows = _stored_rows(args[1] if len(args) > 1 else kwargs.get("grad"))
        if rows is None:  # a dense gradient: nothing to bind (the common case)
            return function(*args, **kwargs)
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        if not bound.arguments.get("lazy_update", True):
            return function(**bound.arguments)
        return _on_rows(function, declared.name, rows, bound.arguments, written)
    return run


def _on_rows(function, op, rows, arguments, written):
    """``function`` run on the ``rows`` of every array, the results written back there."""
    weight, out = arguments["weight"], arguments["out"]
    index = array_module(_data(weight, "weight", op)).asarray(rows)

    def part(name):
        array = arguments[name]
        return new_array(_data(array, name, op)[index], array.ctx)
    parts = {name: part(name) for name in (*written, "grad")}
    function(**dict(arguments, **parts, out=parts["weight"]))
    for name in written[1:]:
        _state(arguments[name], name, op, weight)[index] = parts[name]._read()
    if out is None:
        target = new_array(_data(weight, "weight", op).copy(), weight.ctx)
    else:
        target = out if out is weight else _result(_data(weight, "weight", op), weight, out, op)
    target._write()[index] = parts["weight"]._read()
    return target


def _on_the_arrays_device(function):
    """CuPy computes on the thread's current GPU and refuses arrays of another: each update
    runs with its first array's GPU current, whichever GPU the caller had current."""
    @functools.wraps(function)
    def run(*args, **kwargs):
        first = next((a for a in (*args, *kwargs.values()) if _is_ndarray(a)), None)
        if first is None or first.ctx.device.kind == "cpu":
            return function(*args, **kwargs)
        with first.ctx.device.active():
            return function(*args, **kwargs)
    return run


# -- the operators, made -----------------------------------------------------------------------

def _made(declared):
    function = _operator(declared)
    if declared.lazy is not None:
        function = _lazy_for_row_sparse(function, declared)
    return _on_the_arrays_device(function)


def _multi_form(declared, one):
    """MXNet's list form of ``declared`` (``multi_sgd_update`` over one weight's update):
    the weight, gradient and state arrays of each weight in turn, one lr and wd each."""
    per_weight = 2 + len(declared.states) + int(declared.master)
    with_momentum = any(name == "momentum" for name, _ in declared.params)
    return _multi(one, per_weight, declared.multi, with_momentum)


def _operators() -> dict:
    made = {}
    for definition in definitions().values():
        for declared in definition.operators:
            made[declared.name] = _made(declared)
            if declared.multi:
                made[declared.multi] = _multi_form(declared, made[declared.name])
    return made


_OPERATORS = _operators()
globals().update(_OPERATORS)
for _name in ("multi_sum_sq", "all_finite", "multi_all_finite", "reset_arrays"):
    globals()[_name] = _on_the_arrays_device(globals()[_name])

# MXNet's names (one_multi_* are mixrt's: one weight of a multi_* operator)
FUNCTIONS = tuple(name for name in _OPERATORS if not name.startswith("one_")) + (
    "multi_sum_sq", "all_finite", "multi_all_finite", "reset_arrays")

__all__ = list(FUNCTIONS)
