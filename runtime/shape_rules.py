"""What each op makes of its inputs' shapes, and the shape arithmetic's values, over dims
that are expressions of a feed signature (``runtime/symbolic_dims.py``).

A trace (``runtime/shape_programs.py``) asks :func:`output_shapes` for every node the
graph runs and :func:`output_values` for the nodes a signature's sizes alone fix (Shape,
Gather over it, Concat, the Reshape targets: the *frozen* values, whose elements are dims
and numbers). A value is a :class:`Known`: its shape (ints and dims) and, where the trace
knows its elements, an array of them (NumPy's dtype for numbers, ``object`` where an
element is a dim). An op without a rule here raises :class:`NotSymbolic`: its form keeps
planning each new signature from concrete inference, as before.

These rules say what the ops' kernels and infer functions say (``ops/``), for the forms a
served graph takes; every comparison of dims they make is a guard of the program.
"""

from __future__ import annotations

import numpy as np

from mixrt.ops.attention.fused_attention import QUERY_PERM, input_perms, kv_repeat_of
from mixrt.ops.conv.windows import spatial_attrs, window_geometry
from mixrt.ops.ir.types import broadcast_like_first, broadcast_to_bool, same_as_input
from mixrt.runtime.symbolic_dims import Dim, NotSymbolic, number, product


class NoRule(NotSymbolic):
    """An op this module has no rule for (the trace may ask its infer function)."""


class Known:
    """What a trace knows of one value: its shape, and its elements where it knows them."""

    __slots__ = ("shape", "elements")

    def __init__(self, shape: tuple, elements: np.ndarray | None = None):
        self.shape, self.elements = shape, elements


_SAME_SHAPE = frozenset({
    "Abs", "Acos", "Asin", "Atan", "BatchNormalization", "Cast", "CastLike", "Ceil", "Celu",
    "Clip", "Cos", "Cosh", "CumSum", "Elu", "Erf", "Exp", "Floor", "Gelu", "HardSigmoid",
    "HardSwish", "Hardmax", "Identity", "InstanceNormalization", "IsInf", "IsNaN",
    "LeakyRelu", "Log", "LogSoftmax", "LpNormalization", "Mish", "Neg", "Not", "Reciprocal",
    "Relu", "Round", "Selu", "Sigmoid", "Sign", "Sin", "Sinh", "Softmax", "Softplus",
    "Softsign", "Sqrt", "Tan", "Tanh", "ThresholdedRelu", "Shrink", "Normalizer", "Scaler",
    "Binarizer", "Imputer", "QuickGelu", "FastGelu", "BiasGelu", "QuantizeLinear",
    "DequantizeLinear",
})
_BROADCAST = frozenset({
    "Add", "Sub", "Mul", "Div", "Pow", "Mod", "Max", "Min", "Sum", "Mean", "And", "Or",
    "Xor", "Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual", "Where",
    "BitShift", "PRelu", "FusedElementwise", "FusedRotary",
})


def output_shapes(node, kernel, inputs: list) -> list[tuple]:
    """One shape per output of ``node`` (its kernel's registry entry), over ``inputs``
    (:class:`Known`, None for an absent optional one)."""
    op = node.op_type
    rule = _RULES.get(op)
    if rule is not None:
        return rule(node, inputs)
    infer = kernel.infer_fn if kernel is not None else None
    if (op in _SAME_SHAPE or infer is same_as_input) and len(node.outputs) == 1:
        return [inputs[0].shape]
    if op in _BROADCAST or infer in (broadcast_like_first, broadcast_to_bool):
        if len(node.outputs) == 1:
            return [broadcast(*(known.shape for known in inputs if known is not None))]
    raise NoRule(f"no shape rule for {node.domain or 'ai.onnx'}.{op}")


def broadcast(*shapes) -> tuple:
    """NumPy's broadcasting, each axis's 1 or not, and the agreement of the rest, guarded."""
    rank = max(len(shape) for shape in shapes)
    result = []
    for axis in range(rank):
        picked = 1
        for shape in shapes:
            offset = axis - rank + len(shape)
            if offset < 0:
                continue
            dim = number(shape[offset])
            if dim == 1:
                continue
            if picked.__class__ is int and picked == 1:
                picked = dim
            elif not dim == picked:
                raise NotSymbolic(f"shapes {shapes} do not broadcast at axis {axis}")
        result.append(picked)
    return tuple(result)


