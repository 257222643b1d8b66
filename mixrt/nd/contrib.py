"""``mixrt.nd.contrib``: MXNet 1.x's ``nd.contrib`` names that NDArray code uses most:
``isfinite``, ``isnan``, ``isinf``, ``adamw_update``, ``mp_adamw_update``, ``boolean_mask``,
``arange_like``, ``index_copy``, ``index_array``, ``allclose``, ``div_sqrt_dim``,
``quadratic``, ``gradientmultiplier``.

The tests of values give 0/1 in the data's dtype, as MXNet's. The AdamW updates are MXNet's
operators (no bias correction: the optimizer folds it into ``lr``): ``mean`` and ``var``
change in place, the new weight goes to ``out`` (MXNet's optimizer passes the weight) or into
a new array, and a ``rescale_grad`` of NaN, Inf or 0 skips the step. Their hyper-parameters are
rounded to float32 first, as MXNet's C floats are. ``multi_adamw_update`` and
``multi_mp_adamw_update`` update several weights in one call, each with its own ``lrs``,
``wds`` and ``etas`` entry (MXNet's multi-tensor kernel, whose moment updates are written
``beta1 (m - g) + g``); ``nd._internal._multi_adamw_update`` is the operator under them, its
arrays flat (weight, grad, mean, var[, weight32] per weight) with ``rescale_grad`` last.
``multi_lamb_update`` and ``multi_mp_lamb_update`` are MXNet's multi-tensor LAMB: both phases
per weight, the trust ratio from the weight's norm and its direction's.
"""

from __future__ import annotations

import math

import numpy as np

from mixrt import tape
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
    if clip_gradient >= 0:  # MXNet's kernels clip from 0 on (0 zeroes the gradient)
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
    with tape.pause(), weight.ctx.device.active():  # CuPy computes on the current GPU
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
    with tape.pause(), weight.ctx.device.active():
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


def _rescaled_gradient(xp, grad, kind, rescale, clip_gradient):
    """The gradient in the weight's dtype ``kind`` times ``rescale``, clipped to
    +-clip_gradient from 0 on, the scalars float32-rounded as MXNet's multi-tensor kernels
    take them."""
    g = grad._read().astype(kind, copy=False) * kind(_f32(rescale))
    if clip_gradient >= 0:
        g = xp.clip(g, -kind(_f32(clip_gradient)), kind(_f32(clip_gradient)))
    return g


# -- AdamW on several weights in one call -------------------------------------------------------

def _multi_adamw_step(weight, grad, mean, var, master, scale, lr, wd, eta, beta1, beta2,
                      epsilon, clip_gradient):
    """The new weight (raw, in the master copy's dtype: float32 for the mixed-precision
    form, else the weight's); ``mean``, ``var`` and ``master`` updated in place."""
    xp = weight.ctx.xp
    w = (weight if master is None else master)._read()
    kind = w.dtype.type
    g = _rescaled_gradient(xp, grad, kind, scale, clip_gradient)
    m, v = mean._write(), var._write()
    m[...] = kind(_f32(beta1)) * (m - g) + g
    square = g * g
    v[...] = kind(_f32(beta2)) * (v - square) + square
    step = kind(_f32(lr)) * m / (xp.sqrt(v) + kind(_f32(epsilon))) + kind(_f32(wd)) * w
    new = (w - kind(_f32(eta)) * step).astype(w.dtype, copy=False)
    if master is not None:
        master._write()[...] = new
    return new


def _per_weight(fn: str, arg: str, values, count: int) -> list:
    values = [values] if isinstance(values, (int, float)) else list(values)
    if len(values) != count:
        raise InputError(f"{fn}: {arg} needs one value per weight ({count}), got "
                         f"{len(values)}")
    return values


def _weight_groups(fn: str, arrays: tuple, per_weight: int, count_arg: str, count,
                   after: str = "") -> list:
    """``arrays`` in groups of ``per_weight``: a weight, then its grad, mean, var (and
    float32 master copy), each of the weight's shape."""
    count = _int(fn, count_arg, count, minimum=1)
    if len(arrays) != per_weight * count:
        raise InputError(f"{fn}: {count} weights need {per_weight * count} arrays "
                         f"({per_weight} per weight{after}), got {len(arrays)}")
    groups = []
    for start in range(0, len(arrays), per_weight):
        weight = _array(fn, "weight", arrays[start])
        names = ("grad", "mean", "var", "weight32")[:per_weight - 1]
        groups.append([weight, *(_state(fn, name, value, weight) for name, value in
                                 zip(names, arrays[start + 1:start + per_weight]))])
    return groups


