"""``mixrt.nd.linalg``: MXNet 1.x's ``nd.linalg`` operators on the trailing two axes of their
inputs (the leading axes are a batch): ``gemm``, ``gemm2``, ``syrk``, ``trmm``, ``trsm``,
``potrf``, ``potri``, ``inverse``, ``det``, ``slogdet``, ``sumlogdiag``, ``extractdiag``,
``makediag``, ``extracttrian``, ``maketrian``, ``gelqf``, ``syevd``, with MXNet's argument
names and defaults (``nd.linalg_gemm`` and the other flat names too).

The products, triangles, diagonals and inverses are composed of registered ops (``MatMul``,
``Trilu``, ``Gather``, ``Det``, ``mixrt::MatrixInverse``), so their gradients are those ops'.
The factorizations (``potrf``, ``gelqf``, ``syevd``) are autograd Functions on the device's
LAPACK (NumPy or CuPy) with the gradients MXNet gives. Results that MXNet gives as shape
``(1,)`` for one matrix (``det``, ``sumlogdiag``) are ``(1,)`` here too.
"""

from __future__ import annotations

import numpy as np

from mixrt import tape
from mixrt.base.errors import InputError
from mixrt.nd.mxnet_args import _array, _axis, _int, _ints, _invoke, _made_on, _op
from mixrt.nd.mxnet_shape import moveaxis, pad
from mixrt.nd.ndarray import NDArray


def _matrices(fn: str, arg: str, value, square: bool = False) -> NDArray:
    value = _array(fn, arg, value)
    if value.ndim < 2:
        raise InputError(f"{fn}: {arg} must have at least 2 dimensions, got {value.shape}")
    if square and value.shape[-1] != value.shape[-2]:
        raise InputError(f"{fn}: {arg} must hold square matrices, got {value.shape}")
    return value


def _t(x):
    """The trailing two axes swapped."""
    order = list(range(x.ndim))
    order[-2:] = order[-1], order[-2]
    return x.transpose(*order)


def _one_matrix(result):
    return result.reshape((1,)) if result.ndim == 0 else result


def _rows_at(fn: str, arrays: list, axis: int) -> tuple[list, int]:
    """The arrays with their row axis ``axis`` moved to -2 (MXNet's ``axis``), and it."""
    axis = _axis(fn, axis, arrays[0].ndim)
    if axis == arrays[0].ndim - 2:
        return arrays, axis
    return [moveaxis(a, axis, -2) for a in arrays], axis


def gemm(A, B, C, transpose_a=False, transpose_b=False, alpha=1.0, beta=1.0, axis=-2,
         name=None):
    """``alpha * op(A) @ op(B) + beta * C`` (``op`` transposes when asked); ``axis`` is the
    axis of the matrices' rows (the columns follow it)."""
    fn = "gemm"
    a, b, c = (_matrices(fn, n, v) for n, v in (("A", A), ("B", B), ("C", C)))
    (a, b, c), axis = _rows_at(fn, [a, b, c], axis)
    product = _op("MatMul", [_t(a) if transpose_a else a, _t(b) if transpose_b else b])
    result = product * float(alpha) + c * float(beta)
    return result if axis == result.ndim - 2 else moveaxis(result, -2, axis)


def gemm2(A, B, transpose_a=False, transpose_b=False, alpha=1.0, axis=-2, name=None):
    """``alpha * op(A) @ op(B)``."""
    fn = "gemm2"
    a, b = _matrices(fn, "A", A), _matrices(fn, "B", B)
    (a, b), axis = _rows_at(fn, [a, b], axis)
    result = _op("MatMul", [_t(a) if transpose_a else a, _t(b) if transpose_b else b])
    result = result * float(alpha)
    return result if axis == result.ndim - 2 else moveaxis(result, -2, axis)


def syrk(A, transpose=False, alpha=1.0, name=None):
    """``alpha * A @ A.T`` (``transpose=True``: ``alpha * A.T @ A``)."""
    a = _matrices("syrk", "A", A)
    pair = [_t(a), a] if transpose else [a, _t(a)]
    return _op("MatMul", pair) * float(alpha)


def _triangle(a, lower: bool):
    """The lower (or upper) triangle of each matrix, the rest zeros."""
    return _op("Trilu", [a], upper=int(not lower))


def trmm(A, B, transpose=False, rightside=False, lower=True, alpha=1.0, name=None):
    """``alpha * op(A) @ B`` (``rightside``: ``alpha * B @ op(A)``) for triangular ``A``
    (its ``lower`` or upper triangle; the other is not read)."""
    a = _triangle(_matrices("trmm", "A", A, square=True), lower)
    b = _matrices("trmm", "B", B)
    a = _t(a) if transpose else a
    return _op("MatMul", [b, a] if rightside else [a, b]) * float(alpha)


