"""MXNet's ``mx.operator``: operators written in Python.

    class Sigmoid(mx.operator.CustomOp):
        def forward(self, is_train, req, in_data, out_data, aux):
            self.assign(out_data[0], req[0], 1 / (1 + nd.exp(-in_data[0])))
        def backward(self, req, out_grad, in_data, out_data, in_grad, aux):
            y = out_data[0]
            self.assign(in_grad[0], req[0], out_grad[0] * y * (1 - y))

    @mx.operator.register("sigmoid")
    class SigmoidProp(mx.operator.CustomOpProp):
        def create_operator(self, ctx, in_shapes, in_dtypes):
            return Sigmoid()

    y = mx.nd.Custom(x, op_type="sigmoid")             # now, recorded by autograd
    s = mx.sym.Custom(data=v, op_type="sigmoid")       # a node of a symbol

The property class describes the op (its arguments, outputs and auxiliary states, their
shapes and dtypes, what its backward reads); ``create_operator`` makes the ``CustomOp``
that computes. As in MXNet, the keyword arguments of a ``Custom`` call other than
``op_type`` reach the property's constructor as strings, the outputs are allocated (zeros)
before ``forward`` fills them through :meth:`CustomOp.assign`, and the code runs with
autograd's recording paused. Imperatively, one operator instance serves a call's forward and
its backward (an ``autograd`` tape node); in a graph, each Custom node keeps one instance
per input signature (``ops/control/custom.py`` holds the graph ops, which call back here).
``forward``'s ``is_train`` is ``autograd.is_training()`` where the op runs (imperatively,
a hybridized block's call); a symbol Executor's ``forward(is_train=True)`` does not set
that mode yet, so there it reads False. With the profiler on, a call shows as ``<op_type>::pure_python`` (its backward
``_backward_<op_type>::pure_python``) in the "Custom Operator" category, and the ops its
Python code runs as ``<op_type>::<op>`` there too.
"""

from __future__ import annotations

import json
import time

import numpy as np

from mixrt import tape
from mixrt.tape import nodes
from mixrt.tape.arrays import new_array
from mixrt.base.errors import InputError
from mixrt.context import cpu, gpu
from mixrt.ops.control import custom as _graph_op
from mixrt.ops.ir.types import TensorType
from mixrt.runtime import lru
from mixrt.runtime import profiler as _profiler

REQUESTS = ("null", "write", "inplace", "add")
CATEGORY = "Custom Operator"  # the profiler's category for custom ops, MXNet's name

_REGISTERED: dict[str, type] = {}


# -- the user's classes ------------------------------------------------------------------------

class CustomOp:
    """The computation: ``forward`` fills ``out_data`` from ``in_data`` (and ``aux``),
    ``backward`` fills ``in_grad``; both write through :meth:`assign`, honouring ``req``."""

    def forward(self, is_train, req, in_data, out_data, aux):
        raise NotImplementedError(f"{type(self).__name__}.forward")

    def backward(self, req, out_grad, in_data, out_data, in_grad, aux):
        raise NotImplementedError(f"{type(self).__name__}.backward")

    def assign(self, dst, req, src):
        """Write ``src`` into ``dst`` as ``req`` says: "null" leaves it, "write" and
        "inplace" overwrite it, "add" adds to it."""
        if req not in REQUESTS:
            raise InputError(f"CustomOp.assign: req must be one of {list(REQUESTS)}, got "
                             f"{req!r}")
        if req == "null":
            return
        if req == "add":
            dst[:] = dst + src
        else:
            dst[:] = src


