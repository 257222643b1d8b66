"""What the depthwise convolution's generated forms share (``ops/conv/jit_depthwise.py``'s
row and flat forms, ``ops/conv/jit_depthwise_channels.py``'s channels form,
``ops/conv/jit_grouped_blocks.py``'s block form): FusedConv's activations as their loops
apply them, the head of their modules, the arrays they take, and the copy of a stride-2
row into its scratch as pairs of cells.
"""

from __future__ import annotations

import weakref

import numpy as np

from mixrt.ops.compiled import jit_tier
from mixrt.ops.elementwise import jit_elementwise, odd_rational
from mixrt.ops.panels.native_parts import IMPORTS, part_source

MAX_TAPS = 7  # per axis; larger kernels keep the phase-plane kernel
# every form's njit flags, as their generated modules write them
FLAGS = "nogil=True, cache=True, boundscheck=False, error_model='numpy'"
# float64 input rows from this many columns: the stride-2 copy's two halves in two loops
# (:func:`split_copy`)
SPLIT_LOOPS_COLUMNS = 40


# FusedConv's activations the kernels apply to each sum as they store it: name -> (its
# constants from its params, passed in the input's dtype as the ``act`` array the kernel
# reads as c0, c1, ...; the statements that turn the sum ``v`` into the stored value). Each
# is the template ops/elementwise/jit_elementwise.py compiles for the unfused node (NaN
# passes Relu's and Clip's comparisons, as through NumPy's maximum and minimum), so the
# stored bits are those of the Conv and its activation run apart.
# (``|`` rather than ``or``: no short-circuit branch inside the vectorized loops)
def _nan_max(target: str, a: str, b: str) -> str:
    return f"{target} = {a} if (({a} > {b}) | ({a} != {a})) else {b}"


def _nan_min(target: str, a: str, b: str) -> str:
    return f"{target} = {a} if (({a} < {b}) | ({a} != {a})) else {b}"


ACTIVATIONS = {
    "": (lambda params: [], []),
    "Relu": (lambda params: [0.0], [_nan_max("v", "v", "c0")]),
    "LeakyRelu": (lambda params: [0.0, params[0]], ["v = v if v >= c0 else v * c1"]),
    "Clip": (lambda params: list(params), [_nan_max("v", "v", "c0"), _nan_min("v", "v", "c1")]),
    "HardSigmoid": (lambda params: [0.0, 1.0, *params],
                    ["v = v * c2 + c3", _nan_max("v", "v", "c0"), _nan_min("v", "v", "c1")]),
    "HardSwish": (lambda params: [0.0, 1.0, 1 / 6, 0.5],
                  ["g = v * c2 + c3", _nan_max("g", "g", "c0"), _nan_min("g", "g", "c1"),
                   "v = v * g"]),
    # float32 only: its sigmoid is the compiled programs' rational (sigmoid32)
    "Swish": (lambda params: [0.0, 1.0, 0.5], ["v = v * sigmoid32(v)"]),
}
_FLOAT32_ONLY = ("Swish",)
_MOST_CONSTANTS = 4
_PARAMS = {"LeakyRelu": 1, "Clip": 2, "HardSigmoid": 2}  # how many params each takes


def _module_head(activation: str) -> list[str]:
    """The imports both forms' modules start with, and what the activation calls."""
    return ["import numpy as np", "from numba import njit, uint32, uint64", *IMPORTS,
            *_helpers(activation), ""]


def word_views() -> list[str]:
    """The input's cells as 64-bit words (its whole pairs: an odd count's last cell is in
    none) and the scratch's as 32-bit ones, which :func:`pair_copy` reads and writes."""
    return ["    x64 = xs[:xs.size // 2 * 2].view(np.uint64)",
            "    p32 = ps.view(np.uint32)"]


