"""The named methods NDArray and Symbol share (``x.reshape``, ``x.sum``, ``x.relu``, ...),
and the matching functions, so one ``hybrid_forward`` reads the same with ``F = nd`` and
``F = sym``. Each is one or two registered ops; a subclass says how to call an op
(``_op``) and how to make an int64 tensor of axes or a shape (``_int_tensor``)."""

from __future__ import annotations

import numpy as np
from mixrt.ops.ir.dtypes import to_onnx_type


class ArrayMethods:
    __slots__ = ()

    def _op(self, op_type: str, inputs: list, attributes: dict):
        raise NotImplementedError

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

    def _axes(self, axis):
        return None if axis is None else self._int_tensor(np.atleast_1d(axis))

    # -- shape -------------------------------------------------------------------------

    def reshape(self, *shape, reverse: bool = False, **kwargs):
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
        return self._reshaped([int(d) for d in shape], bool(reverse))

    def _reshaped(self, codes: list[int], reverse: bool):
        """Sizes, 0 and one -1 are ONNX's Reshape; other codes ``_mxnet_reshape``'s."""
        if reverse or any(d < -1 for d in codes) or codes.count(-1) > 1:
            return self._mxnet_reshape(codes, reverse)
        return self._op("Reshape", [self, self._int_tensor(codes)], {})

    def _mxnet_reshape(self, codes: list[int], reverse: bool):
        raise NotImplementedError

    def transpose(self, *axes, **kwargs):
        """The axes in the order given (``x.transpose(1, 0)``, ``x.transpose((1, 0))`` or
        MXNet's ``axes=``); none given: reversed."""
        if "axes" in kwargs:
            axes = (kwargs.pop("axes"),) if not axes else axes
        if kwargs:
            raise TypeError(f"transpose: unknown arguments {sorted(kwargs)}")
        axes = axes[0] if len(axes) == 1 and isinstance(axes[0], (tuple, list)) else axes
        axes = () if axes == (None,) else axes
        return self._op("Transpose", [self], {"perm": list(axes)} if axes else {})

    @property
    def T(self):
        return self.transpose()

    def flatten(self):
        return self._op("Flatten", [self], {"axis": 1})

    def expand_dims(self, axis: int):
        return self._op("Unsqueeze", [self, self._int_tensor([axis])], {})

    def squeeze(self, axis=None):
        return self._op("Squeeze", [self, self._axes(axis)], {})

    # -- reductions ----------------------------------------------------------------------

    def _reduce(self, op_type: str, axis, keepdims: bool):
        return self._op(op_type, [self, self._axes(axis)], {"keepdims": int(keepdims)})

    def sum(self, axis=None, keepdims=False): return self._reduce("ReduceSum", axis, keepdims)
    def mean(self, axis=None, keepdims=False): return self._reduce("ReduceMean", axis, keepdims)
    def max(self, axis=None, keepdims=False): return self._reduce("ReduceMax", axis, keepdims)
    def min(self, axis=None, keepdims=False): return self._reduce("ReduceMin", axis, keepdims)
    def prod(self, axis=None, keepdims=False): return self._reduce("ReduceProd", axis, keepdims)

    def norm(self):
        return self._op("ReduceL2", [self], {"keepdims": 0})

    def argmax(self, axis: int = 0, keepdims: bool = False):
        return self._op("ArgMax", [self], {"axis": axis, "keepdims": int(keepdims)})

    def argmin(self, axis: int = 0, keepdims: bool = False):
        return self._op("ArgMin", [self], {"axis": axis, "keepdims": int(keepdims)})

    # -- elementwise ---------------------------------------------------------------------

    def exp(self): return self._op("Exp", [self], {})
    def log(self): return self._op("Log", [self], {})
    def sqrt(self): return self._op("Sqrt", [self], {})
    def abs(self): return self._op("Abs", [self], {})
    def relu(self): return self._op("Relu", [self], {})
    def sigmoid(self): return self._op("Sigmoid", [self], {})
    def tanh(self): return self._op("Tanh", [self], {})
    def square(self): return self._op("Mul", [self, self], {})
    def softmax(self, axis=-1): return self._op("Softmax", [self], {"axis": axis})
    def log_softmax(self, axis=-1): return self._op("LogSoftmax", [self], {"axis": axis})

    def clip(self, a_min, a_max):
        return self._op("Clip", [self, a_min, a_max], {})

    def astype(self, dtype, copy: bool = True):
        return self._op("Cast", [self], {"to": to_onnx_type(np.dtype(dtype))})

    def dot(self, other):
        return self._op("MatMul", [self, other], {})


# -- the same as functions (``F.relu(x)``) -------------------------------------------------------

def relu(x): return x.relu()
def sigmoid(x): return x.sigmoid()
def tanh(x): return x.tanh()
def exp(x): return x.exp()
def log(x): return x.log()
def sqrt(x): return x.sqrt()
def square(x): return x.square()
def softmax(x, axis=-1): return x.softmax(axis)
def log_softmax(x, axis=-1): return x.log_softmax(axis)
def sum(x, axis=None, keepdims=False): return x.sum(axis, keepdims)  # noqa: A001
def mean(x, axis=None, keepdims=False): return x.mean(axis, keepdims)
def max(x, axis=None, keepdims=False): return x.max(axis, keepdims)  # noqa: A001
def min(x, axis=None, keepdims=False): return x.min(axis, keepdims)  # noqa: A001
def reshape(x, shape, reverse=False): return x.reshape(shape, reverse=reverse)
def transpose(x, axes=None): return x.transpose(*(axes or ()))
def flatten(x): return x.flatten()
def expand_dims(x, axis): return x.expand_dims(axis)
def squeeze(x, axis=None): return x.squeeze(axis)
def clip(x, a_min, a_max): return x.clip(a_min, a_max)


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
             "log_softmax", "sum", "mean", "max", "min", "reshape", "transpose", "flatten",
             "expand_dims", "squeeze", "clip", "dot", "maximum", "minimum", "where", "concat",
             "stack"]
