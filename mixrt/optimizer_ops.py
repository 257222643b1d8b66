"""MXNet's optimizer update operators on NDArrays (``nd.sgd_update``, ``nd.adam_update``, ...).

Each takes the arrays and hyper-parameters MXNet's operator of that name takes and updates
its state arrays (``mom``, ``mean``, ``weight32``, ...) in place, as MXNet's do. The new
weight goes to ``out`` (in MXNet's optimizers always the weight itself) or, without ``out``,
into a new array that is returned. ``clip_gradient`` < 0 means no clipping, MXNet's default.

The arithmetic runs on the arrays' own NumPy/CuPy data in their dtype, with MXNet's
hyper-parameters rounded to float32 first (MXNet's operators take them as C floats), so a
float32 weight takes the same steps as under MXNet to within a few ulps.
``mixrt.optimizer``'s classes call these. This module imports nothing from ``mixrt.nd`` (it
makes arrays through autograd's hand-in, as the op dispatcher does), so ``mixrt.nd`` may
import it to offer these functions under its own name.
"""

from __future__ import annotations

import functools

import numpy as np

from mixrt.tape.arrays import new_array
from mixrt.base.errors import InputError, ShapeError
from mixrt.ops.device import array_module
from mixrt.runtime.training import update_rules as rules


# -- reading and writing NDArrays ----------------------------------------------------------

def _is_ndarray(value) -> bool:
    return hasattr(value, "_read") and hasattr(value, "_write") and hasattr(value, "ctx")


def _data(array, name: str, op: str):
    if not _is_ndarray(array):
        raise InputError(f"{op}: {name} must be an NDArray, got {type(array).__name__}")
    return array._read()


def _state(array, name: str, op: str, like):
    """A state array MXNet's operator updates in place: its data, ready to be written."""
    _data(array, name, op)
    if array.shape != like.shape:
        raise ShapeError(f"{op}: {name} has shape {array.shape}, the weight {like.shape}")
    return array._write()


def _result(value, weight, out, op: str):
    """``value`` into ``out`` (in place), or a new NDArray beside ``weight``."""
    if out is None:
        return new_array(value.astype(weight.dtype, copy=True), weight.ctx)
    if not _is_ndarray(out) or out.shape != weight.shape:
        raise InputError(f"{op}: out must be an NDArray of the weight's shape "
                         f"{weight.shape}")
    target = out._write()
    target[...] = value
    return out


def _f32(value) -> float:
    """A hyper-parameter as MXNet's operators see it: a C float."""
    return float(np.float32(value))


def _rescaled(xp, grad, rescale_grad, clip_gradient, dtype=None):
    """``rescale_grad * grad``, clipped to ``[-clip_gradient, clip_gradient]`` when
    ``clip_gradient`` >= 0."""
    g = grad.astype(dtype, copy=False) if dtype is not None else grad
    g = g * _f32(rescale_grad)
    if clip_gradient is not None and clip_gradient >= 0:
        bound = _f32(clip_gradient)
        g = xp.clip(g, -bound, bound)
    return g


# -- SGD and its momentum forms ------------------------------------------------------------

def _clipped(clip_gradient) -> bool:
    return clip_gradient is not None and clip_gradient >= 0


def _sgd_step(xp, weight, grad, mom, lr, momentum, wd, rescale_grad, clip_gradient,
              multi: bool = False):
    """The new weight; ``mom`` (when given) updated in place: MXNet keeps ``-lr`` inside
    the momentum buffer (``mom = momentum * mom - lr * wd * w - lr * g``; ``w += mom``),
    by the rules of runtime/training/update_rules.py, which the engine's ``mxnet_sgd`` (a parameter
    server's) and the GPU's multi-tensor kernel follow too. ``multi``: without momentum,
    the multi-tensor operator's rounding (``update_rules.multi_sgd``)."""
    clipped = _clipped(clip_gradient)
    hyper = dict(lr=lr, wd=wd, rescale_grad=rescale_grad, clip_gradient=clip_gradient)
    if mom is None:
        rule = rules.multi_sgd(clipped) if multi else rules.sgd(clipped)
        return rules.mxnet_step(rule, xp, weight, grad, {}, **hyper)
    return rules.mxnet_step(rules.sgd_mom(clipped), xp, weight, grad, {"mom": mom},
                            momentum=momentum, **hyper)