def pair_copy(indent: str, place, source: str = "source", target: str = "target",
              cols: str = "cols", left: str = "left") -> list[str]:
    """The copy of one float32 input row of ``cols`` cells from ``source`` into a scratch
    row at ``target`` whose padded column j lies at ``place(j)`` (source text of j's text),
    for a stride of 2 across: even and odd columns to two places, each consecutive. The row
    is read as 64-bit words, each a pair of cells whose low half is the first (x86 is little
    endian), the halves stored as 32-bit words: whole vector loads and truncations, which
    LLVM vectorizes. Read as floats two cells apart each load was a gather: 384 planes of
    80 x 128 (MobileNetV2's first stride-2 layer at four 160 x 256 images) copied in 4.2 ms,
    as words in 1.4 (one thread, 2026-12-02). A row that starts at an odd cell copies that
    cell alone first. Needs ``uint32``, ``x64`` and ``p32`` (:func:`word_views`)."""
    lines = [
        f"odd = {source} % 2  # the row starts at a word's high half",
        "if odd:",
        f"    ps[uint64({target} + {place(left)})] = xs[uint64({source})]",
        f"low = {target} + ({place(f'{left} + 1')} if odd else {place(left)})",
        f"high = {target} + ({place(f'{left} + 2')} if odd else {place(f'{left} + 1')})",
        f"word = ({source} + odd) // 2",
        f"for u in range(({cols} - odd) // 2):",
        "    v = x64[uint64(word + u)]",
        "    p32[uint64(low + u)] = uint32(v & 0xffffffff)",
        "    p32[uint64(high + u)] = uint32(v >> 32)",
        f"if ({cols} - odd) % 2:",
        f"    ps[uint64({target} + {place(f'{left} + {cols} - 1')})]"
        f" = xs[uint64({source} + {cols} - 1)]"]
    return [indent + line for line in lines]


def part_entries() -> list[str]:
    """The row, flat and block forms' native part entries: ``run`` over planes start..stop
    with a scratch of (hp, wp) cells of its own."""
    return part_source([("x", 3, True), ("w", 2, True), ("bias", 1, True), ("y", 3, True),
                        ("act", 1, True)],
                       ["multiplier", "m", "top", "left", "hp", "wp"], lambda dtype: [
                           "run(x, w, bias, y, act, multiplier, m, top, left, start, stop,"
                           f" np.empty((hp, wp), {dtype}))"])


def _helpers(activation: str) -> list[str]:
    """Source lines an activation's statements call: Swish's sigmoid rational."""
    if activation not in _FLOAT32_ONLY:
        return []
    return ["T = np.float32", "",
            *odd_rational.numba_source("Sigmoid", "sigmoid32", jit_elementwise.literal_source)]


def activation_constants(activation: str, params, dtype) -> np.ndarray | None:
    """The ``act`` array of FusedConv's ``activation`` with ``params`` (None where the
    kernels do not apply it), one array per activation, parameters and dtype: a depthwise
    node asked for it at each call of its full route, ~30 a MobileNetV2 size's first run.
    The kernels only read it; it stays writeable, as numba types a read-only array apart."""
    key = (activation, None if params is None else tuple(params), np.dtype(dtype).str)
    found = _CONSTANTS.get(key, _NONE)
    if found is _NONE:
        found = _activation_constants(activation, params, dtype)
        if len(_CONSTANTS) >= 256:  # (parameters are the models': a few each)
            _CONSTANTS.clear()
        _CONSTANTS[key] = found
    return found


_CONSTANTS: dict = {}
_NONE = object()


def _activation_constants(activation: str, params, dtype) -> np.ndarray | None:
    found = ACTIVATIONS.get(activation or "")
    params = list(params or ())
    if found is None or len(params) != _PARAMS.get(activation or "", 0) \
            or (activation in _FLOAT32_ONLY and np.dtype(dtype) != np.float32):
        return None
    values = found[0](params)
    return np.array(values + [0.0] * (_MOST_CONSTANTS - len(values)), dtype)


def weight_and_bias(W, B, dtype, m: int) -> tuple:
    """W as (m, taps) and B as (m,) (zeros for None) in ``dtype``, as the forms take them:
    for a node's constants (read-only, already of ``dtype``) the same two views at every
    call, so that what a call works out from them (their addresses,
    ``native_parts._typed_addresses``) is kept with them; made anew otherwise (a weight
    that may change, or one copied to ``dtype``)."""
    key = (id(W), id(B), dtype.str)
    found = _VIEWS.get(key)
    if found is not None and found[0]() is W and (B is None or found[1]() is B):
        return found[2]
    weights = np.ascontiguousarray(W, dtype).reshape(m, -1)
    bias = np.zeros(m, dtype) if B is None else np.ascontiguousarray(B, dtype).reshape(m)
    constant = not W.flags.writeable and np.may_share_memory(weights, W) and (
        B is None or not B.flags.writeable and np.may_share_memory(bias, B))
    if not constant:
        return weights, bias
    if len(_VIEWS) >= 1024:
        _VIEWS.clear()
    _VIEWS[key] = (weakref.ref(W), None if B is None else weakref.ref(B), (weights, bias))
    return weights, bias


_VIEWS: dict = {}  # (id(W), id(B), dtype) -> (W's weak reference, B's, (weights, bias))


