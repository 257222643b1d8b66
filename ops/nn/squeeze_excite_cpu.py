"""``mixrt::SqueezeExcite`` on the CPU: one generated module per pair of activations, its
three passes (the planes' means, the two small products and their activations, the planes
scaled by their gates) in compiled loops, called as one.

A batch of images is split over the native workers by images, each worker taking an image's
three passes; a single image large enough to split (EfficientNet's early blocks at a large
input) is split by planes for the means and for the scaling, the products between them on
this thread. A plane's mean adds its values in sixteen interleaved sums, then those
pairwise (a plane under sixteen pixels: in turn), whatever the split: an image's results are
the same bits alone or in a batch (the batching of ``mixrt serve`` checks that).

The call is kept as the node's replay (``ops/compiled/replay.py``) where its weights are
constants and its output the caller's, so its bound call is the prepared native call alone.
"""

from __future__ import annotations

import contextlib
import functools

import numpy as np

from mixrt.ops.compiled import image_routes, jit_cpu, jit_tier, replay
from mixrt.ops.compiled.bound_calls import binds_replay, padded
from mixrt.ops.compiled.generated import kernel_module
from mixrt.ops.compiled.workspace import packed
from mixrt.ops.conv.depthwise_common import (ACTIVATIONS, FLAGS, _helpers, _module_head,
                                             activation_constants)
from mixrt.ops.ir.registry import CONSTANT_INPUTS
from mixrt.ops.nn.squeeze_excite import squeeze_excite
from mixrt.ops.panels.native_parts import (SPLIT_ELEMENTS, part_entry, part_source, prepared,
                                           split, warm_prepared)

# the activations the compiled gates apply: the depthwise kernels' (FusedConv's), and Sigmoid
# (RegNet-Y's and EfficientNet's gate) as the compiled programs' rational, float32 only
_SIGMOID = (lambda params: [0.0, 1.0, 0.5], ["v = sigmoid32(v)"])
_SIGMOID_RATIONAL = ("Swish", "Sigmoid")
PHASES = {"means": 0, "scale": 1, "images": 2}


def _statements(activation: str) -> list[str]:
    return (_SIGMOID if activation == "Sigmoid" else ACTIVATIONS[activation])[1]


def _constants(activation: str, params, dtype) -> np.ndarray | None:
    """The ``act`` array of ``activation`` (four constants c0..c3), or None where the compiled
    gates do not apply it."""
    if activation == "Sigmoid":
        if params or np.dtype(dtype) != np.float32:
            return None
        return np.array(_SIGMOID[0](()) + [0.0], dtype)
    return activation_constants(activation, params, dtype)


@squeeze_excite.fast("cpu")
def squeeze_excite_cpu(xp, X, W1, B1=None, W2=None, B2=None, *, activation1="",
                       activation1_params=None, activation2="", activation2_params=None,
                       out=None, _prepacked=None):
    arrays = (X, W1, B1, W2, B2, out)
    if out is not None and (replay.replayed(_prepacked, arrays) or image_routes.ran(
            _prepacked, X, (W1, B1, W2, B2), None, out, None, any_size=True)):
        return out
    replay.forget(_prepacked)
    activations = (activation1 or "", activation2 or "")
    constants = tuple(_constants(name, params, X.dtype) for name, params in
                      zip(activations, (activation1_params, activation2_params)))
    if not _suits(X, W1, B1, W2, B2, out) or constants[0] is None or constants[1] is None:
        return squeeze_excite(np, X, W1, B1, W2, B2, activation1=activation1,
                              activation1_params=activation1_params, activation2=activation2,
                              activation2_params=activation2_params, out=out)
    # the node's dict keeps the transposed weights only where all four are constants
    constant = _prepacked.get(CONSTANT_INPUTS, ()) if _prepacked is not None else ()
    if not all(position in constant or value is None
               for position, value in enumerate((W1, B1, W2, B2), 1)):
        _prepacked = None
    kept = out is not None and _prepacked is not None
    if out is None:
        out = np.empty_like(X)
    module = _module(*activations)
    _warm(module, X.dtype)
    if not kept:
        _call(module, X, W1, B1, W2, B2, constants, out, _prepacked)()
        return out
    _kept_call(X, W1, B1, W2, B2, out, module, constants, _prepacked)
    # any batch and image size may take the same module and constants
    image_routes.stash(_prepacked, out, image_routes.Kept(
        _kept_call, module, constants, _prepacked), _KEPT)
    image_routes.keep(_prepacked, X, (W1, B1, W2, B2), None, out, None, any_size=True)
    return out


