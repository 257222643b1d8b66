"""Depthwise 2-D convolution, and grouped convolution of narrow groups, as a generated numba
loop over one small padded plane (or one group's planes) at a time.

The first compiled kernel (``ops/compiled/jit_cpu.py``) copies the whole input into zero-padded
stride-phase planes, then runs each tap over a flat run of a plane into a scratch row and
copies that into the output. On ShuffleNet's 136x28x28 3x3 layer the planes alone took 35 of
its 90 µs, and 142 of 198 µs on the stride-2 112x56x56 one.

Here the input is read plane by plane: each plane is copied into a small scratch whose
zero border was written once per call (every plane overwrites the same interior), so the
copy stays in L1 and costs a fraction of the loop. Each output row then sums its ``kh * kw``
taps, unrolled, with the weights held in registers; the loads are contiguous when the stride
is 1, so LLVM vectorizes the row. A tap over the padding multiplies its weight by a real
zero, so an infinite or NaN weight gives NaN there, as in the zero-padded reference. With
stride 2 across, the scratch holds each padded row's even cells and then its odd ones
(``depthwise_common.split_copy``), so the taps' loads stay contiguous there too.

Two designs lost (benchmarks/NOTES.md §11): reading the input in place with a
bounds-checked loop for the border outputs (2.6x slower on 28x28 planes, where the border
is a large share), and the taps as one flat run over the whole padded plane (3x slower than
row by row, timed inside numba).

Small planes take a third form, the channels side by side, where ``depthwise_costs`` models
it cheaper than the flat form and the size-free ones (``jit_depthwise_channels.py``).

The module is generated per (kernel, strides, dilations) from fixed templates and integer
literals, then compiled and cached on disk by ``ops/compiled/generated.py`` like the pools'.

Rows narrower than a vector defeat that loop: on 7x7 and 14x14 planes every row is the
scalar remainder of its vectorized loop (MobileNetV3's 960x7x7 5x5 layer ran at ~9 GMAC/s,
6x onnxruntime's time). Outputs up to FLAT_MAX_WIDTH wide take a second form
(:func:`flat_source`), generated per plane geometry as well: the padded plane is copied into
its stride phases (one plane per (row, column) phase, so that every tap reads consecutive
cells at stride 1), and the taps run over the whole phase plane as one flat row, output
``(i, j)`` at ``i * phase_width + j``: the columns past the output's width are computed and
dropped when the flat row is copied out. The offsets and lengths must be literals (passed
as arguments, LLVM kept the flat loop scalar: 3-5x slower). One thread, against the row
form: 960x7x7 5x5 160 -> 46 us, 672x14x14 5x5 stride 2 151 -> 44, 480x14x14 3x3 65 -> 41,
120x28x28 5x5 110 -> 70, 72x56x56 5x5 stride 2 107 -> 63; on 112x112 planes the row form
stays ahead (64 channels, stride 2: 163 against 174 us). Both forms add the taps in the
same order, without fused multiply-adds, so their results are the same bits.

Grouped convolutions whose groups are a few channels wide (RegNet's are 8) took the flat
form too, each output summing its taps over the group's planes (``flat_source``'s
``width``), and since 2026-11-28 the row form as well, at sizes whose flat form was in no
cache. They now take the block form (``ops/conv/jit_grouped_blocks.py``): the flat form's
layout and order of additions, worked out at the call rather than written into the source,
so one module serves every image size and a new size compiles nothing; it was also faster
than the flat form at every size measured. The flat form keeps its group width as the
reference the block form's bits are tested against.

The block form of one-channel groups stands in for a depthwise convolution's flat form too,
where a model of the two size-free forms' work (``depthwise_costs.py``) finds it cheaper than
the row form: the row form's outputs past whole vectors run one by one, and the blocks won
on narrow rows with many taps (a 5x5 kernel over 12 x 20 outputs 152 -> 96 us, 7x7 over
20 x 30 477 -> 191; 2026-11-29), while the rows stay ahead on wide planes of a 3x3 kernel.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib

import numpy as np

from mixrt.ops.compiled import image_routes, jit_cpu, jit_tier, prebuilt, replay
from mixrt.ops.compiled.generated import compiled_before, mark_compiled, mark_name, module_name
from mixrt.ops.compiled.generated import kernel_module as compiled
from mixrt.ops.panels.native_parts import part_entry, prepared, split, warm_prepared
from mixrt.ops.compiled.parallel import MIN_ELEMENTS, parallel_for, thread_parts
from mixrt.ops.conv import jit_grouped_blocks as grouped_blocks
from mixrt.ops.conv.depthwise_costs import blocks_cheaper, small_plane_form
from mixrt.ops.conv.depthwise_common import (ACTIVATIONS, FLAGS, WARM, _module_head,
                                             activation_constants, flat_pairs,
                                             loaded_ahead, part_entries, split_copy,
                                             weight_and_bias, word_views)
from mixrt.ops.conv.jit_depthwise_channels import (CHANNELS_FALLBACK_PIXELS, channels_able,
                                                   channels_conv, warm_channels)

FLAT_MAX_WIDTH = 32  # output widths up to which the flat form (flat_source) is faster
FLAT_LANES = 16  # the flat row's length is rounded up to whole 64-byte vectors of floats
# without the native workers (ops/panels/native_parts.py), outputs from this many elements are
# split over the Python threads by planes (a hand-off costs ~30-40 µs here, as for the pools)
SPLIT_ELEMENTS = 4 * MIN_ELEMENTS

# input channels per group up to which a grouped convolution takes the block form (RegNet's
# are 8 wide: its 440x7x7 3x3 layer took 240 us as 55 im2col products)
MAX_GROUP_WIDTH = 16


def narrow_groups(X, W, group) -> bool:
    """A 2-D grouped convolution of float32 or float64 whose groups are 2 to
    MAX_GROUP_WIDTH input channels wide, each with its own output channels, with the
    compiled tier on: :func:`depthwise_conv` takes it."""
    group = int(group)
    return (isinstance(X, np.ndarray) and X.ndim == 4 and X.dtype in jit_cpu.NATIVE
            and W.dtype == X.dtype and W.ndim == 4 and group > 1
            and 1 < W.shape[1] <= MAX_GROUP_WIDTH and W.shape[1] * group == X.shape[1]
            and W.shape[0] % group == 0 and jit_cpu.enabled())


def depthwise_conv(X, W, B, out, kernel, strides, dilations, begin, out_dims, replays=None,
                   activation=("", None)):
    """Depthwise Conv of X (N, C, H, W) with W (C*k, 1, kh, kw), plus the bias B (or None),
    then ``activation`` (FusedConv's (name, params), one of ACTIVATIONS), into ``out`` (N,
    C*k, oh, ow); see :func:`suits`. W (M, g, kh, kw) with g > 1 makes it a grouped
    convolution of C / g groups g channels wide (:func:`narrow_groups`), which the block
    form computes (``ops/conv/jit_grouped_blocks.py``). A call split over the native
    workers is kept as the node's replay in ``replays`` (its prepacked dict;
    ``ops/compiled/replay.py``) when it passes W and B where they lie."""
    (_, channels, height, width), (m, group_width) = X.shape, W.shape[:2]
    out_dims = tuple(out_dims)  # (the models' answers are kept by it)
    (oh, ow), (sw, left) = out_dims, (strides[1], begin[1])
    multiplier = m // (channels // group_width)  # output channels per group
    if out.size == 0:
        return out
    weights, bias = weight_and_bias(W, B, X.dtype, m)  # the node's, made once
    name = activation[0] or ""
    constants = activation_constants(name, activation[1], X.dtype)
    # the padded plane as far as the last window reaches (not past the image's far pads)
    hp = (oh - 1) * strides[0] + (kernel[0] - 1) * dilations[0] + 1
    wp = (ow - 1) * sw + (kernel[1] - 1) * dilations[1] + 1
    call = (X, W, B, out, weights, bias, constants, multiplier, begin, replays)
    if group_width > 1:  # narrow groups: the block form, one module for every image size
        blocks = grouped_blocks.module(tuple(kernel), tuple(strides), tuple(dilations), name,
                                       int(group_width))
        cells = grouped_blocks.cells(tuple(kernel), tuple(strides), tuple(dilations),
                                     int(group_width), (oh, ow), X.itemsize)
        if jit_tier.compile_misses() is None:
            _warm_rows(blocks, 1, cells, *call)
        else:
            loaded_ahead(_ahead_key(blocks, call), _warm_rows, blocks, 1, cells, *call)
        return _planes(blocks, 1, cells, *call)
    window = (tuple(kernel), tuple(strides), tuple(dilations))
    rows = (_compiled(*window, name), hp, wp)
    cheaper = blocks_cheaper(*window, out_dims, X.itemsize)
    blocks = _blocks_form(window, name, out_dims, X.itemsize, cheaper)
    channels_too = channels_able(X, W, out, kernel)
    loading = jit_tier.compile_misses() is not None
    serving = not loading and jit_tier.background_compiles()
    if not loading:
        _warm_rows(*rows, *call)
        if blocks is not None:
            blocks = _warmed_blocks(blocks, serving, call)
        if channels_too:
            warm_channels(X, W, B, out, kernel, strides, dilations, begin, replays,
                          activation)
    else:  # what the cache holds of them loaded now, not in a later size's request
        loaded_ahead(_ahead_key(rows[0], call), _warm_rows, *rows, *call)
        if blocks is not None and kernel[0] * kernel[1] > 9:  # (a 3x3's: where it is cheaper)
            loaded_ahead(_ahead_key(blocks[0], call), _warm_rows, *blocks, *call)
        if channels_too:
            loaded_ahead(_ahead_key((window, name), call), warm_channels, X, W, B, out, kernel,
                         strides, dilations, begin, replays, activation)
    conv = (X, W, B, out, kernel, strides, dilations, begin, replays, activation)
    free = (rows, blocks if cheaper else None)
    form = small_plane_form(*window, out_dims, X.itemsize, channels_too) \
        if ow <= FLAT_MAX_WIDTH else "free"
    if form != "flat":  # size-free: no flat form to compile
        return _size_free(conv, form == "channels", free, call)
    small = channels_too and oh * ow <= CHANNELS_FALLBACK_PIXELS  # the channels stand in
    image = tuple(int(v) for v in (height, width, begin[0], left, oh, ow))
    # (a depthwise convolution's geometry: one input plane a group, as its markers name it)
    geometry = (tuple(kernel), tuple(strides), tuple(dilations), image, name, 1)
    # the flat form is generated per plane geometry, and a new image size's is in no cache
    # yet (a session's first run of that size may not compile: the background compiler
    # does, if the size comes back): the row form, one per kernel, strides and dilations,
    # adds the taps in the same order, so it gives the same bits meanwhile. Whether the
    # geometry's flat form was compiled is asked by the geometry's name before its source
    # is made: making the source, naming it and looking it up was ~60 us a node, sixteen
    # a new EfficientNet-B0 size (2026-11-27)
    #
    # A first run takes the flat form only where this process has it loaded already: one
    # in the cache costs ~6 ms a node to load (an import and numba's load), against the
    # row form's few hundred microseconds more, and a service restarted over a warm cache
    # paid that for every depthwise node at each size's first request (a ShuffleNet's
    # first sight ~86 ms of conv against ~2). The size's next run, which is not a loading
    # run, loads it: a size met once never pays it.
    #
    # A run that may compile, in a process whose sessions compile in the background, is a
    # serving run on the compiled tier (a signature whose kernels all loaded, or took bound
    # calls, and whose bound calls were let go since): it takes the flat form only where
    # one is in the cache, and loads it without compiling anything. It compiled the form
    # in the serving thread before, ~1-2 s a node with its part entry: a MobileNetV3's
    # image size that came back took 5.6 s (2026-11-29).
    named = _geometry_name(geometry) if loading or serving else None
    miss = f"{FLAT_PREFIX} for {image}"
    if loading and named not in _FLAT_LOADED:
        noted = prebuilt.chosen() is None and not compiled_before(named)
        if noted:
            jit_tier.note_optional_miss(miss)
        return _stand_in(conv, small, free, call, named, miss if noted else None)
    if serving and named not in _FLAT_LOADED and not compiled_before(named):
        return _stand_in(conv, small, free, call, named,
                         miss if prebuilt.chosen() is None else None)
    text, flat_width = _flat_text(*geometry)
    if loading and not compiled_before(_flat_name(text)):
        jit_tier.note_optional_miss(miss)
        return _size_free(conv, small, free, call)
    named = named or _geometry_name(geometry)
    try:
        with jit_tier.optional(), _loading_only_where(serving):
            return _flat_planes(text, flat_width, call, named)
    except jit_tier.CompileForbidden:
        return _stand_in(conv, small, free, call, named)


def _stand_in(conv: tuple, channels: bool, free: tuple, call: tuple, named: str, note=None):
    """:func:`_size_free` standing in for the flat form of the geometry ``named``, which
    this process has not loaded: the node's call kept for its image size
    (``ops/compiled/image_routes.py``) lapses once it is, and notes ``note`` (the optional
    miss a loading run's full route notes there) as it is taken."""
    done = _size_free(conv, channels, free, call)
    image_routes.amend(conv[8], conv[3], (named, _FLAT_LOADED), note)
    return done


def _loading_only_where(serving: bool):
    """Compiling forbidden in the block on a serving run (:func:`depthwise_conv`)."""
    return jit_tier.loading_only() if serving else contextlib.nullcontext()


def _size_free(conv: tuple, channels: bool, free: tuple, call):
    """The forms generated per kernel, strides, dilations and activation, not per size,
    which every size of the node can take once one was compiled (:func:`_warm_rows`,
    ``jit_depthwise_channels.warm_channels``): the channels form of ``conv`` (its
    arguments) where ``channels`` (a plane small enough for it to be the faster), else the
    block form where ``free`` (the row form's (module, scratch rows, scratch columns), the
    block form's or None) holds it, else the row form. All add the taps in the flat form's
    order: the same bits."""
    rows, blocks = free
    if channels:
        try:
            with jit_tier.optional():
                done = channels_conv(*conv)
        except jit_tier.CompileForbidden:  # (compiled with no size of this node yet)
            pass
        else:
            image_routes.stash(conv[8], conv[3], image_routes.Kept(channels_conv, *conv[4:]),
                               LOADING_RUNS)
            return done
    if blocks is not None:
        try:
            with jit_tier.optional():
                return _planes(*blocks, *call)
        except jit_tier.CompileForbidden:  # (warmed at none of this node's sizes yet)
            pass
    return _planes(*rows, *call)


def _blocks_form(window: tuple, name: str, out_dims: tuple, itemsize: int, cheaper: bool):
    """The block form of one-channel groups (``jit_grouped_blocks``) as (module, 1, its
    scratch's cells), for :func:`_size_free` where ``depthwise_costs`` models it cheaper than
    the row form, and warmed with the row form where compiling is allowed: at every size for
    kernels past 3x3, which it beats on all but the widest planes, else at the sizes it
    beats them (``cheaper``). None where neither holds (a 3x3 kernel on a wide plane)."""
    kernel = window[0]
    if kernel[0] * kernel[1] <= 9 and not cheaper:
        return None
    cells = grouped_blocks.cells(*window, 1, tuple(out_dims), itemsize)
    return grouped_blocks.module(*window, name, 1), 1, cells


def _warmed_blocks(blocks: tuple, serving: bool, call: tuple):
    """``blocks`` (:func:`_blocks_form`) warmed, or None where a serving run finds them in
    no cache: such a run may compile, but a block form compiled there would be ~1 s in a
    request (a node warmed before the blocks were chosen at any of its sizes, or a cache
    older than the block form). The background compiler's runs warm them instead."""
    try:
        with _loading_only_where(serving):
            _warm_rows(*blocks, *call)
    except jit_tier.CompileForbidden:
        return None
    return blocks


def _flat_planes(text: str, flat_width: int, call: tuple, named: str):
    """:func:`_planes` by the flat form of ``text``, marked as compiled once it ran (under
    its module's name and its geometry's, ``named``), its part entry with it.

    The part entry is compiled whether or not this call splits (it would not at a batch of
    one): a geometry is the plane's, so another batch of the same image size, which does
    split, finds it marked compiled and loads the form on a serving run, where compiling
    is allowed once a signature is compiled. A part entry missing there compiled in the
    serving thread, ~0.6-1.1 s a node: a MobileNetV3's image size coming back at another
    batch took 5.6 s for six of them (2026-11-29)."""
    module = _flat_module(text)
    if (module.__name__, call[0].dtype.str) not in _PARTS_WARM:
        _warm_part_entry(module, *call[:7])
        _PARTS_WARM.add((module.__name__, call[0].dtype.str))
    done = _planes(module, 1, flat_width, *call)
    mark_compiled(module)
    mark_name(named)
    _FLAT_LOADED.add(named)
    return done


_FLAT_LOADED: set = set()  # the geometries' names whose flat form this process has loaded
_PARTS_WARM: set = set()  # (a flat form's module name, dtype) whose part entry is loaded


@functools.lru_cache(maxsize=1024)  # a digest is ~10 us, asked at each first run of a size
def _geometry_name(geometry: tuple) -> str:
    """The name a flat form is also marked compiled under: its geometry's (the arguments of
    :func:`_flat_text`), which a size's first run asks without making the source. Named
    "with parts" since its part entry is compiled with it: a marker of an older cache does
    not promise that, so it is not read."""
    digest = hashlib.sha256(repr(geometry).encode()).hexdigest()[:20]
    return f"{FLAT_PREFIX}_with_parts_{digest}"


def _warm_rows(rows, hp, wp, X, W, B, out, weights, bias, constants, multiplier, begin,
               replays) -> None:
    """Where compiling is allowed (the background compiler's run, a foreground session):
    the row form of this node compiled whichever form its size takes, as the fallback of
    every size whose flat or channels form is in no cache. A service's new image size met
    flat forms in no cache, and where the node's first sizes had not taken the row form,
    that was in none either: the step ran NumPy's convolution, EfficientNet-B0 at a new
    size per request 7x onnxruntime's time (2026-11-27). The row form's entries are typed
    by the real arrays (a read-only weight compiles apart), on the first plane only, which
    the node's call then writes again."""
    key = (rows, X.dtype.str, weights.flags.writeable, bias.flags.writeable,
           constants is None or constants.flags.writeable)
    if key in WARM:
        return
    x, y = _warm_part_entry(rows, X, W, B, out, weights, bias, constants)
    rows.run(x, weights, bias, y, constants, multiplier, W.shape[0], begin[0], begin[1], 0,
             1, np.empty((hp, wp), X.dtype))
    WARM.add(key)


def _ahead_key(form, call: tuple) -> tuple:
    """``depthwise_common.loaded_ahead``'s key of ``form`` (a module, or the window and
    activation for the channels form) over ``call``'s arrays: what the warmers' entries
    are typed by."""
    X, weights, bias = call[0], call[4], call[5]
    return form, X.dtype.str, weights.flags.writeable, bias.flags.writeable


def _warm_part_entry(module, X, W, B, out, weights, bias, constants) -> tuple:
    """``module``'s part entry for X's dtype and the address fill of its arrays, compiled
    or loaded where the process has native workers (where a call of another batch may split
    over them); the planes (x, y) as :func:`_planes` hands them over."""
    (n, channels, height, width), m = X.shape, W.shape[0]
    x = X.reshape(n * channels, height, width)
    y = out.reshape(n * m, *out.shape[2:])
    if jit_cpu.native_pool() is not None:
        part_entry(module, "f" if X.dtype == np.float32 else "d")
        warm_prepared((x, weights, bias, y, constants))
    return x, y


# how a depthwise node's call is kept for its image size (``ops/compiled/image_routes.py``):
# for loading runs alone (see there), recording its replay itself, on any thread
LOADING_RUNS = image_routes.How(records=True, loading_only=True, tied=False)


def _planes_kept(X, W, B, out, module, hp, wp, weights, bias, constants, multiplier, begin,
                 replays):
    """:func:`_planes` as the node's call kept for its image size (``image_routes.Kept``)."""
    _planes(module, hp, wp, X, W, B, out, weights, bias, constants, multiplier, begin,
            replays, kept=True)


def _planes(module, hp, wp, X, W, B, out, weights, bias, constants, multiplier, begin,
            replays, kept=False):
    """:func:`depthwise_conv`'s loop over its planes by ``module`` (a row or a flat form)
    with a scratch of (hp, wp); ``kept``: called as the node's kept call of its image
    size, which it does not keep again."""
    (n, channels, height, width), m = X.shape, W.shape[0]
    (oh, ow), left = out.shape[2:], begin[1]
    x = X.reshape(n * channels, height, width)
    y = out.reshape(n * m, oh, ow)

    def part(start, stop):
        module.run(x, weights, bias, y, constants, multiplier, m, begin[0], left, start,
                   stop, np.empty((hp, wp), X.dtype))
    native = jit_cpu.native_pool()
    parts = split(n * m, out.size, native)
    if parts is not None:
        go = prepared(native, module, (x, weights, bias, y, constants),
                      (multiplier, m, begin[0], left, hp, wp), parts, keep=(bias, constants))
    elif out.size < SPLIT_ELEMENTS:
        def go(*_):  # one part here: a small plane's call, kept as the replay too
            part(0, n * m)
    else:
        parallel_for(thread_parts(n * m, out.size), part)
        return out
    go()  # before it is kept as the replay: a form in no cache raises here, kept nowhere
    if np.may_share_memory(weights, W) and (B is None or np.may_share_memory(bias, B)):
        replay.record(replays, (X, W, B, None, out), go, silent=True)
        if not kept:
            image_routes.stash(replays, out, image_routes.Kept(
                _planes_kept, module, hp, wp, weights, bias, constants, multiplier, begin,
                replays), LOADING_RUNS)
    return out


@functools.lru_cache(maxsize=64)
def _compiled(kernel: tuple, strides: tuple, dilations: tuple, activation: str = ""):
    # generating the source costs ~10 µs a call; the cache makes a call a dict lookup
    return compiled(source(kernel, strides, dilations, activation), prefix="mixrt_depthwise")


def source(kernel: tuple, strides: tuple, dilations: tuple, activation: str = "") -> str:
    """The module for one geometry: ``run(x, w, bias, y, multiplier, m, top, left, start, stop,
    pad)`` computes output planes start..stop of y (N*M, oh, ow) from x (N*C, H, W), the
    weights w (M, kh*kw) and bias (M,), padding each input plane into ``pad`` (hp, wp)."""
    for value in (*kernel, *strides, *dilations):
        if not (isinstance(value, int) and value >= 1):
            raise ValueError(f"depthwise geometry must be positive integers, got {value!r}")
    (kh, kw), (sh, sw), (dh, dw) = kernel, strides, dilations
    taps = [(a, b) for a in range(kh) for b in range(kw)]
    split = (sw, dw) == (2, 1)  # each padded row as its even cells, then its odd ones
    # every array is flat and indexed with uint64 offsets (see ops/compiled/jit_cpu.py): slicing
    # nine row views per output row cost more than the row's arithmetic on 7x7 and 14x14
    # planes (ShuffleNet's 544x7x7 layer 45 -> 32 us)
    column = (lambda b: f"k + {b // 2}" + (" + half" if b % 2 else "")) if split else \
        (lambda b: f"k * {sw} + {b * dw}")
    weights = [f"    w{a}_{b} = w[uint64(c + {a * kw + b})]" for a, b in taps]
    total = " + ".join(f"w{a}_{b} * pad[uint64(r{a} + {column(b)})]" for a, b in taps)
    return "\n".join([
        *_module_head(activation),
        f"@njit({FLAGS})",
        "def plane(pad, wp, half, w, c, bias, y, base, oh, ow, c0, c1, c2, c3):",
        *weights,
        "    for i in range(oh):",
        *[f"        r{a} = (i * {sh} + {a * dh}) * wp" for a in range(kh)],
        "        o = base + i * ow",
        "        for k in range(ow):",
        f"            v = bias + {total}",
        *[f"            {line}" for line in ACTIVATIONS[activation][1]],
        "            y[uint64(o + k)] = v",
        "",
        f"@njit({FLAGS})",
        "def run(x, w, bias, y, act, multiplier, m, top, left, start, stop, pad):",
        "    c0, c1, c2, c3 = act[0], act[1], act[2], act[3]",
        "    hp, wp = pad.shape",
        "    height, width = x.shape[1], x.shape[2]",
        "    rows, cols = min(height, hp - top), min(width, wp - left)",
        "    oh, ow = y.shape[1], y.shape[2]",
        "    taps = w.shape[1]",
        "    channels = m // multiplier",
        "    half = (wp + 1) // 2  # where a split row's odd cells start",
        "    xs, ws, ys, ps = x.reshape(-1), w.reshape(-1), y.reshape(-1), pad.reshape(-1)",
        *(word_views() if split else []),
        "    # the border stays zero: every plane overwrites the same interior",
        "    for t in range(hp * wp):",
        "        ps[t] = 0",
        "    padded = -1",
        "    for q in range(start, stop):",
        "        image, channel = q // m, q % m",
        "        p = image * channels + channel // multiplier",
        "        if p != padded:",
        *_plane_copy(split),
        "            padded = p",
        "        plane(ps, wp, half, ws, channel * taps, bias[channel], ys, q * oh * ow, oh,"
        " ow, c0, c1, c2, c3)",
        "",
        *part_entries(),
    ])


def _plane_copy(split: bool) -> list[str]:
    """The copy of input plane p into the padded scratch."""
    return split_copy() if split else [
        "            for r in range(rows):",
        "                source = (p * height + r) * width",
        "                target = (top + r) * wp + left",
        "                for c in range(cols):",
        "                    ps[uint64(target + c)] = xs[uint64(source + c)]"]


class FlatPlane:
    """The flat form's layout for one plane geometry: ``kernel``, ``strides``,
    ``dilations`` and ``image`` = (height, width, top pad, left pad, oh, ow). The padded
    plane (as far as the last window reaches) is held as ``sh * sw`` stride phases of
    ``phase_rows`` x ``phase_width`` cells, each phase ``plane`` cells apart; the flat output
    row (``length`` cells, ``oh * phase_width`` rounded up to whole vectors) follows them, so
    one scratch of ``scratch`` cells holds both. Each phase has room past its cells for the
    reads of the rounded-up tail."""

    def __init__(self, kernel: tuple, strides: tuple, dilations: tuple, image: tuple):
        for value in (*kernel, *strides, *dilations, *image):
            if not (isinstance(value, int) and value >= 0):
                raise ValueError(f"depthwise geometry must be integers, got {value!r}")
        self.kernel, self.strides, self.dilations, self.image = kernel, strides, dilations, image
        (kh, kw), (sh, sw), (dh, dw) = kernel, strides, dilations
        _, _, _, _, oh, ow = image
        hp, wp = (oh - 1) * sh + (kh - 1) * dh + 1, (ow - 1) * sw + (kw - 1) * dw + 1
        self.padded = (hp, wp)
        self.phase_rows, self.phase_width = -(-hp // sh), -(-wp // sw)
        self.length = -(-oh * self.phase_width // FLAT_LANES) * FLAT_LANES
        # the farthest tap's start within its phase: its reads end below length + reach
        reach = (kh - 1) * dh // sh * self.phase_width + (kw - 1) * dw // sw
        self.plane = max(self.phase_rows * self.phase_width, self.length + reach)
        self.phases = sh * sw
        self.scratch = self.phases * self.plane + self.length

    def offset(self, a: int, b: int) -> int:
        """Where tap (a, b)'s reads start: its phase, then its place in the phase."""
        (sh, sw), (dh, dw) = self.strides, self.dilations
        row, column = a * dh, b * dw
        phase = (row % sh) * sw + column % sw
        return phase * self.plane + row // sh * self.phase_width + column // sw

    def cell(self, row: str, column: str) -> str:
        """The scratch index of padded cell (row, column), as source text."""
        (sh, sw), wph = self.strides, self.phase_width
        return (f"(({row}) % {sh} * {sw} + ({column}) % {sw}) * {self.plane}"
                f" + ({row}) // {sh} * {wph} + ({column}) // {sw}")


@functools.lru_cache(maxsize=128)
def _flat_module(text: str):
    """The flat form's module of ``text`` (:func:`_flat_text`), imported once: a call
    through ``kernel_module`` reads and compares its file."""
    return compiled(text, prefix=FLAT_PREFIX)


@functools.lru_cache(maxsize=256)
def _flat_name(text: str) -> str:
    return module_name(text, FLAT_PREFIX)


@functools.lru_cache(maxsize=256)
def _flat_text(kernel: tuple, strides: tuple, dilations: tuple, image: tuple,
               activation: str = "", width: int = 1) -> tuple:
    """(the flat form's source, its scratch's cells) for one geometry and group width."""
    plane = FlatPlane(kernel, strides, dilations, image)
    return flat_source(plane, activation, width), width * plane.phases * plane.plane \
        + plane.length


FLAT_PREFIX = "mixrt_depthwise_flat"


def flat_source(plane: FlatPlane, activation: str = "", width: int = 1) -> str:
    """The flat form's module for one geometry (see the module's docstring): ``run`` as in
    :func:`source`, its ``pad`` a (1, cells) scratch: the ``width`` input planes of a
    group (1 for a depthwise convolution), each as its stride phases, then the flat
    output row. Each output sums its taps over the group's planes in turn."""
    (kh, kw), (height, width_, top, left, oh, ow) = plane.kernel, plane.image
    hp, wp = plane.padded
    rows, cols = min(height, hp - top), min(width_, wp - left)
    taps = [(c, a, b) for c in range(width) for a in range(kh) for b in range(kw)]
    held = plane.phases * plane.plane  # one input plane's cells
    output = width * held
    total = " + ".join(f"w{c}_{a}_{b} * ps[uint64(k + {c * held + plane.offset(a, b)})]"
                       for c, a, b in taps)
    pairs = plane.strides[1] == 2 and cols > 1  # float32 rows copied as pairs of cells
    return "\n".join([
        *_module_head(activation),
        f"@njit({FLAGS})",
        "def run(x, w, bias, y, act, multiplier, m, top, left, start, stop, pad):",
        "    c0, c1, c2, c3 = act[0], act[1], act[2], act[3]",
        "    xs, ws, ys, ps = x.reshape(-1), w.reshape(-1), y.reshape(-1), pad.reshape(-1)",
        *(word_views() if pairs else []),
        "    channels = m // multiplier",
        "    # the padding stays zero: every plane overwrites the same cells",
        f"    for t in range({output}):",
        "        ps[t] = 0",
        "    padded = -1",
        "    for q in range(start, stop):",
        "        image, channel = q // m, q % m",
        "        p = image * channels + channel // multiplier  # the group's index",
        "        if p != padded:",
        f"            for g in range({width}):",
        f"                for r in range({max(rows, 0)}):",
        f"                    source = ((p * {width} + g) * {height} + r) * {width_}",
        *(flat_pairs(plane, held, top, left, cols) if pairs else []),
        f"                    for c in range({max(cols, 0)}):",
        f"                        ps[uint64(g * {held} + "
        f"{plane.cell(f'r + {top}', f'c + {left}')})] = xs[uint64(source + c)]",
        "            padded = p",
        *[f"        w{c}_{a}_{b} = ws[uint64(channel * {len(taps)} + {(c * kh + a) * kw + b})]"
          for c, a, b in taps],
        "        b = bias[channel]",
        f"        for k in range({plane.length}):",
        f"            v = b + {total}",
        *[f"            {line}" for line in ACTIVATIONS[activation][1]],
        f"            ps[uint64({output} + k)] = v",
        f"        base = q * {oh * ow}",
        f"        for i in range({oh}):",
        f"            for j in range({ow}):",
        f"                ys[uint64(base + i * {ow} + j)] = ps[uint64({output} + i *"
        f" {plane.phase_width} + j)]",
        "",
        *part_entries(),
    ])
