"""Elementwise math: unary functions, binary arithmetic, comparisons, logic and bit operators,
the variadic Sum/Mean/Max/Min, Where and Clip.

Integer arithmetic follows ONNX, which follows C: Div truncates toward zero, unsigned
results wrap around, Pow keeps the base's dtype. Narrow floats (float16, bfloat16, float8) are
computed in float32 and rounded once at the end, which is both more accurate and the only way
some ufuncs exist for the ml_dtypes types.

Before opset 7 the binary ops broadcast by ``broadcast``/``axis`` attributes instead of NumPy's
rules; those versions are served by kernels named after the version (``add_6``, ``pow_1``).
"""

from __future__ import annotations

import contextlib
import functools
import math

import numpy as np

from mixrt.ops.ir.dtypes import (compute_dtype, BOOL, FLOAT8, FLOATS, INTS, NUMERIC, SIGNED_INTS,
                                 STRING, is_float)
from mixrt.ops.ir.registry import IN_PLACE, op
from mixrt.ops.ir.types import (TensorType, broadcast_like_first, broadcast_shapes,
                             broadcast_to_bool, same_as_input)

FLOAT_LIKE = FLOATS | FLOAT8


def registered(op_type: str, *versions: int, dtypes=None, infer=None, memory=None):
    """Register one kernel for several opset versions of ``op_type`` (the versions that only
    widened the type constraints keep the semantics) and attach its infer function;
    ``memory`` as ``op`` takes it."""
    def register(fn):
        for since in versions:
            fn = op(op_type, since, dtypes=dtypes, memory=memory)(fn)
        if infer is not None:
            fn.infer(infer)
        return fn
    return register


# -- helpers shared with activation.py -------------------------------------------------------

def in_compute_dtype(xp, X, fn):
    """``fn(X)`` evaluated in X's compute dtype and rounded back to X's dtype."""
    wide = compute_dtype(X.dtype)
    if wide == X.dtype:
        return fn(X)
    return fn(X.astype(wide)).astype(X.dtype)


def quiet(xp):
    """Silence NumPy's floating-point warnings: ONNX defines inf/nan results (log(0), 1/0).
    Inside :class:`quiet_numpy` (a session's run) there is nothing left to do."""
    if xp is np or xp.__name__ == "numpy":  # CuPy raises no floating-point warnings
        if _ERROR_STATE is not None and _ERROR_STATE.get() is _IGNORING[1]:
            return _NOTHING
        return np.errstate(all="ignore")
    return _NOTHING


# NumPy 2 keeps the floating-point error state in a context variable, and np.errstate makes
# a new state on every entry: ~0.9 us, once for a session's run and again in kernels that
# quiet their own ufuncs, on a one-node model of ~16 us
try:
    from numpy._core._ufunc_config import _extobj_contextvar as _ERROR_STATE
    from numpy._core._ufunc_config import _make_extobj
except ImportError:  # NumPy 1.x: np.errstate as it is
    _ERROR_STATE = _make_extobj = None

_NOTHING = contextlib.nullcontext()
_IGNORING = [None, None]  # an error state, and the same ignoring every error


def _ignoring_all():
    """The current error state with every error ignored (made once per state it is made
    from, as np.errstate(all="ignore") would make it)."""
    current = _ERROR_STATE.get()
    base, ignoring = _IGNORING
    if current is ignoring or current is base:
        return ignoring
    ignoring = _make_extobj(all="ignore")
    _IGNORING[:] = current, ignoring  # a thread with another state may replace it: no harm
    return ignoring


def quiet_enter():
    """Enter ``np.errstate(all="ignore")`` for a session's run; returns the token
    :func:`quiet_exit` takes. :class:`quiet_numpy` is the same as a ``with`` block."""
    if _ERROR_STATE is None:
        token = np.errstate(all="ignore")
        token.__enter__()
        return token
    return _ERROR_STATE.set(_ignoring_all())


def quiet_exit(token) -> None:
    if _ERROR_STATE is None:
        token.__exit__(None, None, None)
    else:
        _ERROR_STATE.reset(token)