def _multi_adamw(fn: str, data: tuple, per_weight: int, lrs, wds, etas, beta1, beta2,
                 epsilon, clip_gradient, num_weights, out):
    if not data:
        raise InputError(f"{fn}: no arrays given (weights, then rescale_grad)")
    groups = _weight_groups(fn, data[:-1], per_weight, "num_weights", num_weights,
                            ", then rescale_grad")
    lrs, wds, etas = (_per_weight(fn, arg, values, len(groups))
                      for arg, values in (("lrs", lrs), ("wds", wds), ("etas", etas)))
    outs = [out] if isinstance(out, NDArray) else out
    if outs is not None and len(outs) != len(groups):
        raise InputError(f"{fn}: out needs one array per weight ({len(groups)}), got "
                         f"{len(outs)}")
    scale = _rescale(fn, data[-1])
    results = []
    for index, arrays in enumerate(groups):
        weight, grad, mean, var = arrays[:4]
        master = arrays[4] if per_weight == 5 else None
        target = None if outs is None else outs[index]
        if not np.isfinite(scale) or scale == 0:  # MXNet skips the whole step
            results.append(weight.copy() if target is None else target)
            continue
        with tape.pause(), weight.ctx.device.active():
            new = _multi_adamw_step(weight, grad, mean, var, master, scale, lrs[index],
                                    wds[index], etas[index], beta1, beta2, epsilon,
                                    clip_gradient)
            results.append(_written(fn, weight, target, new.astype(weight.dtype)))
    if out is not None:
        return out
    return results[0] if len(results) == 1 else results


def _multi_adamw_update(*data, lrs, wds, etas, beta1=0.9, beta2=0.999, epsilon=1e-8,
                        clip_gradient=-1.0, num_weights=1, out=None, name=None):
    """MXNet's ``_multi_adamw_update`` operator: ``data`` is weight, grad, mean, var for
    each of ``num_weights`` weights, then ``rescale_grad`` (an NDArray of one value)."""
    return _multi_adamw("_multi_adamw_update", data, 4, lrs, wds, etas, beta1, beta2,
                        epsilon, clip_gradient, num_weights, out)


def _multi_mp_adamw_update(*data, lrs, wds, etas, beta1=0.9, beta2=0.999, epsilon=1e-8,
                           clip_gradient=-1.0, num_weights=1, out=None, name=None):
    """MXNet's ``_multi_mp_adamw_update``: as ``_multi_adamw_update`` with each weight's
    float32 master copy after its var (updated in place; the weights get it cast)."""
    return _multi_adamw("_multi_mp_adamw_update", data, 5, lrs, wds, etas, beta1, beta2,
                        epsilon, clip_gradient, num_weights, out)


def multi_adamw_update(weights, grads, mean, var, rescale_grad, lrs, wds, etas, out=None,
                       name=None, size=0, **kwargs):
    """MXNet's ``contrib.multi_adamw_update``: AdamW on each weight of ``weights`` with its
    grad, mean and var (lists), ``lrs``, ``wds`` and ``etas`` one per weight; ``kwargs``
    are ``beta1``, ``beta2``, ``epsilon``, ``clip_gradient``. ``size``: how many weights
    (default all)."""
    size = size or len(weights)
    data = [a for group in zip(weights, grads, mean, var) for a in group]
    # MXNet's wrapper makes a number an array for its operator; ours takes either
    return _multi_adamw_update(*data, rescale_grad, lrs=lrs, wds=wds, etas=etas,
                               num_weights=size, out=out, **kwargs)


def multi_mp_adamw_update(weights, grads, mean, var, weights32, rescale_grad, lrs, wds, etas,
                          out=None, name=None, size=0, **kwargs):
    """MXNet's ``contrib.multi_mp_adamw_update``: ``multi_adamw_update`` on the float32
    master copies ``weights32``, the weights getting them cast to their dtype."""
    size = size or len(weights)
    data = [a for group in zip(weights, grads, mean, var, weights32) for a in group]
    return _multi_mp_adamw_update(*data, rescale_grad, lrs=lrs, wds=wds, etas=etas,
                                  num_weights=size, out=out, **kwargs)


# -- LAMB on several weights in one call --------------------------------------------------------

def _lamb_direction(weight, grad, mean, var, master, step, wd, beta1, beta2, epsilon,
                    rescale_grad, clip_gradient, bias_correction):
    """LAMB's first phase for one weight: ``mean``/``var`` updated in place, and the float32
    direction ``m_hat / (sqrt(v_hat) + epsilon) + wd w`` (hats: bias-corrected at
    ``step``, when ``bias_correction``)."""
    xp = weight.ctx.xp
    w = (weight if master is None else master)._read()
    kind = w.dtype.type
    g = _rescaled_gradient(xp, grad, kind, rescale_grad, clip_gradient)
    m, v = mean._write(), var._write()
    b1, b2 = kind(_f32(beta1)), kind(_f32(beta2))
    m[...] = b1 * m + (kind(1) - b1) * g
    v[...] = b2 * v + (kind(1) - b2) * g * g
    m_hat, v_hat = m, v
    if bias_correction:
        m_hat = m / (kind(1) - b1 ** kind(step))
        v_hat = v / (kind(1) - b2 ** kind(step))
    direction = m_hat / (xp.sqrt(v_hat) + kind(_f32(epsilon))) + kind(_f32(wd)) * w
    return direction.astype(np.float32, copy=False)