def sgd_update(weight, grad, lr, wd=0.0, rescale_grad=1.0, clip_gradient=-1.0,
               lazy_update=True, out=None, name=None):
    w = _data(weight, "weight", "sgd_update")
    g = _data(grad, "grad", "sgd_update")
    value = _sgd_step(array_module(w), w, g, None, lr, 0.0, wd, rescale_grad, clip_gradient)
    return _result(value, weight, out, "sgd_update")


def sgd_mom_update(weight, grad, mom, lr, momentum=0.0, wd=0.0, rescale_grad=1.0,
                   clip_gradient=-1.0, lazy_update=True, out=None, name=None):
    w = _data(weight, "weight", "sgd_mom_update")
    g = _data(grad, "grad", "sgd_mom_update")
    m = _state(mom, "mom", "sgd_mom_update", weight)
    value = _sgd_step(array_module(w), w, g, m, lr, momentum, wd, rescale_grad,
                      clip_gradient)
    return _result(value, weight, out, "sgd_mom_update")


def mp_sgd_update(weight, grad, weight32, lr, wd=0.0, rescale_grad=1.0, clip_gradient=-1.0,
                  lazy_update=True, out=None, name=None):
    """SGD on the float32 master copy ``weight32`` (updated in place); the weight gets it
    cast to its own dtype."""
    w32 = _state(weight32, "weight32", "mp_sgd_update", weight)
    g = _data(grad, "grad", "mp_sgd_update")
    w32[...] = _sgd_step(array_module(w32), w32, g, None, lr, 0.0, wd, rescale_grad,
                         clip_gradient)
    return _result(w32, weight, out, "mp_sgd_update")


def mp_sgd_mom_update(weight, grad, mom, weight32, lr, momentum=0.0, wd=0.0,
                      rescale_grad=1.0, clip_gradient=-1.0, lazy_update=True, out=None,
                      name=None):
    w32 = _state(weight32, "weight32", "mp_sgd_mom_update", weight)
    m = _state(mom, "mom", "mp_sgd_mom_update", weight)
    g = _data(grad, "grad", "mp_sgd_mom_update")
    w32[...] = _sgd_step(array_module(w32), w32, g, m, lr, momentum, wd, rescale_grad,
                         clip_gradient)
    return _result(w32, weight, out, "mp_sgd_mom_update")


def _nag_step(xp, weight, grad, mom, lr, momentum, wd, rescale_grad, clip_gradient,
              in_place: bool):
    """Nesterov momentum as MXNet's NAG keeps it (``-lr`` inside the buffer; the rule
    ``update_rules.nag_mom``). MXNet's kernel writes the weight before the momentum, so
    when the weight is updated in place (``out`` is the weight, or the float32 copy of the
    mixed-precision form) the momentum's decay term reads the new weight; this does the
    same, as MXNet's NAG optimizer's numbers depend on it."""
    rule = rules.nag_mom(_clipped(clip_gradient), in_place)
    return rules.mxnet_step(rule, xp, weight, grad, {"mom": mom}, lr=lr, wd=wd,
                            momentum=momentum, rescale_grad=rescale_grad,
                            clip_gradient=clip_gradient)


def nag_mom_update(weight, grad, mom, lr, momentum=0.0, wd=0.0, rescale_grad=1.0,
                   clip_gradient=-1.0, out=None, name=None):
    w = _data(weight, "weight", "nag_mom_update")
    g = _data(grad, "grad", "nag_mom_update")
    m = _state(mom, "mom", "nag_mom_update", weight)
    value = _nag_step(array_module(w), w, g, m, lr, momentum, wd, rescale_grad, clip_gradient,
                      in_place=out is weight)
    return _result(value, weight, out, "nag_mom_update")


def mp_nag_mom_update(weight, grad, mom, weight32, lr, momentum=0.0, wd=0.0,
                      rescale_grad=1.0, clip_gradient=-1.0, out=None, name=None):
    w32 = _state(weight32, "weight32", "mp_nag_mom_update", weight)
    m = _state(mom, "mom", "mp_nag_mom_update", weight)
    g = _data(grad, "grad", "mp_nag_mom_update")
    w32[...] = _nag_step(array_module(w32), w32, g, m, lr, momentum, wd, rescale_grad,
                         clip_gradient, in_place=True)
    return _result(w32, weight, out, "mp_nag_mom_update")