def _attribute(node, name: str, default=None):
    return node.attributes.get(name, default)


def _axis(axis: int, rank: int) -> int:
    axis = int(axis)
    if not -rank <= axis < rank:
        raise NotSymbolic(f"axis {axis} for rank {rank}")
    return axis + rank if axis < 0 else axis


def _ints(known: Known | None, what: str) -> list:
    """The elements of a 0-d or 1-d value the trace knows (dims or ints), as a list."""
    if known is None or known.elements is None:
        raise NotSymbolic(f"{what} not known to the trace")
    return [number(element) for element in np.asarray(known.elements).reshape(-1)]


def _constant_ints(known: Known | None, what: str) -> list[int]:
    values = _ints(known, what)
    if any(value.__class__ is Dim for value in values):
        raise NotSymbolic(f"{what} depends on the sizes")
    return values


def _axes(node, inputs: list, index: int) -> list[int] | None:
    """An op's ``axes``: its attribute before opset 13 (18 for reductions), else an input."""
    if "axes" in node.attributes:
        return [int(axis) for axis in node.attributes["axes"]]
    if len(inputs) > index and inputs[index] is not None:
        return _constant_ints(inputs[index], f"{node.op_type}'s axes")
    return None


# -- rules by op ---------------------------------------------------------------------------

def _shape_of(node, inputs):
    rank = len(inputs[0].shape)
    start, end = _attribute(node, "start", 0), _attribute(node, "end", None)
    start = max(0, min(rank, start + rank if start < 0 else start))
    end = rank if end is None else max(0, min(rank, end + rank if end < 0 else end))
    return [(max(end - start, 0),)]


def _gather(node, inputs):
    data, indices = inputs[0].shape, inputs[1].shape
    axis = _axis(_attribute(node, "axis", 0), len(data))
    return [tuple(data[:axis]) + tuple(indices) + tuple(data[axis + 1:])]


def _unsqueeze(node, inputs):
    shape = list(inputs[0].shape)
    axes = _axes(node, inputs, 1)
    rank = len(shape) + len(axes)
    for axis in sorted(_axis(axis, rank) for axis in axes):
        shape.insert(axis, 1)
    return [tuple(shape)]


def _squeeze(node, inputs):
    shape = inputs[0].shape
    axes = _axes(node, inputs, 1)
    if axes is None:  # every axis of 1 goes: which ones are is a guard each
        return [tuple(dim for dim in shape if not number(dim) == 1)]
    drop = {_axis(axis, len(shape)) for axis in axes}
    for axis in drop:
        if not number(shape[axis]) == 1:
            raise NotSymbolic(f"Squeeze of axis {axis} of size {shape[axis]!r}")
    return [tuple(dim for axis, dim in enumerate(shape) if axis not in drop)]


def _reshape(node, inputs):
    shape = inputs[0].shape
    target = _ints(inputs[1], "Reshape's shape")
    allow_zero = _attribute(node, "allowzero", 0)
    out = []
    for axis, dim in enumerate(target):
        if dim.__class__ is Dim and not dim > 0:
            # a target computed from the sizes means "copy" at 0 and "the rest" at -1:
            # that it is a size at every signature the program serves is a guard
            raise NotSymbolic("a Reshape target of dims that is not a size")
        if dim.__class__ is int and dim == 0 and not allow_zero:
            dim = shape[axis]
        out.append(dim)
    unknown = [axis for axis, dim in enumerate(out) if dim.__class__ is int and dim == -1]
    if len(unknown) > 1:
        raise NotSymbolic("Reshape with more than one -1")
    if any(dim.__class__ is int and dim < -1 for dim in out):
        raise NotSymbolic(f"Reshape to {target}")
    if unknown:
        rest = product(dim for axis, dim in enumerate(out) if axis != unknown[0])
        total = product(shape)
        if not total % rest == 0:
            raise NotSymbolic("Reshape's -1 does not divide the size")
        out[unknown[0]] = total // rest
    return [tuple(out)]


def _flatten(node, inputs):
    shape = inputs[0].shape
    axis = _attribute(node, "axis", 1)
    axis = axis + len(shape) if axis < 0 else axis
    return [(product(shape[:axis]), product(shape[axis:]))]


