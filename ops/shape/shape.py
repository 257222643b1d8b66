"""Shape operators: ops that create, reshape, join or split tensors without arithmetic.

Shape-like operands (``shape``, ``axes``, ``pads``, ``repeats``...) are small int64 tensors that
decide output shapes, which live on the host; on the GPU reading them is an explicit device-to-host
copy (:func:`host_ints`). Layout permutations (DepthToSpace, Trilu, OneHot...) and Pad live in
:mod:`mixrt.ops.shape.layout`, imported at the bottom so its kernels register with ours.
"""

from __future__ import annotations

import math

import numpy as np

from mixrt.ops.ir.dtypes import FLOATS, SIGNED_INTS, to_numpy_dtype
from mixrt.ops.ir.registry import RESHAPE, SLICES, VIEW, op
from mixrt.ops.ir.types import TensorType, broadcast_shapes, conflicting, normalize_axis, \
    shape_text


# -- helpers shared with index.py and layout.py -------------------------------------------

def host_ints(t) -> list[int]:
    """A small integer tensor (shape, axes, pads) as Python ints."""
    return [int(v) for v in t.reshape(-1).tolist()]


def host_scalar(t):
    """A 0-d or one-element tensor as a Python scalar."""
    return t.reshape(-1)[0].item() if hasattr(t, "reshape") else t


def to_xp(xp, array):
    """Attribute tensors arrive as NumPy; strings stay object arrays on the host."""
    array = np.asarray(array)
    return array if array.dtype == object else xp.asarray(array)


def zero_of(dtype):
    """The fill value for 'zero' padding: the empty string for string tensors."""
    return "" if dtype == object else dtype.type(0)


def const_ints(t: TensorType | None) -> list[int] | None:
    """The values of an input known at plan time (an initializer or folded constant)."""
    if t is None or t.value is None:
        return None
    return [int(v) for v in np.asarray(t.value).reshape(-1)]


def const_length(t: TensorType | None) -> int | None:
    """The length of a 1-D shape-like input, when known even if its values are not."""
    if t is None or t.shape is None or len(t.shape) != 1 or not isinstance(t.shape[0], int):
        return None
    return t.shape[0]


def typed(dtype, shape, value=None) -> TensorType:
    """A TensorType whose shape is a tuple (the rules here build shapes as lists)."""
    return TensorType(None if dtype is None else np.dtype(dtype),
                      None if shape is None else tuple(shape), value)


def unknown_dims(n: int | None):
    return None if n is None else (None,) * n


def _product(dims):
    return math.prod(dims) if all(isinstance(d, int) for d in dims) else None


# -- Constant, Identity -----------------------------------------------------------------

def _constant_value(value, sparse_value, value_float, value_floats, value_int, value_ints,
                    value_string, value_strings) -> np.ndarray:
    """The one value attribute a Constant node carries, as a NumPy array."""
    given = [(v, make) for v, make in (
        (value, np.asarray), (sparse_value, np.asarray),
        (value_float, lambda v: np.asarray(v, np.float32)),
        (value_floats, lambda v: np.asarray(v, np.float32).reshape(-1)),
        (value_int, lambda v: np.asarray(v, np.int64)),
        (value_ints, lambda v: np.asarray(v, np.int64).reshape(-1)),
        (value_string, lambda v: np.asarray(v, object)),
        (value_strings, lambda v: np.asarray(v, object).reshape(-1)),
    ) if v is not None]
    if len(given) != 1:
        raise ValueError(f"Constant needs exactly one value attribute, got {len(given)}")
    value, make = given[0]
    return make(value)


@op("Constant", since=12)
@op("Constant", since=11)
@op("Constant", since=1)
def constant(xp, *, value=None, sparse_value=None, value_float=None, value_floats=None,
             value_int=None, value_ints=None, value_string=None, value_strings=None):
    return to_xp(xp, _constant_value(value, sparse_value, value_float, value_floats,
                                     value_int, value_ints, value_string, value_strings))


