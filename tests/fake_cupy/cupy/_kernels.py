"""ElementwiseKernel and ReductionKernel on the fake: the C subset mixrt generates
(ops/elementwise/fused_elementwise.py's templates and the fused kernels: ``const T rN =
expr;`` lines, casts to a type parameter, calls, one form of ternary; a reduction that sums
a mapped expression) rewritten to NumPy and evaluated. Anything else is refused."""

from __future__ import annotations

import math
import re

import numpy as _np

from cupy._core import check_devices, ndarray, unwrap, wrap

_erf = _np.vectorize(math.erf, otypes=[_np.float64])


def _nan_max(a, b):
    return _np.where((a > b) | _np.isnan(a), a, b)


def _nan_min(a, b):
    return _np.where((a < b) | _np.isnan(a), a, b)


FUNCTIONS = {"mx_max": _nan_max, "mx_min": _nan_min, "fabs": _np.abs, "exp": _np.exp,
             "log": _np.log, "sqrt": _np.sqrt, "floor": _np.floor, "ceil": _np.ceil,
             "tanh": _np.tanh, "pow": _np.power, "where": _np.where,
             "mx_select": _np.where,
             "sin": _np.sin, "cos": _np.cos, "tan": _np.tan, "asin": _np.arcsin,
             "acos": _np.arccos, "atan": _np.arctan, "sinh": _np.sinh, "cosh": _np.cosh,
             "asinh": _np.arcsinh, "acosh": _np.arccosh, "atanh": _np.arctanh,
             "fmax": _np.fmax, "fmin": _np.fmin,
             "erf": lambda x: _erf(x).astype(_np.asarray(x).dtype)}
STATEMENT = re.compile(r"^(?:const [A-Z] )?(\w+) = (.+);$")
CAST = re.compile(r"\([A-Z]\)")  # a cast to a type parameter: NumPy's promotion stands in
TERNARY = re.compile(r"\((\w+) >= 0 \? (\w+) : (\w+) \* \(([^()]+)\)\)")


class ElementwiseKernel:
    def __init__(self, in_params, out_params, operation, name="kernel", preamble="",
                 **options):
        self.name = name
        self.inputs = [p.split()[-1] for p in in_params.split(",")]
        self.outputs = [p.split()[-1] for p in out_params.split(",")]
        self.output = self.outputs[-1]
        self.statements = []
        for line in operation.strip().splitlines():
            match = STATEMENT.match(line.strip())
            if match is None:
                raise NotImplementedError(f"fake CuPy cannot run this CUDA C: {line!r}")
            expression = TERNARY.sub(r"where(\1 >= 0, \2, \3 * (\4))",
                                     CAST.sub("", match.group(2)))
            if "?" in expression:
                raise NotImplementedError(f"fake CuPy cannot run this CUDA C: {line!r}")
            self.statements.append((match.group(1), compile(expression, name, "eval")))

    def __call__(self, *arrays):
        # as CuPy: an input may be a Python number (cast to the arrays' type); the outputs,
        # when given, are device arrays the operation may read and writes in place
        inputs, given = arrays[:len(self.inputs)], arrays[len(self.inputs):]
        if len(self.outputs) > 1 or any(isinstance(a, (int, float)) for a in inputs):
            return self._into_outputs(inputs, given)
        if not all(isinstance(a, ndarray) for a in arrays):
            raise TypeError(f"{self.name}: every argument must be a device array")
        check_devices(arrays)
        values = dict(zip(self.inputs, (unwrap(a) for a in arrays)))
        dtype = _np.result_type(*values.values())
        for register, code in self.statements:
            values[register] = _np.asarray(eval(code, dict(FUNCTIONS), values))  # noqa: S307
        result = _np.broadcast_to(values[self.output], _np.broadcast_shapes(
            *(v.shape for v in values.values() if isinstance(v, _np.ndarray))))
        if len(arrays) > len(self.inputs):
            out = arrays[len(self.inputs)]
            unwrap(out)[...] = result
            return out
        return wrap(_np.array(result, dtype=dtype))


    def _into_outputs(self, inputs, outputs):
        """Several outputs, each a given device array read and written in place."""
        if len(outputs) != len(self.outputs) or not all(isinstance(a, ndarray)
                                                        for a in outputs):
            raise TypeError(f"{self.name}: pass every output, each a device array")
        arrays = [a for a in (*inputs, *outputs) if isinstance(a, ndarray)]
        if not all(isinstance(a, (ndarray, int, float)) for a in inputs):
            raise TypeError(f"{self.name}: an input is a device array or a number")
        check_devices(arrays)
        values = {name: unwrap(a) if isinstance(a, ndarray) else a
                  for name, a in zip(self.inputs + self.outputs, (*inputs, *outputs))}
        dtype = _np.result_type(*(unwrap(a) for a in arrays))
        for register, code in self.statements:
            values[register] = _np.asarray(eval(code, dict(FUNCTIONS), values),  # noqa: S307
                                           dtype=dtype)
        for name, out in zip(self.outputs, outputs):
            unwrap(out)[...] = values[name]
        return tuple(outputs)


class ReductionKernel:
    """CuPy's ReductionKernel for the one form mixrt writes: a sum (``a + b`` from identity
    0) of ``map_expr`` over the inputs broadcast together, taken along ``axis``, the output
    in the dtype its type parameter binds to (that of the first input with that parameter)
    and ``post_map_expr`` of the form ``y = a``."""

    def __init__(self, in_params, out_params, map_expr, reduce_expr, post_map_expr, identity,
                 name="reduce_kernel", reduce_type=None, **options):
        self.name = name
        self.inputs = [p.split() for p in in_params.split(",")]
        (out_type, self.output), = [p.split() for p in out_params.split(",")]
        if reduce_expr.replace(" ", "") != "a+b" or str(identity) != "0" \
                or post_map_expr.replace(" ", "") != f"{self.output}=a":
            raise NotImplementedError(f"fake CuPy reduces only sums: {name}")
        self.out_type = out_type
        self.map = compile(CAST.sub("", map_expr), name, "eval")

    def __call__(self, *args, axis=None, keepdims=False, out=None):
        if len(args) != len(self.inputs) or not all(isinstance(a, (ndarray, int, float))
                                                    for a in args):
            raise TypeError(f"{self.name}: takes {len(self.inputs)} arrays or numbers")
        check_devices([a for a in args if isinstance(a, ndarray)])
        values = {name: unwrap(a) if isinstance(a, ndarray) else a
                  for (_, name), a in zip(self.inputs, args)}
        dtype = next(unwrap(a).dtype for (kind, _), a in zip(self.inputs, args)
                     if kind == self.out_type and isinstance(a, ndarray))
        shape = _np.broadcast_shapes(*(_np.shape(v) for v in values.values()))
        mapped = _np.broadcast_to(eval(self.map, dict(FUNCTIONS), values), shape)  # noqa: S307
        result = mapped.sum(axis=axis, keepdims=keepdims, dtype=dtype)
        if out is not None:
            unwrap(out)[...] = result
            return out
        return wrap(_np.asarray(result, dtype=dtype))
