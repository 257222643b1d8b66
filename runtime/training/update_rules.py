"""MXNet's update rules written once, in text that is both Python and C, so that every path
that runs one (``mixrt.optimizer_ops`` and ``mixrt.optimizer`` on NumPy or CuPy arrays, the
engine's ``mxnet_*`` kinds on a parameter server, the multi-tensor CUDA kernels of
``runtime/training/optimizer_kernels.py``) computes the same operations in the same order.

A rule is a list of statements ``name = expression``. The expressions use ``+ - * /``,
parentheses, ``clip(x, bound)`` (MXNet's ``mshadow_op::clip``), ``sqrt``, ``sign``,
``absolute``, ``greater(x, y)`` (1 or 0) and ``widened``/``narrowed`` (to double and back,
where MXNet's C++ computes in double); Python and C parse them alike (left to right, ``*``
before ``-``). Every operand is of the weight's
dtype: the hyper-parameters are scalars of that dtype and the literals are integers, which
both languages convert to it (a C ``1.0`` would be a double in a float kernel, so float
literals are refused). A name that is not an array of the rule is a local value; an array
name reassigned is written back at the end, as a kernel stores its registers.

The arithmetic is MXNet 1.9.1's (``src/operator/optimizer_op-inl.h``): its operators take the
hyper-parameters as C floats and cast them to the weight's dtype, so a float64 weight computes
in double with float32-rounded hyper-parameters (``momentum`` 0.9 is 0.899999976158...). The
callers round them (``as_mxnet_scalar``); this module computes in whatever it is given.
MXNet's optimizers that do their arithmetic in Python NDArray operations (AdaGrad) pass
doubles, which the dtype takes as they are.

On a GPU each statement's products and sums must not be fused into multiply-adds, which
round once instead of twice: the kernels are compiled with ``--fmad=false`` (``FMAD``).
"""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass, field

import numpy as np

FMAD = "--fmad=false"  # NVRTC's option: the GPU rounds every product and sum as NumPy does

_STATEMENT = re.compile(r"^\s*([A-Za-z_]\w*)\s*=\s*(.+)$")
_FLOAT_LITERAL = re.compile(r"(?<![\w.])\d*\.\d|\d\.(?!\w)|\d[eE][-+]?\d")


@dataclass(frozen=True)
class Rule:
    """``lines`` over the ``arrays`` (read and written back), the ``inputs`` (read only) and
    the ``scalars`` (hyper-parameters in the weight's dtype)."""

    name: str
    arrays: tuple[str, ...]
    inputs: tuple[str, ...]
    scalars: tuple[str, ...]
    lines: tuple[str, ...]
    statements: tuple = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        statements = []
        for line in self.lines:
            match = _STATEMENT.match(line)
            if match is None or _FLOAT_LITERAL.search(match.group(2)):
                raise ValueError(f"rule {self.name}: {line!r} is not 'name = expression' with "
                                 f"integer literals only")
            target, expression = match.groups()
            statements.append((target, expression, compile(expression, self.name, "eval")))
        object.__setattr__(self, "statements", tuple(statements))


def as_mxnet_scalar(value) -> float:
    """A hyper-parameter as MXNet's operators hold it: a C float (then cast to the dtype)."""
    return float(np.float32(value))


# -- running a rule on arrays --------------------------------------------------------------

def run(rule: Rule, xp, dtype, arrays: dict, inputs: dict, scalars: dict,
        kept: tuple = ()) -> dict:
    """The rule's statements on NumPy or CuPy arrays of ``dtype``, one operation at a time
    (each rounds to ``dtype``, as the kernel's do); the ``arrays`` reassigned are written
    back in place, except those named in ``kept``. Returns every value by name."""
    dtype = np.dtype(dtype)
    names = {name: dtype.type(scalars[name]) for name in rule.scalars}
    names.update({name: arrays[name] for name in rule.arrays})
    names.update({name: inputs[name] for name in rule.inputs})
    functions = {**_functions(xp, dtype), "__builtins__": {}}
    for target, _, code in rule.statements:
        names[target] = eval(code, functions, names)  # noqa: S307 (this module's own text)
    for name in rule.arrays:
        if name not in kept and names[name] is not arrays[name]:
            arrays[name][...] = names[name]
    return names


