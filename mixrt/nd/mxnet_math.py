"""MXNet 1.x's elementwise math names on NDArrays: the trigonometric and hyperbolic family
and their inverses, ``degrees``/``radians``, ``expm1``, ``log1p``, ``log2``, ``log10``,
``cbrt``, ``rcbrt``, ``rsqrt``, ``reciprocal``, ``negative``, ``erf``, ``softsign``,
``hard_sigmoid``, ``smooth_l1``; the binary names (``add``, ``subtract``, ...,
``equal``, ``lesser``, ``logical_and``, ...), ``ElementWiseSum``/``add_n`` and
``elemwise_*``.

Each is composed of registered ops through ``mxnet_args._op`` (so it has a gradient, runs on
the array's device, and ``mixrt.sym`` traces the same body). Comparisons and the logical
functions give 0/1 in the array's dtype, as MXNet's. Every function takes ``out=`` (the result
is written into that NDArray, which is returned), as MXNet's operators do.

``expm1`` and ``log1p`` keep their precision near 0 without a kernel of their own:
``expm1(x) = 2t / (1 - t)`` with ``t = tanh(x / 2)`` and ``log1p(x) = 2 atanh(x / (x + 2))``
are exact identities whose right sides lose nothing for small ``x``; beyond ``|x| >= 0.5`` the
plain ``exp(x) - 1`` and ``log(1 + x)`` are as good. The small-``x`` branch reads a clipped
``x``, so the branch not taken never makes an infinite gradient.
"""

from __future__ import annotations

import functools
import inspect
import math

from mixrt.base.errors import InputError
from mixrt.nd.mxnet_args import _array, _into, _is_traced, _made_on, _op
from mixrt.nd.ndarray import NDArray


def _is_array(value) -> bool:
    return isinstance(value, NDArray) or _is_traced(value)


def accepting_out(function):
    """``function`` taking MXNet's ``out=`` (every ``mx.nd`` operator does) and ``name=``
    (a symbol's name, meaningless imperatively): the result is written into ``out`` (an
    NDArray, or a list of them for a function giving several), which is returned. A
    function that already takes ``out`` comes back as it is."""
    if "out" in inspect.signature(function).parameters:
        return function

    @functools.wraps(function)
    def with_out(*args, out=None, name=None, **kwargs):
        result = function(*args, **kwargs)
        if out is None:
            return result
        if not isinstance(result, (list, tuple)):
            return _into(function.__name__, out, result)
        targets = [out] if isinstance(out, NDArray) else list(out)
        if len(targets) != len(result):
            raise InputError(f"{function.__name__}: out has {len(targets)} array(s) for "
                             f"{len(result)} results")
        for target, value in zip(targets, result):
            _into(function.__name__, target, value)
        return out
    return with_out


def _unary(fn: str, compute, doc: str):
    def function(data, out=None, name=None):
        return _into(fn, out, compute(_array(fn, "data", data)))
    function.__name__ = function.__qualname__ = fn
    function.__doc__ = doc
    return function


def _onnx(op_type: str):
    return lambda x: _op(op_type, [x])


def _scaled(factor: float):
    return lambda x: x * factor


def _small(x, bound: float = 0.5):
    return _op("Clip", [x, _filled(-bound, x), _filled(bound, x)])


def _filled(value, like):
    """A 0-d constant of ``like``'s dtype (on its device, or in the traced graph)."""
    return _made_on(like.ctx, "asarray", value, dtype=like.dtype)


def _expm1(x):
    small = _op("Tanh", [_small(x) * 0.5])
    near_zero = (small * 2.0) / (1.0 - small)
    return _pick_small(x, near_zero, _op("Exp", [x]) - 1.0)


def _log1p(x):
    small = _small(x)
    near_zero = _op("Atanh", [small / (small + 2.0)]) * 2.0
    return _pick_small(x, near_zero, _op("Log", [x + 1.0]))


def _pick_small(x, near_zero, elsewhere):
    inside = _op("Less", [_op("Abs", [x]), _filled(0.5, x)])
    return _op("Where", [inside, near_zero, elsewhere])


def _cbrt(x):
    return _op("Sign", [x]) * _op("Pow", [_op("Abs", [x]), _filled(1.0 / 3.0, x)])


