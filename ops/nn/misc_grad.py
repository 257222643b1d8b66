"""Gradients of DepthToSpace, SpaceToDepth, Hardmax, Mod and Det, and the MatrixInverse
kernel (mixrt domain) that Det's gradient needs.

* DepthToSpace and SpaceToDepth only permute elements, so each gradient is the inverse
  permutation. Three of the four (op, mode) pairs are undone by a single ONNX op: the other
  op in DCR mode, and DepthToSpace CRD for SpaceToDepth CRD. ONNX's SpaceToDepth has no
  ``mode`` before opset 28, so DepthToSpace CRD's gradient is written as the
  Reshape/Transpose/Reshape it is, with dims read at run time where they are not static.
* Hardmax is piecewise constant: like Floor and Sign, nothing flows back through it.
* Mod: Y = A - q B with q = floor(A / B) (fmod=0) or trunc(A / B) (fmod=1), so dA = dY and
  dB = -q dY. Integer Mod has no gradient.
* Det: d det(X) = det(X) tr(X^-1 dX), so dX = dY C with C = det(X) X^-T, the cofactor
  matrix. C exists at singular matrices too, where X^-1 does not, so the kernel Cofactors
  (mixrt domain) computes it from X^-1 where X is invertible and from an SVD where it is not
  (X = U S V^T gives C = det(U) det(V) U diag(prod_{j != i} s_j) V^T), as PyTorch does:
  the first derivative is finite everywhere. Cofactors' own gradient is written with
  MatrixInverse, so a second derivative at an exactly singular matrix is NaN.

Each gradient is made of ops that have gradients, so all of them differentiate again.
See runtime/passes/autodiff.py for the calling convention.
"""

from __future__ import annotations

import numpy as np

from mixrt.ops.nn import linalg, nn
from mixrt.ops.shape import layout
from mixrt.ops.elementwise import elementwise as ew
from mixrt.ops.ir.dtypes import FLOATS
from mixrt.ops.training.grad_support import MIXRT
from mixrt.ops.ir.registry import op
from mixrt.ops.shape.shape_grad import reshape_like
from mixrt.ops.ir.types import same_as_input


# -- DepthToSpace, SpaceToDepth ---------------------------------------------------------------

def _blocksize(node) -> int:
    return int(node.attributes["blocksize"])


def _mode(node) -> str:
    return node.attributes.get("mode", "DCR")  # the opset-1 ops have no mode: they are DCR


def _dim(b, name: str, axis: int):
    """``name``'s length along ``axis``: an int when inference knows it, else a
    one-element int64 tensor read at run time."""
    value_type = b.type(name)
    if value_type is not None and value_type.shape is not None \
            and isinstance(value_type.shape[axis], int):
        return value_type.shape[axis]
    return b.emit("Shape", name, start=axis, end=axis + 1)


def _shape_vector(b, dims: list) -> str:
    """A shape tensor from ints and one-element tensors, a constant when all are ints."""
    if all(isinstance(d, int) for d in dims):
        return b.ints(dims)
    return b.emit("Concat", *(b.ints([d]) if isinstance(d, int) else d for d in dims),
                  axis=0)


def _undo_depth_to_space_crd(b, x: str, grad: str, blocksize: int) -> str:
    """CRD read X as [N, C', s, s, H, W] and wrote it as [N, C', H, s, W, s] (transposed by
    (0, 1, 4, 2, 5, 3)): split dY the second way, transpose back, flatten to X's shape."""
    split = [_dim(b, grad, 0), _dim(b, grad, 1), _dim(b, x, 2), blocksize, _dim(b, x, 3),
             blocksize]
    # allowzero: every dim is given, so a real 0 (an empty batch) must stay 0
    grouped = b.emit("Reshape", grad, _shape_vector(b, split), allowzero=1)
    return reshape_like(b, b.emit("Transpose", grouped, perm=[0, 1, 3, 5, 2, 4]), x)


@layout.depthtospace.grad
def _(b, node, dy):
    blocksize = _blocksize(node)
    if _mode(node) == "DCR":
        return [b.emit("SpaceToDepth", dy[0], blocksize=blocksize)]
    return [_undo_depth_to_space_crd(b, node.inputs[0], dy[0], blocksize)]


@layout.spacetodepth.grad
def _(b, node, dy):
    # DepthToSpace in the same mode puts every element back where SpaceToDepth took it
    return [b.emit("DepthToSpace", dy[0], blocksize=_blocksize(node), mode=_mode(node))]


# -- Hardmax ----------------------------------------------------------------------------------

def _piecewise_constant(b, node, dy):
    """Zero wherever the derivative exists; autodiff gives an input reached only through it a
    zero gradient."""
    return [None]


for _hardmax in (nn.hardmax_coerced, nn.hardmax):
    _hardmax.grad(_piecewise_constant)


# -- Mod --------------------------------------------------------------------------------------

