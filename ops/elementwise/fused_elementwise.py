"""``mixrt::FusedElementwise``: a chain (or small DAG) of elementwise ops run as one kernel.

The optimizer (``runtime/passes/fuse_elementwise.py``) replaces e.g. PyTorch's exported GELU,
``x * 0.5 * (1 + erf(x / sqrt 2))``, or a LayerNorm's decomposed tail with one node. The node
carries a small register program in plain ONNX attributes:

* registers ``0 .. n-1`` are the node's inputs; step ``i`` writes register ``n + i``; the
  last step's register is the output;
* ``ops`` (strings): one op name per step, from :data:`OPS`;
* ``operands`` (ints): the registers each step reads, flattened (``OPS`` gives the arity);
* ``params`` (floats): each step's constants, flattened (Pow's exponent, Clip's bounds,
  LeakyRelu's alpha, HardSigmoid's alpha and beta, a ``Scalar``'s value).

The generic kernel runs the program one array-module call per step (:meth:`Program.run`), on
any device. On the CPU (``ops/elementwise/elementwise_cpu.py``) a program whose steps all have
vectorizing loops (arithmetic, max/min, the ReLU family, clip, sqrt, x^3, float32 erf and
tanh...) runs as one generated, numba-compiled loop (``ops/elementwise/jit_elementwise.py``), one
pass over memory. Otherwise, and for small outputs, the steps are NumPy ufunc calls writing in
place: a step reuses the buffer of an operand it is the last reader of, else the output buffer
(``out``) or a pooled one, so a GELU over ``out`` allocates nothing. On the GPU
(``ops/elementwise/elementwise_gpu.py``) the program becomes one generated
``cupy.ElementwiseKernel`` (built once per distinct program and cached), so the chain is one pass
over memory. The generated source is assembled from the fixed templates below; a program read
from a file can only pick templates and supply finite float literals.
"""

from __future__ import annotations

import functools
import math
import threading
from dataclasses import dataclass
from typing import Callable

import numpy as np

from mixrt.ops.elementwise import jit_elementwise, odd_rational
from mixrt.ops.elementwise.elementwise import erf_values, quiet
from mixrt.ops.elementwise.row_blocks import BLOCK, overlaps, pick, row_blocks, same_view
from mixrt.ops.elementwise.simd_cpu import clip_, filled, relu_
from mixrt.ops.elementwise.small_routines import MAX_ROUTINES, Layout, generated
from mixrt.ops.ir.dtypes import FUSED_DTYPES
from mixrt.ops.ir.registry import IN_PLACE, MIXRT, op
from mixrt.ops.ir.types import broadcast_like_first


# -- the op table: arity, parameter count, CPU step, CUDA expression ----------------------------

@dataclass(frozen=True)
class ElementwiseOp:
    arity: int
    params: int
    cpu: Callable  # (args, params, target) -> target, computed into target
    cuda: Callable  # (*operand names, *literals) -> C++ expression


def _ufunc(fn):
    def step(args, params, target):
        return fn(*args, out=target)
    step.ufunc = fn  # called directly by the generated small-output functions
    return step


def _scalar(target, value):
    return target.dtype.type(value)


def _relu_cpu(args, params, target):
    return relu_(args[0], target)


def _sigmoid_cpu(args, params, target):
    """float32: a half plus the rational of sigmoid's odd part
    (``odd_rational.evaluate_sigmoid32``), as the compiled loop computes it (same bits on
    both paths; numba's exp would keep that loop scalar); within ~2e-7 of
    1 / (1 + exp(-x)), which other dtypes take."""
    if target.dtype == np.float32:
        return odd_rational.evaluate_sigmoid32(args[0], target, *_scratch(target.shape, 2))
    np.negative(args[0], out=target)
    np.exp(target, out=target)
    np.add(target, _scalar(target, 1), out=target)
    return np.reciprocal(target, out=target)


