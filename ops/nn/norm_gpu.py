"""BatchNormalization in training mode and LayerNormalization, with their gradients, on a GPU
as a few fused CuPy kernels (LayerNormalization's plan is the same over rows; see its
section).

Written as array expressions, a training BatchNormalization launched ~15 CuPy kernels and
its gradient ~25 (748 us a call in ResNet-18's training step at batch 32 on an H200, 15 ms
a step). Here, over X viewed as (N, C, S):

* **Statistics**, two passes as the generic kernels make them: the sum of x per (n, c)
  over the contiguous S axis (a block per row, as ``norm.axes_sum`` found fast), then over
  N, gives the mean; one ReductionKernel then sums (x - mean)^2 the same way. (One pass
  over shifted values, E[(x-k)^2] - E[x-k]^2, saved a launch but was 1.6e-5 away from
  MXNet's figures on a small batch.)
* **Per channel**, two small kernels turn the sums into the variance and 1 / std, then
  the updated running statistics and the affine map's two coefficients.
* **Normalizing** is one kernel, ``y = x * a + b``.
* **The gradient** recomputes the statistics (as the generic kernel does), sums dy and
  dy (x - mean) per channel the same way, and writes dx in one kernel: with g = dy *
  gamma, dx = inv_std (g - mean(g) - x^ mean(g x^)).

Half-precision X computes in float32, as the generic kernels do. Other modes (inference,
spatial=0) keep the generic kernels.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from mixrt.ops.ir.dtypes import to_numpy_dtype
from mixrt.ops.nn.norm import batch_normalization, layer_normalization
from mixrt.ops.nn.norm_grad import _statistics_dtype, batch_norm_grad, layer_norm_grad

_CENTERED_SQUARES = ("T x, F mean", "F total", "((F)x - mean) * ((F)x - mean)")
_CENTERED_PRODUCT = ("T dy, T x, F mean", "F total", "(F)dy * ((F)x - mean)")

# per channel: the variance and 1 / std from the sum of squared deviations
_STATISTICS = ("F squares, F count, F epsilon", "F var, F inv_std", """
var = squares / count;
inv_std = 1 / sqrt(var + epsilon);
""")
# per channel: the running statistics and the affine map y = x * a + b
_AFFINE = ("F mean, F var, F inv_std, F gamma, F beta, F old_mean, F old_var, F momentum",
           "F a, F b, F new_mean, F new_var", """
a = gamma * inv_std;
b = beta - mean * a;
new_mean = old_mean * momentum + mean * (1 - momentum);
new_var = old_var * momentum + var * (1 - momentum);
""")
_NORMALIZE = ("T x, F a, F b", "T y", "y = (T)((F)x * a + b);")
# per channel: the gradient's coefficients, dx = c1 * (dy - c2 - (x - mean) * c3)
_GRADIENT_TERMS = ("F sum_dy, F sum_dyx, F inv_std, F gamma, F count",
                   "F d_scale, F c1, F c2, F c3", """