@constant.infer
def _(**attrs):
    names = ("value", "sparse_value", "value_float", "value_floats", "value_int",
             "value_ints", "value_string", "value_strings")
    value = _constant_value(*(attrs.get(n) for n in names))
    return [typed(value.dtype, value.shape, value)]


@op("Identity", since=1, memory=VIEW)
def identity(xp, input):
    # Tensors, sequences and optionals alike pass through untouched.
    return input


@identity.infer
def _(input, **_):
    return [input]


# -- Reshape, Flatten, Squeeze, Unsqueeze ------------------------------------------------

def _reshape_target(in_shape, target, allowzero) -> list:
    """Resolve 0 (copy the input dim unless allowzero) and -1 (infer) in a Reshape target.
    Dims of ``in_shape`` may be unknown (None); so may the result's. ValueError where the
    known sizes already show the kernel would fail."""
    if not allowzero and any(d == 0 and i >= len(in_shape) for i, d in enumerate(target)):
        raise ValueError(f"Reshape target {list(target)}: a 0 copies an input dimension, "
                         f"and the input has only {len(in_shape)}")
    out = [in_shape[i] if d == 0 and not allowzero else d for i, d in enumerate(target)]
    if -1 in out:
        out[out.index(-1)] = _inferred_dim(in_shape, [d for d in out if d != -1])
    size, result = _product(in_shape), _product(out)
    if size is not None and result is not None and size != result:
        raise ValueError(f"Reshape target {list(target)}: {size} elements "
                         f"({tuple(in_shape)}) do not fit {tuple(out)}")
    return out


def _inferred_dim(in_dims, out_dims):
    """The dim Reshape's -1 stands for; a symbolic dim on both sides cancels out."""
    rest_in, rest_out = list(in_dims), []
    for d in out_dims:
        if isinstance(d, str) and d in rest_in:
            rest_in.remove(d)
        else:
            rest_out.append(d)
    size_in, size_out = _product(rest_in), _product(rest_out)
    if size_in is None or not size_out:
        return None
    if size_in % size_out:
        raise ValueError(f"-1 cannot be inferred: {size_in} elements do not divide by "
                         f"{size_out}")
    return size_in // size_out


def _reshape(X, target, allowzero):
    # Only the zeros need resolving here; the array library infers the -1 itself. It would
    # also take -3 as -1 (NumPy treats any negative so): ONNX allows -1 alone, once.
    target = list(target)
    if any(d < -1 for d in target) or target.count(-1) > 1:
        raise ValueError(f"Reshape target {target}: only one -1 and no other negative value "
                         f"is allowed (MXNet's -2/-3/-4 codes are not ONNX's)")
    return X.reshape(tuple(X.shape[i] if d == 0 and not allowzero else d
                           for i, d in enumerate(target)))


@op("Reshape", since=1, memory=RESHAPE)
def reshape_1(xp, data, *, shape=None, consumed_inputs=None):
    return _reshape(data, shape, 0)


@op("Reshape", since=14, memory=RESHAPE)
@op("Reshape", since=5, memory=RESHAPE)
def reshape(xp, data, shape, *, allowzero=0):
    return _reshape(data, host_ints(shape), allowzero)


def _infer_reshape(data, target, allowzero, length=None):
    if target is None:
        return [typed(data.dtype, unknown_dims(length))]
    in_shape = data.shape if data.shape is not None else (None,) * len(target)
    if data.shape is None and any(d in (0, -1) for d in target):
        return [typed(data.dtype, [None if d in (0, -1) else d for d in target])]
    return [typed(data.dtype, _reshape_target(in_shape, target, allowzero))]


@reshape_1.infer
def _(data, *, shape=None, **_):
    return _infer_reshape(data, shape, 0)