# -- sign methods ----------------------------------------------------------------------------

def signsgd_update(weight, grad, lr, wd=0.0, rescale_grad=1.0, clip_gradient=-1.0,
                   out=None, name=None):
    """``w = (1 - lr * wd) * w - lr * sign(g)`` (rescaling and clipping keep the sign; the
    rule ``update_rules.signsgd``)."""
    w = _data(weight, "weight", "signsgd_update")
    value = rules.mxnet_step(rules.signsgd(), array_module(w), w,
                             _data(grad, "grad", "signsgd_update"), {}, lr=lr, wd=wd)
    return _result(value, weight, out, "signsgd_update")


def signum_update(weight, grad, mom, lr, momentum=0.0, wd=0.0, rescale_grad=1.0,
                  clip_gradient=-1.0, wd_lh=0.0, out=None, name=None):
    """``mom = momentum * mom - (1 - momentum) * wd * w - (1 - momentum) * g``;
    ``w = (1 - lr * wd_lh) * w + lr * sign(mom)`` (the rule ``update_rules.signum``)."""
    w = _data(weight, "weight", "signum_update")
    m = _state(mom, "mom", "signum_update", weight)
    value = rules.mxnet_step(rules.signum(_clipped(clip_gradient)), array_module(w), w,
                             _data(grad, "grad", "signum_update"), {"mom": m}, lr=lr, wd=wd,
                             momentum=momentum, wd_lh=wd_lh, rescale_grad=rescale_grad,
                             clip_gradient=clip_gradient)
    return _result(value, weight, out, "signum_update")


# -- adaptive methods ------------------------------------------------------------------------

def adam_update(weight, grad, mean, var, lr, beta1=0.9, beta2=0.999, epsilon=1e-8, wd=0.0,
                rescale_grad=1.0, clip_gradient=-1.0, lazy_update=True, out=None, name=None):
    """One Adam step with ``lr`` already bias-corrected by the caller (MXNet's Adam folds
    ``sqrt(1 - beta2^t) / (1 - beta1^t)`` into it): weight decay joins the gradient
    before clipping, epsilon is added after the square root."""
    w = _data(weight, "weight", "adam_update")
    m = _state(mean, "mean", "adam_update", weight)
    v = _state(var, "var", "adam_update", weight)
    value = rules.mxnet_step(
        rules.adam(_clipped(clip_gradient)), array_module(w), w,
        _data(grad, "grad", "adam_update"), {"mean": m, "var": v}, lr=lr, wd=wd, beta1=beta1,
        beta2=beta2, epsilon=epsilon, rescale_grad=rescale_grad, clip_gradient=clip_gradient)
    return _result(value, weight, out, "adam_update")


def _with_decay(xp, weight, grad, wd, rescale_grad, clip_gradient):
    """``rescale_grad * g + wd * w``, then clipped (FTML's order)."""
    g = grad.astype(weight.dtype, copy=False) * _f32(rescale_grad) + _f32(wd) * weight
    if clip_gradient is not None and clip_gradient >= 0:
        g = xp.clip(g, -_f32(clip_gradient), _f32(clip_gradient))
    return g


def rmsprop_update(weight, grad, n, lr, gamma1=0.95, epsilon=1e-8, wd=0.0, rescale_grad=1.0,
                   clip_gradient=-1.0, clip_weights=-1.0, out=None, name=None):
    """``n = (1 - gamma1) g^2 + gamma1 n``; ``w -= lr * (g / sqrt(n + epsilon))`` (Tieleman
    and Hinton; epsilon inside the square root, as MXNet has it; the rule
    ``update_rules.rmsprop``)."""
    w = _data(weight, "weight", "rmsprop_update")
    state = _state(n, "n", "rmsprop_update", weight)
    rule = rules.rmsprop(_clipped(clip_gradient), _clipped(clip_weights))
    value = rules.mxnet_step(rule, array_module(w), w, _data(grad, "grad", "rmsprop_update"),
                             {"n": state}, lr=lr, wd=wd, gamma1=gamma1, epsilon=epsilon,
                             rescale_grad=rescale_grad, clip_gradient=clip_gradient,
                             clip_weights=clip_weights)
    return _result(value, weight, out, "rmsprop_update")