class quiet_numpy:
    """``np.errstate(all="ignore")`` for a session's run, for a fraction of its cost; the
    kernels' own :func:`quiet` blocks inside it cost a lookup."""

    __slots__ = ("_token",)

    def __enter__(self):
        self._token = quiet_enter()
        return self

    def __exit__(self, *exc):
        quiet_exit(self._token)


def _bool_like_input(x: TensorType, **_) -> list[TensorType]:
    return [TensorType(np.dtype(bool), x.shape)]


def _shape_of_first(dtype=None):
    """Legacy (opset < 7) broadcasting: the output has A's shape."""
    def infer(A, *_, **__):
        return [TensorType(A.dtype if dtype is None else np.dtype(dtype), A.shape)]
    return infer


# -- erf, which NumPy lacks -----------------------------------------------------------------
# erf(x) = x * P(x^2) for |x| < 2.5, and 1 - exp(-x^2) / (x sqrt(pi)) * Q(1/x^2) above, with
# P and Q polynomials interpolating the exact function (math.erf/erfc) at Chebyshev nodes,
# built at import time. Float64 gets degrees good to ~1e-14 relative, float32 and narrower
# cheaper ones good to ~1e-9 (evaluated in float64, so the float32 result is correctly
# rounded almost everywhere). erf(6) is 1.0 even in float64.

_ERF_SPLIT, _ERF_ONE = 2.5, 6.0
_NEAR_T = (0.0, _ERF_SPLIT ** 2)            # P's variable x^2 ranges over this
_FAR_U = (_ERF_ONE ** -2, _ERF_SPLIT ** -2)  # Q's variable 1/x^2 ranges over this


def _interpolant(fn, interval, degree: int) -> list[float]:
    """Power-series coefficients, lowest first, in the variable mapped onto [-1, 1]."""
    lo, hi = interval
    cheb = np.polynomial.chebyshev

    def on_unit_interval(v):
        return np.array([fn(lo + (t + 1.0) * (hi - lo) / 2.0) for t in v])
    return [float(c) for c in cheb.cheb2poly(cheb.chebinterpolate(on_unit_interval, degree))]


def _erf_over_x(t):
    x = math.sqrt(t)
    return 2.0 / math.sqrt(math.pi) if x == 0 else math.erf(x) / x


def _scaled_erfc(u):
    x = 1.0 / math.sqrt(u)
    return math.sqrt(math.pi) * x * math.exp(x * x) * math.erfc(x)


_ERF_POLYNOMIALS = {  # double precision?: (P, Q)
    True: (_interpolant(_erf_over_x, _NEAR_T, 18), _interpolant(_scaled_erfc, _FAR_U, 10)),
    False: (_interpolant(_erf_over_x, _NEAR_T, 12), _interpolant(_scaled_erfc, _FAR_U, 8)),
}


def _horner(value, interval, coefficients):
    """The polynomial at ``value`` (a float64 array, overwritten) mapped from interval."""
    lo, hi = interval
    t = value
    t -= lo
    t *= 2.0 / (hi - lo)
    t -= 1.0
    result = np.full_like(t, coefficients[-1])
    for c in coefficients[-2::-1]:
        result *= t
        result += c
    return result


def erf_values(xp, x):
    """erf of a float32/float64 array, in that dtype."""
    # a helper of Erf, Gelu and FusedElementwise, not a kernel: the device picks its erf
    if xp.__name__ == "cupy":
        import cupyx.scipy.special
        return cupyx.scipy.special.erf(x)
    near_poly, far_poly = _ERF_POLYNOMIALS[x.dtype == np.float64]
    a = np.abs(x, dtype=np.float64)
    near = np.minimum(a, _ERF_SPLIT)  # NaN stays NaN here and in the result
    result = near * _horner(near * near, _NEAR_T, near_poly)
    far = a >= _ERF_SPLIT
    if far.any():  # the tails are few in practice, so only they pay for exp
        b = np.minimum(a[far], _ERF_ONE)
        scale = np.exp(-b * b) / (b * math.sqrt(math.pi))
        result[far] = 1.0 - scale * _horner(1.0 / (b * b), _FAR_U, far_poly)
    return np.copysign(result, x).astype(x.dtype, copy=False)


