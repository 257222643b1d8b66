"""MXNet functions on Symbols that need no static shape: built straight from ONNX ops, so a
symbol made before any shape is known still infers and binds once shapes arrive.

``mixrt.sym.mxnet_ops`` runs ``mixrt.nd``'s bodies on a traced stand-in, which reads the
shapes a HybridBlock's trace knows; MXNet's own ``mx.sym`` code builds symbols with no shapes
at all (``elemwise_add(a, b)`` of two bare Variables). The functions here replace those
bodies for ``mx.sym``: MXNet's names and arguments, nodes named MXNet's way
(``elemwise_add0``), shapes left to inference (``partial_shapes`` reads back what an
elementwise operator's output says of its operands).
"""

from __future__ import annotations

import functools

import numpy as np

from mixrt import array_methods
from mixrt.base.errors import GraphError, HybridizeError
from mixrt.sym import mxnet_ops as traced_ops
from mixrt.sym.partial_shapes import SAME_SHAPE
from mixrt.sym.symbol import (call_op, constant, LAYER, layer_name, LOSS_HEAD, MXNET_OP,
                               OUTPUT_SUFFIX, prefixed, split_symbol_attributes, Symbol)
from mixrt.sym.tracing import static_shape


class _Function:
    """One MXNet function call: its node names (``name`` or MXNet's automatic one; inner
    nodes ``<name>_<role>``, part of one layer) and its operands checked."""

    def __init__(self, function: str, name: str | None):
        self.function = function
        self.name = layer_name(function, name)
        self.head = prefixed(self.name)  # the output node's name, which names the layer

    def symbol(self, argument: str, value) -> Symbol:
        if not isinstance(value, Symbol) or len(value) != 1:
            raise GraphError(f"{self.function}: {argument} must be a single-output Symbol, "
                             f"got {value!r}")
        return value

    def node(self, op_type: str, inputs: list, role: str | None = None, domain: str = "",
             **attributes) -> Symbol:
        name = self.name if role is None else f"{self.name}_{role}"
        made = call_op(domain, op_type, inputs, attributes, name=name, exact_name=True)
        made._outputs[0][0].info[LAYER] = self.head
        made._outputs[0][0].info[MXNET_OP] = self.function
        return made


def _elementwise(function: str, op_type: str):
    def elementwise(lhs, rhs, name=None, **attributes):
        call = _Function(function, name)
        made = call.node(op_type, [call.symbol("lhs", lhs), call.symbol("rhs", rhs)],
                         **attributes)
        made._outputs[0][0].info[SAME_SHAPE] = "strict"  # MXNet: operands of one shape
        return made
    elementwise.__name__ = elementwise.__qualname__ = function
    elementwise.__doc__ = f"MXNet's ``{function}``: ``{op_type}`` of two Symbols of one shape."
    return elementwise


def _parameterless(attributes: dict) -> dict:
    """An MXNet operator without parameters takes any keyword given (``axis=1`` to
    ``broadcast_maximum``, say) as a string attribute of its node, where it changes
    nothing: the keywords as ``attr=``, beside the symbol attributes given."""
    own, strings = split_symbol_attributes(attributes)
    return {"attr": {**strings, **{key: str(value) for key, value in own.items()}}}


def _broadcast(function: str, op_type: str, compare: bool):
    def broadcast(lhs, rhs, name=None, **attributes):
        call = _Function(function, name)
        lhs, rhs = call.symbol("lhs", lhs), call.symbol("rhs", rhs)
        attributes = _parameterless(attributes)
        if not compare:
            return call.node(op_type, [lhs, rhs], **attributes)
        if op_type == "NotEqual":
            test = call.node("Not", [call.node("Equal", [lhs, rhs], "equal")], "test")
        else:
            test = call.node(op_type, [lhs, rhs], "test")
        return call.node("CastLike", [test, lhs], **attributes)  # 0/1 in lhs's dtype
    broadcast.__name__ = broadcast.__qualname__ = function
    broadcast.__doc__ = (f"MXNet's ``{function}``: ``{op_type}`` of ``lhs`` and ``rhs`` with "
                         f"length-1 axes broadcast" + ("; 0/1 in lhs's dtype." if compare
                                                       else "."))
    return broadcast


