"""Sequence and optional operators.

An ONNX sequence is a Python list of arrays and an empty optional is ``None``; a non-empty
optional is just its value. Kernels never mutate the list they receive: sequences are values,
and the same list may be bound to several names.
"""

from __future__ import annotations

import numpy as np

from mixrt.ops.ir.dtypes import to_numpy_dtype
from mixrt.ops.ir.registry import op
from mixrt.ops.ir.types import (UNKNOWN, OptionalType, SequenceType, TensorType, merge_types,
                             normalize_axis, tensor, without_value)


def _position(xp, position, length: int, *, inserting: bool = False) -> int:
    """A possibly negative index into a sequence; inserting may also address the end."""
    index = int(xp.asarray(position).reshape(-1)[0])
    limit = length + 1 if inserting else length
    if index < 0:
        index += length
    if not 0 <= index < limit:
        raise IndexError(f"sequence position {index} is out of range for a sequence of "
                         f"length {length}")
    return index


def _element_type(seq_type):
    if isinstance(seq_type, SequenceType) and seq_type.element is not None:
        return seq_type.element
    return UNKNOWN


def _same_sequence(seq_type, *_, **__):
    return [seq_type if isinstance(seq_type, SequenceType) else SequenceType(None)]


@op("SequenceConstruct", since=11)
def sequence_construct(xp, *inputs):
    return (list(inputs),)


@sequence_construct.infer
def _(*inputs, **_):
    element = without_value(inputs[0])
    for other in inputs[1:]:
        element = merge_types(element, without_value(other))
    return [SequenceType(element)]


@op("SequenceEmpty", since=11)
def sequence_empty(xp, *, dtype=None):
    return ([],)


@sequence_empty.infer
def _(*, dtype=None, **_):
    return [SequenceType(tensor(np.float32 if dtype is None else to_numpy_dtype(dtype)))]


@op("SequenceAt", since=11)
def sequence_at(xp, input_sequence, position):
    return input_sequence[_position(xp, position, len(input_sequence))]


@sequence_at.infer
def _(input_sequence, position, **_):
    return [_element_type(input_sequence)]


@op("SequenceInsert", since=11)
def sequence_insert(xp, input_sequence, tensor_, position=None):
    index = (len(input_sequence) if position is None
             else _position(xp, position, len(input_sequence), inserting=True))
    return (input_sequence[:index] + [tensor_] + input_sequence[index:],)


@sequence_insert.infer
def _(input_sequence, tensor_, position=None, **_):
    """The elements after the insert: the old ones' type merged with the new one's."""
    if not isinstance(input_sequence, SequenceType) or input_sequence.element is None:
        return [SequenceType(None)]
    return [SequenceType(merge_types(without_value(input_sequence.element),
                                     without_value(tensor_)))]


@op("SequenceErase", since=11)
def sequence_erase(xp, input_sequence, position=None):
    index = (len(input_sequence) - 1 if position is None
             else _position(xp, position, len(input_sequence)))
    if index < 0:
        raise IndexError("SequenceErase on an empty sequence")
    return (input_sequence[:index] + input_sequence[index + 1:],)


sequence_erase.infer(_same_sequence)


@op("SequenceLength", since=11)
def sequence_length(xp, input_sequence):
    return xp.asarray(len(input_sequence), dtype=np.int64)


@sequence_length.infer
def _(input_sequence, **_):
    return [tensor(np.int64, ())]


@op("SplitToSequence", since=11)
def split_to_sequence(xp, input, split=None, *, axis=0, keepdims=1):
    axis = normalize_axis(axis, input.ndim)
    length = input.shape[axis]
    if split is None:
        # one piece per index; keepdims decides whether the split axis survives
        pieces = [xp.take(input, i, axis=axis) for i in range(length)]
        if keepdims:
            pieces = [xp.expand_dims(p, axis) for p in pieces]
        return (pieces,)
    sizes = [int(s) for s in xp.asarray(split).reshape(-1).tolist()]
    if xp.asarray(split).ndim == 0:  # a scalar is a chunk size; the last chunk may be short
        sizes = [sizes[0]] * (length // sizes[0]) + ([length % sizes[0]] if length % sizes[0]
                                                      else [])
    if sum(sizes) != length:
        raise ValueError(f"SplitToSequence: split sizes {sizes} do not sum to the axis "
                         f"length {length}")
    bounds = np.cumsum(sizes)[:-1].tolist()
    return (xp.split(input, bounds, axis=axis),)


@split_to_sequence.infer
def _(input, split=None, **_):
    return [SequenceType(TensorType(input.dtype, None))]


@op("ConcatFromSequence", since=11)
def concat_from_sequence(xp, input_sequence, *, axis=None, new_axis=0):
    if axis is None:
        raise ValueError("ConcatFromSequence needs the axis attribute")
    if not input_sequence:
        raise ValueError("ConcatFromSequence of an empty sequence has no defined output")
    rank = input_sequence[0].ndim
    if new_axis:
        return xp.stack(input_sequence, axis=normalize_axis(axis, rank + 1))
    return xp.concatenate(input_sequence, axis=normalize_axis(axis, rank))


@concat_from_sequence.infer
def _(input_sequence, **_):
    return [TensorType(_element_type(input_sequence).dtype, None)]


# -- optionals --------------------------------------------------------------------------

@op("Optional", since=15)
def optional(xp, input=None, *, type=None):
    if input is None and type is None:
        raise ValueError("Optional without an input needs the type attribute")
    return (input,)


@optional.infer
def _(input=None, *, type=None, **_):
    return [OptionalType(input)]


@op("OptionalHasElement", since=15)
def optional_has_element(xp, input=None):
    return xp.asarray(input is not None)


@optional_has_element.infer
def _(input=None, **_):
    return [tensor(np.bool_, ())]


@op("OptionalGetElement", since=15)
def optional_get_element(xp, input):
    if input is None:
        raise ValueError("OptionalGetElement on an empty optional")
    return (input,)


@optional_get_element.infer
def _(input, **_):
    return [input.element if isinstance(input, OptionalType) and input.element else
            input if isinstance(input, (TensorType, SequenceType)) else UNKNOWN]