def _erf_cpu(args, params, target):
    if target.dtype != np.float32:
        np.copyto(target, erf_values(np, np.asarray(args[0])))
        return target
    return _erf_float32(args[0], target)


_ERF_LIMIT = odd_rational.limit("Erf")


def _erf_rational() -> tuple[np.ndarray, np.ndarray]:
    """erf's float32 rational (ops/elementwise/odd_rational.py): ~6 ulp, where the generic float64
    polynomial of ops/elementwise/elementwise.py costs several times as much."""
    return odd_rational.coefficients("Erf")


def _erf_float32(x, target):
    """erf into ``target`` through per-thread scratch (no allocation per block)."""
    return odd_rational.evaluate_float32("Erf", x, target, *_scratch(target.shape, 2))


def _tanh_cpu(args, params, target):
    """float32: the rational the compiled loop vectorizes (same bits on both paths)."""
    if target.dtype != np.float32:
        return np.tanh(args[0], out=target)
    return odd_rational.evaluate_float32("Tanh", args[0], target, *_scratch(target.shape, 2))


# Its own float32 scratch rather than workspace.scratch_arrays: carving the shared byte
# workspace per block ran the BERT GELU chain ~10% slower in an A/B pair.
_scratch_local = threading.local()


def _scratch(shape, count: int) -> list[np.ndarray]:
    """``count`` float32 buffers of ``shape`` owned by this thread, reused between calls."""
    size = math.prod(shape)
    buffer = getattr(_scratch_local, "buffer", None)
    if buffer is None or buffer.size < count * size:
        buffer = _scratch_local.buffer = np.empty(max(count * size, BLOCK), np.float32)
    return [buffer[i * size:(i + 1) * size].reshape(shape) for i in range(count)]


def _pow_cpu(args, params, target):
    (x,), (p,) = args, params
    n = jit_elementwise.small_power(p)
    if n is None:
        return np.power(x, _scalar(target, p), out=target)
    if n == 2:
        return np.multiply(x, x, out=target)
    square = np.multiply(x, x) if np.may_share_memory(x, target) else \
        np.multiply(x, x, out=target)
    return np.multiply(square, x if n == 3 else square, out=target)  # (x x) x, (x x)(x x)


def _pow_cuda(a, p):
    n = jit_elementwise.small_power(p)
    if n is None:
        return f"pow({a}, {_lit(p)})"
    return {2: f"({a} * {a})", 3: f"(({a} * {a}) * {a})", 4: f"(({a} * {a}) * ({a} * {a}))"}[n]


def _clip_cpu(args, params, target):
    low, high = params  # max then min: low > high gives high; infinite bounds do nothing
    return clip_(args[0], low, high, target)


def _leaky_relu_cpu(args, params, target):
    np.copyto(target, args[0])
    return np.multiply(target, _scalar(target, params[0]), out=target, where=target < 0)


def _hard_sigmoid_cpu(args, params, target):
    alpha, beta = params
    np.multiply(args[0], _scalar(target, alpha), out=target)
    np.add(target, _scalar(target, beta), out=target)
    return _clip_cpu([target], (0.0, 1.0), target)


def _lit(value: float) -> str:
    if not math.isfinite(value):
        raise ValueError(f"FusedElementwise: parameter {value} is not finite")
    return f"((T){float(value)!r})"


def _cuda_call(function: str):
    return lambda a: f"{function}({a})"


def _clip_cuda(a, low, high):
    inner = a if low == -math.inf else f"mx_max({a}, {_lit(low)})"
    return inner if high == math.inf else f"mx_min({inner}, {_lit(high)})"