_ELEMENTWISE = {"elemwise_add": "Add", "elemwise_sub": "Sub", "elemwise_mul": "Mul",
                "elemwise_div": "Div"}
_BROADCASTS = {"add": ("Add", False), "plus": ("Add", False), "sub": ("Sub", False),
               "minus": ("Sub", False), "mul": ("Mul", False), "div": ("Div", False),
               "power": ("Pow", False), "maximum": ("Max", False),
               "minimum": ("Min", False), "equal": ("Equal", True),
               "not_equal": ("NotEqual", True), "greater": ("Greater", True),
               "greater_equal": ("GreaterOrEqual", True), "lesser": ("Less", True),
               "lesser_equal": ("LessOrEqual", True)}


def split(data=None, num_outputs=None, axis=1, squeeze_axis=False, name=None, **attributes):
    """MXNet's ``split`` (``SliceChannel``): ``num_outputs`` equal parts along ``axis``
    (outputs ``<name>_output0``, ...); ``squeeze_axis`` drops that axis from each part."""
    call = _Function("split", name)
    data = call.symbol("data", data)
    if num_outputs is None or int(num_outputs) < 1:
        raise GraphError(f"split {call.name!r}: num_outputs must be a whole number >= 1, "
                         f"got {num_outputs!r}")
    count, axis = int(num_outputs), int(axis)
    if not squeeze_axis:
        if count == 1:
            return call.node("Identity", [data], **attributes)
        return call.node("Split", [data], num_outputs=count, axis=axis, **attributes)
    parts = call.node("Split", [data], "parts", num_outputs=count, axis=axis) if count > 1 \
        else call.node("Identity", [data], "parts")
    axes = constant(np.asarray([axis], dtype=np.int64))
    squeezed = [call.node("Squeeze", [parts[i], axes], f"output{i}", **attributes)
                for i in range(count)]
    return squeezed[0] if count == 1 else _group(squeezed)


def _group(symbols: list) -> Symbol:
    return Symbol([s._outputs[0] for s in symbols])


def _filled_like(function: str, fill: float):
    def filled_like(data=None, name=None, **attributes):
        call = _Function(function, name)
        data = call.symbol("data", data)
        shape = call.node("Shape", [data], "shape")
        filled = call.node("ConstantOfShape", [shape], "fill",
                           value=np.asarray([fill], dtype=np.float32))
        return call.node("CastLike", [filled, data], **attributes)
    filled_like.__name__ = filled_like.__qualname__ = function
    filled_like.__doc__ = f"MXNet's ``{function}``: {fill:g} in the shape and dtype of data."
    return filled_like


def batch_take(a=None, indices=None, name=None, **attributes):
    """MXNet's ``batch_take``: ``out[i] = a[i, indices[i]]`` for 2-D ``a`` and 1-D
    ``indices``, the indices clipped to ``[0, a.shape[1] - 1]`` (MXNet's rule)."""
    call = _Function("batch_take", name)
    a, indices = call.symbol("a", a), call.symbol("indices", indices)
    index = call.node("Cast", [indices], "index", to=7)  # int64
    width = call.node("Shape", [a], "width", start=1, end=2)
    last = call.node("Sub", [width, constant(np.asarray(1, dtype=np.int64))], "last")
    clipped = call.node("Min", [call.node("Max", [index, constant(np.int64(0))], "low"),
                                last], "clipped")
    columns = call.node("Unsqueeze", [clipped, constant(np.asarray([1], np.int64))],
                        "columns")
    taken = call.node("GatherElements", [a, columns], "taken", axis=1)
    return call.node("Squeeze", [taken, constant(np.asarray([1], np.int64))], **attributes)