sin = _unary("sin", _onnx("Sin"), "MXNet's ``sin`` (radians).")
cos = _unary("cos", _onnx("Cos"), "MXNet's ``cos`` (radians).")
tan = _unary("tan", _onnx("Tan"), "MXNet's ``tan`` (radians).")
arcsin = _unary("arcsin", _onnx("Asin"), "MXNet's ``arcsin``: in [-pi/2, pi/2].")
arccos = _unary("arccos", _onnx("Acos"), "MXNet's ``arccos``: in [0, pi].")
arctan = _unary("arctan", _onnx("Atan"), "MXNet's ``arctan``: in [-pi/2, pi/2].")
sinh = _unary("sinh", _onnx("Sinh"), "MXNet's ``sinh``.")
cosh = _unary("cosh", _onnx("Cosh"), "MXNet's ``cosh``.")
arcsinh = _unary("arcsinh", _onnx("Asinh"), "MXNet's ``arcsinh``.")
arccosh = _unary("arccosh", _onnx("Acosh"), "MXNet's ``arccosh``.")
arctanh = _unary("arctanh", _onnx("Atanh"), "MXNet's ``arctanh``.")
degrees = _unary("degrees", _scaled(180.0 / math.pi), "MXNet's ``degrees``: radians to "
                 "degrees.")
radians = _unary("radians", _scaled(math.pi / 180.0), "MXNet's ``radians``: degrees to "
                 "radians.")
expm1 = _unary("expm1", _expm1, "MXNet's ``expm1``: ``exp(x) - 1``, precise near 0.")
log1p = _unary("log1p", _log1p, "MXNet's ``log1p``: ``log(1 + x)``, precise near 0.")
log2 = _unary("log2", lambda x: _op("Log", [x]) * (1.0 / math.log(2.0)),
              "MXNet's ``log2``.")
log10 = _unary("log10", lambda x: _op("Log", [x]) * (1.0 / math.log(10.0)),
               "MXNet's ``log10``.")
cbrt = _unary("cbrt", _cbrt, "MXNet's ``cbrt``: the real cube root (negative for x < 0).")
rcbrt = _unary("rcbrt", lambda x: _op("Reciprocal", [_cbrt(x)]), "MXNet's ``rcbrt``: "
               "``1 / cbrt(x)``.")
rsqrt = _unary("rsqrt", lambda x: _op("Reciprocal", [_op("Sqrt", [x])]), "MXNet's "
               "``rsqrt``: ``1 / sqrt(x)``.")
reciprocal = _unary("reciprocal", _onnx("Reciprocal"), "MXNet's ``reciprocal``: ``1 / x``.")
negative = _unary("negative", _onnx("Neg"), "MXNet's ``negative``: ``-x``.")
erf = _unary("erf", _onnx("Erf"), "MXNet's ``erf``, the Gauss error function.")
softsign = _unary("softsign", _onnx("Softsign"), "MXNet's ``softsign``: ``x / (1 + |x|)``.")
logical_not = _unary("logical_not", lambda x: _op("Equal", [x, _filled(0, x)]).astype(
    x.dtype), "MXNet's ``logical_not``: 1 where ``x`` is 0, else 0 (in x's dtype).")


def hard_sigmoid(data, alpha=0.2, beta=0.5, out=None, name=None):
    """MXNet's ``hard_sigmoid``: ``max(0, min(1, alpha * x + beta))``."""
    data = _array("hard_sigmoid", "data", data)
    return _into("hard_sigmoid", out, _op("HardSigmoid", [data], alpha=float(alpha),
                                          beta=float(beta)))


def smooth_l1(data, scalar=1.0, out=None, name=None):
    """MXNet's ``smooth_l1``: ``0.5 (s x)^2`` where ``|x| < 1 / s^2``, else
    ``|x| - 0.5 / s^2`` (``s`` is ``scalar``)."""
    data = _array("smooth_l1", "data", data)
    s2 = float(scalar) ** 2
    magnitude = _op("Abs", [data])
    inside = _op("Less", [magnitude, _filled(1.0 / s2, data)])
    return _into("smooth_l1", out, _op("Where", [inside, data * data * (0.5 * s2),
                                                 magnitude - 0.5 / s2]))


# -- binary names ------------------------------------------------------------------------------