class CustomOpProp:
    """What the op looks like from outside. The defaults are MXNet's: one argument
    ``data``, one output ``output`` of its shape and dtype, no auxiliary states, and a
    backward that reads the head gradients (unless ``need_top_grad=False``), the inputs and
    the outputs."""

    def __init__(self, need_top_grad=True):
        self.need_top_grad_ = need_top_grad

    def list_arguments(self):
        return ["data"]

    def list_outputs(self):
        return ["output"]

    def list_auxiliary_states(self):
        return []

    def infer_shape(self, in_shape):
        """(argument shapes, output shapes, auxiliary shapes) from the argument shapes."""
        return in_shape, (in_shape[0],) * len(self.list_outputs()), ()

    def infer_type(self, in_type):
        """(argument dtypes, output dtypes, auxiliary dtypes) from the argument dtypes."""
        first = in_type[0]
        return (in_type, [first] * len(self.list_outputs()),
                [first] * len(self.list_auxiliary_states()))

    def infer_storage_type(self, in_stype):
        return (in_stype, ["default"] * len(self.list_outputs()),
                ["default"] * len(self.list_auxiliary_states()))

    def declare_backward_dependency(self, out_grad, in_data, out_data):
        """The values backward reads: MXNet frees the others early; mixrt keeps them all,
        so this only answers the question."""
        needed = list(out_grad) if self.need_top_grad_ else []
        return needed + list(in_data) + list(out_data)

    def create_operator(self, ctx, in_shapes, in_dtypes):
        raise NotImplementedError(f"{type(self).__name__}.create_operator")


def register(reg_name):
    """Class decorator: ``@register("name")`` makes the ``CustomOpProp`` subclass the op
    ``Custom(..., op_type="name")`` builds (a later registration of the name replaces it)."""
    if not isinstance(reg_name, str) or not reg_name:
        raise InputError(f"operator.register: reg_name must be a non-empty string, got "
                         f"{reg_name!r}")

    def do_register(prop_cls):
        if not (isinstance(prop_cls, type) and issubclass(prop_cls, CustomOpProp)):
            raise InputError(f"operator.register({reg_name!r}): expected a subclass of "
                             f"mx.operator.CustomOpProp, got {prop_cls!r}")
        _REGISTERED[reg_name] = prop_cls
        return prop_cls
    return do_register


def registered_operators() -> list[str]:
    """The names registered with :func:`register`."""
    return sorted(_REGISTERED)


# -- a call's property and signature -----------------------------------------------------------

def make_prop(op_type, kwargs: dict) -> CustomOpProp:
    """The registered property of ``op_type`` made with ``kwargs`` as strings (MXNet hands
    every Custom parameter to the constructor as its string form)."""
    if op_type not in _REGISTERED:
        raise InputError(f"Custom: op_type {op_type!r} is not registered; registered: "
                         f"{registered_operators()} (decorate a CustomOpProp subclass with "
                         f"mx.operator.register(name))")
    return _REGISTERED[op_type](**{key: _as_param(value) for key, value in kwargs.items()})


def _as_param(value) -> str:
    return str(value)  # what MXNet's C API receives for any parameter


def params_text(kwargs: dict) -> str:
    """The Custom parameters as one JSON object of strings (a graph attribute)."""
    return json.dumps({key: _as_param(value) for key, value in kwargs.items()}, sort_keys=True)


def input_names(prop: CustomOpProp) -> list[str]:
    return list(prop.list_arguments()) + list(prop.list_auxiliary_states())


def infer(prop: CustomOpProp, op_type: str, shapes: list, dtypes: list):
    """(output shapes, output dtypes, aux shapes) for arguments of ``shapes``/``dtypes``."""
    count = len(prop.list_arguments())
    _, out_shapes, aux_shapes = prop.infer_shape([list(s) for s in shapes[:count]])
    _, out_types, _ = prop.infer_type([np.dtype(d).type for d in dtypes[:count]])
    out_shapes = [tuple(int(d) for d in s) for s in out_shapes]
    out_types = [np.dtype(t) for t in out_types]
    if len(out_shapes) != len(prop.list_outputs()) or len(out_types) != len(out_shapes):
        raise InputError(f"Custom {op_type!r}: infer_shape/infer_type gave "
                         f"{len(out_shapes)} shapes and {len(out_types)} dtypes for the "
                         f"outputs {prop.list_outputs()}")
    return out_shapes, out_types, aux_shapes


