"""MXNet's sparse NDArrays: ``CSRNDArray`` (compressed sparse rows, 2-D) and
``RowSparseNDArray`` (a subset of the first axis' rows stored, the rest zero).

How they are kept: the values live in a dense buffer of the array's full shape (the
``_data`` every NDArray has), so that every dense operator reads a sparse array as MXNet's
storage fallback does, and autograd records through it unchanged. Beside it each array
keeps its *structure*, the part MXNet stores: the row indices of a row_sparse array, the
``indptr`` and column ``indices`` of a CSR one (host int64, sorted, MXNet's aux types).
Everything outside the structure is zero in the buffer. A write through the dense buffer
(a gradient stored by backward, ``copyto`` from a dense array) bumps the array's version;
a structure older than the version is recomputed from the non-zero values, so the two
never disagree. Sparse operations (``mixrt/nd/sparse.py``) set the structure they produce
directly, which is how a row_sparse array keeps rows that hold zeros (a lazy optimizer
update and ``retain`` depend on which rows are present, not on their values).

What this trades: memory is that of the dense array; the storage types, the stored form
and the result storage types are MXNet's.
"""

from __future__ import annotations

import numpy as np

from mixrt.base.errors import InputError, MixrtError
from mixrt.context import Context, as_context
from mixrt.nd.ndarray import NDArray, sparse_module
from mixrt.ops.device import to_host

INDEX_DTYPE = np.dtype(np.int64)  # MXNet's aux type for indices and indptr


class SparseStorageError(InputError, ValueError):
    """A sparse array used in a way its storage type does not allow; a ``ValueError`` too,
    as MXNet raises for these."""


class SparseFormatError(InputError, ValueError):
    """Sparse components that do not describe a valid array (``check_format``)."""


def _host_ints(values) -> np.ndarray:
    if isinstance(values, NDArray):
        values = values.asnumpy()
    return np.asarray(values).astype(INDEX_DTYPE, copy=False).reshape(-1)


def _placed(host: np.ndarray, ctx: Context):
    with ctx.device.active():
        return ctx.device.put(host) if ctx.device.kind != "cpu" else host


