"""MXNet 1.x's shape and index names on NDArrays: ``moveaxis``, ``swapaxes``/``SwapAxis``,
``crop`` (``slice``), ``Crop``, ``slice_like``, ``reshape_like``, ``concatenate``, ``pad``,
``diag``, ``depth_to_space``, ``space_to_depth``, ``split_v2``, ``shape_array``,
``size_array``, ``cast``, ``cumsum``, ``gather_nd``, ``scatter_nd``, ``unravel_index``,
``ravel_multi_index``, ``khatri_rao``, ``choose_element_0index``, ``fill_element_0index``,
``onehot_encode``.

Each is composed of registered ops through ``mxnet_args._op``, with MXNet's argument names,
defaults and checks, so autograd records it and ``mixrt.sym`` traces it too.
"""

from __future__ import annotations

import numpy as np

from mixrt.base.errors import InputError
from mixrt.nd.mxnet_args import (_array, _axis, _dtype, _index_array, _int, _ints,
                                 _made_on, _op, _tuple, AxisError)
from mixrt.nd.mxnet_indexing import one_hot, pick, slice, slice_axis
from mixrt.nd.ndarray import NDArray


def moveaxis(tensor, source, destination):
    """MXNet's ``moveaxis``: the axes ``source`` (an int or a tuple) moved to
    ``destination``, the others keeping their order."""
    fn = "moveaxis"
    tensor = _array(fn, "tensor", tensor)
    sources = [_axis(fn, a, tensor.ndim, "source") for a in _tuple(fn, "source", source)]
    targets = [_axis(fn, a, tensor.ndim, "destination")
               for a in _tuple(fn, "destination", destination)]
    if len(sources) != len(targets) or len(set(sources)) != len(sources) or \
            len(set(targets)) != len(targets):
        raise AxisError(f"{fn}: source {source} and destination {destination} must name "
                         f"as many distinct axes")
    order = [a for a in range(tensor.ndim) if a not in sources]
    for target, axis in sorted(zip(targets, sources)):
        order.insert(target, axis)
    return tensor.transpose(*order)


def swapaxes(data, dim1=0, dim2=0, name=None):
    """MXNet's ``swapaxes`` (``SwapAxis``): axes ``dim1`` and ``dim2`` exchanged."""
    fn = "swapaxes"
    data = _array(fn, "data", data)
    a, b = _axis(fn, dim1, data.ndim, "dim1"), _axis(fn, dim2, data.ndim, "dim2")
    order = list(range(data.ndim))
    order[a], order[b] = b, a
    return data.transpose(*order)


SwapAxis = swapaxes
crop = slice  # MXNet's crop is its slice


def Crop(*data, offset=(0, 0), h_w=(0, 0), center_crop=False, num_args=None, name=None):
    """MXNet's ``Crop`` of NCHW data: the ``h_w`` window (or the second input's height and
    width) at ``offset``, or centred with ``center_crop``."""
    fn = "Crop"
    if len(data) not in (1, 2):
        raise InputError(f"{fn}: takes the data and, optionally, an array to crop like")
    source = _array(fn, "data", data[0])
    if source.ndim != 4:
        raise InputError(f"{fn}: data must be 4-D (N, C, H, W), got {source.shape}")
    height, width = (_array(fn, "crop_like", data[1]).shape[2:] if len(data) == 2
                     else tuple(_int(fn, "h_w", v, 1) for v in _tuple(fn, "h_w", h_w)))
    if center_crop:
        top, left = (source.shape[2] - height) // 2, (source.shape[3] - width) // 2
    else:
        top, left = (_int(fn, "offset", v, 0) for v in _tuple(fn, "offset", offset))
    if top + height > source.shape[2] or left + width > source.shape[3]:
        raise InputError(f"{fn}: a {height}x{width} window at ({top}, {left}) does not fit "
                         f"data of shape {source.shape}")
    return slice(source, (None, None, top, left), (None, None, top + height, left + width))


def slice_like(data, shape_like, axes=(), name=None):
    """MXNet's ``slice_like``: ``data`` cut, from the start, to ``shape_like``'s size along
    ``axes`` (``()``: every axis)."""
    fn = "slice_like"
    data, like = _array(fn, "data", data), _array(fn, "shape_like", shape_like)
    chosen = _tuple(fn, "axes", axes) or tuple(range(data.ndim))
    if not _tuple(fn, "axes", axes) and like.ndim != data.ndim:
        raise InputError(f"{fn}: shape_like {like.shape} must have the data's "
                         f"{data.ndim} dimensions when axes is empty")
    ends = list(data.shape)
    for axis in chosen:
        a = _axis(fn, axis, data.ndim, "axes")
        size = like.shape[_axis(fn, axis, like.ndim, "axes")]
        if size > data.shape[a]:
            raise InputError(f"{fn}: shape_like's axis {axis} ({size}) is longer than the "
                             f"data's ({data.shape[a]})")
        ends[a] = size
    return slice(data, (0,) * data.ndim, tuple(ends))