def identity_with_attr_like_rhs(lhs=None, rhs=None, name=None, **attributes):
    """MXNet's ``_identity_with_attr_like_rhs``: ``lhs`` as it is, in ``rhs``'s shape (so
    shape inference learns either's shape from the other's)."""
    call = _Function("_identity_with_attr_like_rhs", name)
    lhs, rhs = call.symbol("lhs", lhs), call.symbol("rhs", rhs)
    made = call.node("Expand", [lhs, call.node("Shape", [rhs], "shape")], **attributes)
    made._outputs[0][0].info[SAME_SHAPE] = "strict"
    return made


def _int64s(*values) -> Symbol:
    return constant(np.asarray(values, dtype=np.int64))


def dot(lhs=None, rhs=None, transpose_a=False, transpose_b=False, forward_stype=None,
        name=None, **attributes):
    """MXNet's ``dot``: ``lhs``'s last axis with ``rhs``'s first (``transpose_a`` and
    ``transpose_b`` reverse all of an operand's axes first, as ONNX's Transpose does
    without knowing the rank); two vectors give shape ``(1,)``.

    Where ``rhs``'s shape is known when the symbol is built (declared, or traced), the
    imperative implementation builds it for any rank. Otherwise it is ONNX's MatMul, which
    is MXNet's dot for a ``rhs`` of one or two axes (the case of every layer), whatever
    ``lhs``'s rank; ``Expand`` to shape ``(1,)`` changes only the scalar two vectors give."""
    try:
        rank = len(static_shape(rhs)) if isinstance(rhs, Symbol) else None
    except HybridizeError:
        rank = None
    if rank is not None and rank > 2:  # (before a name is taken: the traced call takes it)
        return traced_ops.FUNCTIONS["dot"](lhs, rhs, transpose_a=transpose_a,
                                           transpose_b=transpose_b, name=name, **attributes)
    call = _Function("dot", name)
    lhs, rhs = call.symbol("lhs", lhs), call.symbol("rhs", rhs)
    if transpose_a:
        lhs = call.node("Transpose", [lhs], "lhs_t")
    if transpose_b:
        rhs = call.node("Transpose", [rhs], "rhs_t")
    product = call.node("MatMul", [lhs, rhs], "product")
    return call.node("Expand", [product, _int64s(1)], **attributes)


def _softmax_family(function: str, op_type: str, negate: bool = False):
    def softmax(data=None, axis=-1, temperature=None, dtype=None, use_length=False,
                length=None, name=None, **attributes):
        if _known_rank(data) is not None or use_length:
            # the imperative body: every argument, checked against the known shape
            return traced_ops.FUNCTIONS[function](data, axis=axis, temperature=temperature,
                                                  dtype=dtype, use_length=use_length,
                                                  length=length, name=name, **attributes)
        call = _Function(function, name)
        data = call.symbol("data", data)
        if negate:
            data = call.node("Neg", [data], "negated")
        if temperature is not None and float(temperature) != 1.0:
            if float(temperature) == 0.0:
                raise GraphError(f"{function} {call.name!r}: temperature must not be 0")
            scale = call.node("CastLike", [constant(np.float64(temperature)), data], "t")
            data = call.node("Div", [data, scale], "tempered")
        if dtype is not None:
            data = call.node("Cast", [data], "cast", to=_float_code(function, dtype))
        return call.node(op_type, [data], axis=int(axis), **attributes)
    softmax.__name__ = softmax.__qualname__ = function
    softmax.__doc__ = (f"MXNet's ``{function}`` along ``axis`` (a negative one counts from "
                       f"the end), of ``data / temperature`` cast to ``dtype``. Where the "
                       f"data's shape is unknown it is ONNX's ``{op_type}``, whose axis needs "
                       f"no rank; ``use_length`` needs the shape (the imperative body).")
    return softmax


def _with_length_second(function):
    """MXNet's ``softmax`` takes ``length`` second (log_softmax and softmin ``axis``)."""
    def softmax(data=None, length=None, axis=-1, temperature=None, dtype=None,
                use_length=False, name=None, **attributes):
        return function(data, axis=axis, temperature=temperature, dtype=dtype,
                        use_length=use_length, length=length, name=name, **attributes)
    softmax.__name__ = softmax.__qualname__ = function.__name__
    softmax.__doc__ = function.__doc__
    return softmax