# how the node's call is kept for its image size (``ops/compiled/image_routes.py``): in any
# run and thread, recording its replay itself, in place as the node may run
_KEPT = image_routes.How(records=True, over_input=True, tied=False)


def _kept_call(X, W1, B1, W2, B2, out, module, constants, prepacked):
    """:func:`_call` with the node's module and activations' constants, run and kept as the
    node's replay: the full route's end where its output is the caller's, and the call it
    keeps for any arrays (``image_routes.Kept``)."""
    go = _call(module, X, W1, B1, W2, B2, constants, out, prepacked)
    go()
    replay.record(prepacked, (X, W1, B1, W2, B2, out), go)


def _suits(X, W1, B1, W2, B2, out) -> bool:
    """C-contiguous native floats of one dtype, 4-D X (N, C, H, W), W1 (R, C, 1, 1), W2 (C, R,
    1, 1), the biases (R,) and (C,) or absent, ``out`` X's shape apart from X (or X itself:
    each image's means are taken before its planes are scaled), with the compiled tier on."""
    if not (isinstance(X, np.ndarray) and X.ndim == 4 and X.dtype in jit_cpu.NATIVE
            and X.flags.c_contiguous and X.flags.aligned and W2 is not None
            and jit_cpu.enabled()):
        return False
    channels, hidden = X.shape[1], W1.shape[0]
    if W1.shape != (hidden, channels, 1, 1) or W2.shape != (channels, hidden, 1, 1) \
            or W1.dtype != X.dtype or W2.dtype != X.dtype:
        return False
    for bias, size in ((B1, hidden), (B2, channels)):
        if bias is not None and (bias.shape != (size,) or bias.dtype != X.dtype):
            return False
    return out is None or out is X or (
        out.shape == X.shape and out.dtype == X.dtype and out.flags.c_contiguous
        and not np.may_share_memory(out, X))


def _call(module, X, W1, B1, W2, B2, constants, out, prepacked):
    """The node's call on these arrays as ``go(*_)``: one native call, or three where a
    single image is split by planes."""
    (n, channels, height, width), hidden = X.shape, W1.shape[0]
    plane = height * width
    weights = packed(prepacked, ("squeeze_excite", W1.shape, W2.shape),
                     lambda: _transposed(W1, W2, B1, B2))
    sums = np.empty((2, n * channels), X.dtype)  # the planes' means, then their gates
    arrays = (X.reshape(-1), *weights, *constants, sums[0], sums[1], out.reshape(-1))
    sizes = (channels, plane, hidden)
    keep = (sums, weights, constants)  # what the prepared calls hold only the addresses of
    native = jit_cpu.native_pool()
    if native is None:
        return _unsplit(module, arrays, sizes, n)
    if n > 1 or X.size < SPLIT_ELEMENTS:  # by images (a small one: one part, here)
        parts = split(n, X.size, native) or [(0, n)]
        return prepared(native, module, arrays, (PHASES["images"], *sizes), parts, keep=keep)
    parts = split(channels, X.size, native) or [(0, channels)]
    means = prepared(native, module, arrays, (PHASES["means"], *sizes), parts, keep=keep)
    scale = prepared(native, module, arrays, (PHASES["scale"], *sizes), parts, keep=keep)
    gates, (w1t, b1, w2t, b2, a1, a2) = module.gates, arrays[1:7]
    s, g = sums

    def go(*_):
        means()
        gates(s, w1t, b1, w2t, b2, a1, a2, g, channels, hidden, 0)
        scale()
    return go


_WARM: set = set()  # (module name, dtype) whose every entry this process compiled or loaded