OPS: dict[str, ElementwiseOp] = {
    "Add": ElementwiseOp(2, 0, _ufunc(np.add), lambda a, b: f"({a} + {b})"),
    "Sub": ElementwiseOp(2, 0, _ufunc(np.subtract), lambda a, b: f"({a} - {b})"),
    "Mul": ElementwiseOp(2, 0, _ufunc(np.multiply), lambda a, b: f"({a} * {b})"),
    "Div": ElementwiseOp(2, 0, _ufunc(np.divide), lambda a, b: f"({a} / {b})"),
    "Max": ElementwiseOp(2, 0, _ufunc(np.maximum), lambda a, b: f"mx_max({a}, {b})"),
    "Min": ElementwiseOp(2, 0, _ufunc(np.minimum), lambda a, b: f"mx_min({a}, {b})"),
    "Neg": ElementwiseOp(1, 0, _ufunc(np.negative), lambda a: f"(-{a})"),
    "Abs": ElementwiseOp(1, 0, _ufunc(np.abs), lambda a: f"fabs({a})"),
    "Exp": ElementwiseOp(1, 0, _ufunc(np.exp), lambda a: f"exp({a})"),
    "Log": ElementwiseOp(1, 0, _ufunc(np.log), lambda a: f"log({a})"),
    "Sqrt": ElementwiseOp(1, 0, _ufunc(np.sqrt), lambda a: f"sqrt({a})"),
    "Reciprocal": ElementwiseOp(1, 0, _ufunc(np.reciprocal), lambda a: f"((T)1 / {a})"),
    "Floor": ElementwiseOp(1, 0, _ufunc(np.floor), lambda a: f"floor({a})"),
    "Ceil": ElementwiseOp(1, 0, _ufunc(np.ceil), lambda a: f"ceil({a})"),
    "Tanh": ElementwiseOp(1, 0, _tanh_cpu, lambda a: f"tanh({a})"),
    # the unfused kernels of these call the same ufunc on float32/float64
    # (ops/elementwise/elementwise.py)
    **{name: ElementwiseOp(1, 0, _ufunc(getattr(np, ufunc)), _cuda_call(cuda))
       for name, ufunc, cuda in (
           ("Sin", "sin", "sin"), ("Cos", "cos", "cos"), ("Tan", "tan", "tan"),
           ("Asin", "arcsin", "asin"), ("Acos", "arccos", "acos"), ("Atan", "arctan", "atan"),
           ("Sinh", "sinh", "sinh"), ("Cosh", "cosh", "cosh"), ("Asinh", "arcsinh", "asinh"),
           ("Acosh", "arccosh", "acosh"), ("Atanh", "arctanh", "atanh"))},
    "Erf": ElementwiseOp(1, 0, _erf_cpu, lambda a: f"erf({a})"),
    "Relu": ElementwiseOp(1, 0, _relu_cpu, lambda a: f"mx_max({a}, (T)0)"),
    "Sigmoid": ElementwiseOp(1, 0, _sigmoid_cpu,
                             lambda a: f"((T)1 / ((T)1 + exp(-{a})))"),
    "Pow": ElementwiseOp(1, 1, _pow_cpu, _pow_cuda),
    "Clip": ElementwiseOp(1, 2, _clip_cpu, _clip_cuda),
    "LeakyRelu": ElementwiseOp(1, 1, _leaky_relu_cpu,
                               lambda a, alpha: f"({a} >= (T)0 ? {a} : {a} * {_lit(alpha)})"),
    "HardSigmoid": ElementwiseOp(
        1, 2, _hard_sigmoid_cpu,
        lambda a, alpha, beta: f"mx_min(mx_max({a} * {_lit(alpha)} + {_lit(beta)}, (T)0), (T)1)"),
    "Scalar": ElementwiseOp(0, 1, None, _lit),  # a literal; register holds a NumPy scalar
}

# -- the same steps with any array module's functions (the generic kernel) ---------------------

def _generic_ufunc(name: str):
    return lambda xp, args, params, dtype: getattr(xp, name)(*args)


def _generic_clip(xp, x, low, high, dtype):
    # max then min, as the other forms: low > high gives high; infinite bounds do nothing
    return xp.minimum(xp.maximum(x, dtype.type(low)), dtype.type(high))