# -- unary math -----------------------------------------------------------------------------

def _float_unary(op_type, *versions, dtypes=FLOATS, memory=None):
    """Register a float function computed through in_compute_dtype."""
    return registered(op_type, *versions, dtypes=dtypes, infer=same_as_input, memory=memory)


@registered("Abs", 6, 13, dtypes=NUMERIC, infer=same_as_input, memory=IN_PLACE)
def abs_(xp, X):
    return in_compute_dtype(xp, X, xp.abs)


@registered("Neg", 6, 13, dtypes=FLOATS | SIGNED_INTS, infer=same_as_input, memory=IN_PLACE)
def neg(xp, X):
    return in_compute_dtype(xp, X, xp.negative)


@registered("Sign", 9, 13, dtypes=NUMERIC, infer=same_as_input)
def sign(xp, X):
    return in_compute_dtype(xp, X, xp.sign)


@_float_unary("Exp", 6, 13, memory=IN_PLACE)
def exp(xp, X):
    with quiet(xp):
        return in_compute_dtype(xp, X, xp.exp)


@_float_unary("Log", 6, 13)
def log(xp, X):
    with quiet(xp):
        return in_compute_dtype(xp, X, xp.log)


@_float_unary("Sqrt", 6, 13, memory=IN_PLACE)
def sqrt(xp, X):
    with quiet(xp):
        return in_compute_dtype(xp, X, xp.sqrt)


@_float_unary("Reciprocal", 6, 13)
def reciprocal(xp, X):
    with quiet(xp):
        return in_compute_dtype(xp, X, xp.reciprocal)


@_float_unary("Floor", 6, 13)
def floor(xp, X):
    return in_compute_dtype(xp, X, xp.floor)


@_float_unary("Ceil", 6, 13)
def ceil(xp, X):
    return in_compute_dtype(xp, X, xp.ceil)


@_float_unary("Round", 11, 22)
def round_(xp, X):
    return in_compute_dtype(xp, X, xp.round)  # halves to even, as ONNX specifies


def _trig(op_type, since, ufunc_name):
    """Sin, Cos, ... Atanh: one ufunc each, NaN outside the domain."""
    @_float_unary(op_type, since, 22)
    def kernel(xp, X):
        with quiet(xp):
            return in_compute_dtype(xp, X, getattr(xp, ufunc_name))
    kernel.__name__ = kernel.__qualname__ = op_type.lower()
    kernel.fn.__name__ = kernel.fn.__qualname__ = op_type.lower()
    return kernel


sin = _trig("Sin", 7, "sin")
cos = _trig("Cos", 7, "cos")
tan = _trig("Tan", 7, "tan")
asin = _trig("Asin", 7, "arcsin")
acos = _trig("Acos", 7, "arccos")
atan = _trig("Atan", 7, "arctan")
sinh = _trig("Sinh", 9, "sinh")
cosh = _trig("Cosh", 9, "cosh")
asinh = _trig("Asinh", 9, "arcsinh")
acosh = _trig("Acosh", 9, "arccosh")
atanh = _trig("Atanh", 9, "arctanh")


@_float_unary("Erf", 9, 13, memory=IN_PLACE)
def erf(xp, X):
    return in_compute_dtype(xp, X, lambda x: erf_values(xp, x))


def _as_native_float(xp, X):
    """ml_dtypes floats (bfloat16, float8) widened so isnan/isinf exist for them."""
    return X if X.dtype.kind == "f" else X.astype(np.float32)


@registered("IsNaN", 9, 13, 20, dtypes=FLOAT_LIKE, infer=_bool_like_input)
def isnan(xp, X):
    return xp.isnan(_as_native_float(xp, X))


@registered("IsInf", 10, 20, dtypes=FLOAT_LIKE, infer=_bool_like_input)
def isinf(xp, X, *, detect_negative=1, detect_positive=1):
    X = _as_native_float(xp, X)
    infinite = xp.isinf(X)
    if not detect_negative:
        infinite &= X > 0
    if not detect_positive:
        infinite &= X < 0
    return infinite


