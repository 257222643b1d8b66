"""``mx.nd.sparse``: MXNet 1.x's sparse NDArrays, how to make them and the operators that
keep them sparse.

    csr = nd.sparse.csr_matrix((data, indices, indptr), shape=(2, 3))
    rsp = nd.sparse.row_sparse_array((rows, [0, 4]), shape=(10, 3))
    nd.sparse.dot(csr, dense)                        # dense
    nd.sparse.dot(csr, dense, transpose_a=True)      # row_sparse
    nd.sparse.retain(rsp, nd.array([4]))             # row_sparse, row 4 only

The arrays are ``sparse_arrays.CSRNDArray`` and ``RowSparseNDArray`` (their docstring says
how the values are kept). Each operator here computes its values with the dense operators,
so autograd records it as it records them, and hands back the storage type MXNet 1.9.1's
documentation gives for its inputs' storage types, holding the structure MXNet's kernel
would store (the union of two row_sparse arrays' rows for a sum, the rows a ``retain``
keeps, ...). A storage combination MXNet serves only by falling back to dense storage gives
a dense NDArray, as there.
"""

from __future__ import annotations

import sys

import numpy as np

from mixrt import dispatch
from mixrt.base.errors import InputError
from mixrt.context import as_context
from mixrt.nd import array_layers, creation, mxnet_indexing, mxnet_ops, reductions
from mixrt.nd import ndarray as ndarray_module
from mixrt.nd.creation import DEFAULT_DTYPE
from mixrt.nd.mxnet_args import _dtype, _out_for
from mixrt.nd.ndarray import NDArray
from mixrt.nd.sparse_arrays import (INDEX_DTYPE, STORAGE_CLASSES, BaseSparseNDArray,
                                    CSRNDArray, RowSparseNDArray, SparseFormatError,
                                    SparseStorageError, _indptr_of, _placed)

STYPES = ("default", "row_sparse", "csr")


# -- storage types -------------------------------------------------------------------------

def _check_stype(fn: str, stype) -> str:
    if stype not in STYPES:
        raise InputError(f"{fn}: stype must be one of {STYPES}, got {stype!r}")
    return stype


def _restyled(result: NDArray, stype: str, stored=None) -> NDArray:
    """``result`` (a dense op's output) as an array of storage ``stype`` holding the same
    values and the same place on autograd's tape; ``stored`` is its structure (``None``:
    the non-zero values')."""
    if stype == "default":
        return result if type(result) is NDArray else _dense_of(result)
    made = STORAGE_CLASSES[stype](result._read(), result.ctx)
    made._entry, made._versions = result._entry, result._versions
    if stored is not None:
        made._keep_structure(stored)
    return made


def _dense_of(array: NDArray) -> NDArray:
    """A dense NDArray with ``array``'s values (its own copy: the dispatcher copies an
    Identity's result), on autograd's tape where ``array`` is recorded."""
    return _invoke("Identity", array)


def cast_storage(data, stype: str) -> NDArray:
    """``data`` in storage ``stype`` (MXNet refuses csr <-> row_sparse; csr needs 2-D)."""
    data = _array("cast_storage", "data", data)
    _check_stype("cast_storage", stype)
    if stype == data.stype:
        return data.copy()
    if {stype, data.stype} == {"csr", "row_sparse"}:
        raise SparseStorageError(f"cast_storage from {data.stype} to {stype} is not "
                                 f"supported")
    if stype == "csr" and data.ndim != 2:
        raise SparseStorageError(f"cast_storage: a csr array is 2-D, this one has shape "
                                 f"{data.shape}")
    if stype == "row_sparse" and data.ndim < 1:
        raise SparseStorageError("cast_storage: a row_sparse array needs at least one axis")
    if stype == "default":
        return _dense_of(data)
    return _restyled(_dense_of(data), stype)


def _array(fn: str, arg: str, value) -> NDArray:
    if not isinstance(value, NDArray):
        raise InputError(f"{fn}: {arg} must be an NDArray, got {type(value).__name__}")
    return value