class BaseSparseNDArray(NDArray):
    """An NDArray stored in a sparse format (MXNet's base of CSRNDArray and
    RowSparseNDArray)."""

    __slots__ = ("_stored", "_stored_at")
    _STYPE = "undefined"

    def __init__(self, data, ctx: Context, stored=None):
        super().__init__(data, ctx)
        self._stored = stored
        self._stored_at = self._version if stored is not None else -1

    # -- the structure ---------------------------------------------------------------

    def _structure(self):
        """The stored positions, recomputed from the values if a dense write came since."""
        if self._stored_at != self._version:
            self._stored = self._structure_of(to_host(self._read()))
            self._stored_at = self._version
        return self._stored

    def _keep_structure(self, stored) -> None:
        """Record ``stored`` as the structure of the values just written."""
        self._stored = stored
        self._stored_at = self._version

    def _structure_of(self, host: np.ndarray):
        raise NotImplementedError

    # -- copies by copy/pickle: NDArray's dense record, and the structure ----------------

    def __getstate__(self) -> dict:
        stored = self._structure()
        parts = stored if isinstance(stored, tuple) else (stored,)
        return dict(NDArray.__getstate__(self), stored=[part.tolist() for part in parts])

    def __setstate__(self, state: dict) -> None:
        NDArray.__setstate__(self, state)
        parts = tuple(np.asarray(part, dtype=INDEX_DTYPE) for part in state["stored"])
        self._keep_structure(parts if self._STYPE == "csr" else parts[0])

    # -- what it is --------------------------------------------------------------------

    @property
    def stype(self) -> str:
        return self._STYPE

    def __repr__(self) -> str:
        return f"\n<{type(self).__name__} {'x'.join(map(str, self.shape))} @{self.ctx}>"

    def _ints(self, host: np.ndarray) -> NDArray:
        return NDArray(_placed(host.astype(INDEX_DTYPE, copy=True), self.ctx), self.ctx)

    @property
    def _aux_types(self) -> list:
        return [INDEX_DTYPE] * (2 if self._STYPE == "csr" else 1)

    # -- copies and conversions -------------------------------------------------------

    def tostype(self, stype: str) -> NDArray:
        """A copy in storage ``stype`` (MXNet refuses csr <-> row_sparse)."""
        return sparse_module().cast_storage(self, stype)

    def copy(self) -> "BaseSparseNDArray":
        """A copy of this storage type and structure (recorded, as NDArray.copy is)."""
        sparse = sparse_module()
        return sparse._restyled(sparse._dense_of(self), self._STYPE, self._structure())

    def _like(self, dense, stored) -> "BaseSparseNDArray":
        """An array of this storage type on this context holding ``dense``."""
        return type(self)(dense, self.ctx, stored)

    def copyto(self, other):
        """Copy into ``other`` (dense, or of this storage type) or onto a context."""
        if isinstance(other, Context) or isinstance(other, str):
            target = as_context(other)
            with target.device.active():
                return type(self)(target.device.put(self._read()).copy(), target,
                                  self._structure())
        if not isinstance(other, NDArray):
            raise InputError(f"copyto: other must be an NDArray or a Context, got "
                             f"{type(other).__name__}")
        if other is self:
            return self
        if other.stype not in ("default", self._STYPE):
            raise SparseStorageError(f"copyto: a {self._STYPE} array cannot be copied into a "
                                     f"{other.stype} one (copyto supports 'default' and "
                                     f"{self._STYPE!r} destinations)")
        stored = self._structure()
        NDArray.copyto(self, other)
        if isinstance(other, BaseSparseNDArray):
            other._keep_structure(stored)
        return other

    def astype(self, dtype, copy: bool = True) -> "BaseSparseNDArray":
        dtype = np.dtype(dtype)
        if not copy and dtype == self.dtype:
            return self
        return self._like(self._read().astype(dtype), self._structure())

    def detach(self) -> "BaseSparseNDArray":
        return self._like(self._read(), self._structure())

    def as_in_context(self, ctx) -> NDArray:
        ctx = as_context(ctx)
        return self if ctx == self.ctx else self.copyto(ctx)

    def zeros_like(self) -> "BaseSparseNDArray":
        return self._like(self.ctx.xp.zeros_like(self._read()), self._empty_structure())

    def reshape(self, *shape, **kwargs):
        raise SparseStorageError(f"reshape is not supported for {type(self).__name__}; "
                                 f"convert with tostype('default') first")

    def check_format(self, full_check: bool = True) -> None:
        """Raise ``SparseFormatError`` unless the stored form is valid (sorted, in range
        indices; for CSR a non-decreasing ``indptr`` that ends at the stored count)."""
        self._check_structure(self._structure(), full_check)

    # -- in-place arithmetic: MXNet computes, then copies the result in ----------------

    def _replace_with(self, result: NDArray) -> "BaseSparseNDArray":
        result.copyto(self) if result.stype in ("default", self._STYPE) else \
            result.tostype(self._STYPE).copyto(self)
        return self

    def __iadd__(self, other): return self._replace_with(self + other)
    def __isub__(self, other): return self._replace_with(self - other)
    def __imul__(self, other): return self._replace_with(self * other)
    def __itruediv__(self, other): return self._replace_with(self / other)

    # -- arithmetic with MXNet's result storage types (mixrt/nd/sparse.py) -------------

    def __add__(self, other): return sparse_module().add(self, other)
    def __radd__(self, other): return sparse_module().add(other, self)
    def __sub__(self, other): return sparse_module().subtract(self, other)
    def __rsub__(self, other): return sparse_module().subtract(other, self)
    def __mul__(self, other): return sparse_module().multiply(self, other)
    def __rmul__(self, other): return sparse_module().multiply(other, self)
    def __truediv__(self, other): return sparse_module().divide(self, other)
    def __neg__(self): return sparse_module().multiply(self, -1.0)
    def __abs__(self): return sparse_module().abs(self)

    __hash__ = NDArray.__hash__

    def _assign_all(self, value) -> None:
        """``x[:] = value``: an NDArray (any storage) or a NumPy array is copied in."""
        if isinstance(value, NDArray):
            if value is not self:
                value.copyto(self) if value.stype in ("default", self._STYPE) else \
                    value.tostype("default").copyto(self)
            return
        if isinstance(value, (np.ndarray, np.generic)):
            NDArray(_placed(np.asarray(value, dtype=self.dtype), self.ctx),
                    self.ctx).copyto(self)
            return
        raise InputError(f"{type(self).__name__}[:] = value: value must be an NDArray or a "
                         f"NumPy array, got {type(value).__name__}")




