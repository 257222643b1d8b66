"""``mixrt.nd.contrib``: MXNet 1.x's ``nd.contrib`` names that NDArray code uses most:
``isfinite``, ``isnan``, ``isinf``, ``adamw_update``, ``mp_adamw_update``, ``boolean_mask``,
``arange_like``, ``index_copy``, ``index_array``, ``allclose``, ``div_sqrt_dim``,
``quadratic``, ``gradientmultiplier``.

The tests of values give 0/1 in the data's dtype, as MXNet's. The AdamW updates are MXNet's
operators (no bias correction: the optimizer folds it into ``lr``): ``mean`` and ``var``
change in place, the new weight goes to ``out`` (MXNet's optimizer passes the weight) or into
a new array, and a ``rescale_grad`` of NaN, Inf or 0 skips the step. Their hyper-parameters are
rounded to float32 first, as MXNet's C floats are.
"""

from __future__ import annotations

import math

import numpy as np

from mixrt import autograd
from mixrt.base.errors import InputError, ShapeError
from mixrt.context import as_context, current_context
from mixrt.nd.mxnet_args import (_array, _axis, _index_array, _int, _into, _made_on, _op,
                                  _tuple)
from mixrt.nd.random import uniform
from mixrt.nd.ndarray import NDArray


def _test(fn: str, compute):
    def function(data, out=None, name=None):
        data = _array(fn, "data", data)
        return _into(fn, out, compute(data).astype(data.dtype))
    function.__name__ = function.__qualname__ = fn
    function.__doc__ = f"MXNet's ``contrib.{fn}``: 1 where it holds, else 0 (data's dtype)."
    return function


isnan = _test("isnan", lambda x: _op("IsNaN", [x]))
isinf = _test("isinf", lambda x: _op("IsInf", [x]))
isfinite = _test("isfinite", lambda x: _op("Not", [_op("Or", [_op("IsNaN", [x]),
                                                               _op("IsInf", [x])])]))


# -- AdamW -------------------------------------------------------------------------------------

def _f32(value) -> float:
    return float(np.float32(value))


def _rescale(fn: str, rescale_grad) -> float:
    if isinstance(rescale_grad, NDArray):
        if rescale_grad.size != 1:
            raise InputError(f"{fn}: rescale_grad must be a number or a one-element NDArray")
        return float(rescale_grad.asscalar())
    return float(rescale_grad)


def _state(fn: str, arg: str, value, like: NDArray):
    if not isinstance(value, NDArray):
        raise InputError(f"{fn}: {arg} must be an NDArray, got {type(value).__name__}")
    if value.shape != like.shape:
        raise ShapeError(f"{fn}: {arg} has shape {value.shape}, the weight {like.shape}")
    return value


def _adamw_step(fn, master, grad, mean, var, scale, lr, eta, beta1, beta2, epsilon, wd,
                clip_gradient):
    """The new weight (raw, master's dtype); ``mean`` and ``var`` updated in place."""
    xp = master.ctx.xp
    weight = master._read()
    g = grad._read().astype(weight.dtype, copy=False) * weight.dtype.type(_f32(scale))
    if clip_gradient > 0:
        g = xp.clip(g, -_f32(clip_gradient), _f32(clip_gradient))
    m, v = mean._write(), var._write()
    m[...] = _f32(beta1) * m + _f32(1 - _f32(beta1)) * g
    v[...] = _f32(beta2) * v + _f32(1 - _f32(beta2)) * g * g
    step = _f32(lr) * m / (xp.sqrt(v) + _f32(epsilon)) + weight * _f32(wd)
    return (weight - _f32(eta) * step).astype(weight.dtype, copy=False)


def adamw_update(weight, grad, mean, var, rescale_grad, lr, eta, beta1=0.9, beta2=0.999,
                 epsilon=1e-8, wd=0, clip_gradient=-1, out=None, name=None):
    """MXNet's ``contrib.adamw_update``: ``m = beta1 m + (1 - beta1) g``,
    ``v = beta2 v + (1 - beta2) g^2``, ``w - eta (lr m / (sqrt(v) + epsilon) + wd w)`` with
    ``g = clip(rescale_grad * grad)``."""
    fn = "adamw_update"
    weight = _array(fn, "weight", weight)
    grad, mean, var = (_state(fn, a, v, weight) for a, v in
                       (("grad", grad), ("mean", mean), ("var", var)))
    scale = _rescale(fn, rescale_grad)
    if not np.isfinite(scale) or scale == 0:
        return _into(fn, out, weight.copy())
    with autograd.pause(), weight.ctx.device.active():  # CuPy computes on the current GPU
        new = _adamw_step(fn, weight, grad, mean, var, scale, lr, eta, beta1, beta2,
                          epsilon, wd, clip_gradient)
        return _written(fn, weight, out, new)