def reshape_like(lhs, rhs, lhs_begin=None, lhs_end=None, rhs_begin=None, rhs_end=None,
                 name=None):
    """MXNet's ``reshape_like``: ``lhs`` with ``rhs``'s shape, or with its dims
    ``lhs_begin:lhs_end`` replaced by ``rhs``'s ``rhs_begin:rhs_end``."""
    fn = "reshape_like"
    lhs, rhs = _array(fn, "lhs", lhs), _array(fn, "rhs", rhs)
    lb, le = _bounds(lhs.ndim, lhs_begin, lhs_end)
    rb, re = _bounds(rhs.ndim, rhs_begin, rhs_end)
    shape = lhs.shape[:lb] + rhs.shape[rb:re] + lhs.shape[le:]
    if int(np.prod(shape)) != lhs.size:
        raise InputError(f"{fn}: {lhs.shape} cannot take the shape {shape}")
    return lhs.reshape(shape)


def _bounds(ndim: int, begin, end) -> tuple:
    begin = 0 if begin is None else (begin + ndim if begin < 0 else begin)
    end = ndim if end is None else (end + ndim if end < 0 else end)
    return begin, end


def concatenate(arrays, axis=0, always_copy=True):
    """MXNet's ``concatenate``: the arrays joined along ``axis`` (default 0, unlike
    ``concat``'s 1); one array with ``always_copy=False`` is returned as it is."""
    fn = "concatenate"
    arrays = [_array(fn, f"arrays[{i}]", a) for i, a in enumerate(arrays)]
    if not arrays:
        raise InputError(f"{fn}: arrays must hold at least one NDArray")
    if len(arrays) == 1 and not always_copy:
        return arrays[0]
    return _op("Concat", arrays, axis=_axis(fn, axis, arrays[0].ndim))


_PAD_MODES = {"constant": "constant", "edge": "edge", "reflect": "reflect"}


def pad(data, mode="constant", pad_width=(), constant_value=0.0, name=None):
    """MXNet's ``pad``: ``pad_width`` holds (before, after) for every axis in turn;
    ``mode`` constant (with ``constant_value``), edge or reflect."""
    fn = "pad"
    data = _array(fn, "data", data)
    if mode not in _PAD_MODES:
        raise InputError(f"{fn}: mode={mode!r} is not one of {list(_PAD_MODES)}")
    widths = [_int(fn, "pad_width", w, 0) for w in _tuple(fn, "pad_width", pad_width)]
    if len(widths) != 2 * data.ndim:
        raise InputError(f"{fn}: pad_width must have 2 entries per axis ({2 * data.ndim}), "
                         f"got {len(widths)}")
    pads = widths[0::2] + widths[1::2]  # ONNX: every begin, then every end
    value = _made_on(data.ctx, "asarray", constant_value, dtype=data.dtype)
    return _op("Pad", [data, _ints(pads, data.ctx), value], mode=_PAD_MODES[mode])


def diag(data, k=0, axis1=0, axis2=1, name=None):
    """MXNet's ``diag``: of a vector, the square matrix with it on diagonal ``k``; of an
    array, its diagonal ``k`` in the plane of ``axis1`` and ``axis2`` (as a last axis)."""
    fn = "diag"
    data = _array(fn, "data", data)
    k = _int(fn, "k", k)
    if data.ndim == 1:
        return _diagonal_matrix(data, k)
    a, b = _axis(fn, axis1, data.ndim, "axis1"), _axis(fn, axis2, data.ndim, "axis2")
    if a == b:
        raise InputError(f"{fn}: axis1 and axis2 must differ, both are {a}")
    moved = moveaxis(data, (a, b), (data.ndim - 2, data.ndim - 1))
    rows, cols = moved.shape[-2:]
    length = max(0, min(rows, cols - k) if k >= 0 else min(rows + k, cols))
    if length == 0:
        raise InputError(f"{fn}: diagonal {k} of a {rows}x{cols} plane is empty")
    flat = moved.reshape(moved.shape[:-2] + (rows * cols,))
    start = k if k >= 0 else -k * cols
    picked = [start + i * (cols + 1) for i in range(length)]
    return _op("Gather", [flat, _ints(picked, data.ctx)], axis=-1)