def _warm(module, dtype) -> None:
    """Every entry a call of ``module`` in ``dtype`` may take, compiled or loaded at once
    (on one pixel of one channel): the module serves every size of every node of its pair
    of activations, and an entry first met at a later size (a single image large enough to
    split) would compile there, in a request. A serving run (one that may compile, where
    sessions compile in the background) only loads them: what is in no cache raises
    ``CompileForbidden``, and the step runs its generic kernel meanwhile."""
    key = (module.__name__, np.dtype(dtype).str)
    if key in _WARM:
        return
    loading = jit_tier.compile_misses() is not None
    serving = not loading and jit_tier.background_compiles()
    with jit_tier.loading_only() if serving else contextlib.nullcontext():
        one = np.ones(1, dtype)
        module.images(one, one, one, one, one, np.zeros(4, dtype), np.zeros(4, dtype),
                      one.copy(), one.copy(), one.copy(), 1, 1, 1, 0, 1)
        module.gates(one, one, one, one, one, np.zeros(4, dtype), np.zeros(4, dtype),
                     one.copy(), 1, 1, 0)
        if jit_cpu.native_pool() is not None:
            part_entry(module, "f" if np.dtype(dtype) == np.float32 else "d")
            warm_prepared((one,) * 10)
    _WARM.add(key)


def _unsplit(module, arrays: tuple, sizes: tuple, n: int):
    """The call without the native pool: the images' passes on this thread."""
    images = module.images

    def go(*_):
        images(*arrays, *sizes, 0, n)
    go.kept = arrays
    return go


def _transposed(W1, W2, B1, B2) -> tuple:
    """(W1 as (C, R), B1 or zeros, W2 as (R, C), B2 or zeros), contiguous and writeable
    copies: the products' inner loops run along a row of each, and a session's constants
    are read-only arrays, which numba types apart from the writeable ones ``_warm``
    compiles (a single large image's ``gates`` call, or a call without the native pool,
    compiled another entry in a request) and whose addresses are read one by one."""
    hidden, channels = W1.shape[:2]
    dtype = W1.dtype
    b1 = np.zeros(hidden, dtype) if B1 is None else np.array(B1, dtype)
    b2 = np.zeros(channels, dtype) if B2 is None else np.array(B2, dtype)
    return (np.ascontiguousarray(W1.reshape(hidden, channels).T).reshape(-1), b1,
            np.ascontiguousarray(W2.reshape(channels, hidden).T).reshape(-1), b2)


@functools.lru_cache(maxsize=32)
def _module(activation1: str, activation2: str):
    return kernel_module(source(activation1, activation2), prefix="mixrt_squeeze_excite")


LANES = 16  # interleaved sums of a plane's mean: a vector of float32 on AVX-512


