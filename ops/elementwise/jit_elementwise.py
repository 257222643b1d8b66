"""FusedElementwise programs compiled into one loop on the CPU (numba), one pass over memory.

The NumPy path of ``ops/elementwise/fused_elementwise.py`` runs a program as one ufunc call per
step over cache-sized blocks: every step reads and writes its block again, and each call costs
about a microsecond. DenseNet's batch-norm + ReLU (``x * scale + shift``, ``max(., 0)`` over
256x56x56) took 0.55 ms that way and 0.065 ms as one compiled loop; the BERT encoder's GELU, 0.9 ms
against 0.1 ms.

A program becomes Python source the same way the GPU path builds its CUDA source: fixed
templates per op, operand names and finite float literals (``repr`` of a float), nothing else
from the program. The loop nest is three deep: the output's axes are merged, innermost first,
wherever every array steps through them as one axis (size-1 axes dropped, broadcast axes
stride 0), so a per-channel scale over NCHW is (1, C, H*W) and a bias over (B, S, H) is
(1, B*S, H). The outer strides are arguments; the source fixes only whether each input steps
along the innermost axis or is broadcast there. Those that are broadcast are loaded once per
row, so LLVM vectorizes the inner loop; an input that the output overwrites in place is read
through the output itself, or LLVM's overlap check would send the loop to its scalar version.
Strided outputs work too: FusedConv's epilogue runs on bands of its output.

Each generated module is written to the cache directory under the hash of its source and
compiled there once (``ops/compiled/generated.py``), or found among the wheel's prebuilt
kernels.

Only ops that LLVM turns into vector instructions are compiled: arithmetic, max/min, abs, sqrt,
floor/ceil, the ReLU family, clip, x^2, x^3 and x^4 as multiplications, and erf and tanh in float32
(rational functions, ops/elementwise/odd_rational.py, the same order of operations as the NumPy
path). exp, log and sigmoid stay on the NumPy path, whose SIMD exp/log run 6-80x faster than
numba's calls into libm.
"""

from __future__ import annotations

import math

import numpy as np

from mixrt.ops.compiled import jit_cpu, replay
from mixrt.ops.elementwise import odd_rational
from mixrt.ops.compiled.generated import kernel, kernel_module  # noqa: F401  (tests clear its cache)
from mixrt.ops.compiled.parallel import MIN_ELEMENTS, parallel_for, thread_parts
from mixrt.ops.panels import native_parts

# below this many output elements the NumPy path is as fast, and tiny tensors (the
# conformance cases) should not pay a compile each
JIT_MIN_ELEMENTS = 1 << 12
# ... but a program with a rational or a power costs tens of NumPy calls per step, whatever
# its size, against one compiled call (replayed in a bound run), so it compiles at any size
# (min_elements): GPT-2's decoder-step GELU over 1024 elements took 34 us as ufunc calls, 10
# us compiled; an MLP's GELU over 46-240 values, from 256 until 2026-12-04, ~15-25 us a
# layer as ufunc calls, its batch-1 run 0.144-0.164 ms against 0.051-0.067 compiled
COSTLY = frozenset({"Erf", "Tanh", "Pow", "Sigmoid"})
COSTLY_DIVISOR = 16  # (what an activation after a product compiles from, ops/nn/fused.py)
# programs with one of these steps are split over the intra-op threads when big (from
# native_parts.SPLIT_ELEMENTS on the native pool, 2 * MIN_ELEMENTS on Python threads); the rest
# are bound by memory, and the hand-off cost more than a second core saved: bias + ReLU over
# 256x3136 took 45 us on one thread, 62 us on two; BERT's bias + GELU 216 us on one, 148 on two
HEAVY = frozenset({"Div", "Reciprocal", "Sqrt", "Erf", "Tanh", "Sigmoid"})
AXES = 3  # the loop nest's depth; programs over layouts that merge to more stay in NumPy



# -- which programs compile --------------------------------------------------------------------