@registered("Not", 1, dtypes=BOOL, infer=same_as_input)
def not_(xp, X):
    return xp.logical_not(X)


@registered("BitwiseNot", 18, dtypes=INTS, infer=same_as_input)
def bitwise_not(xp, X):
    return xp.invert(X)


# -- binary arithmetic ----------------------------------------------------------------------

def _legacy_broadcast(B, A_rank: int, broadcast: int, axis):
    """Opset < 7: with broadcast=1, B's dims line up with A's starting at ``axis`` (or at the
    trailing dims when axis is absent, which is NumPy's rule)."""
    if not broadcast or axis is None or B.ndim == A_rank:
        return B
    axis = axis + A_rank if axis < 0 else axis
    return B.reshape((1,) * axis + B.shape + (1,) * (A_rank - axis - B.ndim))


@registered("Add", 7, 13, 14, dtypes=NUMERIC, infer=broadcast_like_first, memory=IN_PLACE)
def add(xp, A, B):
    return xp.add(A, B)


@registered("Sub", 7, 13, 14, dtypes=NUMERIC, infer=broadcast_like_first, memory=IN_PLACE)
def sub(xp, A, B):
    return xp.subtract(A, B)  # unsigned results wrap around, as in C


@registered("Mul", 7, 13, 14, dtypes=NUMERIC, infer=broadcast_like_first, memory=IN_PLACE)
def mul(xp, A, B):
    return xp.multiply(A, B)


def _truncating_divide(xp, A, B):
    """C integer division: the quotient rounds toward zero (floor_divide rounds down)."""
    quotient = xp.floor_divide(A, B)
    if A.dtype.kind == "i":
        inexact = xp.remainder(A, B) != 0
        quotient = quotient + (inexact & ((A < 0) != (B < 0))).astype(quotient.dtype)
    return quotient


@registered("Div", 7, 13, 14, dtypes=NUMERIC, infer=broadcast_like_first, memory=IN_PLACE)
def div(xp, A, B):
    with quiet(xp):
        if A.dtype.kind in "iu":
            return _truncating_divide(xp, A, B)
        return in_compute_dtype(xp, A, lambda a: xp.divide(a, B.astype(a.dtype)))


def _int_power(xp, X, Y):
    Y = Y.astype(X.dtype)
    if X.dtype.kind == "u":
        return xp.power(X, Y)
    negative = Y < 0
    # x ** -n truncates to 0 unless |x| == 1, and then only the parity of n matters
    exponent = xp.where(negative, Y & 1, Y)
    return xp.where(negative & (xp.abs(X) != 1), X.dtype.type(0), xp.power(X, exponent))


@registered("Pow", 7, 12, 13, 15, dtypes=FLOATS | INTS, infer=broadcast_like_first)
def pow_(xp, X, Y):
    """The result has the base's dtype whatever the exponent's."""
    with quiet(xp):
        if X.dtype.kind in "iu":
            if Y.dtype.kind in "iu":
                return _int_power(xp, X, Y)
            return xp.power(X.astype(np.float64), Y.astype(np.float64)).astype(X.dtype)
        wide = compute_dtype(X.dtype)
        exponent = Y.astype(compute_dtype(Y.dtype)) if is_float(Y.dtype) else Y
        return xp.power(X.astype(wide), exponent).astype(X.dtype)


@registered("Mod", 10, 13, 28, dtypes=NUMERIC, infer=broadcast_like_first)
def mod(xp, A, B, *, fmod=0):
    """fmod=0: the remainder takes the divisor's sign (Python's %); fmod=1: the dividend's
    (C's fmod). Both are exact, so narrow floats lose nothing in float32."""
    with quiet(xp):
        remainder = xp.fmod if fmod else _remainder(xp, A.dtype)
        return in_compute_dtype(xp, A, lambda a: remainder(a, B.astype(a.dtype)))