def _concat(node, inputs):
    present = [known.shape for known in inputs if known is not None]
    axis = _axis(_attribute(node, "axis"), len(present[0]))
    out = list(present[0])
    out[axis] = 0
    for shape in present:
        out[axis] = out[axis] + shape[axis]
        for other in range(len(out)):
            if other != axis and not number(shape[other]) == out[other]:
                raise NotSymbolic("Concat of shapes that differ off its axis")
    return [tuple(out)]


def _transpose(node, inputs):
    shape = inputs[0].shape
    perm = _attribute(node, "perm") or list(range(len(shape)))[::-1]
    return [tuple(shape[int(axis)] for axis in perm)]


def matmul_shape(a: tuple, b: tuple) -> tuple:
    a_vector, b_vector = len(a) == 1, len(b) == 1
    a = (1,) + tuple(a) if a_vector else tuple(a)
    b = tuple(b) + (1,) if b_vector else tuple(b)
    if not number(a[-1]) == b[-2]:
        raise NotSymbolic("MatMul operands do not share an inner dim")
    batch = broadcast(a[:-2], b[:-2]) if len(a) > 2 or len(b) > 2 else ()
    return batch + (() if a_vector else (a[-2],)) + (() if b_vector else (b[-1],))


def _matmul(node, inputs):
    return [matmul_shape(inputs[0].shape, inputs[1].shape)]


def _gemm(node, inputs):
    a, b = inputs[0].shape, inputs[1].shape
    rows = a[1] if _attribute(node, "transA", 0) else a[0]
    inner = a[0] if _attribute(node, "transA", 0) else a[1]
    cols = b[0] if _attribute(node, "transB", 0) else b[1]
    if not number(inner) == (b[1] if _attribute(node, "transB", 0) else b[0]):
        raise NotSymbolic("Gemm operands do not share an inner dim")
    return [(rows, cols)]


def _layer_norm(node, inputs):
    shape = inputs[0].shape
    axis = _axis(_attribute(node, "axis", -1), len(shape))
    reduced = tuple(shape[:axis]) + (1,) * (len(shape) - axis)
    return [tuple(shape)] + [reduced] * (len(node.outputs) - 1)


def _slice(node, inputs):
    shape = list(inputs[0].shape)
    if "starts" in node.attributes:  # opset < 10
        starts, ends = list(node.attributes["starts"]), list(node.attributes["ends"])
        axes, steps = node.attributes.get("axes"), None
    else:
        starts = _ints(inputs[1], "Slice's starts")
        ends = _ints(inputs[2], "Slice's ends")
        axes = _axes_input(inputs, 3)
        steps = _constant_ints(inputs[4], "Slice's steps") \
            if len(inputs) > 4 and inputs[4] is not None else None
    axes = list(range(len(starts))) if axes is None else axes
    steps = [1] * len(starts) if steps is None else steps
    for start, end, axis, step in zip(starts, ends, axes, steps):
        axis = _axis(axis, len(shape))
        shape[axis] = _sliced_length(shape[axis], start, end, step)
    return [tuple(shape)]


def _axes_input(inputs: list, index: int):
    if len(inputs) > index and inputs[index] is not None:
        return _constant_ints(inputs[index], "Slice's axes")
    return None


def _sliced_length(size, start, end, step: int):
    """ONNX Slice's length along one axis (its clamping of start and end), as the kernel
    computes it over Python's slice rules."""
    if step.__class__ is not int or step == 0:
        raise NotSymbolic("Slice with a step of dims or of 0")
    if step < 0:  # reversed slices: served graphs take them at constant bounds only
        if any(v.__class__ is Dim for v in (size, start, end)):
            raise NotSymbolic("a reversed Slice over sizes")
        return len(range(*slice(start, end, step).indices(size)))
    start = _clamped(start, size)
    end = _clamped(end, size)
    return _maximum(end - start, 0)


def _clamped(bound, size):
    """A bound of a forward slice, counted from the end where negative, within [0, size]."""
    if bound.__class__ is int:
        if bound < 0:
            bound = size + bound
            return _maximum(bound, 0)
        return _minimum(bound, size)
    if bound < 0:  # a dim: its sign at the traced sizes is a guard
        return _maximum(size + bound, 0)
    return _minimum(bound, size)


def _trace_of(*values):
    for value in values:
        if value.__class__ is Dim:
            return value.trace
    return None