def mp_adamw_update(weight, grad, mean, var, weight32, rescale_grad, lr, eta, beta1=0.9,
                    beta2=0.999, epsilon=1e-8, wd=0, clip_gradient=-1, out=None, name=None):
    """MXNet's ``contrib.mp_adamw_update``: ``adamw_update`` on the float32 master copy
    ``weight32`` (updated in place), the result cast to the weight's dtype."""
    fn = "mp_adamw_update"
    weight = _array(fn, "weight", weight)
    grad, mean, var, weight32 = (_state(fn, a, v, weight) for a, v in (
        ("grad", grad), ("mean", mean), ("var", var), ("weight32", weight32)))
    scale = _rescale(fn, rescale_grad)
    if not np.isfinite(scale) or scale == 0:
        return _into(fn, out, weight.copy())
    with autograd.pause(), weight.ctx.device.active():
        new = _adamw_step(fn, weight32, grad, mean, var, scale, lr, eta, beta1, beta2,
                          epsilon, wd, clip_gradient)
        weight32._write()[...] = new
        return _written(fn, weight, out, new.astype(weight.dtype))


def _written(fn: str, weight: NDArray, out, raw) -> NDArray:
    if out is None:
        return NDArray(raw, weight.ctx)
    if not isinstance(out, NDArray) or out.shape != weight.shape:
        raise InputError(f"{fn}: out must be an NDArray of the weight's shape")
    out._write()[...] = raw
    return out


# -- indexing ----------------------------------------------------------------------------------

def boolean_mask(data, index, axis=0, out=None, name=None):
    """MXNet's ``contrib.boolean_mask``: the slices of ``data`` along ``axis`` where
    ``index`` is non-zero (differentiable in ``data``)."""
    fn = "boolean_mask"
    data = _array(fn, "data", data)
    axis = _axis(fn, axis, data.ndim)
    index = _array(fn, "index", index)
    if index.shape != (data.shape[axis],):
        raise InputError(f"{fn}: index must have shape ({data.shape[axis]},), got "
                         f"{index.shape}")
    kept = _op("NonZero", [_op("Not", [_op("Equal", [index, _made_on(
        index.ctx, "asarray", 0, dtype=index.dtype)])])]).reshape(-1)
    return _into(fn, out, _op("Gather", [data, kept], axis=axis))