def _diagonal_matrix(vector, k: int):
    """The square matrix with ``vector`` on diagonal ``k``: the vector, shifted by ``|k|``,
    spread along the rows (k >= 0) or the columns, times the identity shifted by ``k``."""
    size = vector.shape[0] + abs(k)
    line = pad(vector, pad_width=(abs(k), 0)) if k else vector
    line = line.reshape((1, size)) if k >= 0 else line.reshape((size, 1))
    eye = _made_on(vector.ctx, "eye", size, size, k, dtype=vector.dtype)
    return _op("Mul", [line, eye])


def depth_to_space(data, block_size, name=None):
    """MXNet's ``depth_to_space`` (NCHW; ONNX's DCR order)."""
    data = _array("depth_to_space", "data", data)
    return _op("DepthToSpace", [data], blocksize=_int("depth_to_space", "block_size",
                                                      block_size, 1), mode="DCR")


def space_to_depth(data, block_size, name=None):
    """MXNet's ``space_to_depth`` (NCHW), the inverse of ``depth_to_space``."""
    data = _array("space_to_depth", "data", data)
    return _op("SpaceToDepth", [data], blocksize=_int("space_to_depth", "block_size",
                                                      block_size, 1))


def split_v2(ary, indices_or_sections, axis=0, squeeze_axis=False):
    """MXNet's ``split_v2``: ``indices_or_sections`` equal parts (an int), or the parts
    between the given indices (a tuple), along ``axis``; always a list."""
    fn = "split_v2"
    ary = _array(fn, "ary", ary)
    axis = _axis(fn, axis, ary.ndim)
    size = ary.shape[axis]
    if isinstance(indices_or_sections, (int, np.integer)):
        sections = _int(fn, "indices_or_sections", indices_or_sections, 1)
        if size % sections:
            raise InputError(f"{fn}: axis {axis} of length {size} does not split into "
                             f"{sections} equal parts")
        cuts = [i * (size // sections) for i in range(sections)]
    else:
        cuts = [0] + [_int(fn, "indices_or_sections", i) for i in indices_or_sections]
    parts = [slice_axis(ary, axis, begin, end) for begin, end in
             zip(cuts, cuts[1:] + [size])]
    if squeeze_axis:
        parts = [p.reshape(p.shape[:axis] + p.shape[axis + 1:]) for p in parts]
    return parts


def shape_array(data, name=None):
    """MXNet's ``shape_array``: the shape as an int64 array."""
    data = _array("shape_array", "data", data)
    if isinstance(data, NDArray):
        return _made_on(data.ctx, "asarray", data.shape, dtype=np.int64)
    return _op("Shape", [data])


def size_array(data, name=None):
    """MXNet's ``size_array``: the number of elements as an int64 array of shape (1,)."""
    data = _array("size_array", "data", data)
    if isinstance(data, NDArray):
        return _made_on(data.ctx, "asarray", [data.size], dtype=np.int64)
    return _op("Size", [data]).reshape((1,))


def cast(data, dtype, name=None):
    """MXNet's ``cast`` (``Cast``): the values converted to ``dtype``."""
    return _array("cast", "data", data).astype(_dtype("cast", "dtype", dtype))


def cumsum(a, axis=None, dtype=None, name=None):
    """MXNet's ``cumsum``: running sums along ``axis`` (``None``: the flattened array), in
    ``dtype`` when given."""
    fn = "cumsum"
    a = _array(fn, "a", a)
    if dtype is not None:
        a = a.astype(_dtype(fn, "dtype", dtype))
    if axis is None:
        a, axis = a.reshape(-1), 0
    axis = _axis(fn, axis, a.ndim)
    return _op("CumSum", [a, _ints([axis], a.ctx).reshape(())])


def gather_nd(data, indices, name=None):
    """MXNet's ``gather_nd``: ``indices`` of shape (M, ...) index the first M axes of
    ``data`` (ONNX's GatherND takes them on its last axis)."""
    fn = "gather_nd"
    data = _array(fn, "data", data)
    index = _index_array(fn, "indices", indices, data.ctx)
    if index.ndim < 1 or index.shape[0] > data.ndim:
        raise InputError(f"{fn}: indices {index.shape} must index at most the data's "
                         f"{data.ndim} axes on its first axis")
    return _op("GatherND", [data, moveaxis(index, 0, -1)])


def scatter_nd(data, indices, shape, name=None):
    """MXNet's ``scatter_nd``: zeros of ``shape`` with ``data`` put at ``indices`` (shape
    (M, ...), as ``gather_nd``'s)."""
    fn = "scatter_nd"
    data = _array(fn, "data", data)
    index = _index_array(fn, "indices", indices, data.ctx)
    shape = tuple(_int(fn, "shape", d, 0) for d in _tuple(fn, "shape", shape))
    zeros = _made_on(data.ctx, "zeros", shape, dtype=data.dtype)
    return _op("ScatterND", [zeros, moveaxis(index, 0, -1), data])


def unravel_index(data, shape, name=None):
    """MXNet's ``unravel_index``: flat indices to one row of coordinates per axis of
    ``shape`` (shape (len(shape), N)), in the data's dtype."""
    fn = "unravel_index"
    data = _array(fn, "data", data)
    shape = [_int(fn, "shape", d, 1) for d in _tuple(fn, "shape", shape)]
    flat = data.astype(np.int64)
    rows = []
    for size in reversed(shape):
        rest = flat % size
        rows.append(rest)
        flat = (flat - rest) / size  # exact: integers
    return _op("Concat", [r.expand_dims(0) for r in reversed(rows)], axis=0).astype(
        data.dtype)


def ravel_multi_index(data, shape, name=None):
    """MXNet's ``ravel_multi_index``: coordinates (one row per axis of ``shape``) to flat
    indices, in the data's dtype."""
    fn = "ravel_multi_index"
    data = _array(fn, "data", data)
    shape = [_int(fn, "shape", d, 1) for d in _tuple(fn, "shape", shape)]
    if data.ndim < 1 or data.shape[0] != len(shape):
        raise InputError(f"{fn}: data's first axis must have one row per axis of shape "
                         f"{tuple(shape)}, got {data.shape}")
    strides = np.cumprod([1] + shape[:0:-1])[::-1].astype(np.float64)
    weights = _made_on(data.ctx, "asarray", strides, dtype=data.dtype)
    weights = weights.reshape((-1,) + (1,) * (data.ndim - 1))
    return (data * weights).sum(axis=0)


def khatri_rao(*args, name=None):
    """MXNet's ``khatri_rao``: the column-wise Kronecker product of matrices with one
    number of columns."""
    fn = "khatri_rao"
    matrices = [_array(fn, f"args[{i}]", a) for i, a in enumerate(args)]
    if not matrices or any(m.ndim != 2 or m.shape[1] != matrices[0].shape[1]
                           for m in matrices):
        raise InputError(f"{fn}: needs matrices with one number of columns, got "
                         f"{[m.shape for m in matrices]}")
    product = matrices[0]
    for matrix in matrices[1:]:
        rows = product.shape[0] * matrix.shape[0]
        product = (product.expand_dims(1) * matrix.expand_dims(0)).reshape(
            (rows, matrix.shape[1]))
    return product


def choose_element_0index(lhs, rhs, name=None):
    """MXNet's ``choose_element_0index``: ``lhs[i, rhs[i]]`` for each row ``i``."""
    return pick(lhs, rhs, axis=1)


def fill_element_0index(lhs, mhs, rhs, name=None):
    """MXNet's ``fill_element_0index``: ``lhs`` with ``lhs[i, rhs[i]] = mhs[i]``."""
    fn = "fill_element_0index"
    lhs, mhs = _array(fn, "lhs", lhs), _array(fn, "mhs", mhs)
    index = _index_array(fn, "rhs", rhs, lhs.ctx).reshape((-1, 1))
    return _op("ScatterElements", [lhs, index, mhs.reshape((-1, 1))], axis=1)


def onehot_encode(indices, out, name=None):
    """MXNet's (deprecated) ``onehot_encode``: one-hot rows of ``indices`` written into
    the 2-D ``out``, which is returned."""
    fn = "onehot_encode"
    if not isinstance(out, NDArray) or out.ndim != 2:
        raise InputError(f"{fn}: out must be a 2-D NDArray")
    out[:] = one_hot(indices, depth=out.shape[1], dtype=out.dtype)
    return out


FUNCTIONS = ["moveaxis", "swapaxes", "SwapAxis", "crop", "Crop", "slice_like",
             "reshape_like", "concatenate", "pad", "diag", "depth_to_space", "space_to_depth",
             "split_v2", "shape_array", "size_array", "cast", "cumsum", "gather_nd",
             "scatter_nd", "unravel_index", "ravel_multi_index", "khatri_rao",
             "choose_element_0index", "fill_element_0index", "onehot_encode"]
METHODS = ["swapaxes", "slice_like", "reshape_like", "pad", "diag", "depth_to_space",
           "space_to_depth", "split_v2", "shape_array", "size_array"]