def _known_rank(data) -> int | None:
    try:
        return len(static_shape(data)) if isinstance(data, Symbol) else None
    except HybridizeError:
        return None


_FLOAT_CODES = {"float16": 10, "float32": 1, "float64": 11}  # ONNX's element types


def _float_code(function: str, dtype) -> int:
    key = np.dtype(dtype).name if dtype in (np.float16, np.float32, np.float64) else dtype
    if key not in _FLOAT_CODES:
        raise GraphError(f"{function}: dtype must be None, 'float16', 'float32' or "
                         f"'float64', got {dtype!r}")
    return _FLOAT_CODES[key]


def batch_dot(lhs=None, rhs=None, transpose_a=False, transpose_b=False, forward_stype=None,
              name=None, **attributes):
    """MXNet's ``batch_dot``: the matrix products ``lhs[i] @ rhs[i]`` over the leading
    (batch) axes; ``transpose_a``/``transpose_b`` swap each matrix's two axes."""
    call = _Function("batch_dot", name)
    lhs, rhs = call.symbol("lhs", lhs), call.symbol("rhs", rhs)
    left = "...ji" if transpose_a else "...ij"
    right = "...kj" if transpose_b else "...jk"
    return call.node("Einsum", [lhs, rhs], equation=f"{left},{right}->...ik", **attributes)


def pick(data=None, index=None, axis=-1, keepdims=False, mode="clip", name=None,
         **attributes):
    """MXNet's ``pick``: ``data``'s entry at ``index`` along ``axis`` (``index`` has the
    data's shape without that axis); indices out of range are clipped (``mode="clip"``)
    or wrapped (``"wrap"``); ``axis=None`` picks from the flattened data."""
    call = _Function("pick", name)
    data, index = call.symbol("data", data), call.symbol("index", index)
    if mode not in ("clip", "wrap"):
        raise GraphError(f"pick {call.name!r}: mode must be 'clip' or 'wrap', got {mode!r}")
    if axis is None:
        data = call.node("Reshape", [data, _int64s(-1)], "flat")
        index = call.node("Reshape", [index, _int64s(-1)], "flat_index")
        axis = 0
    axis = int(axis)
    index = call.node("Cast", [index], "index", to=7)  # int64
    bounds = {"start": axis} if axis == -1 else {"start": axis, "end": axis + 1}
    length = call.node("Shape", [data], "length", **bounds)
    if mode == "wrap":
        index = call.node("Mod", [index, length], "wrapped", fmod=0)
    else:
        last = call.node("Sub", [length, _int64s(1)], "last")
        index = call.node("Min", [call.node("Max", [index, _int64s(0)], "low"), last],
                          "clipped")
    positions = call.node("Unsqueeze", [index, _int64s(axis)], "positions")
    if keepdims:
        return call.node("GatherElements", [data, positions], axis=axis, **attributes)
    picked = call.node("GatherElements", [data, positions], "picked", axis=axis)
    return call.node("Squeeze", [picked, _int64s(axis)], **attributes)


def _filled(function: str, fill):
    def filled(shape=None, dtype=None, name=None, **attributes):
        return full(shape, fill, dtype, name=name, _function=function, **attributes)
    filled.__name__ = filled.__qualname__ = function.lstrip("_")
    filled.__doc__ = f"MXNet's ``{function.lstrip('_')}``: {fill:g} in ``shape`` (float32 " \
                     f"unless ``dtype``)."
    return filled


def full(shape=None, val=None, dtype=None, name=None, _function="_full", **attributes):
    """MXNet's ``full``: ``val`` in ``shape`` (float32 unless ``dtype``), a node of the
    graph (``_full0``) rather than a stored array."""
    call = _Function(_function, name)
    if shape is None or val is None:
        raise GraphError(f"{_function.lstrip('_')} {call.name!r}: needs shape and a value, "
                         f"got shape={shape!r}, val={val!r}")
    dims = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
    if any(not isinstance(d, (int, np.integer)) or d < 0 for d in dims):
        raise GraphError(f"{_function.lstrip('_')} {call.name!r}: shape must be whole "
                         f"numbers >= 0, got {shape!r}")
    value = np.asarray([val], dtype=np.dtype(dtype) if dtype is not None else np.float32)
    return call.node("ConstantOfShape", [_int64s(*dims)], value=value, **attributes)