def source(activation1: str, activation2: str) -> str:
    """The module of one pair of activations: ``means``, ``gates``, ``scale`` and ``images``
    over flat arrays, and the native part entries (``PHASES`` picks the pass a part runs)."""
    helper = "Swish" if {activation1, activation2} & set(_SIGMOID_RATIONAL) else ""
    arrays = [(name, 1, True) for name in
              ("x", "w1t", "b1", "w2t", "b2", "a1", "a2", "s", "g", "y")]
    scalars = ["phase", "channels", "plane", "hidden"]
    return "\n".join([
        *_module_head(""), *_helpers(helper),
        f"LANES = {LANES}", "",
        f"@njit({FLAGS})",
        "def mean(x, first, plane, sums):",
        "    for lane in range(LANES):",
        "        sums[uint64(lane)] = 0",
        "    whole = plane - plane % LANES",
        "    for j in range(0, whole, LANES):",
        "        for lane in range(LANES):",
        "            sums[uint64(lane)] += x[uint64(first + j + lane)]",
        "    width = LANES",
        "    while width > 1:",
        "        width //= 2",
        "        for lane in range(width):",
        "            sums[uint64(lane)] += sums[uint64(lane + width)]",
        "    total = sums[0]",
        "    for j in range(whole, plane):",
        "        total += x[uint64(first + j)]",
        "    return total / plane",
        "",
        f"@njit({FLAGS})",
        "def means(x, s, plane, start, stop):",
        "    if plane < LANES:",
        "        # planes of a few pixels: each plane's values in turn, the planes side by",
        "        # side (one sum a plane left a chain of dependent additions: ~2x slower)",
        "        for p in range(start, stop):",
        "            s[uint64(p)] = x[uint64(p * plane)]",
        "        for j in range(1, plane):",
        "            for p in range(start, stop):",
        "                s[uint64(p)] += x[uint64(p * plane + j)]",
        "        for p in range(start, stop):",
        "            s[uint64(p)] /= plane",
        "        return",
        "    sums = np.empty(LANES, x.dtype)  # the interleaved sums, made once a call",
        "    for p in range(start, stop):",
        "        s[p] = mean(x, p * plane, plane, sums)",
        "",
        f"@njit({FLAGS})",
        "def gates(s, w1t, b1, w2t, b2, a1, a2, g, channels, hidden, first):",
        "    h = b1.copy()",
        *_axpy("h", "", "w1t", "s", "first + ", "channels", "hidden"),
        *_activated("h", "hidden", "a1", activation1),
        "    for c in range(channels):",
        "        g[uint64(first + c)] = b2[uint64(c)]",
        *_axpy("g", "first + ", "w2t", "h", "", "hidden", "channels"),
        *_activated("g", "channels", "a2", activation2, "first + "),
        "",
        f"@njit({FLAGS})",
        "def scale(x, g, y, plane, start, stop):",
        "    for p in range(start, stop):",
        "        gate = g[p]",
        "        for j in range(p * plane, (p + 1) * plane):",
        "            y[uint64(j)] = x[uint64(j)] * gate",
        "",
        f"@njit({FLAGS})",
        "def images(x, w1t, b1, w2t, b2, a1, a2, s, g, y, channels, plane, hidden, start,",
        "           stop):",
        "    for image in range(start, stop):",
        "        first = image * channels",
        "        means(x, s, plane, first, first + channels)",
        "        gates(s, w1t, b1, w2t, b2, a1, a2, g, channels, hidden, first)",
        "        scale(x, g, y, plane, first, first + channels)",
        "",
        *part_source(arrays, scalars, lambda dtype: [
            "if phase == 0:",
            "    means(x, s, plane, start, stop)",
            "elif phase == 1:",
            "    scale(x, g, y, plane, start, stop)",
            "else:",
            "    images(x, w1t, b1, w2t, b2, a1, a2, s, g, y, channels, plane, hidden, start,",
            "           stop)"]),
    ])


def _axpy(y: str, y_at: str, weights: str, x: str, x_at: str, inputs: str,
          outputs: str) -> list[str]:
    """The lines adding ``weights`` (inputs, outputs) times ``x`` to ``y`` in place, as one
    pass over y per input would, in that order, but four inputs a pass: y is loaded and
    stored a quarter as often (the products ran at ~7 GMAC/s one input a pass, their
    vector loop bound by y's stores)."""
    def term(k: int) -> str:
        return f"{weights}[uint64((i + {k}) * {outputs} + o)] * v{k}"
    return [f"    whole = {inputs} - {inputs} % 4",
            "    for i in range(0, whole, 4):",
            *[f"        v{k} = {x}[uint64({x_at}i + {k})]" for k in range(4)],
            f"        for o in range({outputs}):",
            f"            at = uint64({y_at}o)",
            f"            {y}[at] = ((({y}[at] + {term(0)}) + {term(1)}) + {term(2)}) "
            f"+ {term(3)}",
            f"    for i in range(whole, {inputs}):",
            f"        v0 = {x}[uint64({x_at}i)]",
            f"        for o in range({outputs}):",
            f"            {y}[uint64({y_at}o)] += {weights}[uint64(i * {outputs} + o)] * v0"]


def _activated(name: str, size: str, constants: str, activation: str,
               offset: str = "") -> list[str]:
    """The lines applying ``activation`` to ``name``'s first ``size`` values in place."""
    statements = _statements(activation)
    if not statements:
        return []
    return [f"    c0, c1, c2, c3 = {constants}[0], {constants}[1], {constants}[2], "
            f"{constants}[3]",
            f"    for i in range({size}):",
            f"        v = {name}[uint64({offset}i)]",
            *[f"        {line}" for line in statements],
            f"        {name}[uint64({offset}i)] = v"]


# its planned call, bound once per arena (ops/compiled/bound_calls.py): the recorded replay
binds_replay(squeeze_excite_cpu, lambda args, out: padded(args, 5) + (out,), "_prepacked")