def trsm(A, B, transpose=False, rightside=False, lower=True, alpha=1.0, name=None):
    """``X`` solving ``op(A) @ X = alpha * B`` (``rightside``: ``X @ op(A) = alpha * B``)
    for triangular ``A``."""
    a = _triangle(_matrices("trsm", "A", A, square=True), lower)
    b = _matrices("trsm", "B", B)
    inverse = _inverse(_t(a) if transpose else a)
    return _op("MatMul", [b, inverse] if rightside else [inverse, b]) * float(alpha)


def _inverse(a):
    return _invoke("MatrixInverse", [a], {}, domain="mixrt")


def inverse(A, name=None):
    """The inverse of each square matrix."""
    return _inverse(_matrices("inverse", "A", A, square=True))


def potri(A, name=None):
    """``inverse(L @ L.T)`` for the lower Cholesky factor ``L`` (``potrf``'s result)."""
    inverse_l = _inverse(_triangle(_matrices("potri", "A", A, square=True), True))
    return _op("MatMul", [_t(inverse_l), inverse_l])


def det(A, name=None):
    """The determinant of each square matrix."""
    return _one_matrix(_op("Det", [_matrices("det", "A", A, square=True)]))


def slogdet(A, name=None):
    """``[sign, log|det|]`` of each square matrix."""
    value = det(A)
    return [_op("Sign", [value]), _op("Log", [_op("Abs", [value])])]


def extractdiag(A, offset=0, name=None):
    """Diagonal ``offset`` of each matrix, as a last axis."""
    a = _matrices("extractdiag", "A", A)
    rows, cols = a.shape[-2:]
    k = _int("extractdiag", "offset", offset)
    length = min(rows, cols - k) if k >= 0 else min(rows + k, cols)
    if length <= 0:
        raise InputError(f"extractdiag: diagonal {k} of a {rows}x{cols} matrix is empty")
    start = k if k >= 0 else -k * cols
    return _flat_gather(a, [start + i * (cols + 1) for i in range(length)])


def _flat_gather(a, positions: list):
    flat = a.reshape(a.shape[:-2] + (a.shape[-2] * a.shape[-1],))
    return _op("Gather", [flat, _ints(positions, a.ctx)], axis=-1)


def makediag(A, offset=0, name=None):
    """Square matrices with the last axis of ``A`` on diagonal ``offset``."""
    a = _array("makediag", "A", A)
    k = _int("makediag", "offset", offset)
    size = a.shape[-1] + abs(k)
    line = pad(a, pad_width=(0, 0) * (a.ndim - 1) + (abs(k), 0)) if k else a
    line = line.expand_dims(-2) if k >= 0 else line.expand_dims(-1)
    eye = _made_on(a.ctx, "eye", size, size, k, dtype=a.dtype)
    return _op("Mul", [line, eye])


def _triangle_positions(size: int, offset: int, lower: bool) -> list:
    """Flat positions of MXNet's triangle order: the lower one row by row; the upper one
    column by column (the lower triangle of the transpose)."""
    upper = offset > 0 or (offset == 0 and not lower)
    depth = -abs(offset)
    cells = [(i, j) for i in range(size) for j in range(size) if j - i <= depth]
    return [(j * size + i) if upper else (i * size + j) for i, j in cells]


def extracttrian(A, offset=0, lower=True, name=None):
    """The triangle of each square matrix (``offset < 0`` below the diagonal, ``> 0``
    above; at 0, ``lower`` picks) as a last axis, in MXNet's order."""
    a = _matrices("extracttrian", "A", A, square=True)
    k = _int("extracttrian", "offset", offset)
    return _flat_gather(a, _triangle_positions(a.shape[-1], k, lower))


def maketrian(A, offset=0, lower=True, name=None):
    """Square matrices with ``A``'s last axis as their triangle (``extracttrian``'s
    inverse), zeros elsewhere."""
    a = _array("maketrian", "A", A)
    k = _int("maketrian", "offset", offset)
    count = a.shape[-1]
    side = int(round((np.sqrt(8 * count + 1) - 1) / 2))
    if side * (side + 1) // 2 != count:
        raise InputError(f"maketrian: {count} entries are no triangle")
    size = side + abs(k)
    where = np.zeros(size * size, dtype=np.int64)  # 0: the zero put in front below
    where[_triangle_positions(size, k, lower)] = np.arange(1, count + 1)
    padded = pad(a, pad_width=(0, 0) * (a.ndim - 1) + (1, 0))
    picked = _op("Gather", [padded, _ints(where.tolist(), a.ctx)], axis=-1)
    return picked.reshape(a.shape[:-1] + (size, size))


def sumlogdiag(A, name=None):
    """The sum of the logarithms of each square matrix's diagonal."""
    diagonal = extractdiag(_matrices("sumlogdiag", "A", A, square=True))
    return _one_matrix(_op("ReduceSum", [_op("Log", [diagonal]), _ints([-1], diagonal.ctx)],
                           keepdims=0))


# -- factorizations: the device's LAPACK, with MXNet's gradients -------------------------------