def rmspropalex_update(weight, grad, n, g, delta, lr, gamma1=0.95, gamma2=0.9, epsilon=1e-8,
                       wd=0.0, rescale_grad=1.0, clip_gradient=-1.0, clip_weights=-1.0,
                       out=None, name=None):
    """Centered RMSProp (Graves, 2013): running means of ``g^2`` (``n``) and ``g``
    (``g``), ``delta = gamma2 delta - lr g / sqrt(n - g_mean^2 + epsilon)``, ``w += delta``
    (the rule ``update_rules.rmsprop_centered``)."""
    w = _data(weight, "weight", "rmspropalex_update")
    states = {"n": _state(n, "n", "rmspropalex_update", weight),
              "g": _state(g, "g", "rmspropalex_update", weight),
              "delta": _state(delta, "delta", "rmspropalex_update", weight)}
    rule = rules.rmsprop_centered(_clipped(clip_gradient), _clipped(clip_weights))
    value = rules.mxnet_step(rule, array_module(w), w,
                             _data(grad, "grad", "rmspropalex_update"), states, lr=lr, wd=wd,
                             gamma1=gamma1, gamma2=gamma2, epsilon=epsilon,
                             rescale_grad=rescale_grad, clip_gradient=clip_gradient,
                             clip_weights=clip_weights)
    return _result(value, weight, out, "rmspropalex_update")


def ftrl_update(weight, grad, z, n, lr, lamda1=0.01, beta=1.0, wd=0.0, rescale_grad=1.0,
                clip_gradient=-1.0, out=None, name=None):
    """FTRL-Proximal (McMahan et al., 2013) with MXNet's parameter names (the rule
    ``update_rules.ftrl``)."""
    w = _data(weight, "weight", "ftrl_update")
    states = {"z": _state(z, "z", "ftrl_update", weight),
              "n": _state(n, "n", "ftrl_update", weight)}
    value = rules.mxnet_step(rules.ftrl(_clipped(clip_gradient)), array_module(w), w,
                             _data(grad, "grad", "ftrl_update"), states, lr=lr, wd=wd,
                             lamda1=lamda1, beta=beta, rescale_grad=rescale_grad,
                             clip_gradient=clip_gradient)
    return _result(value, weight, out, "ftrl_update")


def ftml_update(weight, grad, d, v, z, lr, t, beta1=0.6, beta2=0.999, epsilon=1e-8, wd=0.0,
                rescale_grad=1.0, clip_grad=-1.0, out=None, name=None):
    """FTML (Zheng & Kwok, 2017) at step ``t`` (1 on the first update)."""
    w = _data(weight, "weight", "ftml_update")
    d_state = _state(d, "d", "ftml_update", weight)
    v_state = _state(v, "v", "ftml_update", weight)
    z_state = _state(z, "z", "ftml_update", weight)
    xp = array_module(w)
    g = _with_decay(xp, w, _data(grad, "grad", "ftml_update"), wd, rescale_grad, clip_grad)
    beta1, beta2, lr, t = _f32(beta1), _f32(beta2), _f32(lr), int(t)
    v_state[...] = beta2 * v_state + (1 - beta2) * (g * g)
    d_t = (1 - beta1 ** t) / lr * (xp.sqrt(v_state / (1 - beta2 ** t)) + float(epsilon))
    z_state[...] = beta1 * z_state + (1 - beta1) * g - (d_t - beta1 * d_state) * w
    d_state[...] = d_t
    return _result(-z_state / d_t, weight, out, "ftml_update")


def lamb_update_phase1(weight, grad, mean, var, t, wd, beta1=0.9, beta2=0.999, epsilon=1e-6,
                       bias_correction=True, rescale_grad=1.0, clip_gradient=-1.0, out=None,
                       name=None):
    """LAMB's direction (You et al., 2019): Adam's moments, bias-corrected when asked,
    ``m / (sqrt(v) + epsilon) + wd * w``. Returns it (a new array unless ``out``)."""
    w = _data(weight, "weight", "lamb_update_phase1")
    return _lamb_direction(weight, w, grad, mean, var, t, wd, beta1, beta2, epsilon,
                           bias_correction, rescale_grad, clip_gradient, out,
                           "lamb_update_phase1")