def _whole(key) -> bool:
    return isinstance(key, slice) and key.start is None and key.stop is None \
        and key.step is None


class RowSparseNDArray(BaseSparseNDArray):
    """A subset of rows (the first axis) stored as ``data`` (``(k,) + shape[1:]``) and
    their sorted ``indices`` (``(k,)`` int64); every other row is zero."""

    __slots__ = ()
    _STYPE = "row_sparse"

    def _structure_of(self, host: np.ndarray) -> np.ndarray:
        rows = host.reshape(host.shape[0], int(np.prod(host.shape[1:], dtype=np.int64)))
        return np.flatnonzero(rows.any(axis=1)).astype(INDEX_DTYPE)

    def _empty_structure(self) -> np.ndarray:
        return np.zeros(0, INDEX_DTYPE)

    @property
    def indices(self) -> NDArray:
        """The stored rows' indices (int64, sorted)."""
        return self._ints(self._structure())

    @property
    def data(self) -> NDArray:
        """The stored rows, ``(len(indices),) + shape[1:]``."""
        rows = _placed(self._structure(), self.ctx)
        with self.ctx.device.active():
            return NDArray(self._read()[rows], self.ctx)

    def retain(self, indices) -> "RowSparseNDArray":
        """Only the stored rows that ``indices`` names (MXNet's ``sparse.retain``)."""
        return sparse_module().retain(self, indices)

    def _check_structure(self, rows: np.ndarray, full_check: bool) -> None:
        if full_check and rows.size:
            if np.any(np.diff(rows) <= 0):
                raise SparseFormatError("check_format: row_sparse indices are not sorted "
                                        "and unique")
            if rows[0] < 0 or rows[-1] >= self.shape[0]:
                raise SparseFormatError(f"check_format: row_sparse indices out of range "
                                        f"[0, {self.shape[0]})")

    def __getitem__(self, key):
        """Only ``x[:]`` (the array itself), as MXNet."""
        if _whole(key):
            return self
        raise SparseStorageError(f"RowSparseNDArray only supports [:] for __getitem__, "
                                 f"got {key!r}")

    def __setitem__(self, key, value) -> None:
        """Only ``x[:] = value``; a number fills every row (all rows become stored)."""
        if not _whole(key):
            raise SparseStorageError(f"RowSparseNDArray only supports [:] for assignment, "
                                     f"got {key!r}")
        if isinstance(value, (int, float, np.number)) and not isinstance(value, bool):
            self._write()[...] = value
            self._keep_structure(np.arange(self.shape[0], dtype=INDEX_DTYPE))
            return
        self._assign_all(value)