d_scale = sum_dyx * inv_std;
c1 = gamma * inv_std;
c2 = sum_dy / count;
c3 = sum_dyx * inv_std * inv_std / count;
""")
_INPUT_GRADIENT = ("T dy, T x, F mean, F c1, F c2, F c3", "T dx",
                   "dx = (T)(c1 * ((F)dy - c2 - ((F)x - mean) * c3));")


@functools.lru_cache(maxsize=None)
def _elementwise(make, params: tuple, name: str):
    inputs, outputs, body = params
    return make(inputs, outputs, body.strip(), name)


@functools.lru_cache(maxsize=None)
def _reduction(make, params: tuple, name: str):
    inputs, output, mapped = params
    return make(inputs, output, mapped, "a + b", f"{output.split()[-1]} = a", "0", name)


def _run(xp, params, name, *arrays):
    """An ElementwiseKernel of ``params`` (built once per module), launched on ``arrays``
    (inputs, then every output)."""
    return _elementwise(xp.ElementwiseKernel, params, name)(*arrays)


def _row_sums(xp, params, name, *arrays):
    """The per-channel sums of ``params``' mapped expression over (N, C, S) operands: each
    (n, c) row over S in one ReductionKernel, then the N rows."""
    rows = _reduction(xp.ReductionKernel, params, name)(*arrays, axis=2)
    return rows.sum(axis=0)


def _work_dtype(dtype):
    return np.dtype(np.float32) if np.dtype(dtype).itemsize < 4 else np.dtype(dtype)


def _channels(xp, values, dtype):
    return [xp.ascontiguousarray(v).astype(dtype, copy=False).reshape(-1) for v in values]


def _moments(xp, x3, dtype, epsilon):
    """mean, var and 1 / sqrt(var + epsilon) per channel of (N, C, S) ``x3``."""
    count = x3.shape[0] * x3.shape[2]
    mean = x3.sum(axis=2, dtype=dtype).sum(axis=0) / count
    squares = _row_sums(xp, _CENTERED_SQUARES, "mixrt_bn_centered_squares", x3,
                        mean.reshape(1, -1, 1))
    var, inv_std = (xp.empty(mean.shape, dtype=dtype) for _ in range(2))
    _run(xp, _STATISTICS, "mixrt_bn_statistics", squares, float(count), float(epsilon), var,
         inv_std)
    return mean, var, inv_std


def _usable(X) -> bool:
    return X.ndim >= 2 and X.size > 0 and np.dtype(X.dtype).kind == "f"


@batch_normalization.fast("gpu")
def batch_normalization_gpu(xp, X, scale, B, input_mean, input_var, *, epsilon=1e-5,
                            momentum=0.9, training_mode=0, _outputs=1, out=None):
    """Training mode fused (see the module docstring), Y written into ``out`` when given;
    inference mode as the generic kernel computes it."""
    if not training_mode or not _usable(X):
        return batch_normalization(xp, X, scale, B, input_mean, input_var, epsilon=epsilon,
                                   momentum=momentum, training_mode=training_mode,
                                   _outputs=_outputs)
    dtype = _work_dtype(X.dtype)
    n, c = X.shape[:2]
    x3 = xp.ascontiguousarray(X).reshape(n, c, -1)
    mean, var, inv_std = _moments(xp, x3, dtype, epsilon)
    gamma, beta, old_mean, old_var = _channels(xp, (scale, B, input_mean, input_var), dtype)
    a, b, new_mean, new_var = (xp.empty((c,), dtype=dtype) for _ in range(4))
    _run(xp, _AFFINE, "mixrt_bn_affine", mean, var, inv_std, gamma, beta, old_mean, old_var,
         float(momentum), a, b, new_mean, new_var)
    y = out if out is not None and out.flags.c_contiguous else xp.empty(X.shape, X.dtype)
    _run(xp, _NORMALIZE, "mixrt_bn_normalize", x3, a.reshape(1, c, 1), b.reshape(1, c, 1),
         y.reshape(n, c, -1))
    outputs = (y, new_mean.astype(input_mean.dtype, copy=False),
               new_var.astype(input_var.dtype, copy=False),
               mean.astype(input_mean.dtype, copy=False),
               var.astype(input_var.dtype, copy=False))
    return y if _outputs == 1 else outputs[:_outputs]


@batch_norm_grad.fast("gpu")
def batch_norm_grad_gpu(xp, dY, X, scale, mean=None, var=None, *, epsilon=1e-5, spatial=1,
                        training_mode=0, _outputs=3, out=None):
    """dX, dscale, dB of training mode fused (see the module docstring), dX written into
    ``out`` when given; inference mode and spatial=0 as the generic kernel."""
    if not training_mode or not _usable(X) or dY.dtype != X.dtype:
        grads = batch_norm_grad(
            xp, dY, X, scale, mean, var, epsilon=epsilon, spatial=spatial,
            training_mode=training_mode, _outputs=_outputs)
        return _first_into(out, grads)
    dtype = _work_dtype(X.dtype)
    n, c = X.shape[:2]
    x3 = xp.ascontiguousarray(X).reshape(n, c, -1)
    dy3 = xp.ascontiguousarray(dY).reshape(n, c, -1)
    batch_mean, _, inv_std = _moments(xp, x3, dtype, epsilon)
    sum_dy = dy3.sum(axis=2, dtype=dtype).sum(axis=0)
    sum_dyx = _row_sums(xp, _CENTERED_PRODUCT, "mixrt_bn_centered_product", dy3, x3,
                        batch_mean.reshape(1, c, 1))
    (gamma,) = _channels(xp, (scale,), dtype)
    d_scale, c1, c2, c3 = (xp.empty((c,), dtype=dtype) for _ in range(4))
    count = float(n * math.prod(X.shape[2:]))
    _run(xp, _GRADIENT_TERMS, "mixrt_bn_gradient_terms", sum_dy, sum_dyx, inv_std, gamma,
         count, d_scale, c1, c2, c3)
    dx = out if out is not None and out.flags.c_contiguous and out.shape == X.shape \
        and out.dtype == X.dtype else xp.empty(X.shape, dtype=X.dtype)
    per_channel = [v.reshape(1, c, 1) for v in (batch_mean, c1, c2, c3)]
    _run(xp, _INPUT_GRADIENT, "mixrt_bn_input_gradient", dy3, x3, *per_channel,
         dx.reshape(n, c, -1))
    grads = (dx, d_scale.astype(scale.dtype, copy=False).reshape(scale.shape),
             sum_dy.astype(scale.dtype, copy=False).reshape(scale.shape))
    return _first_into(out, grads[:_outputs])


def _first_into(out, grads):
    """``grads`` (one array or a tuple) with the first in ``out`` when given."""
    first = grads[0] if isinstance(grads, tuple) else grads
    if out is None or first is out:
        return grads
    out[...] = first
    return (out, *grads[1:]) if isinstance(grads, tuple) else out


# -- LayerNormalization ----------------------------------------------------------------------
# The same plan over X viewed as (rows, D), D the normalized axes: row sums for the mean and
# the squared deviations, one kernel for 1 / std, one for y; the gradient's two row sums of
# g = dy * scale and g (x - mean), one kernel for dx, column sums for dscale and dbias.

_LN_STATISTICS = ("F squares, F count, F epsilon", "F inv_std",
                  "inv_std = 1 / sqrt(squares / count + epsilon);")
# the normalized value rounded to X's type before the affine step, as the generic kernel
_LN_AFFINE = ("T x, F mean, F inv_std, T scale, T bias", "T y",
              "y = (T)((T)(((F)x - mean) * inv_std) * scale + bias);")
_LN_SCALE = ("T x, F mean, F inv_std, T scale", "T y",
             "y = (T)((T)(((F)x - mean) * inv_std) * scale);")
_LN_SCALED = ("T dy, T scale, F mean", "F total", "(F)dy * (F)scale")  # mean binds F
_LN_SCALED_CENTERED = ("T dy, T scale, T x, F mean", "F total",
                       "(F)dy * (F)scale * ((F)x - mean)")
_LN_NORMALIZED_DY = ("T dy, T x, F mean, F inv_std", "F total",
                     "(F)dy * (((F)x - mean) * inv_std)")
# dx = inv_std (g - sum(g) / D - x^ sum(g x^) / D), with x^ = (x - mean) inv_std
_LN_INPUT_GRADIENT = ("T dy, T scale, T x, F mean, F inv_std, F sum_g, F sum_gx, F count",
                      "T dx", """