def _lamb_direction(weight, w, grad, mean, var, t, wd, beta1, beta2, epsilon,
                    bias_correction, rescale_grad, clip_gradient, out, op):
    """The rule ``update_rules.lamb_direction`` on ``w`` (the weight's data or its float32
    copy), ``mean`` and ``var`` updated in place."""
    states = {"mean": _state(mean, "mean", op, weight), "var": _state(var, "var", op, weight)}
    powers = {"beta1_t": rules.lamb_power(beta1, t, w.dtype),
              "beta2_t": rules.lamb_power(beta2, t, w.dtype)}
    value = rules.mxnet_values(
        rules.lamb_direction(_clipped(clip_gradient), bool(bias_correction)), array_module(w),
        w, _data(grad, "grad", op), states, exact=powers, wd=wd, beta1=beta1, beta2=beta2,
        epsilon=epsilon, rescale_grad=rescale_grad, clip_gradient=clip_gradient)["direction"]
    if out is None:
        return new_array(value, weight.ctx)
    return _result(value, weight, out, op)


def lamb_update_phase2(weight, g, r1, r2, lr, lower_bound=-1.0, upper_bound=-1.0, out=None,
                       name=None):
    """``w -= lr * r1 / r2 * g`` in the weight's dtype (``r1``, the weight's norm, held to
    ``[lower_bound, upper_bound]`` where those are > 0; ``lr`` alone when either norm is
    0: ``update_rules.lamb_trust_step``)."""
    w = _data(weight, "weight", "lamb_update_phase2")
    value = w.copy()
    _trust_step(value, _data(g, "g", "lamb_update_phase2"), r1, r2, lr, lower_bound,
                upper_bound)
    return _result(value, weight, out, "lamb_update_phase2")


def _trust_step(w, direction, r1, r2, lr, lower_bound, upper_bound) -> None:
    first = float(_data(r1, "r1", "lamb_update_phase2").reshape(-1)[0])
    second = float(_data(r2, "r2", "lamb_update_phase2").reshape(-1)[0])
    rules.lamb_trust_step(array_module(w), w, direction.astype(w.dtype, copy=False), lr,
                          first, second, lower_bound, upper_bound)


def mp_lamb_update_phase1(weight, grad, mean, var, weight32, t, wd, beta1=0.9, beta2=0.999,
                          epsilon=1e-6, bias_correction=True, rescale_grad=1.0,
                          clip_gradient=-1.0, out=None, name=None):
    w32 = _data(weight32, "weight32", "mp_lamb_update_phase1")
    return _lamb_direction(weight32, w32, grad, mean, var, t, wd, beta1, beta2, epsilon,
                           bias_correction, rescale_grad, clip_gradient, out,
                           "mp_lamb_update_phase1")


def mp_lamb_update_phase2(weight, g, r1, r2, weight32, lr, lower_bound=-1.0,
                          upper_bound=-1.0, out=None, name=None):
    w32 = _state(weight32, "weight32", "mp_lamb_update_phase2", weight)
    _trust_step(w32, _data(g, "g", "mp_lamb_update_phase2"), r1, r2, lr, lower_bound,
                upper_bound)
    return _result(w32, weight, out, "mp_lamb_update_phase2")


def group_adagrad_update(weight, grad, history, lr, rescale_grad=1.0, clip_gradient=-1.0,
                         epsilon=1e-5, out=None, name=None):
    """AdaGrad with one accumulator per row: ``history`` (rows, 1) gains the row's mean
    squared gradient; ``w -= lr * g / sqrt(history + epsilon)``."""
    w = _data(weight, "weight", "group_adagrad_update")
    h = history._write() if _is_ndarray(history) else None
    if h is None or h.shape[0] != w.shape[0]:
        raise ShapeError(f"group_adagrad_update: history must be an NDArray with "
                         f"{w.shape[0]} rows")
    xp = array_module(w)
    g = _rescaled(xp, _data(grad, "grad", "group_adagrad_update"), rescale_grad,
                  clip_gradient, w.dtype)
    rows = g.reshape(g.shape[0], -1)
    h += (rows * rows).mean(axis=1).reshape(h.shape)
    scale = xp.sqrt(h.reshape(-1) + _f32(epsilon)).reshape((-1,) + (1,) * (w.ndim - 1))
    return _result(w - _f32(lr) * g / scale, weight, out, "group_adagrad_update")


# -- the multi-tensor forms (the same steps, one weight after the other) --------------------