def _nan_reduce(function: str, op_type: str, neutral: float):
    def nan_reduce(data=None, axis=None, keepdims=False, exclude=False, name=None,
                   **attributes):
        call = _Function(function, name)
        data = call.symbol("data", data)
        if exclude:
            raise GraphError(f"{function} {call.name!r}: exclude=True needs the data's rank, "
                             f"which a Symbol does not have until bound; name the axes")
        is_nan = call.node("IsNaN", [data], "is_nan")
        kept = call.node("Where", [is_nan, call.node("CastLike", [
            constant(np.float64(neutral)), data], "neutral"), data], "kept")
        inputs = [kept] if axis is None else [kept, _int64s(*np.atleast_1d(axis))]
        return call.node(op_type, inputs, keepdims=int(bool(keepdims)), **attributes)
    nan_reduce.__name__ = nan_reduce.__qualname__ = function
    nan_reduce.__doc__ = (f"MXNet's ``{function}``: ``{op_type}`` over ``axis`` (all axes "
                          f"when None) with NaN counted as {neutral:g}.")
    return nan_reduce


def square_sum(data=None, axis=None, keepdims=False, exclude=False, name=None,
               **attributes):
    """MXNet's ``_square_sum``: the sum of ``data``'s squares over ``axis`` (every axis
    when None), kept as length-1 axes with ``keepdims``. MXNet keeps a row_sparse input's
    storage; the values are these."""
    call = _Function("_square_sum", name)
    data = call.symbol("data", data)
    if exclude:
        raise GraphError(f"_square_sum {call.name!r}: exclude=True needs the data's rank, "
                         f"which a Symbol does not have until bound; name the axes")
    squares = call.node("Mul", [data, data], "squares")
    inputs = [squares] if axis is None else [squares, _int64s(*np.atleast_1d(axis))]
    return call.node("ReduceSum", inputs, keepdims=int(bool(keepdims)), **attributes)


def argmax_channel(data=None, name=None, **attributes):
    """MXNet's ``argmax_channel``: the index of the largest entry along axis 1, in the
    data's dtype."""
    call = _Function("argmax_channel", name)
    data = call.symbol("data", data)
    index = call.node("ArgMax", [data], "index", axis=1, keepdims=0)
    return call.node("CastLike", [index, data], **attributes)


def make_loss(data=None, name=None, **attributes):
    """MXNet's ``make_loss``: a loss head of one's own making, output ``<name>_loss``.
    Forward: ``data`` itself; backward: ones, whatever head gradient ``backward`` is
    given (the executor seeds a loss head itself). The operator has no parameters: any
    keyword given (MakeLoss's ``grad_scale``, say) is kept as a string attribute and
    changes nothing, as in MXNet."""
    call = _Function("make_loss", name)
    data = call.symbol("data", data)
    loss = call.node("Identity", [data], **_parameterless(attributes))
    node = loss._outputs[0][0]
    node.info[OUTPUT_SUFFIX], node.info[LOSS_HEAD] = "loss", True
    return loss