def _maximum(a, b):
    trace = _trace_of(a, b)
    return max(a, b) if trace is None else trace.maximum(a, b)


def _minimum(a, b):
    trace = _trace_of(a, b)
    return min(a, b) if trace is None else trace.minimum(a, b)


def _expand(node, inputs):
    return [broadcast(inputs[0].shape, tuple(_ints(inputs[1], "Expand's shape")))]


def _constant_of_shape(node, inputs):
    shape = tuple(_ints(inputs[0], "ConstantOfShape's shape"))
    if any(dim.__class__ is Dim and not dim >= 0 for dim in shape):
        raise NotSymbolic("ConstantOfShape of a negative size")
    return [shape]


def _range(node, inputs):
    start, limit, delta = (_ints(known, "Range's bounds")[0] for known in inputs)
    if delta.__class__ is not int or delta <= 0:
        raise NotSymbolic("Range with a step of dims or not positive")
    return [(_maximum((limit - start + (delta - 1)) // delta, 0),)]


def _split(node, inputs):
    shape = inputs[0].shape
    axis = _axis(_attribute(node, "axis", 0), len(shape))
    parts = len(node.outputs)
    if "split" in node.attributes:
        sizes = [int(size) for size in node.attributes["split"]]
    elif len(inputs) > 1 and inputs[1] is not None:
        sizes = _constant_ints(inputs[1], "Split's sizes")
    else:
        whole = shape[axis]
        if not whole % parts == 0:
            raise NotSymbolic("an uneven Split over sizes")
        sizes = [whole // parts] * parts
    shapes = []
    for size in sizes:
        part = list(shape)
        part[axis] = size
        shapes.append(tuple(part))
    return shapes


def _reduce(node, inputs):
    shape = inputs[0].shape
    axes = _axes(node, inputs, 1)
    keep = _attribute(node, "keepdims", 1)
    if not axes:
        if _attribute(node, "noop_with_empty_axes", 0):
            return [tuple(shape)]
        axes = range(len(shape))
    drop = {_axis(axis, len(shape)) for axis in axes}
    return [tuple(1 if axis in drop else dim for axis, dim in enumerate(shape) if keep
                  or axis not in drop)]


def _arg_extreme(node, inputs):
    shape = inputs[0].shape
    axis = _axis(_attribute(node, "axis", 0), len(shape))
    keep = _attribute(node, "keepdims", 1)
    return [tuple(1 if index == axis else dim for index, dim in enumerate(shape)
                  if keep or index != axis)]


def _windowed(node, inputs, channels, weight: int = 1):
    """Conv's and the pools' output: batch, ``channels``, the windows' counts (the kernel's
    shape from its attribute, else from input ``weight``'s trailing dims)."""
    shape = inputs[0].shape
    spatial = shape[2:]
    kernel = _attribute(node, "kernel_shape") or (
        inputs[weight].shape[2:] if node.op_type not in _POOLS else None)
    if kernel is None or any(dim.__class__ is Dim for dim in kernel):
        raise NotSymbolic(f"{node.op_type} without a fixed kernel shape")
    kernel, strides, dilations = spatial_attrs(len(spatial), [int(k) for k in kernel],
                                               _attribute(node, "strides"),
                                               _attribute(node, "dilations"))
    _, _, out = window_geometry(list(spatial), kernel, strides, dilations,
                                _attribute(node, "pads"), _attribute(node, "auto_pad", "NOTSET"),
                                bool(_attribute(node, "ceil_mode", 0)))
    return [(shape[0], channels) + tuple(out)] * len(node.outputs)


_POOLS = frozenset({"MaxPool", "AveragePool", "LpPool"})


def _conv(node, inputs):
    return _windowed(node, inputs, inputs[1].shape[0])[:1]


def _quantized_conv(node, inputs):
    """QLinearConv: x, its scale and zero point, then w (input 3)."""
    return _windowed(node, inputs, inputs[3].shape[0], weight=3)[:1]


def _quantized_binary(node, inputs):
    """com.microsoft's QLinearAdd/QLinearMul: A and B at inputs 0 and 3."""
    return [broadcast(inputs[0].shape, inputs[3].shape)]


def _quantized_matmul(node, inputs):
    """QLinearMatMul: A at input 0, B at input 3."""
    return [matmul_shape(inputs[0].shape, inputs[3].shape)]


def _quantized_gemm(node, inputs):
    """com.microsoft's QGemm: A at input 0, B at input 3, Gemm's transposes."""
    return _gemm(node, [inputs[0], inputs[3]])


def _dynamic_quantize(node, inputs):
    return [tuple(inputs[0].shape), (), ()][:len(node.outputs)]


def _quantized_global_pool(node, inputs):
    shape = inputs[0].shape
    if _attribute(node, "channels_last", 0):
        return [(shape[0],) + (1,) * (len(shape) - 2) + (shape[-1],)]
    return _global_pool(node, inputs)


def _pool(node, inputs):
    if len(node.outputs) > 1 and node.outputs[1]:
        raise NotSymbolic("MaxPool's indices")
    return _windowed(node, inputs, inputs[0].shape[1])[:1]


def _global_pool(node, inputs):
    shape = inputs[0].shape
    return [tuple(shape[:2]) + (1,) * (len(shape) - 2)]


def _fused_attention(node, inputs):
    """mixrt's FusedAttention: softmax(Q K^T + mask) V, each operand in its own layout
    (``heads_first``), K and V's heads repeated ``kv_repeat`` times."""
    heads_first = _attribute(node, "heads_first")
    repeat = kv_repeat_of(heads_first, _attribute(node, "kv_repeat", 1))
    q_perm, k_perm, v_perm = input_perms(heads_first)

    def permuted(known, perm, grouped=False):
        shape = tuple(known.shape)
        if len(shape) != 4:
            raise NotSymbolic("FusedAttention over operands not of rank 4")
        if grouped and repeat > 1:
            shape = (shape[0], shape[1] * repeat) + shape[2:]
        return shape if perm is None else tuple(shape[axis] for axis in perm)

    scores = matmul_shape(permuted(inputs[0], q_perm), permuted(inputs[1], k_perm, True))
    if len(inputs) > 3 and inputs[3] is not None:
        scores = broadcast(scores, inputs[3].shape)
    shape = matmul_shape(scores, permuted(inputs[2], v_perm, True))
    return [tuple(shape[axis] for axis in QUERY_PERM)]


def _size(node, inputs):
    return [()]


_RULES = {
    "Shape": _shape_of, "Size": _size, "Gather": _gather, "Unsqueeze": _unsqueeze,
    "Squeeze": _squeeze, "Reshape": _reshape, "Flatten": _flatten, "Concat": _concat,
    "Transpose": _transpose, "MatMul": _matmul, "FusedMatMul": _matmul, "Gemm": _gemm,
    "FusedGemm": _gemm, "LayerNormalization": _layer_norm, "Slice": _slice,
    "Expand": _expand, "ConstantOfShape": _constant_of_shape, "Range": _range,
    "Split": _split, "ArgMax": _arg_extreme, "ArgMin": _arg_extreme,
    "GatherElements": lambda node, inputs: [inputs[1].shape],
    "FusedAttention": _fused_attention,
    "QLinearConv": _quantized_conv, "QLinearAdd": _quantized_binary,
    "QLinearMul": _quantized_binary, "QLinearMatMul": _quantized_matmul,
    "MatMulInteger": _matmul, "MatMulIntegerToFloat": _matmul, "ConvInteger": _conv,
    "QGemm": _quantized_gemm, "DynamicQuantizeLinear": _dynamic_quantize,
    "QLinearGlobalAveragePool": _quantized_global_pool,
    "Conv": _conv, "FusedConv": _conv, "MaxPool": _pool, "AveragePool": _pool,
    "LpPool": _pool, "GlobalAveragePool": _global_pool, "GlobalMaxPool": _global_pool,
    **{op: _reduce for op in ("ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin",
                              "ReduceProd", "ReduceL1", "ReduceL2", "ReduceLogSumExp",
                              "ReduceSumSquare", "ReduceLogSum")},
}


# -- the shape arithmetic's values -----------------------------------------------------------

def output_values(node, inputs: list, shapes: list) -> list[np.ndarray]:
    """The elements of each output of a frozen node (``shapes``: what :func:`output_shapes`
    gave), each an array of dims and numbers; :class:`NotSymbolic` where this op's values
    are none of the trace's business (the program calls its kernel)."""
    rule = _VALUE_RULES.get(node.op_type) if not node.domain else None
    if rule is None or any(dim.__class__ is Dim for shape in shapes for dim in shape):
        raise NotSymbolic(f"no value rule for {node.op_type} over these sizes")
    made = rule(node, inputs)
    return [np.asarray(value, dtype=object).reshape(shape) for value, shape in zip(made, shapes)]


def _elements(known: Known | None) -> np.ndarray:
    if known is None or known.elements is None:
        raise NotSymbolic("an operand's elements are not known to the trace")
    return np.asarray(known.elements, dtype=object)


def _shape_value(node, inputs):
    rank = len(inputs[0].shape)
    start, end = _attribute(node, "start", 0), _attribute(node, "end", None)
    return [np.array(list(inputs[0].shape)[slice(start, end)] if rank else [], dtype=object)]


def _size_value(node, inputs):
    return [np.array(product(inputs[0].shape), dtype=object)]


def _gather_value(node, inputs):
    data = _elements(inputs[0])
    indices = np.asarray(_elements(inputs[1]))
    if any(index.__class__ is Dim for index in indices.reshape(-1)):
        raise NotSymbolic("Gather at indices that depend on the sizes")
    return [np.take(data, indices.astype(np.int64), axis=_attribute(node, "axis", 0))]


def _same_elements(node, inputs):
    return [_elements(inputs[0])]  # reshaped to the rule's shape by output_values


def _concat_value(node, inputs):
    parts = [_elements(known) for known in inputs if known is not None]
    return [np.concatenate(parts, axis=_attribute(node, "axis"))]


def _slice_value(node, inputs):
    data = _elements(inputs[0])
    starts = _constant_ints(inputs[1], "Slice's starts")
    ends = _constant_ints(inputs[2], "Slice's ends")
    axes = _axes_input(inputs, 3) or list(range(len(starts)))
    steps = _constant_ints(inputs[4], "Slice's steps") \
        if len(inputs) > 4 and inputs[4] is not None else [1] * len(starts)
    index = [slice(None)] * data.ndim
    for start, end, axis, step in zip(starts, ends, axes, steps):
        index[_axis(axis, data.ndim)] = slice(start, end, step)
    return [data[tuple(index)]]


def _binary(function):
    def rule(node, inputs):
        return [np.frompyfunc(function, 2, 1)(_elements(inputs[0]), _elements(inputs[1]))]
    return rule


def _divided(a, b):
    """ONNX's integer Div (truncating), where both are non-negative (a guard each)."""
    a, b = number(a), number(b)
    if not a >= 0 or not b > 0:
        raise NotSymbolic("a Div of shape arithmetic over negative numbers")
    return a // b


def _where_value(node, inputs):
    condition = _elements(inputs[0])
    if any(flag.__class__ is Dim for flag in condition.reshape(-1)):
        raise NotSymbolic("Where over a condition of dims")
    return [np.where(condition.astype(bool), _elements(inputs[1]), _elements(inputs[2]))]


def _cast_value(node, inputs):
    to = _attribute(node, "to")
    elements = _elements(inputs[0])
    if to == 9:  # bool: a dim's truth would be a guard the rules do not take
        raise NotSymbolic("Cast of dims to bool")
    return [elements]


_VALUE_RULES = {
    "Shape": _shape_value, "Size": _size_value, "Gather": _gather_value,
    "Unsqueeze": _same_elements, "Squeeze": _same_elements, "Reshape": _same_elements,
    "Flatten": _same_elements, "Identity": _same_elements, "Cast": _cast_value,
    "Concat": _concat_value, "Slice": _slice_value, "Where": _where_value,
    "Add": _binary(lambda a, b: number(a) + number(b)),
    "Sub": _binary(lambda a, b: number(a) - number(b)),
    "Mul": _binary(lambda a, b: number(a) * number(b)),
    "Div": _binary(_divided),
    "Equal": _binary(lambda a, b: number(a) == number(b)),
    "Less": _binary(lambda a, b: number(a) < number(b)),
    "Greater": _binary(lambda a, b: number(a) > number(b)),
    "LessOrEqual": _binary(lambda a, b: number(a) <= number(b)),
    "GreaterOrEqual": _binary(lambda a, b: number(a) >= number(b)),
    "Max": _binary(lambda a, b: _maximum(number(a), number(b))),
    "Min": _binary(lambda a, b: _minimum(number(a), number(b))),
}