def _groups(data, per_weight: int, num_weights: int, op: str) -> list:
    data = list(data)
    if len(data) != per_weight * int(num_weights):
        raise InputError(f"{op}: {num_weights} weights need {per_weight * int(num_weights)} "
                         f"arrays, got {len(data)}")
    return [data[i:i + per_weight] for i in range(0, len(data), per_weight)]


def _outs(out, count: int, op: str) -> list:
    if out is None:
        return [None] * count
    outs = list(out) if isinstance(out, (list, tuple)) else [out]
    if len(outs) != count:
        raise InputError(f"{op}: {count} weights need {count} outputs, got {len(outs)}")
    return outs


def _multi(step, per_weight: int, op: str, with_momentum: bool):
    def run(*data, lrs, wds, momentum=0.0, rescale_grad=1.0, clip_gradient=-1.0,
            num_weights=1, out=None, name=None):
        groups = _groups(data, per_weight, num_weights, op)
        outs = _outs(out, len(groups), op)
        extra = {"momentum": momentum} if with_momentum else {}
        results = [step(*arrays, lr=lr, wd=wd, rescale_grad=rescale_grad,
                        clip_gradient=clip_gradient, out=target, **extra)
                   for arrays, lr, wd, target in zip(groups, lrs, wds, outs)]
        return results if len(results) > 1 else results[0]
    run.__name__ = op
    run.__doc__ = f"MXNet's {op}: {step.__name__} on each of ``num_weights`` weights."
    return run


def one_multi_sgd_update(weight, grad, lr, wd=0.0, rescale_grad=1.0, clip_gradient=-1.0,
                         lazy_update=True, out=None, name=None):
    """One weight of MXNet's ``multi_sgd_update`` (not MXNet's name: its operator takes
    lists), whose kernel rounds otherwise than ``sgd_update``'s. MXNet's SGD optimizer
    runs it on every dense weight it updates without momentum."""
    w = _data(weight, "weight", "multi_sgd_update")
    g = _data(grad, "grad", "multi_sgd_update")
    value = _sgd_step(array_module(w), w, g, None, lr, 0.0, wd, rescale_grad, clip_gradient,
                      multi=True)
    return _result(value, weight, out, "multi_sgd_update")


def one_multi_mp_sgd_update(weight, grad, weight32, lr, wd=0.0, rescale_grad=1.0,
                            clip_gradient=-1.0, lazy_update=True, out=None, name=None):
    """``one_multi_sgd_update`` on the float32 master copy ``weight32`` (updated in
    place), the weight getting it cast to its own dtype."""
    w32 = _state(weight32, "weight32", "multi_mp_sgd_update", weight)
    g = _data(grad, "grad", "multi_mp_sgd_update")
    w32[...] = _sgd_step(array_module(w32), w32, g, None, lr, 0.0, wd, rescale_grad,
                         clip_gradient, multi=True)
    return _result(w32, weight, out, "multi_mp_sgd_update")


multi_sgd_update = _multi(one_multi_sgd_update, 2, "multi_sgd_update", False)
multi_sgd_mom_update = _multi(sgd_mom_update, 3, "multi_sgd_mom_update", True)
multi_mp_sgd_update = _multi(one_multi_mp_sgd_update, 3, "multi_mp_sgd_update", False)
multi_mp_sgd_mom_update = _multi(mp_sgd_mom_update, 4, "multi_mp_sgd_mom_update", True)


def _host_values(values, ctx):
    """Float32 ``values`` as an NDArray on ``ctx``."""
    result = np.asarray(values, np.float32)
    return new_array(ctx.device.put(result) if ctx.device.kind != "cpu" else result, ctx)


def multi_sum_sq(*data, num_arrays, out=None, name=None):
    """The sum of squares of each array, as one float32 NDArray of ``num_arrays`` values."""
    arrays = list(data)
    if not arrays or len(arrays) != int(num_arrays):
        raise InputError(f"multi_sum_sq: num_arrays={num_arrays} but {len(arrays)} given")
    return _host_values([float((_data(a, "data", "multi_sum_sq").astype(np.float32) ** 2)
                               .sum()) for a in arrays], arrays[0].ctx)


def _finite(array) -> bool:
    raw = _data(array, "data", "all_finite")
    return bool(array_module(raw).isfinite(raw).all())


def all_finite(data, init_output=True, out=None, name=None):
    """1.0 (float32, shape (1,)) when every element of ``data`` is finite, else 0.0."""
    return _host_values([1.0 if _finite(data) else 0.0], data.ctx)