def _binary(fn: str, compute, doc: str):
    def function(lhs, rhs, out=None, name=None):
        if not (_is_array(lhs) or _is_array(rhs)):
            return compute(lhs, rhs)  # two numbers, as MXNet: a number
        return _into(fn, out, compute(lhs, rhs))
    function.__name__ = function.__qualname__ = fn
    function.__doc__ = doc
    return function


def _dtype_of(lhs, rhs):
    return lhs.dtype if _is_array(lhs) else rhs.dtype


def _compare(op_type: str, negate: bool = False):
    def compute(lhs, rhs):
        if not (_is_array(lhs) or _is_array(rhs)):
            return float(_python_compare(op_type, lhs, rhs) != negate)
        result = _op(op_type, [lhs, rhs])
        if negate:
            result = _op("Not", [result])
        return result.astype(_dtype_of(lhs, rhs))
    return compute


def _python_compare(op_type: str, a, b) -> bool:
    return {"Equal": a == b, "Greater": a > b, "GreaterOrEqual": a >= b, "Less": a < b,
            "LessOrEqual": a <= b}[op_type]


def _truth(value):
    """Whether each entry is non-zero, as bool (a number: a Python bool)."""
    if not _is_array(value):
        return bool(value)
    return _op("Not", [_op("Equal", [value, _filled(0, value)])])


def _logical(op_type: str):
    def compute(lhs, rhs):
        if not (_is_array(lhs) or _is_array(rhs)):
            return float({"And": bool(lhs) and bool(rhs), "Or": bool(lhs) or bool(rhs),
                          "Xor": bool(lhs) != bool(rhs)}[op_type])
        both = [_truth(lhs), _truth(rhs)]
        return _op(op_type, both).astype(_dtype_of(lhs, rhs))
    return compute


add = _binary("add", lambda a, b: a + b, "MXNet's ``add``: ``lhs + rhs``, broadcast.")
subtract = _binary("subtract", lambda a, b: a - b, "MXNet's ``subtract``: ``lhs - rhs``.")
multiply = _binary("multiply", lambda a, b: a * b, "MXNet's ``multiply``: ``lhs * rhs``.")
divide = _binary("divide", lambda a, b: a / b, "MXNet's ``divide``: ``lhs / rhs``.")
true_divide = divide
modulo = _binary("modulo", lambda a, b: a % b, "MXNet's ``modulo``: ``lhs % rhs`` (the "
                 "sign of ``rhs``, as Python's).")
power = _binary("power", lambda a, b: a ** b, "MXNet's ``power``: ``lhs ** rhs``.")
equal = _binary("equal", _compare("Equal"), "MXNet's ``equal``: 1 where equal, else 0.")
not_equal = _binary("not_equal", _compare("Equal", negate=True), "MXNet's ``not_equal``.")
greater = _binary("greater", _compare("Greater"), "MXNet's ``greater``: 1 where lhs > rhs.")
greater_equal = _binary("greater_equal", _compare("GreaterOrEqual"),
                        "MXNet's ``greater_equal``: 1 where lhs >= rhs.")
lesser = _binary("lesser", _compare("Less"), "MXNet's ``lesser``: 1 where lhs < rhs.")
lesser_equal = _binary("lesser_equal", _compare("LessOrEqual"),
                       "MXNet's ``lesser_equal``: 1 where lhs <= rhs.")
logical_and = _binary("logical_and", _logical("And"), "MXNet's ``logical_and``: 1 where "
                      "both are non-zero.")
logical_or = _binary("logical_or", _logical("Or"), "MXNet's ``logical_or``: 1 where "
                     "either is non-zero.")
logical_xor = _binary("logical_xor", _logical("Xor"), "MXNet's ``logical_xor``: 1 where "
                      "exactly one is non-zero.")


def _same_shape(fn: str):
    def check(lhs, rhs):
        lhs, rhs = _array(fn, "lhs", lhs), _array(fn, "rhs", rhs)
        if lhs.shape != rhs.shape:
            raise InputError(f"{fn}: lhs {lhs.shape} and rhs {rhs.shape} must have the same "
                             f"shape (use broadcast_* to broadcast)")
        return lhs, rhs
    return check