@reshape.infer
def _(data, shape, *, allowzero=0, **_):
    return _infer_reshape(data, const_ints(shape), allowzero, const_length(shape))


def _flatten_axis(axis: int, rank: int) -> int:
    """Flatten's axis may also be ``rank`` (everything in the first dimension)."""
    return rank if axis == rank else normalize_axis(axis, rank)


@op("Flatten", since=1, memory=RESHAPE)
def flatten(xp, input, *, axis=1):
    axis = _flatten_axis(axis, input.ndim)
    return input.reshape(math.prod(input.shape[:axis]), math.prod(input.shape[axis:]))


@flatten.infer
def _(input, *, axis=1, **_):
    if input.shape is None:
        return [typed(input.dtype, (None, None))]
    axis = _flatten_axis(axis, len(input.shape))
    return [typed(input.dtype, (_product(input.shape[:axis]), _product(input.shape[axis:])))]


def _squeeze(X, axes):
    if axes is None:
        return X.reshape(tuple(d for d in X.shape if d != 1))
    axes = {normalize_axis(a, X.ndim) for a in axes}
    _require_unit_axes(X.shape, axes)
    return X.reshape(tuple(d for i, d in enumerate(X.shape) if i not in axes))


def _require_unit_axes(shape, axes):
    """Squeeze may drop only axes of length 1; say which axis is not, rather than let a
    reshape fail with an element count the user never wrote."""
    for a in sorted(axes):
        if isinstance(shape[a], int) and shape[a] != 1:
            raise ValueError(f"Squeeze axis {a} has length {shape[a]} in shape "
                             f"{list(shape)}; only axes of length 1 can be squeezed")


def _unsqueeze(X, axes):
    rank = X.ndim + len(axes)
    axes = sorted(normalize_axis(a, rank) for a in axes)
    shape = list(X.shape)
    for a in axes:
        shape.insert(a, 1)
    return X.reshape(tuple(shape))


@op("Squeeze", since=1, memory=RESHAPE)
def squeeze_1(xp, data, *, axes=None):
    return _squeeze(data, axes)


@op("Squeeze", since=13, memory=RESHAPE)
def squeeze(xp, data, axes=None):
    return _squeeze(data, None if axes is None else host_ints(axes))


@op("Unsqueeze", since=1, memory=RESHAPE)
def unsqueeze_1(xp, data, *, axes=None):
    if axes is None:
        raise ValueError("Unsqueeze-1 requires the 'axes' attribute")
    return _unsqueeze(data, axes)


@op("Unsqueeze", since=13, memory=RESHAPE)
def unsqueeze(xp, data, axes):
    return _unsqueeze(data, host_ints(axes))


def _infer_squeeze(data, axes):
    if data.shape is None:
        return [typed(data.dtype, None)]
    if axes is None:
        if any(not isinstance(d, int) for d in data.shape):
            return [typed(data.dtype, None)]
        return [typed(data.dtype, [d for d in data.shape if d != 1])]
    axes = {normalize_axis(a, len(data.shape)) for a in axes}
    _require_unit_axes(data.shape, axes)
    return [typed(data.dtype, [d for i, d in enumerate(data.shape) if i not in axes])]


def _infer_unsqueeze(data, axes, count=None):
    if data.shape is None or axes is None:
        rank = None if data.shape is None or count is None else len(data.shape) + count
        return [typed(data.dtype, unknown_dims(rank))]
    rank = len(data.shape) + len(axes)
    shape = list(data.shape)
    for a in sorted(normalize_axis(a, rank) for a in axes):
        shape.insert(a, 1)
    return [typed(data.dtype, shape)]


@squeeze_1.infer
def _(data, *, axes=None, **_):
    return _infer_squeeze(data, axes)


@squeeze.infer
def _(data, axes=None, **_):
    if axes is not None and axes.value is None:
        return [typed(data.dtype, None)]
    return _infer_squeeze(data, const_ints(axes))