def multi_all_finite(*data, num_arrays=1, init_output=True, out=None, name=None):
    finite = all(_finite(array) for array in data[:int(num_arrays)])
    return _host_values([1.0 if finite else 0.0], data[0].ctx)


def reset_arrays(*data, num_arrays, out=None, name=None):
    """Set every array to zero (in place)."""
    for array in data[:int(num_arrays)]:
        array._write()[...] = 0


FUNCTIONS = ("sgd_update", "sgd_mom_update", "mp_sgd_update", "mp_sgd_mom_update",
             "nag_mom_update", "mp_nag_mom_update", "signsgd_update", "signum_update",
             "adam_update", "rmsprop_update", "rmspropalex_update", "ftrl_update",
             "ftml_update", "lamb_update_phase1", "lamb_update_phase2",
             "mp_lamb_update_phase1", "mp_lamb_update_phase2", "group_adagrad_update",
             "multi_sgd_update", "multi_sgd_mom_update", "multi_mp_sgd_update",
             "multi_mp_sgd_mom_update", "multi_sum_sq", "all_finite", "multi_all_finite",
             "reset_arrays")



# -- row_sparse gradients: MXNet's lazy updates ----------------------------------------------

def _stored_rows(grad):
    """The row indices a row_sparse gradient stores (a host int64 array), else None."""
    if getattr(grad, "stype", "default") != "row_sparse":
        return None
    return np.asarray(grad._structure(), dtype=np.int64)


def _lazy_for_row_sparse(function, states: int, flag: bool = True):
    """``function`` as MXNet runs it on a row_sparse gradient: only the rows the gradient
    stores are updated (weight decay, momentum and moments included), the others keep
    their weight and states. ``flag``: the operator has ``lazy_update`` (when False, the
    update is the dense one); the FTRL operator is always lazy."""
    @functools.wraps(function)
    def run(weight, grad, *args, **kwargs):
        rows = _stored_rows(grad)
        lazy = kwargs.get("lazy_update", True) if flag else True
        if rows is None or not lazy:
            return function(weight, grad, *args, **kwargs)
        return _on_rows(function, rows, weight, grad, args[:states], args[states:], kwargs)
    return run


def _on_rows(function, rows, weight, grad, states, rest, kwargs):
    """``function`` run on the ``rows`` of every array, the results written back there."""
    op = function.__name__
    out = kwargs.pop("out", None)
    xp = array_module(_data(weight, "weight", op))
    index = xp.asarray(rows)

    def part(array, name):
        return new_array(_data(array, name, op)[index], array.ctx)
    weight_rows = part(weight, "weight")
    state_rows = [part(state, f"state {i}") for i, state in enumerate(states)]
    function(weight_rows, part(grad, "grad"), *state_rows, *rest, out=weight_rows, **kwargs)
    for state, updated in zip(states, state_rows):
        _state(state, "state", op, weight)[index] = updated._read()
    target = weight if out is None else out
    if out is None:
        target = new_array(_data(weight, "weight", op).copy(), weight.ctx)
    elif out is not weight:
        _result(_data(weight, "weight", op), weight, out, op)
    target._write()[index] = weight_rows._read()
    return target


def _on_the_arrays_device(function):
    """CuPy computes on the thread's current GPU and refuses arrays of another: each update
    runs with its first array's GPU current, whichever GPU the caller had current."""
    @functools.wraps(function)
    def run(*args, **kwargs):
        first = next((a for a in args if _is_ndarray(a)), None)
        if first is None or first.ctx.device.kind == "cpu":
            return function(*args, **kwargs)
        with first.ctx.device.active():
            return function(*args, **kwargs)
    return run


# how many state arrays follow (weight, grad) in each operator MXNet updates lazily
_LAZY = {"sgd_update": 0, "sgd_mom_update": 1, "mp_sgd_update": 1, "mp_sgd_mom_update": 2,
         "adam_update": 2}
for _name, _states in _LAZY.items():
    globals()[_name] = _lazy_for_row_sparse(globals()[_name], _states)
ftrl_update = _lazy_for_row_sparse(ftrl_update, 2, flag=False)  # noqa: F821

for _name in (*FUNCTIONS, "one_multi_sgd_update", "one_multi_mp_sgd_update"):
    globals()[_name] = _on_the_arrays_device(globals()[_name])

__all__ = list(FUNCTIONS)