@ew.mod.grad
def _(b, node, dy):
    a, divisor = node.inputs
    if not b.differentiable(a):
        return [None, None]  # integer remainders have no gradient
    # (A - Y) / B is the integer quotient the forward used, floor for fmod=0 and trunc for
    # fmod=1, read back from Y so that it agrees with the forward even where A / B rounds
    # onto an integer. Round drops the division's rounding error and, having no gradient
    # itself, keeps q constant when this gradient is differentiated again (it is constant
    # wherever the derivative exists).
    quotient = b.emit("Round", b.emit("Div", b.emit("Sub", a, node.outputs[0]), divisor))
    return [b.sum_to(dy[0], a), b.sum_to(b.neg(b.mul(quotient, dy[0])), divisor)]


# -- Det and MatrixInverse --------------------------------------------------------------------

def _matrix_transpose(b, name: str, rank: int) -> str:
    """The trailing two axes swapped."""
    return b.emit("Transpose", name, perm=[*range(rank - 2), rank - 1, rank - 2])


@op("MatrixInverse", since=1, domain=MIXRT, dtypes=FLOATS)
def matrix_inverse(xp, X):
    """Inverses of the trailing square matrices of X ([*, M, M]); a singular one gives NaNs
    (NumPy would raise for the whole batch; CuPy gives inf or NaN)."""
    if X.ndim < 2 or X.shape[-1] != X.shape[-2]:
        raise ValueError(f"MatrixInverse: expected [*, M, M] square matrices, got shape "
                         f"{X.shape}")
    # LAPACK has no half-precision routines: float16 and bfloat16 go through float32
    compute = np.float64 if X.dtype == np.float64 else np.float32
    square = X.astype(compute, copy=False)
    try:
        inverse = xp.linalg.inv(square)
    except np.linalg.LinAlgError:
        inverse = _inverse_each(xp, square)
    return inverse.astype(X.dtype, copy=False)


def _inverse_each(xp, square):
    """One matrix at a time, NaN for the singular ones: only reached when one is."""
    flat = square.reshape(-1, *square.shape[-2:])
    inverse = xp.full_like(flat, np.nan)
    for i in range(flat.shape[0]):
        try:
            inverse[i] = xp.linalg.inv(flat[i])
        except np.linalg.LinAlgError:
            pass
    return inverse.reshape(square.shape)


matrix_inverse.infer(same_as_input)


@matrix_inverse.grad
def _(b, node, dy):
    """d X^-1 = -X^-1 dX X^-1, so dX = -Y^T dY Y^T with Y = X^-1."""
    transposed = _matrix_transpose(b, node.outputs[0], b.known_rank(node, node.inputs[0]))
    return [b.neg(b.emit("MatMul", b.emit("MatMul", transposed, dy[0]), transposed))]


@linalg.det.grad
def _(b, node, dy):
    """dX = dY C, dY broadcast over each matrix."""
    scale = b.emit("Unsqueeze", dy[0], b.ints([-2, -1]))
    return [b.mul(scale, b.emit("Cofactors", node.inputs[0], domain=MIXRT))]


@op("Cofactors", since=1, domain=MIXRT, dtypes=FLOATS)
def cofactors(xp, X):
    """The cofactor matrices det(X) X^-T of the trailing square matrices of X ([*, M, M]),
    finite at singular matrices too."""
    if X.ndim < 2 or X.shape[-1] != X.shape[-2]:
        raise ValueError(f"Cofactors: expected [*, M, M] square matrices, got shape "
                         f"{X.shape}")
    compute = np.float64 if X.dtype == np.float64 else np.float32  # as MatrixInverse
    square = X.astype(compute, copy=False)
    inverse_t = xp.swapaxes(matrix_inverse(xp, square), -1, -2)
    result = xp.linalg.det(square)[..., None, None] * inverse_t
    singular = ~xp.isfinite(result).all(axis=(-2, -1))
    if bool(singular.any()):
        result[singular] = _cofactors_by_svd(xp, square[singular])
    return result.astype(X.dtype, copy=False)


def _cofactors_by_svd(xp, square):
    """det(U) det(V) U diag(p) V^T with p_i the product of the singular values but the
    i-th: no division, so exact zeros in s give the adjugate's true value."""
    u, s, vt = xp.linalg.svd(square)
    ones = xp.ones_like(s[..., :1])
    before = xp.cumprod(xp.concatenate([ones, s[..., :-1]], axis=-1), axis=-1)
    after = xp.flip(xp.cumprod(xp.concatenate([ones, xp.flip(s[..., 1:], axis=-1)],
                                              axis=-1), axis=-1), axis=-1)
    sign = xp.linalg.det(u) * xp.linalg.det(vt)
    return sign[..., None, None] * xp.matmul(u * (before * after)[..., None, :], vt)


cofactors.infer(same_as_input)


@cofactors.grad
def _(b, node, dy):
    """With C = det(X) X^-T and Z = X^-T: dC = tr(X^-1 dX) C - C dX^T Z, so
    dX = <dY, Z> C - C dY^T Z, <dY, Z> summed over each matrix."""
    x, c = node.inputs[0], node.outputs[0]
    rank = b.known_rank(node, x)
    z = _matrix_transpose(b, b.emit("MatrixInverse", x, domain=MIXRT), rank)
    along_z = b.emit("ReduceSum", b.mul(dy[0], z), b.ints([-2, -1]), keepdims=1)
    bent = b.emit("MatMul", b.emit("MatMul", c, _matrix_transpose(b, dy[0], rank)), z)
    return [b.emit("Sub", b.mul(along_z, c), bent)]