@unsqueeze_1.infer
def _(data, *, axes=None, **_):
    return _infer_unsqueeze(data, axes)


@unsqueeze.infer
def _(data, axes, **_):
    return _infer_unsqueeze(data, const_ints(axes), const_length(axes))


# -- Transpose, Concat, Split, Expand, Tile --------------------------------------------

@op("Transpose", since=1)
def transpose(xp, data, *, perm=None):
    return xp.transpose(data, perm)


@transpose.infer
def _(data, *, perm=None, **_):
    if data.shape is None:
        return [typed(data.dtype, None)]
    perm = perm if perm is not None else range(len(data.shape) - 1, -1, -1)
    return [typed(data.dtype, [data.shape[p] for p in perm])]


@op("Concat", since=4)
@op("Concat", since=1)
def concat(xp, *inputs, axis=None):
    if axis is None:
        axis = 1  # Concat-1 defaulted to 1; from Concat-4 on the attribute is required
    return xp.concatenate(inputs, axis=axis)


@concat.infer
def _(*inputs, axis=1, **_):
    shapes = [t.shape for t in inputs]
    if any(s is None for s in shapes):
        known = next((s for s in shapes if s is not None), None)
        return [typed(inputs[0].dtype, unknown_dims(None if known is None else len(known)))]
    axis = normalize_axis(axis, len(shapes[0]))
    _require_concatenable(shapes, axis)
    out = list(shapes[0])
    axis_dims = [s[axis] for s in shapes]
    out[axis] = sum(axis_dims) if all(isinstance(d, int) for d in axis_dims) else None
    for i in range(len(out)):
        if i != axis and not isinstance(out[i], int):
            out[i] = next((s[i] for s in shapes if isinstance(s[i], int)), out[i])
    return [typed(inputs[0].dtype, out)]


def _require_concatenable(shapes, axis: int) -> None:
    """One rank, and one size along every axis but ``axis`` (where the dims are static)."""
    first = shapes[0]
    for shape in shapes[1:]:
        if len(shape) != len(first) or any(
                conflicting(a, b) for i, (a, b) in enumerate(zip(first, shape)) if i != axis):
            raise ValueError(f"Concat along axis {axis}: shapes {shape_text(first)} and "
                             f"{shape_text(shape)} differ off that axis")