@functools.lru_cache(maxsize=8)
def _functions(xp, dtype) -> dict:
    """The functions a rule may call, as MXNet's ``mshadow_op`` computes them in ``dtype``."""
    def clip(x, bound):
        """MXNet's clip: above ``bound`` is ``bound``, below ``-bound`` is ``-bound``."""
        return xp.clip(x, -bound, bound)

    def sign(x):
        """MXNet's ``(x > 0) - (x < 0)``: 0 for either zero (NumPy's keeps -0.0)."""
        return (x > 0).astype(dtype) - (x < 0).astype(dtype)

    def greater(x, y):
        return (x > y).astype(dtype)

    def widened(x):
        """``x`` as a double: where MXNet's kernel meets a double literal (LAMB's ``1.``)."""
        return x.astype(np.float64)

    def narrowed(x):
        """A double back in the weight's dtype, as the kernel's assignment rounds it."""
        return x.astype(dtype)
    return {"clip": clip, "sqrt": xp.sqrt, "sign": sign, "absolute": xp.abs,
            "greater": greater, "widened": widened, "narrowed": narrowed}


def mxnet_step(rule: Rule, xp, weight, grad, states: dict, exact: dict | None = None,
               **hyper):
    """The new weight by MXNet's ``rule`` (``weight`` itself left as it is; the ``states``
    updated in place), the gradient taken in the weight's dtype and the hyper-parameters
    rounded to C floats, as MXNet's operators take them; ``exact`` holds those that reach
    MXNet's arithmetic otherwise (doubles of its Python, values its C++ computes), taken as
    given."""
    return mxnet_values(rule, xp, weight, grad, states, exact, **hyper)["weight_out"]


def mxnet_values(rule: Rule, xp, weight, grad, states: dict, exact: dict | None = None,
                 **hyper) -> dict:
    """``mxnet_step``'s values by name, the new weight as ``weight_out`` (a rule's ``out``
    where it writes one apart from the weight)."""
    scalars = {name: as_mxnet_scalar(value) for name, value in hyper.items()}
    scalars.update(exact or {})
    names = run(rule, xp, weight.dtype, {"weight": weight, **states},
                {"grad": grad.astype(weight.dtype, copy=False)}, scalars, kept=("weight",))
    names["weight_out"] = names["out"] if "out" in names else names["weight"]
    return names


# -- the same rule as CUDA C ---------------------------------------------------------------

CUDA_HELPERS = """
__device__ __forceinline__ T clip(const T x, const T bound) {
    return x > bound ? bound : (x < -bound ? -bound : x);
}
__device__ __forceinline__ T sign(const T x) { return (T)((x > 0) - (x < 0)); }
__device__ __forceinline__ T absolute(const T x) { return x < 0 ? -x : x; }
__device__ __forceinline__ T greater(const T x, const T y) { return x > y ? (T)1 : (T)0; }
__device__ __forceinline__ double widened(const T x) { return x; }
__device__ __forceinline__ T narrowed(const double x) { return (T)x; }
"""


def cuda_statements(rule: Rule, load, store, indent: str = "        ") -> str:
    """The rule as C statements on type ``T``: each array and input loaded into a local
    (``load(name)`` is the C expression that reads it), the statements in order, then each
    array stored back (``store(name)`` the C lvalue)."""
    lines = [f"T {name} = {load(name)};" for name in rule.arrays]
    lines += [f"const T {name} = {load(name)};" for name in rule.inputs]
    declared = set(rule.arrays) | set(rule.inputs)
    for target, expression, _ in rule.statements:
        lines.append(f"{target} = {expression};" if target in declared
                     else f"T {target} = {expression};")
        declared.add(target)
    lines += [f"{store(name)} = {name};" for name in rule.arrays]
    return "".join(f"{indent}{line}\n" for line in lines)


# -- MXNet's rules -------------------------------------------------------------------------

def _gradient(clipped: bool, factor: str) -> str:
    """``factor`` times the rescaled gradient, in MXNet's order: with clipping
    ``factor * clip(rescale_grad * grad, clip_gradient)``, without ``factor * rescale_grad
    * grad`` (the factor meets rescale_grad first)."""
    if clipped:
        return f"{factor} * clip(rescale_grad * grad, clip_gradient)"
    return f"{factor} * rescale_grad * grad"


def _scalars(clipped: bool, *names: str) -> tuple[str, ...]:
    return names + ("rescale_grad",) + (("clip_gradient",) if clipped else ())