def _trust_ratio(weight, direction, lower_bound, upper_bound) -> float:
    """LAMB's ``||w|| / ||direction||`` (``||w||`` held to the bounds that are >= 0), 1 where
    either norm is 0."""
    xp = weight.ctx.xp
    r1 = float(xp.sqrt(xp.sum(xp.square(weight._read().astype(np.float32)))))
    r2 = float(xp.sqrt(xp.sum(xp.square(direction))))
    if lower_bound >= 0:
        r1 = max(r1, _f32(lower_bound))
    if upper_bound >= 0:
        r1 = min(r1, _f32(upper_bound))
    return 1.0 if r1 == 0 or r2 == 0 else r1 / r2


def _multi_lamb(fn: str, data: tuple, per_weight: int, learning_rates, wds, step_count,
                num_tensors, out, beta1=0.9, beta2=0.999, epsilon=1e-6, rescale_grad=1.0,
                lower_bound=-1.0, upper_bound=-1.0, clip_gradient=-1.0, bias_correction=True):
    groups = _weight_groups(fn, data, per_weight, "num_tensors", num_tensors)
    rates, decays, steps = (_per_weight(fn, arg, values, len(groups)) for arg, values in (
        ("learning_rates", learning_rates), ("wds", wds), ("step_count", step_count)))
    outs = [out] if isinstance(out, NDArray) else out
    if outs is not None and len(outs) != len(groups):
        raise InputError(f"{fn}: out needs one array per weight ({len(groups)}), got "
                         f"{len(outs)}")
    results = []
    for index, arrays in enumerate(groups):
        weight, grad, mean, var = arrays[:4]
        master = arrays[4] if per_weight == 5 else None
        with tape.pause(), weight.ctx.device.active():
            direction = _lamb_direction(weight, grad, mean, var, master, steps[index],
                                        decays[index], beta1, beta2, epsilon, rescale_grad,
                                        clip_gradient, bias_correction)
            ratio = _trust_ratio(weight, direction, lower_bound, upper_bound)
            w = (weight if master is None else master)._read()
            step = w.dtype.type(_f32(rates[index])) * w.dtype.type(ratio)
            new = (w - step * direction).astype(w.dtype, copy=False)
            if master is not None:
                master._write()[...] = new
            target = None if outs is None else outs[index]
            results.append(_written(fn, weight, target, new.astype(weight.dtype)))
    if out is not None:
        return out
    return results[0] if len(results) == 1 else results


def _multi_lamb_update(*data, learning_rates, wds, step_count, num_tensors=1, out=None,
                       name=None, **options):
    """MXNet's ``_multi_lamb_update`` operator: weight, grad, mean, var per tensor; the
    options are ``beta1``, ``beta2``, ``epsilon``, ``rescale_grad``, ``lower_bound``,
    ``upper_bound``, ``clip_gradient``, ``bias_correction``."""
    return _multi_lamb("_multi_lamb_update", data, 4, learning_rates, wds, step_count,
                       num_tensors, out, **options)


def _multi_mp_lamb_update(*data, learning_rates, wds, step_count, num_tensors=1, out=None,
                          name=None, **options):
    """MXNet's ``_multi_mp_lamb_update``: ``_multi_lamb_update`` on each weight's float32
    master copy (after its var; updated in place)."""
    return _multi_lamb("_multi_mp_lamb_update", data, 5, learning_rates, wds, step_count,
                       num_tensors, out, **options)


def multi_lamb_update(weights, grads, mean, var, step_count, lrs, wds, out=None,
                      num_tensors=0, **kwargs):
    """MXNet's ``contrib.multi_lamb_update``: LAMB on each weight of ``weights`` with its
    grad, mean, var, step count, learning rate and weight decay (lists)."""
    data = [a for group in zip(weights, grads, mean, var) for a in group]
    return _multi_lamb_update(*data, learning_rates=lrs, wds=wds, step_count=step_count,
                              num_tensors=num_tensors or len(weights), out=out, **kwargs)


def multi_mp_lamb_update(weights, grads, mean, var, weights32, step_count, lrs, wds,
                         out=None, num_tensors=0, **kwargs):
    """MXNet's ``contrib.multi_mp_lamb_update``: ``multi_lamb_update`` on the float32
    master copies ``weights32``."""
    data = [a for group in zip(weights, grads, mean, var, weights32) for a in group]
    return _multi_mp_lamb_update(*data, learning_rates=lrs, wds=wds, step_count=step_count,
                                 num_tensors=num_tensors or len(weights), out=out, **kwargs)


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


class _GradientMultiplier(tape.Function):
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


FUNCTIONS = ["isnan", "isinf", "isfinite", "adamw_update", "mp_adamw_update",
             "multi_adamw_update", "multi_mp_adamw_update", "multi_lamb_update",
             "multi_mp_lamb_update", "boolean_mask",
             "arange_like", "index_copy", "index_array", "allclose", "div_sqrt_dim",
             "quadratic", "gradientmultiplier", "rand_zipfian"]