# a recorded run's call on the very arrays it was recorded with, their flat views made once
# (the replay reshapes the arrays it is given at each call: ~0.4 us an array); kept only in
# a ``replays`` dict that holds the key already (a bound caller's own, not a node's, which
# would keep the arena's memory alive through the views)
FIXED = "fixed call"


def _nan_max(a, b):
    # NumPy's maximum: NaN in either operand gives NaN
    return f"({a} if ({a} > {b} or {a} != {a}) else {b})"


def _nan_min(a, b):
    return f"({a} if ({a} < {b} or {a} != {a}) else {b})"


def _lit(value: float) -> str:
    return f"T({float(value)!r})"


def _clip(a, low, high):
    inner = a if low == -math.inf else _nan_max(a, _lit(low))
    return inner if high == math.inf else _nan_min(inner, _lit(high))


TEMPLATES = {  # op -> (source of the step's value from its operands and params)
    "Add": lambda a, b: f"({a} + {b})",
    "Sub": lambda a, b: f"({a} - {b})",
    "Mul": lambda a, b: f"({a} * {b})",
    "Div": lambda a, b: f"({a} / {b})",
    "Max": _nan_max,
    "Min": _nan_min,
    "Neg": lambda a: f"(-{a})",
    "Abs": lambda a: f"abs({a})",
    "Sqrt": lambda a: f"math.sqrt({a})",
    "Reciprocal": lambda a: f"(T(1.0) / {a})",
    "Floor": lambda a: f"np.floor({a})",
    "Ceil": lambda a: f"np.ceil({a})",
    "Relu": lambda a: _nan_max(a, "T(0.0)"),
    "Clip": _clip,
    "LeakyRelu": lambda a, alpha: f"({a} if {a} >= T(0.0) else {a} * {_lit(alpha)})",
    "HardSigmoid": lambda a, alpha, beta: _clip(f"({a} * {_lit(alpha)} + {_lit(beta)})",
                                                0.0, 1.0),
    "Pow": lambda a, p: _power(a, int(p)),  # only p in 2, 3, 4 (see compilable)
    "Erf": lambda a: f"erf32({a})",  # float32 only: a rational (ops/elementwise/odd_rational.py)
    "Tanh": lambda a: f"tanh32({a})",
    # a half plus the rational of sigmoid's odd part, as ops/elementwise/fused_elementwise.py's
    # NumPy form computes it: numba's exp is a scalar libm call that keeps the loop from
    # vectorizing (EfficientNet's SiLU took 8 of its 19 ms as NumPy's four passes)
    "Sigmoid": lambda a: f"sigmoid32({a})",
    "Scalar": _lit,
}


def small_power(p: float) -> int | None:
    """The exponent as an int when Pow(x, p) is computed by multiplying: 2, 3 or 4, as
    onnxruntime does x^2 and x^3 (NumPy's float32 power cost ~60 ns an element)."""
    return int(p) if p in (2.0, 3.0, 4.0) else None


def _power(a, n: int) -> str:
    # the association order of ops/elementwise/fused_elementwise._pow_cpu: the same bits on both
    # paths
    return {2: f"({a} * {a})", 3: f"(({a} * {a}) * {a})", 4: f"(({a} * {a}) * ({a} * {a}))"}[n]


# the templates other generated kernels reuse (ops/conv/jit_depthwise.py's Swish)
literal_source = _lit

RATIONAL = {"Erf": "erf32", "Tanh": "tanh32", "Sigmoid": "sigmoid32"}  # float32 only
RATIONAL_OF = {"Erf": "Erf", "Tanh": "Tanh", "Sigmoid": "Sigmoid"}  # the rational a step uses


def compilable(steps, dtype) -> bool:
    """Whether every step has a vectorizing template for ``dtype``."""
    if np.dtype(dtype) not in jit_cpu.NATIVE:
        return False
    for step in steps:
        if step.op not in TEMPLATES or not all(math.isfinite(p) for p in step.params
                                                if step.op != "Clip"):
            return False
        if step.op == "Pow" and small_power(step.params[0]) is None:
            return False
        if step.op in RATIONAL_OF and np.dtype(dtype) != np.float32:
            return False
    return True


