"""The named methods NDArray and Symbol share (``x.reshape``, ``x.sum``, ``x.relu``, ...),
and the matching functions, so one ``hybrid_forward`` reads the same with ``F = nd`` and
``F = sym``. Each is one or two registered ops; a subclass says how to call an op
(``_op``) and how to make an int64 tensor of axes or a shape (``_int_tensor``)."""

from __future__ import annotations

import numpy as np
from mixrt.ops.ir.dtypes import to_onnx_type


def beyond_onnx_reshape(codes: list[int], reverse: bool) -> bool:
    """Whether MXNet's reshape ``codes`` need more than ONNX's Reshape, which takes sizes, 0
    and one -1: a -2, -3 or -4, a second -1, or matching from the right (``reverse``);
    ``_reshaped`` and a Symbol's ``_named_reshape`` send those to ``_mxnet_reshape``."""
    return reverse or any(d < -1 for d in codes) or codes.count(-1) > 1


class ArrayMethods:
    __slots__ = ()

    def _op(self, op_type: str, inputs: list, attributes: dict):
        raise NotImplementedError

    def _named_op(self, kind: str, op_type: str, inputs: list, attributes: dict, name=None):
        """``_op`` for MXNet's function ``kind`` as a method, which takes ``name=``: a
        Symbol names its node so (``x.abs(name="abs0")``), or as MXNet names a ``kind``
        node (``abs0``); an array has no name to give and ignores it."""
        return self._op(op_type, inputs, attributes)

    def _int_tensor(self, values):
        raise NotImplementedError

    def _binary(self, op_type: str, other, reverse: bool = False):
        raise NotImplementedError

    # -- operators: each one registered op (a number becomes a constant of the array's type)

    def __add__(self, other): return self._binary("Add", other)
    def __radd__(self, other): return self._binary("Add", other, reverse=True)
    def __sub__(self, other): return self._binary("Sub", other)
    def __rsub__(self, other): return self._binary("Sub", other, reverse=True)
    def __mul__(self, other): return self._binary("Mul", other)
    def __rmul__(self, other): return self._binary("Mul", other, reverse=True)
    def __truediv__(self, other): return self._binary("Div", other)
    def __rtruediv__(self, other): return self._binary("Div", other, reverse=True)
    def __pow__(self, other): return self._binary("Pow", other)
    def __rpow__(self, other): return self._binary("Pow", other, reverse=True)
    def __matmul__(self, other): return self._binary("MatMul", other)
    def __rmatmul__(self, other): return self._binary("MatMul", other, reverse=True)
    def __gt__(self, other): return self._binary("Greater", other)
    def __lt__(self, other): return self._binary("Less", other)
    def __ge__(self, other): return self._binary("GreaterOrEqual", other)
    def __le__(self, other): return self._binary("LessOrEqual", other)
    def __abs__(self): return self.abs()

    def _axes(self, axis):
        return None if axis is None else self._int_tensor(np.atleast_1d(axis))

    # -- shape -------------------------------------------------------------------------

    def reshape(self, *shape, reverse: bool = False, name=None, **kwargs):
        """MXNet's reshape: ``x.reshape((2, -1))``, ``x.reshape(2, 3)`` or ``shape=``, with
        its codes: ``0`` copies a dimension, ``-1`` infers one, ``-2`` copies all the rest,
        ``-3`` merges two, ``-4, a, b`` splits one in two (either may be -1), and
        ``reverse=True`` matches them from the right. Sizes, 0 and one -1 are ONNX's Reshape;
        a subclass resolves the others (``_reshaped``, ``_mxnet_reshape``)."""
        if "shape" in kwargs:
            if shape:
                raise TypeError("reshape: the shape given both positionally and as shape=")
            shape = (kwargs.pop("shape"),)
        if kwargs:
            raise TypeError(f"reshape: unknown arguments {sorted(kwargs)}")
        shape = shape[0] if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else shape
        return self._named_reshape([int(d) for d in shape], bool(reverse), name)

    def _named_reshape(self, codes: list[int], reverse: bool, name=None):
        """``_reshaped`` for MXNet's ``name=``, which only a Symbol has a use for."""
        return self._reshaped(codes, reverse)

    def _reshaped(self, codes: list[int], reverse: bool):
        """Sizes, 0 and one -1 are ONNX's Reshape; other codes ``_mxnet_reshape``'s."""
        if beyond_onnx_reshape(codes, reverse):
            return self._mxnet_reshape(codes, reverse)
        return self._op("Reshape", [self, self._int_tensor(codes)], {})

    def _mxnet_reshape(self, codes: list[int], reverse: bool):
        raise NotImplementedError

    def transpose(self, *axes, name=None, **kwargs):
        """The axes in the order given (``x.transpose(1, 0)``, ``x.transpose((1, 0))`` or
        MXNet's ``axes=``); none given: reversed."""
        if "axes" in kwargs:
            axes = (kwargs.pop("axes"),) if not axes else axes
        if kwargs:
            raise TypeError(f"transpose: unknown arguments {sorted(kwargs)}")
        axes = axes[0] if len(axes) == 1 and isinstance(axes[0], (tuple, list)) else axes
        axes = () if axes == (None,) else axes
        return self._named_op("transpose", "Transpose", [self],
                              {"perm": list(axes)} if axes else {}, name)

    @property
    def T(self):
        return self.transpose()

    def flatten(self, name=None):
        return self._named_op("flatten", "Flatten", [self], {"axis": 1}, name)

    def expand_dims(self, axis: int, name=None):
        return self._named_op("expand_dims", "Unsqueeze", [self, self._int_tensor([axis])],
                              {}, name)

    def squeeze(self, axis=None, name=None):
        return self._named_op("squeeze", "Squeeze", [self, self._axes(axis)], {}, name)

    # -- reductions ----------------------------------------------------------------------

    def _reduce(self, kind: str, op_type: str, axis, keepdims: bool, name=None):
        return self._named_op(kind, op_type, [self, self._axes(axis)],
                              {"keepdims": int(keepdims)}, name)

    def sum(self, axis=None, keepdims=False, name=None):
        return self._reduce("sum", "ReduceSum", axis, keepdims, name)

    def mean(self, axis=None, keepdims=False, name=None):
        return self._reduce("mean", "ReduceMean", axis, keepdims, name)

    def max(self, axis=None, keepdims=False, name=None):
        return self._reduce("max", "ReduceMax", axis, keepdims, name)

    def min(self, axis=None, keepdims=False, name=None):
        return self._reduce("min", "ReduceMin", axis, keepdims, name)

    def prod(self, axis=None, keepdims=False, name=None):
        return self._reduce("prod", "ReduceProd", axis, keepdims, name)

    def norm(self, name=None):
        return self._named_op("norm", "ReduceL2", [self], {"keepdims": 0}, name)

    def argmax(self, axis: int = 0, keepdims: bool = False, name=None):
        return self._named_op("argmax", "ArgMax", [self],
                              {"axis": axis, "keepdims": int(keepdims)}, name)

    def argmin(self, axis: int = 0, keepdims: bool = False, name=None):
        return self._named_op("argmin", "ArgMin", [self],
                              {"axis": axis, "keepdims": int(keepdims)}, name)

    # -- elementwise ---------------------------------------------------------------------

    def exp(self, name=None): return self._named_op("exp", "Exp", [self], {}, name)
    def log(self, name=None): return self._named_op("log", "Log", [self], {}, name)
    def sqrt(self, name=None): return self._named_op("sqrt", "Sqrt", [self], {}, name)
    def abs(self, name=None): return self._named_op("abs", "Abs", [self], {}, name)
    def relu(self, name=None): return self._named_op("relu", "Relu", [self], {}, name)
    def sigmoid(self, name=None): return self._named_op("sigmoid", "Sigmoid", [self], {}, name)
    def tanh(self, name=None): return self._named_op("tanh", "Tanh", [self], {}, name)
    def square(self, name=None): return self._named_op("square", "Mul", [self, self], {}, name)

    def softmax(self, axis=-1, name=None):
        return self._named_op("softmax", "Softmax", [self], {"axis": axis}, name)

    def log_softmax(self, axis=-1, name=None):
        return self._named_op("log_softmax", "LogSoftmax", [self], {"axis": axis}, name)

    def clip(self, a_min, a_max, name=None):
        return self._named_op("clip", "Clip", [self, a_min, a_max], {}, name)

    def astype(self, dtype, copy: bool = True, name=None):
        attributes = {"to": to_onnx_type(np.dtype(dtype))}
        if name is None:
            return self._op("Cast", [self], attributes)
        return self._named_op("cast", "Cast", [self], attributes, name)  # MXNet's sym.cast

    def dot(self, other):
        return self._op("MatMul", [self, other], {})