def arange_like(data, start=0.0, step=1.0, repeat=1, ctx=None, axis=None, out=None,
                name=None):
    """MXNet's ``contrib.arange_like``: ``start, start + step, ...`` (each ``repeat`` times)
    in ``data``'s shape and dtype (``axis``: a vector as long as that axis)."""
    fn = "arange_like"
    data = _array(fn, "data", data)
    shape = data.shape if axis is None else (data.shape[_axis(fn, axis, data.ndim)],)
    repeat = _int(fn, "repeat", repeat, 1)
    count = int(np.prod(shape))
    values = start + (np.arange(count) // repeat) * float(step)
    return _into(fn, out, _made_on(data.ctx, "asarray", values.reshape(shape),
                                   dtype=data.dtype))


def index_copy(old_tensor, index_vector, new_tensor, out=None, name=None):
    """MXNet's ``contrib.index_copy``: ``old_tensor`` with its rows ``index_vector``
    replaced by ``new_tensor``'s rows (differentiable in both tensors)."""
    fn = "index_copy"
    old, new = _array(fn, "old_tensor", old_tensor), _array(fn, "new_tensor", new_tensor)
    index = _index_array(fn, "index_vector", index_vector, old.ctx)
    if index.ndim != 1 or new.shape != (index.shape[0],) + old.shape[1:]:
        raise InputError(f"{fn}: new_tensor must have shape (len(index_vector),) + "
                         f"{old.shape[1:]}, got {new.shape}")
    return _into(fn, out, _op("ScatterND", [old, index.reshape((-1, 1)), new]))


def index_array(data, axes=None, out=None, name=None):
    """MXNet's ``contrib.index_array``: each element's coordinates (along ``axes``, all by
    default) as int64, in a new last axis."""
    fn = "index_array"
    data = _array(fn, "data", data)
    chosen = range(data.ndim) if axes is None else [_axis(fn, a, data.ndim, "axes")
                                                   for a in _tuple(fn, "axes", axes)]
    grids = np.indices(data.shape, dtype=np.int64)
    stacked = np.stack([grids[a] for a in chosen], axis=-1)
    return _into(fn, out, _made_on(data.ctx, "asarray", stacked))


def allclose(a, b, rtol=1e-5, atol=1e-8, equal_nan=True, out=None, name=None):
    """MXNet's ``contrib.allclose``: 1 (uint8, shape ``()``) where every
    ``|a - b| <= atol + rtol |b|``."""
    fn = "allclose"
    a, b = _array(fn, "a", a), _array(fn, "b", b)
    close = np.allclose(a.asnumpy(), b.asnumpy(), rtol=rtol, atol=atol, equal_nan=equal_nan)
    return _into(fn, out, _made_on(a.ctx, "asarray", int(close), dtype=np.uint8))


def div_sqrt_dim(data, out=None, name=None):
    """MXNet's ``contrib.div_sqrt_dim``: ``data / sqrt(data.shape[-1])``."""
    data = _array("div_sqrt_dim", "data", data)
    return _into("div_sqrt_dim", out, data * (1.0 / np.sqrt(data.shape[-1])))


def quadratic(data, a=0.0, b=0.0, c=0.0, out=None, name=None):
    """MXNet's ``contrib.quadratic``: ``a x^2 + b x + c``."""
    data = _array("quadratic", "data", data)
    return _into("quadratic", out, data * data * float(a) + data * float(b) + float(c))


class _GradientMultiplier(autograd.Function):
    def __init__(self, scalar: float):
        super().__init__()
        self.scalar = scalar

    def forward(self, x):
        return x.copy()

    def backward(self, dy):
        return dy * self.scalar


def gradientmultiplier(data, scalar=1.0, is_int=True, out=None, name=None):
    """MXNet's ``contrib.gradientmultiplier``: the data unchanged, its gradient times
    ``scalar`` (a negative one reverses it)."""
    data = _array("gradientmultiplier", "data", data)
    return _into("gradientmultiplier", out, _GradientMultiplier(float(scalar))(data))


# -- sampling -----------------------------------------------------------------------------------

def rand_zipfian(true_classes, num_sampled, range_max, ctx=None):
    """MXNet's ``contrib.rand_zipfian``: ``num_sampled`` classes in [0, range_max) drawn
    with replacement from the approximate Zipfian distribution, P(k) = log((k + 2) /
    (k + 1)) / log(range_max + 1), and the expected counts of ``true_classes`` and of the
    drawn classes among ``num_sampled`` draws (float64), for sampled softmax. Draws on
    ``ctx`` (the current context by default)."""
    fn = "rand_zipfian"
    true_classes = _array(fn, "true_classes", true_classes)
    num_sampled, range_max = _int(fn, "num_sampled", num_sampled), \
        _int(fn, "range_max", range_max)
    if num_sampled < 1 or range_max < 1:
        raise InputError(f"{fn}: num_sampled and range_max must be positive, got "
                         f"{num_sampled} and {range_max}")
    ctx = current_context() if ctx is None else as_context(ctx)
    log_range = math.log(range_max + 1)
    draws = uniform(0, log_range, shape=(num_sampled,), dtype="float64", ctx=ctx)
    sampled = (draws.exp() - 1).astype("int64") % range_max
    return (sampled, _expected_count(true_classes.as_in_context(ctx), log_range, num_sampled),
            _expected_count(sampled, log_range, num_sampled))


def _expected_count(classes: NDArray, log_range: float, num_sampled: int) -> NDArray:
    classes = classes.astype("float64")  # in float64: an int class would divide as ints
    return ((classes + 2.0) / (classes + 1.0)).log() / log_range * num_sampled


FUNCTIONS = ["isnan", "isinf", "isfinite", "adamw_update", "mp_adamw_update", "boolean_mask",
             "arange_like", "index_copy", "index_array", "allclose", "div_sqrt_dim",
             "quadratic", "gradientmultiplier", "rand_zipfian"]