# -- running one: the forward and backward shared by both frontends -----------------------------

class _Call:
    """One operator instance, with its inputs split into arguments and auxiliary states."""

    def __init__(self, prop: CustomOpProp, op_type: str, inputs: list, ctx):
        self.prop, self.op_type, self.ctx = prop, op_type, ctx
        count = len(prop.list_arguments())
        self.args, self.aux = list(inputs[:count]), list(inputs[count:])
        shapes = [list(x.shape) for x in self.args]
        dtypes = [x.dtype for x in self.args]
        self.out_shapes, self.out_types, _ = infer(prop, op_type, shapes, dtypes)
        self.operator = prop.create_operator(ctx, shapes, [np.dtype(d).type for d in dtypes])

    def forward(self, is_train: bool) -> list:
        outputs = [self._zeros(shape, dtype)
                   for shape, dtype in zip(self.out_shapes, self.out_types)]
        with _profiled(f"{self.op_type}::pure_python", self.op_type), \
                tape.pause(train_mode=is_train):
            self.operator.forward(is_train=is_train, req=["write"] * len(outputs),
                                  in_data=self.args, out_data=outputs, aux=self.aux)
        return outputs

    def backward(self, out_grads: list, outputs: list) -> list:
        in_grads = [self._zeros(x.shape, x.dtype) for x in self.args]
        with _profiled(f"_backward_{self.op_type}::pure_python", self.op_type), \
                tape.pause():
            self.operator.backward(req=["write"] * len(in_grads), out_grad=out_grads,
                                   in_data=self.args, out_data=outputs, in_grad=in_grads,
                                   aux=self.aux)
        return in_grads

    def _zeros(self, shape, dtype):
        with self.ctx.device.active():
            return new_array(self.ctx.xp.zeros(tuple(shape), dtype=dtype), self.ctx)


class _profiled:
    """The Python code's time as one "Custom Operator" event, and the ops it runs named
    ``<op_type>::<op>`` in that category."""

    def __init__(self, name: str, op_type: str):
        self.name, self.op_type = name, op_type

    def __enter__(self):
        self.profiler = _profiler.current()
        self.token = _profiler.IMPERATIVE_GROUP.set((CATEGORY, f"{self.op_type}::"))
        self.started = time.perf_counter()
        return self

    def __exit__(self, *exc_info):
        _profiler.IMPERATIVE_GROUP.reset(self.token)
        if self.profiler is not None:
            self.profiler.python_op(self.name, CATEGORY, self.started)


# -- imperative: nd.Custom ----------------------------------------------------------------------

class _TapeEntry:
    """The tape's view of one imperative call: backward runs the operator's backward."""

    def __init__(self, call: _Call, outputs: list):
        self.call, self.outputs = call, outputs

    def backward(self, *out_grads):
        return self.call.backward(list(out_grads), self.outputs)


def imperative_custom(*inputs, op_type=None, name=None, out=None, **kwargs):
    """MXNet's ``nd.Custom``: runs the registered op ``op_type`` on NDArrays now. Inputs
    are positional or named after the property's arguments and auxiliary states; the other
    keyword arguments go to the property. One output is an NDArray, several a list."""
    if op_type is None:
        raise InputError("Custom: op_type= (the name given to mx.operator.register) is "
                         "required")
    named = {k: v for k, v in kwargs.items() if hasattr(v, "_entry")}
    prop = make_prop(op_type, {k: v for k, v in kwargs.items() if k not in named})
    inputs = _ordered_inputs(prop, op_type, list(inputs), named)
    ctx = inputs[0].ctx
    call = _Call(prop, op_type, inputs, ctx)
    outputs = call.forward(tape.is_training())
    if tape.needs_tape(call.args):
        meta = [(o.shape, o.dtype) for o in outputs]
        node = nodes.FunctionNode(_TapeEntry(call, outputs), call.args, ctx, meta)
        node.name = op_type
        for index, output in enumerate(outputs):
            output._entry = (node, index)
    if out is not None:
        _copy_into(out, outputs)
        return out
    return outputs[0] if len(outputs) == 1 else outputs