def _elementwise(fn: str, compute):
    check = _same_shape(fn)

    def function(lhs, rhs, out=None, name=None):
        return _into(fn, out, compute(*check(lhs, rhs)))
    function.__name__ = function.__qualname__ = fn
    function.__doc__ = f"MXNet's ``{fn}``: of two arrays of one shape (no broadcasting)."
    return function


elemwise_add = _elementwise("elemwise_add", lambda a, b: a + b)
elemwise_sub = _elementwise("elemwise_sub", lambda a, b: a - b)
elemwise_mul = _elementwise("elemwise_mul", lambda a, b: a * b)
elemwise_div = _elementwise("elemwise_div", lambda a, b: a / b)


def check_broadcastable(fn: str, lhs, rhs) -> None:
    """MXNet's broadcasting: shapes aligned at their last axes (the shorter one read as
    having length-1 axes in front), where each pair of lengths is equal or has a 1."""
    pairs = zip(reversed(lhs.shape), reversed(rhs.shape))
    if any(a != b and 1 not in (a, b) for a, b in pairs):
        raise InputError(f"{fn}: shapes {lhs.shape} and {rhs.shape} do not broadcast "
                         f"(aligned at their last dimensions, only length-1 ones broadcast)")


def _broadcast_checked(fn: str, compute):
    def function(lhs, rhs, out=None, name=None, **ignored):
        del ignored  # MXNet's broadcast operators take any keyword, without effect
        lhs, rhs = _array(fn, "lhs", lhs), _array(fn, "rhs", rhs)
        check_broadcastable(fn, lhs, rhs)
        return _into(fn, out, compute(lhs, rhs))
    function.__name__ = function.__qualname__ = fn
    function.__doc__ = f"MXNet's ``{fn}`` (length-1 axes broadcast, shapes aligned at the end)."
    return function


broadcast_hypot = _broadcast_checked(
    "broadcast_hypot", lambda a, b: _op("Sqrt", [a * a + b * b]))
broadcast_logical_and = _broadcast_checked("broadcast_logical_and", _logical("And"))
broadcast_logical_or = _broadcast_checked("broadcast_logical_or", _logical("Or"))
broadcast_logical_xor = _broadcast_checked("broadcast_logical_xor", _logical("Xor"))


def ElementWiseSum(*args, out=None, name=None, num_args=None):
    """MXNet's ``ElementWiseSum`` (``add_n``): the sum of arrays of one shape."""
    fn = "ElementWiseSum"
    if not args:
        raise InputError(f"{fn}: needs at least one array")
    arrays = [_array(fn, f"args[{i}]", a) for i, a in enumerate(args)]
    if any(a.shape != arrays[0].shape for a in arrays):
        raise InputError(f"{fn}: the arrays must have one shape, got "
                         f"{[a.shape for a in arrays]}")
    if len(arrays) == 1:
        result = arrays[0] * 1
    elif arrays[0].dtype.kind == "f":
        result = _op("Sum", arrays)
    else:  # ONNX's Sum is for floats; integers add pairwise
        result = arrays[0]
        for array in arrays[1:]:
            result = result + array
    return _into(fn, out, result)


add_n = ElementWiseSum


FUNCTIONS = ["sin", "cos", "tan", "arcsin", "arccos", "arctan", "sinh", "cosh", "arcsinh",
             "arccosh", "arctanh", "degrees", "radians", "expm1", "log1p", "log2", "log10",
             "cbrt", "rcbrt", "rsqrt", "reciprocal", "negative", "erf", "softsign",
             "logical_not", "hard_sigmoid", "smooth_l1", "add", "subtract",
             "multiply", "divide", "true_divide", "modulo", "power", "equal", "not_equal",
             "greater", "greater_equal", "lesser", "lesser_equal", "logical_and",
             "logical_or", "logical_xor", "elemwise_add", "elemwise_sub", "elemwise_mul",
             "elemwise_div", "broadcast_hypot", "broadcast_logical_and",
             "broadcast_logical_or", "broadcast_logical_xor", "ElementWiseSum", "add_n"]
METHODS = ["sin", "cos", "tan", "arcsin", "arccos", "arctan", "sinh", "cosh", "arcsinh",
           "arccosh", "arctanh", "degrees", "radians", "expm1", "log1p", "log2", "log10",
           "cbrt", "rcbrt", "rsqrt", "reciprocal"]