def _generic_sigmoid(xp, args, params, dtype):
    one = dtype.type(1)
    return one / (one + xp.exp(-args[0]))


def _generic_leaky_relu(xp, args, params, dtype):
    x = args[0]
    return xp.where(x >= 0, x, x * dtype.type(params[0]))


def _generic_hard_sigmoid(xp, args, params, dtype):
    alpha, beta = params
    return _generic_clip(xp, args[0] * dtype.type(alpha) + dtype.type(beta), 0.0, 1.0, dtype)


GENERIC_STEPS: dict[str, Callable] = {  # name -> (xp, args, params, dtype) -> a new value
    **{name: _generic_ufunc(spec.cpu.ufunc.__name__) for name, spec in OPS.items()
       if hasattr(spec.cpu, "ufunc")},
    "Tanh": lambda xp, args, params, dtype: xp.tanh(args[0]),
    "Erf": lambda xp, args, params, dtype: erf_values(xp, args[0]),
    "Relu": lambda xp, args, params, dtype: xp.maximum(args[0], dtype.type(0)),
    "Sigmoid": _generic_sigmoid,
    "Pow": lambda xp, args, params, dtype: xp.power(args[0], dtype.type(params[0])),
    "Clip": lambda xp, args, params, dtype: _generic_clip(xp, args[0], *params, dtype),
    "LeakyRelu": _generic_leaky_relu,
    "HardSigmoid": _generic_hard_sigmoid,
    "Scalar": lambda xp, args, params, dtype: dtype.type(params[0]),
}


# -- programs --------------------------------------------------------------------------------

@dataclass(frozen=True)
class Step:
    op: str
    operands: tuple[int, ...]
    params: tuple[float, ...]