# -- layouts -------------------------------------------------------------------------------------

def layout(out, inputs):
    """The loop nest for ``out`` and the inputs broadcast to its shape: (dims, strides), where
    ``dims`` are AXES sizes whose product is out's size and ``strides[a]`` the element
    strides of array a (the inputs, then ``out``) along them; 0 where an input is broadcast.
    Output axes are merged, innermost first, wherever every array steps through them as one
    axis. None when they do not merge into AXES, when an innermost stride is neither 0 nor 1
    (no vector loads), or when a stride is negative or not a whole number of elements."""
    shape = out.shape
    if out.flags.c_contiguous and out.size > 1 and all(
            x.shape == shape and x.flags.c_contiguous for x in inputs):
        # one run of every array (GELU over a new sequence length's hidden states): what
        # _layout merges them into, without a key per shape (~10 us a new shape)
        return (1, 1, out.size), ((0, 0, 1),) * (len(inputs) + 1)
    key = (shape, out.strides, out.itemsize) + tuple((x.shape, x.strides) for x in inputs)
    placed = _layouts.get(key, _layouts)
    if placed is _layouts:
        placed = _layouts[key] = _layout(out, inputs)
        if len(_layouts) > 4096:  # shapes from a long-running service with dynamic axes
            _layouts.clear()
    return placed


_layouts: dict = {}


