"""Value types seen by shape/type inference, and the inference rules most ops share.

Inference runs at plan time and never touches data. A dimension is an ``int`` when known,
a ``str`` when symbolic ("batch"), or ``None`` when unknown. A shape of ``None`` means even the
rank is unknown. ``value`` holds the data of a value known at plan time (an initializer or a
folded constant), which ops like Reshape need to know their output shape.

An infer function receives one type per input (``None`` for a missing optional input,
``UNKNOWN`` for a present optional input whose type inference does not know) and the node's
attributes as keywords, and returns a list of output types.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

Dim = int | str | None


@dataclass(frozen=True)
class TensorType:
    dtype: np.dtype | None
    shape: tuple[Dim, ...] | None = None
    value: Any = None

    @property
    def rank(self) -> int | None:
        return None if self.shape is None else len(self.shape)

    def with_shape(self, shape) -> "TensorType":
        return TensorType(self.dtype, None if shape is None else tuple(shape))

    def with_dtype(self, dtype) -> "TensorType":
        return TensorType(None if dtype is None else np.dtype(dtype), self.shape)

    def __str__(self) -> str:
        dims = "?" if self.shape is None else "x".join(
            "?" if d is None else str(d) for d in self.shape)
        name = "?" if self.dtype is None else np.dtype(self.dtype).name
        return f"{name}[{dims}]"


@dataclass(frozen=True)
class SequenceType:
    element: TensorType | MapType | None

    def __str__(self) -> str:
        return f"seq({self.element})"


@dataclass(frozen=True, repr=False)
class MapType:
    """An ``ai.onnx.ml`` map: ``key`` is int64 or object (string), ``value`` the type of its
    values (a TensorType, as ONNX declares them; ``tensor(float)`` means float scalars).

    A map value is a host Python dict, as onnxruntime's and onnx's Python APIs hand them
    over (a sequence of maps is a list of dicts): Session converts a fed dict's keys and
    values to the declared types, and no map ever enters the memory arena or a GPU."""

    key: np.dtype | None
    value: TensorType | None

    def __str__(self) -> str:
        return f"map({_scalar_name(self.key)},{_scalar_name(getattr(self.value, 'dtype', None))})"

    __repr__ = __str__  # error messages (the .mxr writer's among them) print types with !r


@dataclass(frozen=True)
class OptionalType:
    element: TensorType | SequenceType | None

    def __str__(self) -> str:
        return f"optional({self.element})"


UNKNOWN = TensorType(None, None)


def without_value(value_type):
    """The type without a plan-time value (what one loop iteration computes, the next may
    not); None becomes UNKNOWN."""
    if value_type is None:
        return UNKNOWN
    if isinstance(value_type, TensorType):
        return TensorType(value_type.dtype, value_type.shape)
    return value_type


def merge_types(a, b):
    """The type two values agree on (two If branches, two loop iterations, a sequence's old
    and inserted elements): dims that differ become unknown, and so does the rank when the
    ranks differ. Give it types without values."""
    for kind in (SequenceType, OptionalType):
        if isinstance(a, kind) and isinstance(b, kind):
            if a.element is None or b.element is None:
                return kind(None)
            return kind(merge_types(a.element, b.element))
    if not (isinstance(a, TensorType) and isinstance(b, TensorType)):
        return a if a == b else UNKNOWN  # a tensor and a sequence, or one unknown: no kind
    dtype = a.dtype if a.dtype is not None else b.dtype
    if a.shape is None or b.shape is None or len(a.shape) != len(b.shape):
        return TensorType(dtype, None)
    return TensorType(dtype, tuple(x if x == y else None for x, y in zip(a.shape, b.shape)))


def type_of_value(value):
    """The type of a run-time value (an array, a list for a sequence), as inference writes
    it; UNKNOWN for anything else."""
    if isinstance(value, list):
        return SequenceType(type_of_value(value[0]) if value else None)
    if value is None or not hasattr(value, "shape") or not hasattr(value, "dtype"):
        return UNKNOWN
    return TensorType(np.dtype(value.dtype), tuple(value.shape))


def _scalar_name(dtype) -> str:
    if dtype is None:
        return "?"
    return "string" if np.dtype(dtype) == np.dtype(object) else np.dtype(dtype).name


def tensor(dtype, shape=None) -> TensorType:
    return TensorType(None if dtype is None else np.dtype(dtype),
                      None if shape is None else tuple(shape))


def broadcast_shapes(*shapes) -> tuple | None:
    """NumPy broadcasting over shapes that may hold symbolic or unknown dims. Two static
    dims that differ and are not 1 are an error (ValueError): no run could broadcast them.
    A symbolic or unknown dim conflicts with nothing."""
    if any(s is None for s in shapes):
        return None
    rank = max((len(s) for s in shapes), default=0)
    result = []
    for axis in range(rank):
        dims = [s[len(s) - rank + axis] for s in shapes if len(s) - rank + axis >= 0]
        known = {d for d in dims if d != 1}
        if not known:
            result.append(1)
        elif len(known) == 1:
            result.append(known.pop())
        else:
            ints = {d for d in known if isinstance(d, int)}
            if len(ints) > 1:
                raise ValueError(f"shapes {', '.join(shape_text(s) for s in shapes)} do not "
                                 f"broadcast (dims {sorted(ints)} at axis {axis - rank})")
            result.append(ints.pop() if ints else None)
    return tuple(result)


def broadcasts_to(shape: tuple, target: tuple) -> bool:
    """Whether concrete ``shape`` broadcasts to concrete ``target`` without widening it:
    what ``broadcast_or_none(target, shape) == target`` answers, at a kernel's per-call
    cost (~0.3 us against ~4)."""
    if len(shape) > len(target):
        return False
    for own, wanted in zip(reversed(shape), reversed(target)):
        if own != 1 and own != wanted:
            return False
    return True


def broadcast_or_none(*shapes) -> tuple | None:
    """broadcast_shapes, with None for shapes that do not broadcast (for passes that only
    ask whether they do)."""
    try:
        return broadcast_shapes(*shapes)
    except ValueError:
        return None


def shape_text(shape) -> str:
    """(2, 'N', None) as (2, N, ?): how error messages show a shape."""
    if shape is None:
        return "(?)"
    dims = ["?" if d is None else str(d) for d in shape]
    return f"({dims[0]},)" if len(dims) == 1 else "(" + ", ".join(dims) + ")"


def conflicting(a, b) -> bool:
    """Whether two dims are static and differ (symbolic or unknown dims match anything)."""
    return isinstance(a, int) and isinstance(b, int) and a != b


def fits(shape, expected) -> bool:
    """Whether ``shape`` can be ``expected``: the same rank, and no static dim that differs
    from a static expected one (symbolic and unknown dims fit anything)."""
    return len(shape) == len(expected) and not any(map(conflicting, shape, expected))


def require_shape(what: str, value_type, expected) -> None:
    """Raise ValueError when ``value_type``'s shape is known and cannot be ``expected``
    (:func:`fits`)."""
    if not isinstance(value_type, TensorType) or value_type.shape is None:
        return
    shape, expected = tuple(value_type.shape), tuple(expected)
    if not fits(shape, expected):
        raise ValueError(f"{what} has shape {shape_text(shape)}; expected "
                         f"{shape_text(expected)}")


def normalize_axis(axis: int, rank: int) -> int:
    """``axis`` in ``[-rank, rank)`` as a non-negative index; anything else is an error (a
    silent wrap or a clamp would compute on the wrong axis)."""
    if not -rank <= axis < rank:
        raise ValueError(f"axis {axis} is out of range for rank {rank} "
                         f"(expected {-rank} <= axis < {rank})")
    return axis + rank if axis < 0 else axis


# -- rules shared by many ops -------------------------------------------------------------

def same_as_input(x: TensorType, *_, **__) -> list[TensorType]:
    """Unary ops whose output has the input's dtype and shape."""
    return [TensorType(x.dtype, x.shape)]