class Program:
    """A decoded, validated FusedElementwise program."""

    def __init__(self, ops, operands, params, inputs: int):
        self.inputs = inputs
        self.steps = _decode(ops, operands, params, inputs)
        last_use = {}
        for index, step in enumerate(self.steps):
            for register in step.operands:
                last_use[register] = index
        self.last_use = last_use
        # its compiled loops (ops/elementwise/jit_elementwise.py) by variant
        self.jit_kernels: dict = {}
        self.routines: dict = {}  # its generated small-output functions by operand layout

    # -- any device: one array-module call per step -------------------------------------

    def run(self, xp, inputs):
        """The program over ``inputs`` through ``xp``'s functions, each step into a new array
        (the generic kernel and the reference of the paths below)."""
        dtype = inputs[0].dtype
        values = list(inputs)
        for step in self.steps:
            values.append(GENERIC_STEPS[step.op](xp, [values[r] for r in step.operands],
                                                 step.params, dtype))
        shape = np.broadcast_shapes(*(x.shape for x in inputs))
        return xp.ascontiguousarray(xp.broadcast_to(xp.asarray(values[-1], dtype), shape))

    # -- CPU: in-place ufunc calls over cache-sized blocks --------------------------------

    def run_cpu(self, inputs, out=None, replays=None):
        routine = self.routine(inputs, out)
        if routine is not None:
            return routine(*inputs, out)
        if out is not None and all(x.shape == out.shape for x in inputs):
            shape = out.shape  # (no broadcasting to work out: GELU over hidden states)
        else:
            shape = np.broadcast_shapes(*(x.shape for x in inputs))
        alias = None  # the input that ``out`` is (an in-place plan), asked once
        if out is None:
            out = np.empty(shape, inputs[0].dtype)
        elif not out.flags.c_contiguous:
            np.copyto(out, self.run_cpu(inputs))  # compute aside
            return out
        else:
            for index, x in enumerate(inputs):
                if isinstance(x, np.ndarray) and np.may_share_memory(out, x):
                    if not same_view(out, x):  # a partial overlap: compute aside
                        np.copyto(out, self.run_cpu(inputs))
                        return out
                    alias = index if alias is None else alias
        if jit_elementwise.suits(self.steps, inputs, out, self.jit_kernels):
            if jit_elementwise.run(self.steps, inputs, out, alias, self.jit_kernels,
                                   replays):
                return out
        blocks = row_blocks(shape, inputs, out)
        if blocks is None:
            return self._run_block(inputs, out, [])
        views, out_rows, rows, step = blocks
        # one thread: these ufuncs take microseconds per block, and two Python threads
        # trading the GIL at every call ran this slower than one (ops/compiled/parallel.py)
        spare: list = []  # temporaries handed from one block to the next
        for start in range(0, rows, step):
            part = slice(start, start + step)
            self._run_block([v[part] if full else v for v, full in views], out_rows[part],
                            spare)
        return out

    def routine(self, inputs, out):
        """The program over these operands as one generated function of its ufunc calls,
        ``f(*inputs, out)`` (``out`` None: made there), with the buffers :meth:`_run_block`
        would choose chosen once; None where that path does not apply (operands of
        several dtypes or not NumPy arrays, a strided ``out`` or one partly over an input,
        an output that runs in blocks or through a compiled loop). The layout's size is
        asked first: a new sequence length's chains, which the compiled loop runs, were
        asked about aliasing and generated a routine they never called."""
        dtype = inputs[0].dtype
        key = [dtype]
        for x in inputs:
            if x.__class__ is not np.ndarray or x.dtype != dtype:
                return None
            key.append(x.shape)
        key = tuple(key)
        if out is not None and out.size >= self._no_routine_size(dtype):
            return None  # blocks or a compiled loop, whatever the layout (asked no more)
        routines = self.routines
        found = routines.get(key)
        if found is None:
            found = Layout(self, dtype, key[1:])
            if len(routines) >= MAX_ROUTINES:  # shapes from a service with dynamic axes
                routines.clear()
            routines[key] = found
        if (out is not None and out.shape != found.shape) or found.size >= 2 * BLOCK \
                or (found.compilable and found.size >= jit_elementwise.min_elements(
                    self.steps)):
            return None  # blocks, or a compiled loop may take it
        over = False
        if out is not None:
            if out.__class__ is not np.ndarray or out.dtype != dtype \
                    or not out.flags.c_contiguous:
                return None
            for x in inputs:
                if np.may_share_memory(out, x):
                    if not same_view(out, x):
                        return None
                    over = True
        made = found.routines[over]
        if made is None:
            made = found.routines[over] = generated(self, dtype, key[1:], over, OPS)
        return made

    def _no_routine_size(self, dtype) -> float:
        """The output size from which :meth:`routine` never gives a routine: blocks
        (2 x BLOCK), or a compiled loop where the program compiles for ``dtype`` (what a
        ``small_routines.Layout`` asks, without making one for each new shape: ~10 us)."""
        compilable = self.jit_kernels.get(dtype.char)
        if compilable is None:
            compilable = self.jit_kernels[dtype.char] = jit_elementwise.compilable(
                self.steps, dtype)
        limit = 2 * BLOCK
        if compilable:
            limit = min(limit, jit_elementwise.min_elements(self.steps))
        return limit

    def _run_block(self, inputs, out, spare: list):
        """The program over one block, the last step into ``out``; other steps reuse the
        buffer of an operand they are the last reader of, then ``out`` (when it aliases no
        input), then ``spare`` buffers, and allocate only when none fits."""
        dtype = inputs[0].dtype
        full = out.shape
        values, owned = list(inputs), [False] * len(inputs)
        pool = spare + ([out] if not overlaps(out, inputs) else [])
        final = len(self.steps) - 1
        for index, step in enumerate(self.steps):
            if step.op == "Scalar":
                values.append(dtype.type(step.params[0]))
                owned.append(False)
                continue
            args = [values[r] for r in step.operands]
            result_shape = np.broadcast_shapes(*(np.shape(a) for a in args))
            dying = [r for r in dict.fromkeys(step.operands)
                     if owned[r] and self.last_use[r] == index]
            target = out if index == final else pick(values, dying, pool, result_shape, dtype)
            values.append(OPS[step.op].cpu(args, step.params, target))
            owned.append(True)
            for r in dying:
                if values[r] is not target and values[r].shape == full:
                    pool.append(values[r])
                values[r] = None
        spare[:] = [b for b in pool if b is not out]
        return out

    # -- GPU: the source of one generated kernel (ops/elementwise/elementwise_gpu.py) ---------

    def cuda_source(self) -> tuple[str, str, str]:
        """(in_params, out_params, operation) of the ElementwiseKernel."""
        names = [f"in{i}" for i in range(self.inputs)]
        lines = []
        for step in self.steps:
            register = f"r{len(names)}"
            expression = OPS[step.op].cuda(*(names[r] for r in step.operands), *step.params)
            lines.append(f"const T {register} = {expression};")
            names.append(register)
        lines.append(f"out0 = {names[-1]};")
        return ", ".join(f"T {n}" for n in names[:self.inputs]), "T out0", "\n".join(lines)