# -- making sparse arrays ------------------------------------------------------------------

def _default_dtype(source, dtype) -> np.dtype:
    """MXNet's rule: the dtype given, else the source's if it has one, else float32."""
    if dtype is not None:
        return _dtype("sparse", "dtype", dtype)
    if isinstance(source, (NDArray, np.ndarray)) or _is_scipy_sparse(source):
        return np.dtype(source.dtype)
    return DEFAULT_DTYPE


def _is_scipy_sparse(value) -> bool:
    module = type(value).__module__ or ""
    return module.startswith("scipy.sparse") and hasattr(value, "tocsr")


def _host(values, dtype=None) -> np.ndarray:
    host = values.asnumpy() if isinstance(values, NDArray) else np.asarray(values)
    return host if dtype is None else host.astype(dtype, copy=False)


def _shape_of(fn: str, shape) -> tuple:
    try:
        shape = tuple(int(d) for d in shape)
    except (TypeError, ValueError) as exc:
        raise InputError(f"{fn}: shape must be a tuple of ints, got {shape!r}") from exc
    if any(d < 0 for d in shape):
        raise InputError(f"{fn}: shape {shape} has a negative dimension")
    return shape


def _is_shape(arg) -> bool:
    return isinstance(arg, tuple) and all(
        isinstance(d, (int, np.integer)) and not isinstance(d, bool) for d in arg)


def zeros(stype: str, shape, ctx=None, dtype=None, **kwargs) -> NDArray:
    """An array of zeros in storage ``stype`` (nothing stored for a sparse one)."""
    kwargs.pop("name", None)
    if kwargs:
        raise InputError(f"zeros: unknown arguments {sorted(kwargs)}")
    _check_stype("zeros", stype)
    if stype == "default":
        return creation.zeros(shape, ctx=ctx, dtype=dtype)
    shape = _shape_of("zeros", (shape,) if isinstance(shape, int) else shape)
    if stype == "csr" and len(shape) != 2:
        raise SparseStorageError(f"zeros: a csr array is 2-D, not of shape {shape}")
    dense = creation.zeros(shape, ctx=ctx, dtype=dtype)
    made = STORAGE_CLASSES[stype](dense._read(), dense.ctx)
    made._keep_structure(made._empty_structure())
    return made


def empty(stype: str, shape, ctx=None, dtype=None) -> NDArray:
    """An array in storage ``stype`` with nothing stored (MXNet's sparse ``empty``)."""
    return zeros(stype, shape, ctx=ctx, dtype=dtype)


def csr_matrix(arg1, shape=None, ctx=None, dtype=None) -> CSRNDArray:
    """A CSRNDArray from ``(data, indices, indptr)``, ``(data, (row, col))`` (duplicates
    summed), a shape (all zeros), a dense NDArray or NumPy array, a SciPy sparse matrix, or
    another CSRNDArray."""
    if isinstance(arg1, tuple) and _is_shape(arg1):
        return zeros("csr", arg1, ctx=ctx, dtype=dtype)
    if isinstance(arg1, tuple) and len(arg1) == 3:
        data, indices, indptr = arg1
        return _csr_from_definition(data, indices, indptr, shape, ctx,
                                    _default_dtype(data, dtype))
    if isinstance(arg1, tuple) and len(arg1) == 2:
        data, (row, col) = arg1[0], arg1[1]
        return _csr_from_coordinates(data, row, col, shape, ctx, _default_dtype(data, dtype))
    if _is_scipy_sparse(arg1):
        matrix = arg1.tocsr()
        matrix.sort_indices()
        return _csr_from_definition(matrix.data, matrix.indices, matrix.indptr,
                                    shape or matrix.shape, ctx, _default_dtype(arg1, dtype))
    return _from_dense("csr_matrix", "csr", arg1, shape, ctx, dtype)