class CSRNDArray(BaseSparseNDArray):
    """A 2-D array in compressed sparse row form: row ``i``'s values ``data[indptr[i]:
    indptr[i+1]]`` sit in the columns ``indices[indptr[i]:indptr[i+1]]`` (sorted, int64)."""

    __slots__ = ()
    _STYPE = "csr"

    def _structure_of(self, host: np.ndarray) -> tuple:
        rows, cols = np.nonzero(host)
        return _indptr_of(rows, host.shape[0]), cols.astype(INDEX_DTYPE)

    def _empty_structure(self) -> tuple:
        return np.zeros(self.shape[0] + 1, INDEX_DTYPE), np.zeros(0, INDEX_DTYPE)

    @property
    def indptr(self) -> NDArray:
        return self._ints(self._structure()[0])

    @property
    def indices(self) -> NDArray:
        """The stored values' column indices (int64, sorted within each row)."""
        return self._ints(self._structure()[1])

    @property
    def data(self) -> NDArray:
        rows, cols = self._positions()
        with self.ctx.device.active():
            return NDArray(self._read()[_placed(rows, self.ctx), _placed(cols, self.ctx)],
                           self.ctx)

    def _positions(self) -> tuple:
        indptr, cols = self._structure()
        rows = np.repeat(np.arange(len(indptr) - 1, dtype=INDEX_DTYPE), np.diff(indptr))
        return rows, cols

    def asscipy(self):
        """A ``scipy.sparse.csr_matrix`` copy (SciPy is needed for this call only)."""
        try:
            import scipy.sparse  # noqa: PLC0415  (an optional dependency)
        except ImportError as missing:
            raise MixrtError("CSRNDArray.asscipy needs SciPy (pip install scipy); "
                             "asnumpy() gives the dense values without it") from missing
        indptr, cols = self._structure()
        return scipy.sparse.csr_matrix((self.data.asnumpy(), cols.copy(), indptr.copy()),
                                       shape=self.shape)

    def _check_structure(self, structure: tuple, full_check: bool) -> None:
        indptr, cols = structure
        if len(indptr) != self.shape[0] + 1 or indptr[0] != 0 or indptr[-1] != len(cols):
            raise SparseFormatError(f"check_format: indptr of length {len(indptr)} must "
                                    f"have shape[0] + 1 = {self.shape[0] + 1} entries, "
                                    f"start at 0 and end at nnz = {len(cols)}")
        if not full_check:
            return
        if np.any(np.diff(indptr) < 0):
            raise SparseFormatError("check_format: indptr is not non-decreasing")
        if cols.size and (cols.min() < 0 or cols.max() >= self.shape[1]):
            raise SparseFormatError(f"check_format: column indices out of range "
                                    f"[0, {self.shape[1]})")
        rows = np.repeat(np.arange(len(indptr) - 1), np.diff(indptr))
        same_row = rows[1:] == rows[:-1]
        if np.any(same_row & (np.diff(cols) <= 0)):
            raise SparseFormatError("check_format: column indices are not sorted and "
                                    "unique within a row")

    def __getitem__(self, key):
        """A row (``x[i]``, shape ``(1, n)``) or a run of rows (``x[a:b]``), as CSR."""
        if isinstance(key, (int, np.integer)) and not isinstance(key, bool):
            begin = int(key) + self.shape[0] if key < 0 else int(key)
            return sparse_module().slice(self, begin=(begin,), end=(begin + 1,))
        if isinstance(key, slice):
            if key.step not in (None, 1):
                raise SparseStorageError("CSRNDArray only supports continuous slicing on "
                                         "axis 0")
            if _whole(key):
                return self
            begin, end, _ = key.indices(self.shape[0])
            return sparse_module().slice(self, begin=(begin,), end=(max(begin, end),))
        if isinstance(key, tuple):
            raise SparseStorageError("CSRNDArray: multi-dimension indexing is not supported")
        raise SparseStorageError(f"CSRNDArray: undefined behaviour for the key {key!r}")

    def __setitem__(self, key, value) -> None:
        """Only ``x[:] = value`` with an NDArray or a NumPy array (no numbers), as MXNet."""
        if not _whole(key):
            raise SparseStorageError(f"CSRNDArray only supports [:] for assignment, got "
                                     f"{key!r}")
        if isinstance(value, (int, float, np.number)):
            raise SparseStorageError("Assigning numeric types to CSRNDArray is not "
                                     "implemented (as in MXNet)")
        self._assign_all(value)


def _indptr_of(rows: np.ndarray, num_rows: int) -> np.ndarray:
    counts = np.bincount(rows, minlength=num_rows) if rows.size else np.zeros(num_rows,
                                                                              np.int64)
    return np.concatenate([[0], np.cumsum(counts)]).astype(INDEX_DTYPE)


STORAGE_CLASSES = {"row_sparse": RowSparseNDArray, "csr": CSRNDArray}