def _broadcast_of(inputs) -> tuple | None:
    """The broadcast shape; unknown when any input's type is (a value inference could not
    type, such as a Loop's output, may have any shape: leaving it out would claim the
    others' shape)."""
    if any(t is None for t in inputs):
        return None
    return broadcast_shapes(*(t.shape for t in inputs))


def broadcast_like_first(*inputs: TensorType, **_) -> list[TensorType]:
    """Binary/variadic ops: the first input's dtype, the broadcast shape of all."""
    present = [t for t in inputs if t is not None]
    return [TensorType(present[0].dtype, _broadcast_of(inputs))]


def broadcast_to_bool(*inputs: TensorType, **_) -> list[TensorType]:
    """Comparisons and logic ops: bool, broadcast shape."""
    return [TensorType(np.dtype(bool), _broadcast_of(inputs))]


def dtype_of_input(index: int = 0, outputs: int = 1):
    """Rank and dims unknown, dtype taken from one input: for data-dependent output shapes."""
    def infer(*inputs, **_):
        return [TensorType(inputs[index].dtype, None) for _ in range(outputs)]
    return infer


def fixed_dtype(dtype, outputs: int = 1):
    """Output dtype fixed by the op (e.g. int64 indices), shape unknown."""
    def infer(*_, **__):
        return [TensorType(np.dtype(dtype), None) for _ in range(outputs)]
    return infer


def reduced_shape(shape, axes, keepdims: bool) -> tuple | None:
    """The shape after reducing ``axes`` (all axes when ``axes`` is empty or None)."""
    if shape is None:
        return None
    rank = len(shape)
    axes = set(range(rank)) if not axes else {normalize_axis(a, rank) for a in axes}
    if keepdims:
        return tuple(1 if i in axes else d for i, d in enumerate(shape))
    return tuple(d for i, d in enumerate(shape) if i not in axes)