@functools.lru_cache(maxsize=None)
def sgd(clipped: bool) -> Rule:
    """MXNet's ``sgd_update`` (SGDKernel)."""
    return Rule("sgd", ("weight",), ("grad",), _scalars(clipped, "lr", "wd"), (
        f"weight = (1 - lr * wd) * weight - {_gradient(clipped, 'lr')}",))


@functools.lru_cache(maxsize=None)
def multi_sgd(clipped: bool) -> Rule:
    """MXNet's ``multi_sgd_update`` (MultiSGDKernel without momentum), which MXNet's SGD
    optimizer runs on every dense weight, even one alone: the momentum form with a zero
    buffer and momentum, ``w + (0 * 0 - lr * wd * w - lr * g)``, which rounds otherwise
    than ``sgd_update``'s ``(1 - lr * wd) * w - lr * g``."""
    return Rule("multi_sgd", ("weight",), ("grad",), _scalars(clipped, "lr", "wd"), (
        f"mom = 0 * 0 - lr * wd * weight - {_gradient(clipped, 'lr')}",
        "weight = weight + mom"))


@functools.lru_cache(maxsize=None)
def sgd_mom(clipped: bool) -> Rule:
    """MXNet's ``sgd_mom_update`` (SGDMomKernel; multi_sgd_mom_update's is the same):
    ``-lr`` lives inside the momentum buffer."""
    return Rule("sgd_mom", ("weight", "mom"), ("grad",),
                _scalars(clipped, "lr", "wd", "momentum"), (
                    f"mom = momentum * mom - lr * wd * weight - {_gradient(clipped, 'lr')}",
                    "weight = weight + mom"))


@functools.lru_cache(maxsize=None)
def nag_mom(clipped: bool, in_place: bool) -> Rule:
    """MXNet's ``nag_mom_update`` (NAGMomKernel). The kernel writes the new weight before it
    updates the momentum, which reads the weight again: in place (``out`` is the weight, as
    in MXNet's NAG optimizer) it reads the new one."""
    g = "clip(rescale_grad * grad, clip_gradient)" if clipped else "rescale_grad * grad"
    return Rule("nag_mom", ("weight", "mom"), ("grad",),
                _scalars(clipped, "lr", "wd", "momentum"), (
                    "mom = momentum * mom",
                    f"out = weight - mom + (momentum + 1) * (mom - lr * ({g} + wd * weight))",
                    *(("weight = out",) if in_place else ()),
                    f"mom = mom - lr * ({g} + wd * weight)"))


@functools.lru_cache(maxsize=None)
def adam(clipped: bool) -> Rule:
    """MXNet's ``adam_update`` (AdamUpdateKernel): weight decay joins the gradient before
    clipping; ``lr`` comes bias-corrected by the optimizer; epsilon after the square root."""
    return Rule("adam", ("weight", "mean", "var"), ("grad",),
                _scalars(clipped, "lr", "wd", "beta1", "beta2", "epsilon"), (
                    "g = grad * rescale_grad + weight * wd",
                    *(("g = clip(g, clip_gradient)",) if clipped else ()),
                    "mean = beta1 * mean + (1 - beta1) * g",
                    "var = beta2 * var + (1 - beta2) * g * g",
                    "weight = weight - lr * mean / (sqrt(var) + epsilon)"))


@functools.lru_cache(maxsize=None)
def rmsprop(clipped: bool, clipped_weights: bool) -> Rule:
    """MXNet's ``rmsprop_update`` (RMSPropUpdateKernel, Tieleman and Hinton): epsilon inside
    the square root; ``clip_weights`` clips the new weight."""
    return Rule("rmsprop", ("weight", "n"), ("grad",),
                _scalars(clipped, "lr", "wd", "gamma1", "epsilon")
                + (("clip_weights",) if clipped_weights else ()), (
                    "g = rescale_grad * grad + wd * weight",
                    *(("g = clip(g, clip_gradient)",) if clipped else ()),
                    "n = (1 - gamma1) * (g * g) + gamma1 * n",
                    "weight = weight - lr * (g / sqrt(n + epsilon))",
                    *(("weight = clip(weight, clip_weights)",) if clipped_weights else ())))