def _decode(ops, operands, params, inputs: int) -> tuple[Step, ...]:
    if inputs < 1 or not ops:
        raise ValueError("FusedElementwise needs at least one input and one op")
    steps, at_operand, at_param = [], 0, 0
    for index, name in enumerate(ops):
        if name not in OPS:
            raise ValueError(f"FusedElementwise step {index}: unknown op {name!r}; expected "
                             f"one of {', '.join(OPS)}")
        spec = OPS[name]
        reads = tuple(int(r) for r in operands[at_operand:at_operand + spec.arity])
        values = tuple(float(p) for p in params[at_param:at_param + spec.params])
        if len(reads) != spec.arity or len(values) != spec.params:
            raise ValueError(f"FusedElementwise step {index} ({name}) needs {spec.arity} "
                             f"operands and {spec.params} params; the attributes run out")
        if any(not 0 <= r < inputs + index for r in reads):
            raise ValueError(f"FusedElementwise step {index} ({name}) reads registers "
                             f"{list(reads)}; only 0..{inputs + index - 1} exist there")
        steps.append(Step(name, reads, values))
        at_operand += spec.arity
        at_param += spec.params
    if at_operand != len(operands) or at_param != len(params):
        raise ValueError(f"FusedElementwise: {len(operands) - at_operand} operands and "
                         f"{len(params) - at_param} params are left over after the last op")
    return tuple(steps)


@functools.lru_cache(maxsize=512)
def program(ops: tuple, operands: tuple, params: tuple, inputs: int) -> Program:
    return Program(ops, operands, params, inputs)


# -- the kernel -------------------------------------------------------------------------------

@op("FusedElementwise", since=1, domain=MIXRT, dtypes=FUSED_DTYPES, memory=IN_PLACE)
def fused_elementwise(xp, *inputs, ops=(), operands=(), params=(), out=None, _node=None):
    """The program over ``inputs``, one array-module call per step; the CPU's and the GPU's
    one-pass forms are registered beside it (``elementwise_cpu.py``, ``elementwise_gpu.py``)."""
    compiled = node_program(_node, ops, operands, params, len(inputs))
    with quiet(xp):
        result = compiled.run(xp, inputs)
    if out is None:
        return result
    xp.copyto(out, result)
    return out


PROGRAM = ("program",)  # its place in a node's dict


def node_program(node: dict | None, ops, operands, params, inputs: int) -> Program:
    """The node's decoded program, kept in its dict: making the key of the shared cache
    from a 100-step program's attributes cost ~3 us a call."""
    found = None if node is None else node.get(PROGRAM)
    if found is None:
        found = program(tuple(ops), tuple(operands), tuple(params), inputs)
        if node is not None:
            node[PROGRAM] = found
    return found


fused_elementwise.infer(broadcast_like_first)