def _ordered_inputs(prop, op_type: str, positional: list, named: dict) -> list:
    names = input_names(prop)
    unknown = sorted(set(named) - set(names))
    if unknown:
        raise InputError(f"Custom {op_type!r}: unknown input(s) {unknown}; its inputs are "
                         f"{names}")
    inputs = positional + [None] * (len(names) - len(positional))
    for key, value in named.items():
        inputs[names.index(key)] = value
    if len(positional) > len(names) or any(x is None for x in inputs):
        raise InputError(f"Custom {op_type!r} takes {len(names)} inputs {names}; got "
                         f"{len(positional)} positional and {sorted(named)} by name")
    return inputs


def _copy_into(out, outputs: list) -> None:
    targets = out if isinstance(out, (list, tuple)) else [out]
    if len(targets) != len(outputs):
        raise InputError(f"Custom: out= has {len(targets)} arrays for {len(outputs)} outputs")
    for target, value in zip(targets, outputs):
        target[:] = value


# -- in a graph: the runner mixrt::Custom and mixrt::CustomGrad call -----------------------------

class _GraphRunner:
    """Runs Custom nodes on a session's raw arrays. Each node (``node_key``) keeps its
    operator per input signature, so its backward calls the instance its forward used."""

    def __init__(self):
        self.calls = lru.LruCache(256)

    def forward(self, xp, op_type, params, node_key, inputs, count):
        ctx = _context_of(xp, inputs)
        arrays = [new_array(x, ctx) for x in inputs]
        call = self._call(op_type, params, node_key, arrays, ctx)
        if len(call.out_shapes) != count:
            raise InputError(f"Custom {op_type!r}: the node has {count} outputs, the op "
                             f"{call.prop.list_outputs()}")
        return [o._read() for o in call.forward(tape.is_training())]

    def backward(self, xp, op_type, params, node_key, out_grads, in_data, out_data):
        ctx = _context_of(xp, in_data)
        arrays = [new_array(x, ctx) for x in in_data]
        call = self._call(op_type, params, node_key, arrays, ctx)
        call.args = arrays[:len(call.args)]
        call.aux = arrays[len(call.args):]
        grads = call.backward([new_array(g, ctx) for g in out_grads],
                              [new_array(o, ctx) for o in out_data])
        zeros = [ctx.xp.zeros(x.shape, dtype=x.dtype) for x in call.aux]
        return [g._read() for g in grads] + zeros

    def _call(self, op_type, params, node_key, arrays, ctx) -> _Call:
        key = (op_type, params, node_key, str(ctx),
               tuple((tuple(a.shape), str(a.dtype)) for a in arrays))
        call = self.calls.get(key)
        if call is None:
            prop = make_prop(op_type, json.loads(params))
            call = self.calls.put(key, _Call(prop, op_type, arrays, ctx))
        call.args = arrays[:len(call.args)]
        call.aux = arrays[len(call.args):]
        return call

    @staticmethod
    def infer(op_type, params, input_types):
        prop = make_prop(op_type, json.loads(params))
        count = len(prop.list_outputs())
        known = all(t is not None and t.shape is not None and t.dtype is not None
                    and all(isinstance(d, int) for d in t.shape) for t in input_types)
        if not known:
            return [TensorType(None, None) for _ in range(count)]
        shapes, dtypes, _ = infer(prop, op_type, [t.shape for t in input_types],
                                  [t.dtype for t in input_types])
        return [TensorType(d, s) for s, d in zip(shapes, dtypes)]


def _context_of(xp, arrays: list):
    """The context a session's kernel runs in: the CPU, or the GPU it made current."""
    if xp is np:
        return cpu()
    return gpu(arrays[0].device.id if arrays else xp.cuda.Device().id)


_graph_op.use_runner(_GraphRunner())

__all__ = ["CustomOp", "CustomOpProp", "register", "registered_operators"]