def suits(X, W, out, kernel) -> bool:
    """C-contiguous float arrays, ``out`` apart from the input, a kernel it unrolls."""
    return (X.flags.c_contiguous and out.flags.c_contiguous and out.dtype == X.dtype
            and len(kernel) == 2 and max(kernel) <= MAX_TAPS
            and not np.may_share_memory(X, out))


# (module, dtype, flags) whose entries this process compiled or loaded, each form's fallback
# for the sizes whose own form is in no cache (jit_depthwise._warm_rows, warm_channels)
WARM: set = set()
# the size-free forms (by :func:`loaded_ahead`'s keys) a loading run has loaded or found in
# no cache
LOADED_AHEAD: set = set()


def loaded_ahead(key: tuple, warm, *arguments) -> None:
    """``warm(*arguments)``, a size-free form's warmer, in a loading run (compiling
    forbidden): it loads what the cache holds of the form for these arrays' types (its
    entries, its part entry, the address fill), as a run that may compile compiles them.
    A form in no cache is noted nowhere (no path of this run went without it). Each ``key``
    is asked once a process: every new shape's first run is a loading run, and a miss is
    numba's look in its cache (~0.3 ms), a warmer's own check a few microseconds.

    Without it a process started over a warm cache (a service's image made with ``mixrt
    warmup``) warmed none of them: its signature's first run is a loading run, its later
    runs take their bound calls, and a form first needed at a new image size was loaded in
    that request, 4-7 ms a kernel (MobileNetV3-small: a row form's entry for a read-only
    weight, a block form's and a channels form's part entries, at 3 of its first 80 new
    shapes, 2026-12-04)."""
    if key in LOADED_AHEAD:
        return
    with jit_tier.unnoted():
        warm(*arguments)
    LOADED_AHEAD.add(key)


def flat_pairs(plane, held: int, top: int, left: int, cols: int) -> list[str]:
    """The flat form's copy of a float32 input row at stride 2 across as pairs of cells
    (:func:`pair_copy`): the row's cells go to its row phase's two column phases,
    ``plane.plane`` cells apart (``plane``: ``jit_depthwise.FlatPlane``)."""
    (sh, _), wph = plane.strides, plane.phase_width
    return [
        "                    if xs.itemsize == 4:  # (a constant of the compiled loop)",
        f"                        target = g * {held} + (r + {top}) % {sh} * 2 * {plane.plane}"
        f" + (r + {top}) // {sh} * {wph}",
        *pair_copy(" " * 24, lambda j: f"({j}) % 2 * {plane.plane} + ({j}) // 2",
                   cols=str(cols), left=str(left)),
        "                        continue"]


def split_copy() -> list[str]:
    """The copy of plane p into the padded scratch for stride 2 (dilation 1): padded column
    j of a row goes to j // 2 when even, to ``half`` + j // 2 when odd, so that each tap of a
    row of outputs reads consecutive cells (read in place, ``pad[2 * k + b]`` took a gather
    per tap: 112x56x56 to 28x28, one thread, 115 -> 94 us). Float32 rows are copied as
    pairs of cells (:func:`pair_copy`); float64 rows a half at a time, columns
    two apart read into consecutive cells (two loops vectorize where one did not: 96 x 96 x
    96 copied in 241 us against 456, 2026-12-01, Xeon), rows under SPLIT_LOOPS_COLUMNS in
    one loop."""
    def place(j):  # where padded column j lies in its row
        return f"({j}) % 2 * half + ({j}) // 2"
    indent = " " * 20
    first = f"{indent}    ps[uint64(target + first + u)] = xs[uint64(source + 2 * u)]"
    second = f"{indent}    ps[uint64(target + second + u)] = xs[uint64(source + 2 * u + 1)]"
    pairs = f"{indent}for u in range(cols // 2):"
    return [
        f"            first, second = {place('left')}, {place('left + 1')}",
        f"            last = {place('left + cols - 1')}",
        "            for r in range(rows):",
        "                source = (p * height + r) * width",
        "                target = (top + r) * wp",
        "                if xs.itemsize == 4:  # (a constant of the compiled loop)",
        *pair_copy(" " * 20, place),
        "                    continue",
        f"                if cols < {SPLIT_LOOPS_COLUMNS}:  # short rows: one loop",
        pairs, first, second,
        "                else:",
        pairs, first, pairs, second,
        "                if cols % 2:",
        "                    ps[uint64(target + last)] = xs[uint64(source + cols - 1)]",
    ]