def _split_sizes(dim: int, split, count: int, num_outputs=None) -> list[int]:
    if split is not None:
        if sum(split) != dim:
            raise ValueError(f"Split sizes {split} do not add up to the axis length {dim}")
        return list(split)
    if num_outputs is not None:
        # Split-18: equal chunks of ceil(dim / n); the last one takes what is left.
        chunk = -(-dim // num_outputs)
        return [max(0, min(chunk, dim - i * chunk)) for i in range(num_outputs)]
    if dim % count:
        raise ValueError(f"cannot split an axis of length {dim} into {count} equal parts")
    return [dim // count] * count


def _split(X, axis, sizes):
    """Views of X's consecutive parts along ``axis`` (a running sum, not np.cumsum: that
    was 3 of a decoder step's 4 us a Split)."""
    leading = (slice(None),) * normalize_axis(axis, X.ndim)
    parts, begin = [], 0
    for size in sizes:
        parts.append(X[(*leading, slice(begin, begin + size))])
        begin += size
    return tuple(parts)


@op("Split", since=1, memory=SLICES)
def split_1(xp, input, split_input=None, *, axis=0, split=None, _outputs=1):
    # Split-1 took the sizes from an input or an attribute, both named 'split'.
    sizes = split if split_input is None else host_ints(split_input)
    return _split(input, axis, _split_sizes(input.shape[axis], sizes, _outputs))


@op("Split", since=2, memory=SLICES)
def split_2(xp, input, *, axis=0, split=None, _outputs=1):
    return _split(input, axis, _split_sizes(input.shape[axis], split, _outputs))


@op("Split", since=18, memory=SLICES)
@op("Split", since=13, memory=SLICES)
def split(xp, input, split=None, *, axis=0, num_outputs=None, _outputs=1):
    sizes = None if split is None else host_ints(split)
    return _split(input, axis, _split_sizes(input.shape[axis], sizes, _outputs, num_outputs))


def _infer_split(input, sizes, axis, count, num_outputs=None, sized_at_run_time=False):
    if sizes is None and num_outputs is None and count is None:
        raise ValueError("Split inference needs the split sizes or the output count")
    n = len(sizes) if sizes is not None else num_outputs or count
    if input.shape is None:
        return [typed(input.dtype, None)] * n
    axis = normalize_axis(axis, len(input.shape))
    dim = input.shape[axis]
    if sizes is None and isinstance(dim, int) and not sized_at_run_time:
        sizes = _split_sizes(dim, None, n, num_outputs)
    out = []
    for i in range(n):
        shape = list(input.shape)
        shape[axis] = None if sizes is None else sizes[i]
        out.append(typed(input.dtype, shape))
    return out


@split_1.infer
def _(input, split_input=None, *, axis=0, split=None, _outputs=None, **_):
    sizes = split if split_input is None else const_ints(split_input)
    # sizes fed at run time: the parts' lengths are unknown, not equal
    return _infer_split(input, sizes, axis, _outputs,
                        sized_at_run_time=split_input is not None and sizes is None)


@split_2.infer
def _(input, *, axis=0, split=None, _outputs=None, **_):
    return _infer_split(input, split, axis, _outputs)


@split.infer
def _(input, split=None, *, axis=0, num_outputs=None, _outputs=None, **_):
    sizes = const_ints(split)
    return _infer_split(input, sizes, axis, _outputs, num_outputs,
                        sized_at_run_time=split is not None and sizes is None)


@op("Expand", since=8)
def expand(xp, input, shape):
    target = np.broadcast_shapes(input.shape, tuple(host_ints(shape)))
    # A real copy: broadcast_to's read-only, zero-stride view must not escape as an output.
    return xp.array(xp.broadcast_to(input, target))


@expand.infer
def _(input, shape, **_):
    target = const_ints(shape)
    if target is None:
        length = const_length(shape)
        rank = None if length is None or input.shape is None else max(length, len(input.shape))
        return [typed(input.dtype, unknown_dims(rank))]
    return [typed(input.dtype, broadcast_shapes(input.shape, tuple(target)))]


@op("Tile", since=1)
def tile_1(xp, input, tiles, axis):
    reps = [1] * input.ndim
    reps[normalize_axis(int(host_scalar(axis)), input.ndim)] = int(host_scalar(tiles))
    return xp.tile(input, reps)


@op("Tile", since=6)
def tile(xp, input, repeats):
    return xp.tile(input, host_ints(repeats))


@tile_1.infer
def _(input, tiles, axis, **_):
    return [typed(input.dtype, unknown_dims(input.rank))]


@tile.infer
def _(input, repeats, **_):
    reps = const_ints(repeats)
    if input.shape is None or reps is None:
        return [typed(input.dtype, unknown_dims(input.rank))]
    return [typed(input.dtype, [d * r if isinstance(d, int) else None
                                for d, r in zip(input.shape, reps)])]


# -- Shape, Size ----------------------------------------------------------------------

def _shape_range(rank, start, end):
    start = min(max(start + rank if start < 0 else start, 0), rank)
    end = rank if end is None else min(max(end + rank if end < 0 else end, 0), rank)
    return start, max(start, end)


@op("Shape", since=15)
@op("Shape", since=1)
def shape(xp, data, *, start=0, end=None):
    begin, stop = _shape_range(data.ndim, start, end)
    return xp.asarray(data.shape[begin:stop], dtype=np.int64)


@shape.infer
def _(data, *, start=0, end=None, **_):
    if data.shape is None:
        return [typed(np.dtype(np.int64), (None,))]
    begin, stop = _shape_range(len(data.shape), start, end)
    dims = data.shape[begin:stop]
    value = np.asarray(dims, np.int64) if all(isinstance(d, int) for d in dims) else None
    return [typed(np.dtype(np.int64), (len(dims),), value)]


@op("Size", since=1)
def size(xp, data):
    return xp.asarray(math.prod(data.shape), dtype=np.int64)


@size.infer
def _(data, **_):
    n = None if data.shape is None else _product(data.shape)
    return [typed(np.dtype(np.int64), (), None if n is None else np.asarray(n, np.int64))]


# -- ConstantOfShape, Range, EyeLike ------------------------------------------------------

def _fill_value(value):
    return np.zeros(1, np.float32) if value is None else np.asarray(value).reshape(-1)


@op("ConstantOfShape", since=9)
def constantofshape(xp, input, *, value=None):
    fill = _fill_value(value)
    out = xp.empty(tuple(host_ints(input)), dtype=fill.dtype)
    out[...] = fill[0]
    return out


@constantofshape.infer
def _(input, *, value=None, **_):
    dims = const_ints(input)
    shape = dims if dims is not None else unknown_dims(const_length(input))
    return [typed(_fill_value(value).dtype, shape)]


def _range_length(start, limit, delta) -> int:
    return max(int(math.ceil((limit - start) / delta)), 0)


@op("Range", since=27, dtypes=FLOATS | SIGNED_INTS)
@op("Range", since=11, dtypes=FLOATS | SIGNED_INTS)
def range_(xp, start, limit, delta, *, stash_type=1):
    dtype = start.dtype
    first, last, step = (host_scalar(t) for t in (start, limit, delta))
    if dtype.kind in "iu":
        n = _range_length(int(first), int(last), int(step))
        return xp.arange(n, dtype=np.int64).astype(dtype) * dtype.type(step) + dtype.type(first)
    n = _range_length(float(first), float(last), float(step))
    if stash_type == 0 and dtype.itemsize < 4:
        # Without a stash type the elements are successive additions in the narrow type.
        steps = xp.full(n, step, dtype=dtype)
        steps[:1] = first
        return xp.cumsum(steps, dtype=dtype)
    # float32 for the narrow types (the default stash type), float64 for float64.
    wide = np.float64 if dtype == np.float64 else np.float32
    values = xp.arange(n, dtype=wide) * wide(float(step)) + wide(float(first))
    return values.astype(dtype)


@range_.infer
def _(start, limit, delta, **_):
    values = [t.value for t in (start, limit, delta)]
    if any(v is None for v in values):
        return [typed(start.dtype, (None,))]
    first, last, step = (np.asarray(v).reshape(-1)[0].item() for v in values)
    return [typed(start.dtype, (_range_length(first, last, step),))]


def _eye_dtype(dtype, input_dtype):
    return input_dtype if dtype is None else to_numpy_dtype(dtype)


@op("EyeLike", since=9)
def eyelike(xp, input, *, dtype=None, k=0):
    rows, cols = input.shape
    return xp.eye(rows, cols, k=k, dtype=_eye_dtype(dtype, input.dtype))


@eyelike.infer
def _(input, *, dtype=None, k=0, **_):
    return [typed(_eye_dtype(dtype, input.dtype), input.shape)]


# -- inputs read on the host only (OpHandle.reads_on_host) ------------------------------------

reshape.reads_on_host(1)
squeeze.reads_on_host(1)
unsqueeze.reads_on_host(1)
split_1.reads_on_host(1)
split.reads_on_host(1)
expand.reads_on_host(1)
tile_1.reads_on_host(1, 2)
tile.reads_on_host(1)
constantofshape.reads_on_host(0)
range_.reads_on_host(0, 1, 2)