const F g = (F)dy * (F)scale;
const F correction = ((F)x - mean) * inv_std * inv_std * sum_gx / count;
dx = (T)(inv_std * (g - sum_g / count - correction));
""")


def _layer_rows(X, Scale, B, axis: int):
    """(rows, D) of X's normalized axes when the scale (and bias) cover them exactly,
    else None."""
    start = axis % X.ndim
    width = math.prod(X.shape[start:])
    rows = X.size // max(width, 1)
    fits = all(p is None or (p.size == width and p.dtype == X.dtype) for p in (Scale, B))
    return (rows, width) if fits and X.size and np.dtype(X.dtype).kind == "f" else None


def _layer_moments(xp, x2, dtype, epsilon):
    """mean and 1 / sqrt(var + epsilon) of each row of (rows, D) ``x2``, as (rows, 1)."""
    rows, width = x2.shape
    mean = (x2.sum(axis=1, dtype=dtype) / width).reshape(rows, 1)
    squares = _reduction(xp.ReductionKernel, _CENTERED_SQUARES, "mixrt_ln_squares")(
        x2, mean, axis=1)
    inv_std = xp.empty((rows,), dtype=dtype)
    _run(xp, _LN_STATISTICS, "mixrt_ln_statistics", squares, float(width), float(epsilon),
         inv_std)
    return mean, inv_std.reshape(rows, 1)


@layer_normalization.fast("gpu")
def layer_normalization_gpu(xp, X, Scale, B=None, *, axis=-1, epsilon=1e-5, stash_type=1,
                            _outputs=1, out=None):
    """Fused (above) when Scale and B cover the normalized axes; Y written into ``out``."""
    shape = _layer_rows(X, Scale, B, axis)
    if shape is None:
        return layer_normalization(xp, X, Scale, B, axis=axis, epsilon=epsilon,
                                   stash_type=stash_type, _outputs=_outputs)
    stash = to_numpy_dtype(stash_type)
    x2 = xp.ascontiguousarray(X).reshape(shape)
    mean, inv_std = _layer_moments(xp, x2, stash, epsilon)
    y = out if out is not None and out.flags.c_contiguous else xp.empty(X.shape, X.dtype)
    scale = xp.ascontiguousarray(Scale).reshape(1, shape[1])
    if B is None:
        _run(xp, _LN_SCALE, "mixrt_ln_scale", x2, mean, inv_std, scale, y.reshape(shape))
    else:
        _run(xp, _LN_AFFINE, "mixrt_ln_affine", x2, mean, inv_std, scale,
             xp.ascontiguousarray(B).reshape(1, shape[1]), y.reshape(shape))
    if _outputs == 1:
        return y
    start = axis % X.ndim
    stats_shape = tuple(X.shape[:start]) + (1,) * (X.ndim - start)
    return (y, mean.reshape(stats_shape), inv_std.reshape(stats_shape))[:_outputs]


@layer_norm_grad.fast("gpu")
def layer_norm_grad_gpu(xp, dY, X, Scale, B=None, dMean=None, dInvStdDev=None, *, axis=-1,
                        epsilon=1e-5, stash_type=None, _outputs=2):
    """dX, dScale (and dB) fused (above); the statistics outputs' gradients (dMean,
    dInvStdDev) and a missing dY go to the generic kernel."""
    shape = _layer_rows(X, Scale, B, axis)
    if shape is None or dY is None or dMean is not None or dInvStdDev is not None \
            or dY.dtype != X.dtype:
        return layer_norm_grad(xp, dY, X, Scale, B, dMean, dInvStdDev, axis=axis,
                               epsilon=epsilon, stash_type=stash_type, _outputs=_outputs)
    dtype = _statistics_dtype(X, stash_type)
    x2 = xp.ascontiguousarray(X).reshape(shape)
    dy2 = xp.ascontiguousarray(dY).reshape(shape)
    scale = xp.ascontiguousarray(Scale).reshape(1, shape[1])
    mean, inv_std = _layer_moments(xp, x2, dtype, epsilon)
    sum_g = _reduction(xp.ReductionKernel, _LN_SCALED, "mixrt_ln_scaled")(
        dy2, scale, mean, axis=1).reshape(-1, 1)
    sum_gx = _reduction(xp.ReductionKernel, _LN_SCALED_CENTERED, "mixrt_ln_scaled_centered")(
        dy2, scale, x2, mean, axis=1).reshape(-1, 1)
    dx = xp.empty(X.shape, dtype=X.dtype)
    _run(xp, _LN_INPUT_GRADIENT, "mixrt_ln_input_gradient", dy2, scale, x2, mean, inv_std,
         sum_g, sum_gx, float(shape[1]), dx.reshape(shape))
    d_scale = _reduction(xp.ReductionKernel, _LN_NORMALIZED_DY, "mixrt_ln_normalized_dy")(
        dy2, x2, mean, inv_std, axis=0)
    grads = (dx, d_scale.astype(Scale.dtype, copy=False).reshape(Scale.shape))
    if B is not None:
        grads += (dy2.sum(axis=0, dtype=dtype).astype(B.dtype, copy=False).reshape(B.shape),)
    return grads[:_outputs]