@functools.lru_cache(maxsize=None)
def rmsprop_centered(clipped: bool, clipped_weights: bool) -> Rule:
    """MXNet's ``rmspropalex_update`` (RMSPropAlexUpdateKernel, Graves 2013): running means
    of ``g * g`` (``n``) and of ``g`` (``g``); the step ``delta`` keeps a momentum
    ``gamma2``. Its square is ``(1 - gamma1) * g * g``, left to right, unlike
    ``rmsprop``'s ``(1 - gamma1) * (g * g)``."""
    return Rule("rmsprop_centered", ("weight", "n", "g", "delta"), ("grad",),
                _scalars(clipped, "lr", "wd", "gamma1", "gamma2", "epsilon")
                + (("clip_weights",) if clipped_weights else ()), (
                    "rescaled = rescale_grad * grad + wd * weight",
                    *(("rescaled = clip(rescaled, clip_gradient)",) if clipped else ()),
                    "n = (1 - gamma1) * rescaled * rescaled + gamma1 * n",
                    "g = (1 - gamma1) * rescaled + gamma1 * g",
                    "delta = gamma2 * delta - lr * rescaled / sqrt(n - g * g + epsilon)",
                    "weight = weight + delta",
                    *(("weight = clip(weight, clip_weights)",) if clipped_weights else ())))


def _rescaled_first(clipped: bool) -> tuple[str, ...]:
    """``g = grad * rescale_grad``, clipped: the gradient first (FTRL's, LAMB's and the
    NDArray arithmetic of AdaGrad's Python)."""
    return ("g = grad * rescale_grad",) + (("g = clip(g, clip_gradient)",) if clipped else ())


@functools.lru_cache(maxsize=None)
def adagrad(clipped: bool) -> Rule:
    """MXNet's AdaGrad optimizer on a dense gradient, which its Python writes as NDArray
    operations (``history[:] += square(grad)``; ``div = grad / sqrt(history + eps)``;
    ``weight[:] += (div + weight * wd) * -lr``): their scalars are doubles cast to the
    dtype, not C floats; the clip bound is (``clip``'s ``real_t``)."""
    return Rule("adagrad", ("weight", "history"), ("grad",),
                _scalars(clipped, "lr", "wd", "epsilon"), (
                    *_rescaled_first(clipped),
                    "history = history + g * g",
                    "div = g / sqrt(history + epsilon)",
                    "weight = weight + (div + weight * wd) * -lr"))


@functools.lru_cache(maxsize=None)
def ftrl(clipped: bool) -> Rule:
    """MXNet's ``ftrl_update`` (FtrlUpdateKernel, McMahan et al. 2013): ``z`` and ``n``
    accumulate; the weight is solved afresh from them, 0 where ``|z| <= lamda1``."""
    return Rule("ftrl", ("weight", "z", "n"), ("grad",),
                _scalars(clipped, "lr", "wd", "lamda1", "beta"), (
                    *_rescaled_first(clipped),
                    "z = z + (g - (sqrt(n + g * g) - sqrt(n)) * weight / lr)",
                    "n = n + g * g",
                    "weight = (sign(z) * lamda1 - z) / ((beta + sqrt(n)) / lr + wd)"
                    " * greater(absolute(z), lamda1)"))


@functools.lru_cache(maxsize=None)
def signsgd() -> Rule:
    """MXNet's ``signsgd_update`` (SignSGDKernel): the gradient's sign only, so rescaling
    and clipping change nothing."""
    return Rule("signsgd", ("weight",), ("grad",), ("lr", "wd"), (
        "weight = (1 - lr * wd) * weight - lr * sign(grad)",))


@functools.lru_cache(maxsize=None)
def signum(clipped: bool) -> Rule:
    """MXNet's ``signum_update`` (SignumKernel): the momentum of ``-(wd * w + g)`` scaled
    by ``1 - momentum``, term by term; ``wd_lh`` decays the weight apart."""
    g = "clip(rescale_grad * grad, clip_gradient)" if clipped else "rescale_grad * grad"
    return Rule("signum", ("weight", "mom"), ("grad",),
                _scalars(clipped, "lr", "wd", "momentum", "wd_lh"), (
                    f"mom = momentum * mom - (1 - momentum) * wd * weight"
                    f" - (1 - momentum) * {g}",
                    "weight = (1 - lr * wd_lh) * weight + lr * sign(mom)"))