def _from_dense(fn: str, stype: str, source, shape, ctx, dtype) -> NDArray:
    if isinstance(source, BaseSparseNDArray):
        if source.stype != stype:
            raise SparseStorageError(f"{fn}: cannot make a {stype} array of a "
                                     f"{source.stype} one")
        made = source.astype(_default_dtype(source, dtype))
        return made if ctx is None else made.copyto(as_context(ctx))
    if ctx is None and isinstance(source, NDArray):
        ctx = source.ctx
    dense = creation.array(source, ctx=ctx, dtype=_default_dtype(source, dtype))
    if shape is not None and tuple(shape) != dense.shape:
        raise InputError(f"{fn}: shape {tuple(shape)} does not match the source's "
                         f"{dense.shape}")
    return cast_storage(dense, stype)


def _csr_from_definition(data, indices, indptr, shape, ctx, dtype) -> CSRNDArray:
    values = _host(data, dtype).reshape(-1)
    cols, indptr = _host(indices, INDEX_DTYPE).reshape(-1), \
        _host(indptr, INDEX_DTYPE).reshape(-1)
    if len(indptr) < 1 or len(values) != len(cols) or indptr[-1] != len(cols):
        raise SparseFormatError(f"csr_matrix: {len(values)} values, {len(cols)} column "
                                f"indices and indptr ending at "
                                f"{indptr[-1] if len(indptr) else None} must agree")
    if shape is None:
        shape = (len(indptr) - 1, int(cols.max()) + 1 if cols.size else 0)
    shape = _shape_of("csr_matrix", shape)
    if len(shape) != 2 or shape[0] != len(indptr) - 1:
        raise SparseFormatError(f"csr_matrix: shape {shape} must be 2-D with "
                                f"{len(indptr) - 1} rows (len(indptr) - 1)")
    if cols.size and (cols.min() < 0 or cols.max() >= shape[1]):
        raise SparseFormatError(f"csr_matrix: column indices must lie in [0, {shape[1]})")
    dense = np.zeros(shape, dtype)
    rows = np.repeat(np.arange(shape[0], dtype=INDEX_DTYPE), np.diff(indptr))
    dense[rows, cols] = values
    return _made(CSRNDArray, dense, ctx, (indptr.copy(), cols.copy()))