def _remainder(xp, dtype):
    """Python's % for ``dtype``: NumPy's remainder, or on a GPU for floats one built from C's
    fmod. CuPy computes a float remainder as a - floor(a / b) * b, which is nan for an infinite
    divisor (NumPy and the spec: -3 % inf = inf, 3 % inf = 3) and drops the sign of a zero
    result (NumPy's takes the divisor's)."""
    if xp is np or not is_float(dtype):  # a helper: one result, CuPy's float form corrected
        return xp.remainder

    def float_remainder(a, b):
        r = xp.fmod(a, b)  # exact, with the dividend's sign
        r = xp.where((r != 0) & ((r < 0) != (b < 0)), r + b, r)
        return xp.where(r == 0, xp.copysign(xp.zeros_like(r), b), r)
    return float_remainder


@registered("BitShift", 11, 28, dtypes=INTS, infer=broadcast_like_first)
def bit_shift(xp, X, Y, *, direction=None):
    if direction not in ("LEFT", "RIGHT"):
        raise ValueError(f"BitShift direction must be 'LEFT' or 'RIGHT', got {direction!r}")
    bits = X.dtype.itemsize * 8
    # a shift by a negative amount or by the width or more leaves only the sign fill
    in_range = (Y >= 0) & (Y < bits)
    amount = xp.where(in_range, Y, Y.dtype.type(0)).astype(X.dtype)
    if direction == "LEFT":
        return xp.where(in_range, xp.left_shift(X, amount), X.dtype.type(0))
    fill = xp.right_shift(X, bits - 1) if X.dtype.kind == "i" else xp.zeros_like(X)
    return xp.where(in_range, xp.right_shift(X, amount), fill)


@registered("BitwiseAnd", 18, dtypes=INTS, infer=broadcast_like_first)
def bitwise_and(xp, A, B):
    return xp.bitwise_and(A, B)


@registered("BitwiseOr", 18, dtypes=INTS, infer=broadcast_like_first)
def bitwise_or(xp, A, B):
    return xp.bitwise_or(A, B)


@registered("BitwiseXor", 18, dtypes=INTS, infer=broadcast_like_first)
def bitwise_xor(xp, A, B):
    return xp.bitwise_xor(A, B)


# -- comparisons and logic --------------------------------------------------------------------

@registered("Equal", 7, 11, 13, 19, dtypes=NUMERIC | BOOL | STRING, infer=broadcast_to_bool)
def equal(xp, A, B):
    return xp.equal(A, B)


@registered("Less", 7, 9, 13, dtypes=NUMERIC, infer=broadcast_to_bool)
def less(xp, A, B):
    return xp.less(A, B)


@registered("Greater", 7, 9, 13, dtypes=NUMERIC, infer=broadcast_to_bool)
def greater(xp, A, B):
    return xp.greater(A, B)


@registered("LessOrEqual", 12, 16, dtypes=NUMERIC, infer=broadcast_to_bool)
def less_or_equal(xp, A, B):
    return xp.less_equal(A, B)


@registered("GreaterOrEqual", 12, 16, dtypes=NUMERIC, infer=broadcast_to_bool)
def greater_or_equal(xp, A, B):
    return xp.greater_equal(A, B)


@registered("And", 7, dtypes=BOOL, infer=broadcast_to_bool)
def and_(xp, A, B):
    return xp.logical_and(A, B)


@registered("Or", 7, dtypes=BOOL, infer=broadcast_to_bool)
def or_(xp, A, B):
    return xp.logical_or(A, B)


@registered("Xor", 7, dtypes=BOOL, infer=broadcast_to_bool)
def xor(xp, A, B):
    return xp.logical_xor(A, B)


# -- opset < 7 versions of the binary ops: same math, legacy broadcasting ----------------------

def _legacy(op_type, since, modern, dtypes, output_dtype=None):
    memory = modern.kernels[0].memory  # what the modern version may do with memory
    @registered(op_type, since, dtypes=dtypes, infer=_shape_of_first(output_dtype),
                memory=memory)
    def kernel(xp, A, B, *, broadcast=0, axis=None):
        return modern(xp, A, _legacy_broadcast(B, A.ndim, broadcast, axis))
    kernel.fn.__name__ = kernel.__name__ = f"{modern.__name__.rstrip('_')}_{since}"
    return kernel