# -- the same as functions (``F.relu(x)``) -------------------------------------------------------

def relu(x, name=None): return x.relu(name=name)
def sigmoid(x, name=None): return x.sigmoid(name=name)
def tanh(x, name=None): return x.tanh(name=name)
def exp(x, name=None): return x.exp(name=name)
def log(x, name=None): return x.log(name=name)
def sqrt(x, name=None): return x.sqrt(name=name)
def square(x, name=None): return x.square(name=name)
def softmax(x, axis=-1, name=None): return x.softmax(axis, name=name)
def log_softmax(x, axis=-1, name=None): return x.log_softmax(axis, name=name)
def sum(x, axis=None, keepdims=False, name=None): return x.sum(axis, keepdims, name)  # noqa: A001
def mean(x, axis=None, keepdims=False, name=None): return x.mean(axis, keepdims, name)
def max(x, axis=None, keepdims=False, name=None): return x.max(axis, keepdims, name)  # noqa: A001
def min(x, axis=None, keepdims=False, name=None): return x.min(axis, keepdims, name)  # noqa: A001
def prod(x, axis=None, keepdims=False, name=None): return x.prod(axis, keepdims, name)
def reshape(x, shape, reverse=False, name=None): return x.reshape(shape, reverse=reverse, name=name)
def transpose(x, axes=None, name=None): return x.transpose(*(axes or ()), name=name)
def flatten(x, name=None): return x.flatten(name=name)
def expand_dims(x, axis, name=None): return x.expand_dims(axis, name=name)
def squeeze(x, axis=None, name=None): return x.squeeze(axis, name=name)
def clip(x, a_min, a_max, name=None): return x.clip(a_min, a_max, name=name)


def dot(a, b, transpose_a: bool = False, transpose_b: bool = False):
    return a._op("Gemm", [a, b], {"transA": int(transpose_a), "transB": int(transpose_b)})


def _array_among(*values):
    return next(v for v in values if isinstance(v, ArrayMethods))  # the others may be numbers


def maximum(a, b): return _array_among(a, b)._op("Max", [a, b], {})
def minimum(a, b): return _array_among(a, b)._op("Min", [a, b], {})


def where(condition, x, y):
    return _array_among(condition, x, y)._op("Where", [condition, x, y], {})


def concat(*arrays, dim: int = 1):
    return arrays[0]._op("Concat", list(arrays), {"axis": dim})


def stack(*arrays, axis: int = 0):
    return concat(*[a.expand_dims(axis) for a in arrays], dim=axis)


FUNCTIONS = ["relu", "sigmoid", "tanh", "exp", "log", "sqrt", "square", "softmax",
             "log_softmax", "sum", "mean", "max", "min", "prod", "reshape", "transpose", "flatten",
             "expand_dims", "squeeze", "clip", "dot", "maximum", "minimum", "where", "concat",
             "stack"]