def _layout(out, inputs):
    shape, itemsize, rank = out.shape, out.itemsize, out.ndim
    element_strides = []
    for array in list(inputs) + [out]:
        strides = [0] * (rank - array.ndim)
        for size, stride in zip(array.shape, array.strides):
            if stride < 0 or stride % itemsize:
                return None
            strides.append(0 if size == 1 else stride // itemsize)
        element_strides.append(strides)
    axes: list[tuple[int, list]] = []  # innermost first: (size, stride per array)
    for k in reversed(range(rank)):
        if shape[k] == 1:
            continue
        strides = [s[k] for s in element_strides]
        if axes and all(outer == inner * axes[-1][0]
                        for outer, inner in zip(strides, axes[-1][1])):
            axes[-1] = (axes[-1][0] * shape[k], axes[-1][1])
        else:
            axes.append((shape[k], strides))
    if len(axes) > AXES or (axes and any(s not in (0, 1) for s in axes[0][1])):
        return None
    axes += [(1, [0] * len(element_strides))] * (AXES - len(axes))
    axes.reverse()
    dims = tuple(int(size) for size, _ in axes)
    strides = tuple(tuple(int(s[a]) for _, s in axes) for a in range(len(element_strides)))
    return dims, strides


# -- source ----------------------------------------------------------------------------------

def source(steps, inputs: int, dtype, inner: tuple, alias: int | None) -> str:
    """The module source of the kernel ``run(x0, ..., out, n1, n2, <outer strides>, start,
    stop)`` over rows start..stop of the output seen as (n0 * n1, n2). Arrays are flat views
    from their first element; ``x<a>_0``, ``x<a>_1`` (``out_0``, ``out_1``) are the element
    strides of array a along n0 and n1. ``inner[a]``: whether input a steps along n2 (else it
    is broadcast there). ``alias``: the input ``out`` overwrites in place, read through
    ``out``, or None."""
    names = [f"x{i}" for i in range(inputs)]
    strides = [f"{name}_{d}" for name in names + ["out"] for d in (0, 1)]
    lines = [
        '"""Generated by mixrt.ops.elementwise.jit_elementwise; rewritten if edited."""',
        "import math",
        "import numpy as np",
        "from numba import njit, uint64",
        f"T = np.{np.dtype(dtype).name}",
        "",
    ]
    for op_name, function in RATIONAL.items():
        if any(RATIONAL_OF.get(step.op) == op_name for step in steps):
            lines += odd_rational.numba_source(op_name, function, _lit)
    lines += [
        "@njit(nogil=True, cache=True, boundscheck=False, error_model='numpy')",
        f"def run({', '.join(names)}, out, n1, n2, {', '.join(strides)}, start, stop):",
        "    for t in range(start, stop):",
        "        i = t // n1",
        "        j = t - i * n1",
        "        o = i * out_0 + j * out_1",
    ]
    loads = []
    for index, name in enumerate(names):
        array, offset = (("out", "o") if index == alias
                         else (name, f"i * {name}_0 + j * {name}_1"))
        if inner[index]:
            lines.append(f"        b{index} = {offset}")
            loads.append(f"            v{index} = {array}[uint64(b{index} + k)]")
        else:  # constant along the inner loop: loaded once per row
            lines.append(f"        v{index} = {array}[uint64({offset})]")
    lines.append("        for k in range(n2):")
    lines += loads
    values = [f"v{i}" for i in range(inputs)]
    for step in steps:
        register = f"r{len(values)}"
        expression = TEMPLATES[step.op](*(values[r] for r in step.operands), *step.params)
        lines.append(f"            {register} = {expression}")
        values.append(register)
    lines.append(f"            out[uint64(o + k)] = {values[-1]}")
    return "\n".join(lines) + "\n"


# -- running -------------------------------------------------------------------------------------

def costly(steps) -> bool:
    """Whether ``steps`` hold a rational or a power (COSTLY): tens of NumPy calls a step."""
    return any(step.op in COSTLY for step in steps)


def min_elements(steps) -> int:
    """The output size from which ``steps`` run compiled: any, for a costly program."""
    return 1 if costly(steps) else JIT_MIN_ELEMENTS


def suits(steps, inputs, out, kernels: dict | None = None, any_size: bool = False) -> bool:
    """Whether the program should run compiled here; ``kernels`` (as for :func:`run`) also
    keeps the answer of :func:`compilable` per dtype. ``any_size``: below
    :func:`min_elements` too (a call that a replay makes again, without this dispatch)."""
    if not (0 < out.size and (any_size or out.size >= min_elements(steps)) and jit_cpu.enabled()
            and all(isinstance(x, np.ndarray) and x.dtype == out.dtype for x in inputs)):
        return False
    if kernels is None:
        return compilable(steps, out.dtype)
    known = kernels.get(out.dtype.char)
    if known is None:
        known = kernels[out.dtype.char] = compilable(steps, out.dtype)
    return known


def run(steps, inputs, out, alias: int | None = None, kernels: dict | None = None,
        replays: dict | None = None) -> bool:
    """The program over ``inputs`` into ``out`` (their broadcast shape; any strides, but
    its elements must not overlap an input's except as ``alias``, the input that is ``out``
    itself). False, with nothing written, when the arrays do not fit the loop nest.
    ``kernels``: the caller's cache of this program's compiled variants (a dict kept with
    the program), so a call costs a few dictionary lookups besides the loop. A one-thread
    call over contiguous arrays is kept as the node's replay in ``replays`` (its dict, or
    None: ``ops/compiled/replay.py``)."""
    placed = layout(out, inputs)
    if placed is None:
        return False
    dims, strides = placed
    inner = tuple(s[2] == 1 for s in strides[:-1])
    variant = (out.dtype.char, inner, alias)
    run_kernel = None if kernels is None else kernels.get(variant)
    if run_kernel is None:
        run_kernel = kernel(source(steps, len(inputs), out.dtype, inner, alias))
        if kernels is not None:
            kernels[variant] = run_kernel
    heavy = out.size >= native_parts.SPLIT_ELEMENTS and any(step.op in HEAVY for step in steps)
    native = jit_cpu.native_pool() if heavy else None
    heavy = heavy and (native is not None or out.size >= 2 * MIN_ELEMENTS)
    if heavy and dims[0] * dims[1] == 1:
        dims, strides = _as_rows(dims, strides)
    flat = [_flat(array, dims, s) for array, s in zip(list(inputs) + [out], strides)]
    outer = [s[d] for s in strides for d in (0, 1)]
    rows = dims[0] * dims[1]
    if not heavy:
        run_kernel(*flat, dims[1], dims[2], *outer, 0, rows)
        if all(array.flags.c_contiguous for array in inputs) and out.flags.c_contiguous:
            scalars = (dims[1], dims[2], *outer, 0, rows)
            replay.record(replays, tuple(inputs) + (out,), lambda *arrays: run_kernel(
                *(array.reshape(-1) for array in arrays), *scalars), silent=True)
            if replays is not None and FIXED in replays:  # a caller that asked for it
                replays[FIXED] = lambda: run_kernel(*flat, *scalars)
        return True
    if native is not None:  # the native workers take a part in ~5 us, without the GIL
        go = _native_call(native, steps, inputs, out, alias, inner, kernels, flat,
                          (dims[1], dims[2], *outer), rows)
        go()
        if all(array.flags.c_contiguous for array in inputs) and out.flags.c_contiguous:
            replay.record(replays, tuple(inputs) + (out,), lambda *arrays: go(), silent=True)
        return True
    parallel_for(thread_parts(rows, out.size),
                 lambda start, stop: run_kernel(*flat, dims[1], dims[2], *outer, start, stop))
    return True


def _native_call(native, steps, inputs, out, alias, inner, kernels, flat, scalars, rows):
    """The program's rows split over the native pool (``ops/panels/native_parts.py``), as a
    call ``go()`` on these very arrays. Through Python threads a heavy pass gained nothing
    inside a run, where the native worker spins on the other core: EfficientNet-B0's SiLU
    and ConvNeXt's GELU over (1, 160, 40, 40) took ~260-330 us on one thread. The module's
    part entries are given to it here (``module.PART_SOURCES``), so its own source, and the
    cached and prebuilt code of its ``run``, stay as they are."""
    key = ("native", out.dtype.char, inner, alias)
    module = None if kernels is None else kernels.get(key)
    if module is None:
        module = kernel_module(source(steps, len(inputs), out.dtype, inner, alias))
        if not hasattr(module, "PART_SOURCES"):
            names = [f"x{i}" for i in range(len(inputs))]
            strides = [f"{name}_{d}" for name in names + ["out"] for d in (0, 1)]
            call = f"run({', '.join(names)}, out, n1, n2, {', '.join(strides)}, start, stop)"
            sources = native_parts.part_sources(
                [(name, 1, True) for name in names + ["out"]], ["n1", "n2", *strides],
                lambda dtype: [call])
            module.PART_SOURCES = {suffix: "\n".join(native_parts.IMPORTS) + "\n" + text
                                   for suffix, text in sources.items()}
        if kernels is not None:
            kernels[key] = module
    count = min(rows, NATIVE_PARTS_PER_THREAD * (native.workers + 1))
    parts = [(rows * p // count, rows * (p + 1) // count) for p in range(count)]
    return native_parts.prepared(native, module, tuple(flat), scalars, parts)


# parts of a heavy pass per thread of the native pool, claimed one at a time
NATIVE_PARTS_PER_THREAD = 2


# rows a loop nest of one long row is cut into, so that the threads can share it
ROWS_OF_ONE = 64


def _as_rows(dims, strides):
    """A loop nest that merged into one row (every array contiguous alike, EfficientNet's
    SiLU over a (1, 32, 112, 112) map) as ROWS_OF_ONE rows of the same elements (or the
    largest count up to it that divides the row), each array stepping a row's length (or
    0 where it is broadcast) between them."""
    length = dims[2]
    count = next(r for r in range(min(ROWS_OF_ONE, length), 0, -1) if length % r == 0)
    if count < 2:
        return dims, strides
    step = length // count
    return (1, count, step), [(s[0], s[2] * step, s[2]) for s in strides]


def _flat(array, dims, strides) -> np.ndarray:
    """A 1-D view of ``array``'s memory from its first element to the last one the loop
    nest reaches (``strides`` along ``dims``, in elements)."""
    if array.flags.c_contiguous:  # every offset the loops reach lies in it
        return array.reshape(-1)
    span = 1 + sum((n - 1) * s for n, s in zip(dims, strides))
    return np.lib.stride_tricks.as_strided(array, (span,), (array.itemsize,),
                                           writeable=array.flags.writeable)