add_6 = _legacy("Add", 6, add, NUMERIC)
sub_6 = _legacy("Sub", 6, sub, NUMERIC)
mul_6 = _legacy("Mul", 6, mul, NUMERIC)
div_6 = _legacy("Div", 6, div, NUMERIC)
pow_1 = _legacy("Pow", 1, pow_, FLOATS)
equal_1 = _legacy("Equal", 1, equal, NUMERIC | BOOL, bool)
less_1 = _legacy("Less", 1, less, NUMERIC, bool)
greater_1 = _legacy("Greater", 1, greater, NUMERIC, bool)
and_1 = _legacy("And", 1, and_, BOOL, bool)
or_1 = _legacy("Or", 1, or_, BOOL, bool)
xor_1 = _legacy("Xor", 1, xor, BOOL, bool)


# -- variadic -------------------------------------------------------------------------------

def _fold(xp, ufunc, inputs):
    """ufunc folded over the inputs with NumPy broadcasting (opset 6 required equal shapes,
    which broadcasting also serves); narrow floats accumulate in float32."""
    dtype = inputs[0].dtype
    wide = compute_dtype(dtype)
    result = functools.reduce(ufunc, (x.astype(wide, copy=False) for x in inputs))
    return result.astype(dtype, copy=result is inputs[0])


@registered("Sum", 6, 8, 13, dtypes=FLOATS, infer=broadcast_like_first)
def sum_(xp, *data_0):
    return _fold(xp, xp.add, data_0)


@registered("Mean", 6, 8, 13, dtypes=FLOATS, infer=broadcast_like_first)
def mean(xp, *data_0):
    dtype = data_0[0].dtype
    total = _fold(xp, xp.add, [x.astype(compute_dtype(dtype)) for x in data_0])
    return (total / total.dtype.type(len(data_0))).astype(dtype)


@registered("Max", 6, 8, 12, 13, dtypes=NUMERIC, infer=broadcast_like_first)
def max_(xp, *data_0):
    return _fold(xp, xp.maximum, data_0)  # NaN propagates


@registered("Min", 6, 8, 12, 13, dtypes=NUMERIC, infer=broadcast_like_first)
def min_(xp, *data_0):
    return _fold(xp, xp.minimum, data_0)


def _where_type(condition, X, Y, **_):
    return [TensorType(X.dtype, broadcast_shapes(condition.shape, X.shape, Y.shape))]


@registered("Where", 9, 16, dtypes=BOOL, infer=_where_type)
def where(xp, condition, X, Y):
    # CuPy's where has no bfloat16 loop and answers such operands in float32
    return xp.where(condition, X, Y).astype(X.dtype, copy=False)


# -- Clip -----------------------------------------------------------------------------------

_FLOAT32_MAX = float(np.finfo(np.float32).max)


def _clamp(xp, X, low, high):
    """Max then Min, so that low > high gives high everywhere, as the spec says."""
    if low is not None:
        X = xp.maximum(X, low)
    if high is not None:
        X = xp.minimum(X, high)
    return X


def _bound_in(dtype, value: float):
    """A float attribute bound as a scalar of ``dtype``, saturated to its finite range (the
    default +-FLT_MAX would overflow float16)."""
    limit = float(np.finfo(dtype).max) if is_float(dtype) else np.inf
    return np.dtype(dtype).type(min(max(value, -limit), limit))


@registered("Clip", 6, dtypes=FLOATS, infer=same_as_input, memory=IN_PLACE)
def clip_6(xp, input, *, min=-_FLOAT32_MAX, max=_FLOAT32_MAX):
    return _clamp(xp, input, _bound_in(input.dtype, min), _bound_in(input.dtype, max))


@registered("Clip", 11, 12, 13, dtypes=NUMERIC, infer=same_as_input, memory=IN_PLACE)
def clip(xp, input, min=None, max=None):
    if min is None and max is None:
        return input.copy()
    low = None if min is None else min.astype(input.dtype).reshape(())
    high = None if max is None else max.astype(input.dtype).reshape(())
    return _clamp(xp, input, low, high)
