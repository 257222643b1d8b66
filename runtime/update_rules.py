"""MXNet's update rules written once, in text that is both Python and C, so that every path
that runs one (``mixrt.optimizer_ops`` on NumPy or CuPy arrays, the engine's ``mxnet_sgd``,
``mxnet_adam`` and ``mxnet_rmsprop`` on a parameter server, the multi-tensor CUDA kernels of
``runtime/optimizer_kernels.py``) computes the same operations in the same order.

A rule is a list of statements ``name = expression``. The expressions use ``+ - * /``,
parentheses, ``clip(x, bound)`` (MXNet's ``mshadow_op::clip``) and ``sqrt``; Python and C
parse them alike (left to right, ``*`` before ``-``). Every operand is of the weight's
dtype: the hyper-parameters are scalars of that dtype and the literals are integers, which
both languages convert to it (a C ``1.0`` would be a double in a float kernel, so float
literals are refused). A name that is not an array of the rule is a local value; an array
name reassigned is written back at the end, as a kernel stores its registers.

The arithmetic is MXNet 1.9.1's (``src/operator/optimizer_op-inl.h``): its operators take the
hyper-parameters as C floats and cast them to the weight's dtype, so a float64 weight computes
in double with float32-rounded hyper-parameters (``momentum`` 0.9 is 0.899999976158...). The
callers round them (``as_mxnet_scalar``); this module computes in whatever it is given.

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
    functions = {"clip": _clip(xp), "sqrt": xp.sqrt, "__builtins__": {}}
    for target, _, code in rule.statements:
        names[target] = eval(code, functions, names)  # noqa: S307 (this module's own text)
    for name in rule.arrays:
        if name not in kept and names[name] is not arrays[name]:
            arrays[name][...] = names[name]
    return names


@functools.lru_cache(maxsize=4)
def _clip(xp):
    def clip(x, bound):
        """MXNet's clip: above ``bound`` is ``bound``, below ``-bound`` is ``-bound``."""
        return xp.clip(x, -bound, bound)
    return clip


def mxnet_step(rule: Rule, xp, weight, grad, states: dict, **hyper):
    """The new weight by MXNet's ``rule`` (``weight`` itself left as it is; the ``states``
    updated in place), the gradient taken in the weight's dtype and the hyper-parameters
    rounded to C floats, as MXNet's operators take them."""
    names = run(rule, xp, weight.dtype, {"weight": weight, **states},
                {"grad": grad.astype(weight.dtype, copy=False)},
                {name: as_mxnet_scalar(value) for name, value in hyper.items()},
                kept=("weight",))
    return names["out"] if "out" in names else names["weight"]


# -- the same rule as CUDA C ---------------------------------------------------------------

CUDA_HELPERS = """
__device__ __forceinline__ T clip(const T x, const T bound) {
    return x > bound ? bound : (x < -bound ? -bound : x);
}
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


def mxnet_adam_rate(lr: float, beta1: float, beta2: float, t: int) -> float:
    """MXNet's Adam optimizer folds the bias corrections into the rate, in Python floats
    (``lr *= math.sqrt(coef2) / coef1``: math.sqrt is correctly rounded, ``** 0.5`` need
    not be)."""
    return lr * (math.sqrt(1.0 - beta2 ** t) / (1.0 - beta1 ** t))


__all__ = ["Rule", "run", "mxnet_step", "cuda_statements", "CUDA_HELPERS", "FMAD", "as_mxnet_scalar",
           "sgd", "multi_sgd", "sgd_mom", "nag_mom", "adam", "rmsprop", "mxnet_adam_rate"]