def _csr_from_coordinates(data, row, col, shape, ctx, dtype) -> CSRNDArray:
    values = _host(data, dtype).reshape(-1)
    rows, cols = _host(row, INDEX_DTYPE).reshape(-1), _host(col, INDEX_DTYPE).reshape(-1)
    if not len(values) == len(rows) == len(cols):
        raise InputError(f"csr_matrix: {len(values)} values, {len(rows)} rows and "
                         f"{len(cols)} columns must agree")
    if shape is None:
        shape = (int(rows.max()) + 1 if rows.size else 0,
                 int(cols.max()) + 1 if cols.size else 0)
    shape = _shape_of("csr_matrix", shape)
    dense = np.zeros(shape, dtype)
    np.add.at(dense, (rows, cols), values)
    positions = np.unique(rows * max(shape[1], 1) + cols)
    stored = (_indptr_of(positions // max(shape[1], 1), shape[0]),
              (positions % max(shape[1], 1)).astype(INDEX_DTYPE))
    return _made(CSRNDArray, dense, ctx, stored)


def row_sparse_array(arg1, shape=None, ctx=None, dtype=None) -> RowSparseNDArray:
    """A RowSparseNDArray from ``(data, indices)`` (row ``indices[i]`` is ``data[i]``), a
    shape (all zeros), a dense NDArray or NumPy array, or another RowSparseNDArray."""
    if isinstance(arg1, tuple) and _is_shape(arg1):
        return zeros("row_sparse", arg1, ctx=ctx, dtype=dtype)
    if isinstance(arg1, tuple) and len(arg1) == 2:
        data, indices = arg1
        return _rsp_from_definition(data, indices, shape, ctx, _default_dtype(data, dtype))
    return _from_dense("row_sparse_array", "row_sparse", arg1, shape, ctx, dtype)


def _rsp_from_definition(data, indices, shape, ctx, dtype) -> RowSparseNDArray:
    values = _host(data, dtype)
    rows = _host(indices, INDEX_DTYPE).reshape(-1)
    if values.ndim < 1 or values.shape[0] != len(rows):
        raise SparseFormatError(f"row_sparse_array: data of shape {values.shape} must have "
                                f"one row per index ({len(rows)} indices)")
    if shape is None:
        shape = (int(rows.max()) + 1 if rows.size else 0,) + values.shape[1:]
    shape = _shape_of("row_sparse_array", shape)
    if shape[1:] != values.shape[1:]:
        raise SparseFormatError(f"row_sparse_array: data rows of shape {values.shape[1:]} "
                                f"do not fit shape {shape}")
    if rows.size and (rows.min() < 0 or rows.max() >= shape[0]):
        raise SparseFormatError(f"row_sparse_array: indices must lie in [0, {shape[0]})")
    dense = np.zeros(shape, dtype)
    dense[rows] = values
    return _made(RowSparseNDArray, dense, ctx, rows.copy())


def _made(cls, host: np.ndarray, ctx, stored):
    ctx = as_context(ctx)
    return cls(_placed(host, ctx), ctx, stored)


def array(source_array, ctx=None, dtype=None) -> NDArray:
    """A sparse array copied from a CSRNDArray, a RowSparseNDArray or a SciPy sparse
    matrix (MXNet's ``sparse.array``; ``tostype`` makes one of a dense array)."""
    if isinstance(source_array, BaseSparseNDArray):
        maker = csr_matrix if source_array.stype == "csr" else row_sparse_array
        return maker(source_array, ctx=ctx, dtype=dtype)
    if _is_scipy_sparse(source_array):
        return csr_matrix(source_array, ctx=ctx, dtype=dtype)
    raise InputError(f"sparse.array: source_array must be a sparse NDArray or a SciPy "
                     f"sparse matrix, got {type(source_array).__name__}; use "
                     f"nd.array(...).tostype(stype) for dense data")


# -- structures of results -----------------------------------------------------------------

def _rows(array: NDArray):
    """A row_sparse array's stored rows; a dense array's are all of them."""
    if isinstance(array, RowSparseNDArray):
        return array._structure()
    return np.arange(array.shape[0], dtype=INDEX_DTYPE)


# -- elementwise arithmetic ----------------------------------------------------------------
# The values come from the ONNX kernels through mixrt.dispatch, which reads a sparse array's
# dense buffer and records the call for autograd with the array itself as the input.

def _invoke(op_type: str, *inputs) -> NDArray:
    return dispatch.invoke("", op_type, list(inputs), {})


def _check_same_shape(fn: str, lhs: NDArray, rhs: NDArray) -> None:
    if lhs.shape != rhs.shape:
        raise InputError(f"{fn}: lhs {lhs.shape} and rhs {rhs.shape} must have the same "
                         f"shape")


def _sum_like(fn: str, op_type: str, lhs, rhs) -> NDArray:
    """``elemwise_add``/``elemwise_sub``: sparse when both operands share a sparse storage
    type (a row_sparse result stores the union of the rows), else dense."""
    lhs, rhs = _array(fn, "lhs", lhs), _array(fn, "rhs", rhs)
    _check_same_shape(fn, lhs, rhs)
    result = _invoke(op_type, lhs, rhs)
    if lhs.stype == rhs.stype == "row_sparse":
        return _restyled(result, "row_sparse", np.union1d(_rows(lhs), _rows(rhs)))
    if lhs.stype == rhs.stype == "csr":
        return _restyled(result, "csr")
    return _restyled(result, "default")


def elemwise_add(lhs, rhs, out=None, name=None) -> NDArray:
    """``lhs + rhs`` of one shape: row_sparse + row_sparse is row_sparse, csr + csr is csr,
    anything else dense."""
    return _into("elemwise_add", out, _sum_like("elemwise_add", "Add", lhs, rhs))


def elemwise_sub(lhs, rhs, out=None, name=None) -> NDArray:
    """``lhs - rhs`` of one shape, with ``elemwise_add``'s storage types."""
    return _into("elemwise_sub", out, _sum_like("elemwise_sub", "Sub", lhs, rhs))


def elemwise_mul(lhs, rhs, out=None, name=None) -> NDArray:
    """``lhs * rhs`` of one shape: zero wherever either is, so row_sparse with row_sparse
    or dense stays row_sparse (the rows both store), csr with csr or dense stays csr;
    dense * sparse (dense first) is dense, as MXNet."""
    fn = "elemwise_mul"
    lhs, rhs = _array(fn, "lhs", lhs), _array(fn, "rhs", rhs)
    _check_same_shape(fn, lhs, rhs)
    return _into(fn, out, _product_storage(lhs, rhs, _invoke("Mul", lhs, rhs)))


def _product_storage(lhs: NDArray, rhs: NDArray, result: NDArray) -> NDArray:
    if lhs.stype == "row_sparse" and rhs.stype in ("row_sparse", "default"):
        return _restyled(result, "row_sparse", np.intersect1d(_rows(lhs), _rows(rhs)))
    if lhs.stype == "csr" and rhs.stype in ("csr", "default"):
        return _restyled(result, "csr")
    return _restyled(result, "default")


def _scaled(fn: str, op_type: str, array: NDArray, scalar) -> NDArray:
    """A sparse array times or divided by a number keeps its storage and structure."""
    result = _invoke(op_type, array, scalar)
    if isinstance(array, BaseSparseNDArray):
        return _restyled(result, array.stype, array._structure())
    return result


def add(lhs, rhs) -> NDArray:
    """``lhs + rhs``, broadcasting: two arrays of one shape as ``elemwise_add``; a number
    or a broadcast makes a dense result."""
    if _same_shape_arrays(lhs, rhs):
        return elemwise_add(lhs, rhs)
    return _dense_binary("Add", lhs, rhs)


def subtract(lhs, rhs) -> NDArray:
    """``lhs - rhs``, broadcasting, with ``add``'s storage types."""
    if _same_shape_arrays(lhs, rhs):
        return elemwise_sub(lhs, rhs)
    return _dense_binary("Sub", lhs, rhs)


def multiply(lhs, rhs) -> NDArray:
    """``lhs * rhs``, broadcasting: as ``elemwise_mul`` for one shape; a sparse array
    times a number keeps its storage."""
    if _same_shape_arrays(lhs, rhs):
        return elemwise_mul(lhs, rhs)
    if _is_number(rhs) and isinstance(lhs, NDArray):
        return _scaled("multiply", "Mul", lhs, rhs)
    if _is_number(lhs) and isinstance(rhs, NDArray):
        return _scaled("multiply", "Mul", rhs, lhs)
    return _dense_binary("Mul", lhs, rhs)


def divide(lhs, rhs) -> NDArray:
    """``lhs / rhs``, broadcasting: a sparse array divided by a number keeps its storage;
    otherwise dense."""
    if _is_number(rhs) and isinstance(lhs, NDArray):
        return _scaled("divide", "Div", lhs, rhs)
    return _dense_binary("Div", lhs, rhs)


def _is_number(value) -> bool:
    return isinstance(value, (int, float, np.number)) and not isinstance(value, bool)


def _same_shape_arrays(lhs, rhs) -> bool:
    return isinstance(lhs, NDArray) and isinstance(rhs, NDArray) and lhs.shape == rhs.shape


def _dense_binary(op_type: str, lhs, rhs) -> NDArray:
    return _restyled(_invoke(op_type, lhs, rhs), "default")


def add_n(*args, out=None, name=None) -> NDArray:
    """The sum of ``args`` (one shape): row_sparse if all are (the union of their rows),
    csr if all are, else dense."""
    if not args:
        raise InputError("add_n: needs at least one array")
    arrays = [_array("add_n", f"args[{i}]", a) for i, a in enumerate(args)]
    total = arrays[0]
    for other in arrays[1:]:
        _check_same_shape("add_n", arrays[0], other)
        total = _sum_like("add_n", "Add", total, other)
    return _into("add_n", out, total if len(arrays) > 1 else arrays[0].copy())


ElementWiseSum = add_n


# -- unary operators -----------------------------------------------------------------------
# zero maps to zero, so a sparse input keeps its storage and structure (MXNet's list)

def _zero_preserving(fn: str, compute):
    """MXNet's unary ``fn`` (computed by ``compute``), keeping a sparse input's storage."""
    def operator(data, out=None, name=None):
        data = _array(fn, "data", data)
        result = compute(data)
        if isinstance(data, BaseSparseNDArray):
            result = _restyled(result, data.stype, data._structure())
        return _into(fn, out, result)
    operator.__name__ = operator.__qualname__ = fn
    operator.__doc__ = (f"MXNet's ``{fn}``: a sparse input keeps its storage type and "
                        f"structure (``{fn}(0) == 0``).")
    return operator


_ONNX_UNARY = {"abs": "Abs", "sqrt": "Sqrt", "sign": "Sign", "negative": "Neg",
               "relu": "Relu", "floor": "Floor", "ceil": "Ceil", "sin": "Sin",
               "tan": "Tan", "arcsin": "Asin", "arctan": "Atan", "sinh": "Sinh",
               "tanh": "Tanh", "arcsinh": "Asinh", "arctanh": "Atanh"}
for _name, _op_type in _ONNX_UNARY.items():
    globals()[_name] = _zero_preserving(_name, lambda x, _t=_op_type: _invoke(_t, x))
square = _zero_preserving("square", lambda x: _invoke("Mul", x, x))
for _name in ("rint", "round", "fix", "trunc", "expm1", "log1p", "degrees", "radians"):
    globals()[_name] = _zero_preserving(
        _name, lambda x, _n=_name: getattr(_nd, _n)(_as_plain_input(x)))


def _as_plain_input(data: NDArray) -> NDArray:
    """``data`` for one of mixrt.nd's MXNet functions, which may call NDArray methods a
    sparse array refuses (``reshape``): a dense NDArray over the same buffer and at the
    same place on autograd's tape. A sparse leaf with a gradient attached is the tape's
    own parent and goes as itself (these functions only transpose, slice or reduce it)."""
    if not isinstance(data, BaseSparseNDArray) or data._grad is not None:
        return data
    plain = NDArray(data._read(), data.ctx)
    plain._entry, plain._versions = data._entry, data._versions
    return plain


def clip(data, a_min, a_max, out=None, name=None) -> NDArray:
    """``data`` clipped to ``[a_min, a_max]``; a sparse input keeps its storage where the
    range holds 0 (MXNet's rule), else the result is dense."""
    data = _array("clip", "data", data)
    result = array_layers.clip(_as_plain_input(data), a_min, a_max)
    if isinstance(data, BaseSparseNDArray) and a_min <= 0 <= a_max:
        result = _restyled(result, data.stype, data._structure())
    return _into("clip", out, result)


# -- reductions: dense results -------------------------------------------------------------

def sum(data, axis=None, keepdims=False, exclude=False, out=None, name=None):  # noqa: A001
    """MXNet's ``sum`` of any storage type (a dense result)."""
    return reductions.sum(_as_plain_input(data), axis=axis, keepdims=keepdims, exclude=exclude,
                   out=out)


def mean(data, axis=None, keepdims=False, exclude=False, out=None, name=None):
    """MXNet's ``mean`` of any storage type (a dense result)."""
    return reductions.mean(_as_plain_input(data), axis=axis, keepdims=keepdims, exclude=exclude,
                    out=out)


def square_sum(data, axis=None, keepdims=False, out=None, name=None) -> NDArray:
    """``sum(data ** 2, axis)`` (MXNet's ``_square_sum``): row_sparse data summed over
    axis 1 with ``keepdims`` stays row_sparse (its rows), anything else is dense."""
    data = _array("square_sum", "data", data)
    squares = _invoke("Mul", data, data)
    result = reductions.sum(squares, axis=axis, keepdims=keepdims)
    if isinstance(data, RowSparseNDArray) and axis in (1, -1, (1,)) and keepdims \
            and data.ndim == 2:
        result = _restyled(result, "row_sparse", data._structure())
    return _into("square_sum", out, result)


# -- selecting -----------------------------------------------------------------------------

def retain(data, indices, out=None, name=None) -> RowSparseNDArray:
    """The rows of row_sparse ``data`` that ``indices`` names and ``data`` stores; every
    other row zero (its gradient reaches the kept rows only)."""
    data = _array("retain", "data", data)
    if not isinstance(data, RowSparseNDArray):
        raise SparseStorageError(f"retain: data must be a row_sparse array, got "
                                 f"{data.stype}")
    wanted = np.unique(_host(indices).astype(INDEX_DTYPE).reshape(-1))
    kept = np.intersect1d(data._structure(), wanted)
    mask = np.zeros((data.shape[0],) + (1,) * (data.ndim - 1), data.dtype)
    mask[kept] = 1
    result = _invoke("Mul", data, NDArray(_placed(mask, data.ctx), data.ctx))
    return _into("retain", out, _restyled(result, "row_sparse", kept))


def slice(data, begin, end, step=(), out=None, name=None):  # noqa: A001 (MXNet's name)
    """MXNet's ``slice``: of a csr array (step 1) a csr array; of others dense."""
    data = _array("slice", "data", data)
    result = mxnet_indexing.slice(_as_plain_input(data), begin=begin, end=end, step=step)
    if isinstance(data, CSRNDArray) and all(s in (None, 1) for s in (step or ())):
        result = _restyled(result, "csr")
    return _into("slice", out, result if isinstance(data, CSRNDArray)
                 else _restyled(result, "default"))


# -- products ------------------------------------------------------------------------------

def dot(lhs, rhs, transpose_a=False, transpose_b=False, forward_stype=None, out=None,
        name=None) -> NDArray:
    """MXNet's ``dot`` with its sparse storage types: csr x dense (or row_sparse) is
    dense; csr.T x dense (or row_sparse) is row_sparse, storing the rows the csr's
    columns touch; dense x csr (or csr.T) is csr; other combinations are dense.
    ``forward_stype`` asks for a result storage type instead."""
    lhs, rhs = _array("dot", "lhs", lhs), _array("dot", "rhs", rhs)
    result = mxnet_ops.dot(_as_plain_input(lhs), _as_plain_input(rhs), transpose_a=transpose_a,
                     transpose_b=transpose_b)
    if forward_stype is not None:
        _check_stype("dot", forward_stype)
        return _into("dot", out, _restyled(result, forward_stype))
    if isinstance(lhs, CSRNDArray) and transpose_a and rhs.stype in ("default",
                                                                      "row_sparse"):
        touched = np.unique(lhs._structure()[1])
        return _into("dot", out, _restyled(result, "row_sparse", touched))
    if lhs.stype == "default" and isinstance(rhs, CSRNDArray):
        return _into("dot", out, _restyled(result, "csr"))
    return _into("dot", out, _restyled(result, "default"))


# -- out= ----------------------------------------------------------------------------------

def _into(fn: str, out, result: NDArray) -> NDArray:
    """``result`` written into ``out`` (MXNet's ``out=``, checked as the dense functions
    check it), in ``out``'s storage, or ``result`` itself."""
    if _out_for(fn, out, result) is None:
        return result
    result.copyto(out) if result.stype in ("default", out.stype) else \
        cast_storage(result, "default").copyto(out)
    return out


FUNCTIONS = ["cast_storage", "zeros", "empty", "array", "csr_matrix", "row_sparse_array",
             "elemwise_add", "elemwise_sub", "elemwise_mul", "add", "subtract", "multiply",
             "divide", "add_n", "ElementWiseSum", "square", "clip", "sum", "mean",
             "square_sum", "retain", "slice", *_ONNX_UNARY,
             "rint", "round", "fix", "trunc", "expm1", "log1p", "degrees", "radians", "dot"]
__all__ = ["BaseSparseNDArray", "CSRNDArray", "RowSparseNDArray", *FUNCTIONS]

ndarray_module.hand_in_sparse(sys.modules[__name__])