@functools.lru_cache(maxsize=None)
def lamb_direction(clipped: bool, bias_correction: bool) -> Rule:
    """MXNet's ``lamb_update_phase1`` (LambUpdatePhaseOneKernel): Adam's moments and the
    direction ``direction`` (the weight is read, not written). ``beta1_t`` and ``beta2_t``
    are ``std::pow(beta, t)`` in the dtype; the first correction divides by the double
    ``1. - beta1_t`` (a double literal in MXNet's kernel), the second in the dtype."""
    corrected = ("mean_hat = narrowed(widened(mean) / (1 - widened(beta1_t)))",
                 "var_hat = var / (1 - beta2_t)",
                 "direction = mean_hat / (sqrt(var_hat) + epsilon) + wd * weight")
    plain = ("direction = mean / (sqrt(var) + epsilon) + wd * weight",)
    return Rule("lamb_direction", ("weight", "mean", "var"), ("grad",),
                _scalars(clipped, "wd", "beta1", "beta2", "beta1_t", "beta2_t", "epsilon"), (
                    *_rescaled_first(clipped),
                    "mean = beta1 * mean + (1 - beta1) * g",
                    "var = beta2 * var + (1 - beta2) * g * g",
                    *(corrected if bias_correction else plain)))


LAMB_STEP = Rule("lamb_step", ("weight",), ("direction",), ("lr", "r1", "r2"), (
    "rate = lr * r1 / r2",  # LambUpdatePhaseTwoKernel: the rate in the dtype, then the step
    "weight = weight - rate * direction"))


def lamb_power(beta: float, t: int, dtype) -> float:
    """``std::pow(beta, t)`` of LAMB's first phase (the C float ``beta`` raised in double,
    as C++ promotes it), in the weight's dtype."""
    return float(np.dtype(dtype).type(as_mxnet_scalar(beta) ** int(t)))


def lamb_norm(xp, array) -> float:
    """The L2 norm of LAMB's trust ratio, as mixrt computes it wherever LAMB runs (in this
    process and on a server: the same NumPy reduction in the same order, so the same bits):
    the squares summed in float32 over the flattened array, then the square root. A GPU's
    reduction (CuPy's) adds in another order."""
    values = xp.ascontiguousarray(array, dtype=np.float32).reshape(-1)
    return float(xp.sqrt((values * values).sum()))  # float32 throughout


def lamb_trust_step(xp, weight, direction, lr, r1: float, r2: float, lower_bound=None,
                    upper_bound=None):
    """``lamb_update_phase2`` in place on ``weight``: ``r1`` (the weight's norm) held to the
    bounds MXNet's Python passes (those set and > 0), the rate ``lr * r1 / r2`` in the
    dtype, ``lr`` alone where either norm is 0."""
    dtype = weight.dtype.type
    r1 = dtype(r1)
    if lower_bound is not None and lower_bound > 0:
        r1 = max(r1, dtype(as_mxnet_scalar(lower_bound)))
    if upper_bound is not None and upper_bound > 0:
        r1 = min(r1, dtype(as_mxnet_scalar(upper_bound)))
    if r1 == 0 or r2 == 0:
        r1, r2 = 1.0, 1.0  # lr * 1 / 1 is lr, as the kernel's ``lr * 1.0f``
    run(LAMB_STEP, xp, weight.dtype, {"weight": weight}, {"direction": direction},
        {"lr": as_mxnet_scalar(lr), "r1": float(r1), "r2": float(dtype(r2))})


def mxnet_adam_rate(lr: float, beta1: float, beta2: float, t: int) -> float:
    """MXNet's Adam optimizer folds the bias corrections into the rate, in Python floats
    (``lr *= math.sqrt(coef2) / coef1``: math.sqrt is correctly rounded, ``** 0.5`` need
    not be)."""
    return lr * (math.sqrt(1.0 - beta2 ** t) / (1.0 - beta1 ** t))


__all__ = ["Rule", "run", "mxnet_step", "mxnet_values", "cuda_statements", "CUDA_HELPERS",
           "FMAD", "as_mxnet_scalar", "sgd", "multi_sgd", "sgd_mom", "nag_mom", "adam",
           "rmsprop", "mxnet_adam_rate", "rmsprop_centered", "adagrad", "ftrl", "signsgd",
           "signum", "lamb_direction", "LAMB_STEP", "lamb_power", "lamb_norm",
           "lamb_trust_step"]