def _host_like(x):
    return x.ctx.xp, x._read()


def _mT(x):
    return x.swapaxes(-1, -2)


def _lower_half_diagonal(xp, m):
    """The lower triangle of each matrix with its diagonal halved (Cholesky's Phi)."""
    lower = xp.tril(m)
    return lower - 0.5 * xp.eye(m.shape[-1], dtype=m.dtype) * m


def _lower_to_upper(xp, m):
    """Each matrix made symmetric from its lower triangle (MXNet's copyltu)."""
    lower = xp.tril(m)
    return lower + _mT(xp.tril(m, -1))


class _Cholesky(tape.Function):
    def forward(self, a):
        xp, raw = _host_like(a)
        self.factor = xp.linalg.cholesky(raw)
        return type(a)(self.factor, a.ctx)

    def backward(self, d_factor):
        xp, grad = d_factor.ctx.xp, d_factor._read()
        factor = self.factor
        inverse = xp.linalg.inv(factor)
        inner = _lower_half_diagonal(xp, _mT(factor) @ grad)
        s = _mT(inverse) @ inner @ inverse
        return type(d_factor)(0.5 * (s + _mT(s)), d_factor.ctx)


def potrf(A, name=None):
    """The lower Cholesky factor ``L`` of each symmetric positive-definite matrix
    (``A = L @ L.T``; only the lower triangle of ``A`` is read)."""
    return _Cholesky()(_matrices("potrf", "A", A, square=True))


class _LQ(tape.Function):
    def forward(self, a):
        xp, raw = _host_like(a)
        q_t, r = xp.linalg.qr(_mT(raw))  # A.T = Q' R, so A = R.T Q'.T
        self.q, self.l = _mT(q_t), _mT(r)
        return type(a)(xp.ascontiguousarray(self.q), a.ctx), \
            type(a)(xp.ascontiguousarray(self.l), a.ctx)

    def backward(self, dq, dl):
        xp = (dq if dq is not None else dl).ctx.xp
        q, l = self.q, self.l
        grad_q = xp.zeros_like(q) if dq is None else dq._read()
        grad_l = xp.zeros_like(l) if dl is None else dl._read()
        m = _mT(l) @ grad_l - grad_q @ _mT(q)
        da = _mT(xp.linalg.inv(l)) @ (grad_q + _lower_to_upper(xp, m) @ q)
        like = dq if dq is not None else dl
        return type(like)(da, like.ctx)


def gelqf(A, name=None):
    """The LQ factorization of each matrix of ``m <= n`` rows: ``[Q, L]`` with ``A = L @ Q``,
    ``Q``'s rows orthonormal and ``L`` lower triangular."""
    a = _matrices("gelqf", "A", A)
    if a.shape[-2] > a.shape[-1]:
        raise InputError(f"gelqf: A must have no more rows than columns, got {a.shape}")
    return list(_LQ()(a))


class _SymmetricEigen(tape.Function):
    def forward(self, a):
        xp, raw = _host_like(a)
        values, vectors = xp.linalg.eigh(raw)
        rows = _mT(vectors)
        largest = xp.take_along_axis(rows, xp.abs(rows).argmax(-1)[..., None], -1)
        rows = rows * xp.where(largest < 0, -1, 1).astype(rows.dtype)  # MXNet's signs
        self.u, self.values = rows, values
        return type(a)(xp.ascontiguousarray(rows), a.ctx), type(a)(values, a.ctx)

    def backward(self, du, dvalues):
        like = du if du is not None else dvalues
        xp = like.ctx.xp
        u, values = self.u, self.values
        grad_u = xp.zeros_like(u) if du is None else du._read()
        grad_values = xp.zeros_like(values) if dvalues is None else dvalues._read()
        gaps = values[..., None, :] - values[..., :, None]
        n = values.shape[-1]
        off = ~xp.eye(n, dtype=bool)
        scale = xp.where(off, 1.0 / xp.where(off, gaps, 1.0), 0.0).astype(u.dtype)
        inner = scale * (u @ _mT(grad_u))
        inner = inner + grad_values[..., :, None] * xp.eye(n, dtype=u.dtype)
        da = _mT(u) @ inner @ u
        return type(like)(0.5 * (da + _mT(da)), like.ctx)


def syevd(A, name=None):
    """The eigen-decomposition of each symmetric matrix: ``[U, lam]`` with
    ``A = U.T @ diag(lam) @ U``, ``lam`` ascending, each row of ``U`` an eigenvector whose
    largest entry (in magnitude) is positive."""
    return list(_SymmetricEigen()(_matrices("syevd", "A", A, square=True)))


FUNCTIONS = ["gemm", "gemm2", "syrk", "trmm", "trsm", "potrf", "potri", "inverse", "det",
             "slogdet", "sumlogdiag", "extractdiag", "makediag", "extracttrian", "maketrian",
             "gelqf", "syevd"]