def MakeLoss(data=None, grad_scale=1.0, valid_thresh=0.0, normalization="null", name=None,
             **attributes):
    """MXNet's legacy ``MakeLoss``: a loss head whose backward is ``grad_scale`` for every
    element, whatever head gradient ``backward`` is given, divided by the batch size
    (``normalization="batch"``) or by the count of elements above ``valid_thresh``
    (``"valid"``, at least 1). Forward: ``data`` itself. Built as ``held + (data - held) *
    scale`` with ``held`` the data behind BlockGrad, whose value is the data and whose
    gradient is ``scale`` for the ones the executor seeds a loss head with."""
    call = _Function("MakeLoss", name)
    data = call.symbol("data", data)
    if normalization not in ("null", "batch", "valid"):
        raise GraphError(f"MakeLoss {call.name!r}: normalization must be 'null', 'batch' or "
                         f"'valid', got {normalization!r}")
    scale = call.node("CastLike", [constant(np.float64(grad_scale)), data], "scale")
    if normalization != "null":
        scale = call.node("Div", [scale, _normalizer(call, data, normalization,
                                                     valid_thresh)], "normalized")
    held = call.node("BlockGrad", [data], "held", domain="mixrt")
    moving = call.node("Mul", [call.node("Sub", [data, held], "moving"), scale], "scaled")
    loss = call.node("Add", [held, moving], **attributes)
    loss._outputs[0][0].info[LOSS_HEAD] = True
    return loss


def _normalizer(call: _Function, data: Symbol, normalization: str, valid_thresh) -> Symbol:
    """The batch size, or the count of elements above ``valid_thresh`` (at least 1), in
    the data's dtype."""
    if normalization == "batch":
        count = call.node("Shape", [data], "batch", start=0, end=1)
    else:
        threshold = call.node("CastLike", [constant(np.float64(valid_thresh)), data],
                              "threshold")
        above = call.node("Greater", [data, threshold], "above")
        count = call.node("ReduceSum", [call.node("Cast", [above], "valid", to=7)],
                          "count", keepdims=0)
        count = call.node("Max", [count, _int64s(1)], "at_least_one")
    return call.node("CastLike", [count, data], "count_as_data")


def _data_operand(function):
    """``function`` (``mixrt.array_methods``', whose operand is ``x``) under MXNet's
    signature, whose operand is ``data``: ``sym.square(data=x)`` as MXNet code writes it."""
    @functools.wraps(function)
    def with_data(data=None, *args, **kwargs):
        if data is None:
            raise GraphError(f"{function.__name__}: data (a Symbol) is required")
        return function(data, *args, **kwargs)
    del with_data.__wrapped__  # its signature is not the wrapped one's
    return with_data


# array_methods' functions that take one operand, MXNet's data
_DATA_OPERAND = ("relu", "sigmoid", "tanh", "exp", "log", "sqrt", "square", "sum", "mean",
                 "max", "min", "prod", "reshape", "transpose", "flatten", "expand_dims",
                 "squeeze", "clip")

FUNCTIONS = {
    **{name: _data_operand(getattr(array_methods, name)) for name in _DATA_OPERAND},
    **{name: _elementwise(name, op) for name, op in _ELEMENTWISE.items()},
    **{f"broadcast_{name}": _broadcast(f"broadcast_{name}", op, compare)
       for name, (op, compare) in _BROADCASTS.items()},
    "split": split, "SliceChannel": split, "batch_take": batch_take,
    "zeros_like": _filled_like("zeros_like", 0.0), "ones_like": _filled_like("ones_like", 1.0),
    "dot": dot, "batch_dot": batch_dot, "pick": pick, "argmax_channel": argmax_channel,
    "nansum": _nan_reduce("nansum", "ReduceSum", 0.0),
    "nanprod": _nan_reduce("nanprod", "ReduceProd", 1.0),
    "make_loss": make_loss, "MakeLoss": MakeLoss,
    "softmax": _with_length_second(_softmax_family("softmax", "Softmax")),
    "log_softmax": _softmax_family("log_softmax", "LogSoftmax"),
    "softmin": _softmax_family("softmin", "Softmax", negate=True),
}

CREATORS = {"zeros": _filled("_zeros", 0), "ones": _filled("_ones", 1), "full": full}
"""MXNet's functions that make a Symbol from a shape alone (no operand to trace)."""


# MXNet's Symbol methods of the same names (``x.zeros_like()``, ``x.nansum(axis=1)``)
METHODS = ("zeros_like", "ones_like", "nansum", "nanprod", "argmax_channel", "pick", "split",
           "dot")


def _attach_methods() -> None:
    for method in METHODS:
        setattr(Symbol, method, FUNCTIONS[method])


_attach_methods()
