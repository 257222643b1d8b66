"""The language MXNet's update rules are written in, once each, in text that is both Python
and C (the rules themselves are in ``runtime/training/optimizers/``, one file per optimizer),
so that every path that runs one (``mixrt.optimizer_ops`` and ``mixrt.optimizer`` on NumPy
or CuPy arrays, the engine's ``mxnet_*`` kinds on a parameter server, a multi-tensor CUDA
kernel) computes the same operations in the same order.

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


# -- what the rules of runtime/training/optimizers/ share -----------------------------------

def gradient_term(clipped: bool, factor: str) -> str:
    """``factor`` times the rescaled gradient, in MXNet's order: with clipping
    ``factor * clip(rescale_grad * grad, clip_gradient)``, without ``factor * rescale_grad
    * grad`` (the factor meets rescale_grad first)."""
    if clipped:
        return f"{factor} * clip(rescale_grad * grad, clip_gradient)"
    return f"{factor} * rescale_grad * grad"


def scalars(clipped: bool, *names: str) -> tuple[str, ...]:
    """A rule's scalars: ``names``, then ``rescale_grad`` and, clipped, ``clip_gradient``."""
    return names + ("rescale_grad",) + (("clip_gradient",) if clipped else ())


def rescaled_first(clipped: bool) -> tuple[str, ...]:
    """``g = grad * rescale_grad``, clipped: the gradient first (FTRL's, LAMB's and the
    NDArray arithmetic of AdaGrad's Python)."""
    return ("g = grad * rescale_grad",) + (("g = clip(g, clip_gradient)",) if clipped else ())


__all__ = ["Rule", "run", "mxnet_step", "mxnet_values", "cuda_statements", "CUDA_HELPERS",
           "FMAD", "as_mxnet_scalar", "gradient_term", "scalars", "rescaled_first"]
