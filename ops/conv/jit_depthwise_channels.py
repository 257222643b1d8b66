"""The depthwise convolution's channels form: small planes with the channels side by side
(``ops/conv/jit_depthwise.py`` takes it; its row and flat forms are there)."""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np

from mixrt.ops.compiled import jit_cpu, replay
from mixrt.ops.compiled.generated import kernel_file_stamp
from mixrt.ops.compiled.generated import kernel_module as compiled
from mixrt.ops.compiled.workspace import packed
from mixrt.ops.conv.depthwise_common import (ACTIVATIONS, FLAGS, WARM, _module_head,
                                             activation_constants, suits,
                                             weight_and_bias)
from mixrt.ops.conv.depthwise_costs import small_plane_form
from mixrt.ops.panels.native_parts import (part_entry, part_source, prepared, split,
                                           warm_prepared)

# -- the channels form: small planes with the channels side by side ----------------------------
#
# The row and flat forms above vectorize along a plane's pixels: a row of outputs, or the
# whole padded plane as one flat row. Once a plane is a few pixels across
# (the mobile networks' last stages: 3x3, 6x6 and 7x7 at 96-224 pixel inputs) a vector has
# little to hold: EfficientNet-B0's 1152 x 3x3 5x5 layer computes a padded 7-wide flat row
# rounded up to 32 cells for each of its 9 outputs, 3.6x the arithmetic, and ran at ~2
# GMAC/s (135 us against onnxruntime's ~20 for its whole stage).
#
# Here (where ``depthwise_costs.small_plane_form`` models it the cheapest form) a block
# of up to CHANNEL_BLOCK channels of one image is copied, a band of rows at a time, into a
# zero-bordered (row, column, channel) scratch, and each output pixel sums its taps across the
# block's channels at once, one vector per 16 channels; the sums are then activated and
# transposed back (both copies transposes in registers, ``ops/panels/_jit_transpose.py``). A
# tap that falls on the padding multiplies its weight by a real zero, as the zero-padded
# reference does (a NaN or infinite weight gives NaN there), and the taps are added in the
# same order (bias first, then row by row) without fused multiply-adds: the results are the
# bits of the other two forms. The weight is transposed once per node into (taps, channels).
#
# The (image, channel block) units are split over the native workers
# (``ops/panels/native_parts.py``) and the call is kept as the node's replay.

# the block transposes' kernel file: its hash is in each module's text
_TRANSPOSE = str(Path(__file__).parents[1] / "panels" / "_jit_transpose.py")
# channels per unit: four 64-byte vectors of floats, so that a block's (pixels, channels)
# scratch of a 7x7 plane stays in L1
CHANNEL_BLOCK = 64
# the scratch a band of output rows reads, at most: its padded rows of a block's channels
# side by side stay in the core's L2 (a 96 x 96 plane's 64 channels are 2.4 MB whole; copied
# whole, then read again, they went to memory and back)
BAND_BYTES = 256 * 1024
# output pixels up to which this form, rather than the row form, stands in for a flat form in
# no cache (one thread, 2026-11-27: 1152 x 7 x 7 5x5 319 -> 138 us, 1152 x 10 x 10 336 -> 238;
# at 14 x 14 a 3x3 kernel's rows were ahead, 106 against 135; the flat form 81, 137, 65)
CHANNELS_FALLBACK_PIXELS = 100


def channels_suit(X, W, out, kernel, strides, dilations, out_dims) -> bool:
    """Whether ``out`` = depthwise Conv(X, W) takes this form rather than the flat form or
    the size-free ones (as ``jit_depthwise.depthwise_conv`` picks): one output channel per
    input channel, a plane its model finds cheapest here
    (``depthwise_costs.small_plane_form``), a 2-D kernel of at most ``MAX_TAPS`` per axis,
    native floats, C-contiguous arrays."""
    return channels_able(X, W, out, kernel) and small_plane_form(
        tuple(kernel), tuple(strides), tuple(dilations), tuple(out_dims), X.itemsize,
        True) == "channels"


def channels_able(X, W, out, kernel) -> bool:
    """:func:`channels_suit` whatever the number of output pixels."""
    return X.ndim == 4 and W.shape[0] == X.shape[1] and W.shape[1] == 1 \
        and len(kernel) == 2 and X.dtype in jit_cpu.NATIVE and W.dtype == X.dtype \
        and suits(X, W, out, kernel)


def channels_conv(X, W, B, out, kernel, strides, dilations, begin, replays=None,
                  activation=("", None)):
    """``out`` = activation(depthwise Conv(X, W) + B) (see :func:`suits`); ``replays``: the
    node's prepacked dict where ``out`` is the caller's and W a constant (the transposed
    weight is kept there and the call recorded), else None."""
    n, channels = X.shape[:2]
    name = activation[0] or ""
    constants = activation_constants(name, activation[1], X.dtype)
    taps = _channel_taps(W, replays)
    _, bias = weight_and_bias(W, B, X.dtype, channels)  # the node's bias view, made once
    # (2-D: channels_able; pairs written out, no generators, at each size's first call)
    module = _compiled_channels((int(kernel[0]), int(kernel[1])),
                                (int(strides[0]), int(strides[1])),
                                (int(dilations[0]), int(dilations[1])), name)
    pads = (int(begin[0]), int(begin[1]))
    blocks = -(-channels // CHANNEL_BLOCK)
    units = n * blocks
    native = jit_cpu.native_pool()
    parts = split(units, out.size, native)
    if parts is not None:
        go = prepared(native, module, (X, taps, bias, out, constants), (blocks, *pads),
                      parts, keep=(bias, constants, taps))
    else:
        zero = X.dtype.type(0)

        def go(*_):
            module.run(X, taps, bias, out, constants, blocks, *pads, 0, units, zero)
    go()
    if replays is not None and (B is None or np.may_share_memory(bias, B)):
        replay.record(replays, (X, W, B, None, out), go, silent=True)
    return out


def _channel_taps(W, prepacked):
    """W (C, 1, kh, kw) as (kh * kw, C), contiguous: kept in ``prepacked`` when given."""
    return packed(prepacked, ("depthwise_channels_last", W.shape),
                  lambda: np.ascontiguousarray(W.reshape(W.shape[0], -1).T))


@functools.lru_cache(maxsize=64)
def _compiled_channels(kernel: tuple, strides: tuple, dilations: tuple, activation: str):
    return compiled(channels_source(kernel, strides, dilations, activation),
                    prefix="mixrt_depthwise_channels")


def channels_source(kernel: tuple, strides: tuple, dilations: tuple,
                    activation: str = "") -> str:
    """The channels form's module for one geometry and activation: ``run(x, ws, bias, y, act,
    blocks, top, left, start, stop, zero)`` computes the units start..stop (image ``u //
    blocks``, channels from ``u % blocks * CHANNEL_BLOCK``) of y (N, C, oh, ow) from x (N, C, H,
    W), ``ws`` the weight as (taps, channels). A unit goes by bands of output rows: the band's
    padded rows are a (rows, wp, BLOCK) scratch whose side columns are zeroed once per call
    (every band writes the same interior columns), so each tap of an output pixel is a fixed
    offset from the pixel's corner, unrolled with the tap's weights; a band is as many output
    rows as keep that scratch within BAND_BYTES (a small plane's is the whole plane)."""
    for value in (*kernel, *strides, *dilations):
        if not (isinstance(value, int) and value >= 1):
            raise ValueError(f"depthwise geometry must be positive integers, got {value!r}")
    (kh, kw), (sh, sw), (dh, dw) = kernel, strides, dilations
    taps = [(a, b) for a in range(kh) for b in range(kw)]
    total = " + ".join(f"ws[uint64(w{a}_{b} + c)] * rows[uint64(corner + d{a}_{b} + c)]"
                       for a, b in taps)
    statements = ACTIVATIONS[activation][1]
    return "\n".join([
        *_module_head(activation),
        "from mixrt.ops.panels._jit_transpose import transpose"
        f"  # {kernel_file_stamp(_TRANSPOSE)}",
        f"BLOCK = {CHANNEL_BLOCK}",
        f"BAND_BYTES = {BAND_BYTES}",
        "",
        f"@njit({FLAGS})",
        "def unit(xs, ws, bias, ys, act, u, blocks, channels, height, width, oh, ow, wp,",
        "         top, left, band, rows, sums, zero):",
        "    c0, c1, c2, c3 = act[0], act[1], act[2], act[3]",
        "    image, first = u // blocks, u % blocks * BLOCK",
        "    count = min(BLOCK, channels - first)",
        "    plane, pixels = height * width, oh * ow",
        "    source = (image * channels + first) * plane",
        "    target = (image * channels + first) * pixels",
        *[f"    w{a}_{b} = {a * kw + b} * channels + first" for a, b in taps],
        *[f"    d{a}_{b} = ({a * dh} * wp + {b * dw}) * BLOCK" for a, b in taps],
        "    for i0 in range(0, oh, band):",
        "        i1 = min(oh, i0 + band)",
        f"        p0 = i0 * {sh}",
        "        # the band's padded rows into the scratch, the channels side by side: each",
        "        # image row transposed in registers, a padding row zeroed where an earlier",
        "        # band may have left an image row there (one band: zero since the call began)",
        f"        for q in range((i1 - 1 - i0) * {sh} + {(kh - 1) * dh} + 1):",
        "            r = p0 + q - top",
        "            if 0 <= r < height:",
        "                transpose(xs, source + r * width, plane, rows, (q * wp + left) * BLOCK,",
        "                          BLOCK, count, width)",
        "            elif band < oh:",
        "                for t in range(q * wp * BLOCK, (q + 1) * wp * BLOCK):",
        "                    rows[t] = zero",
        "        for i in range(i1 - i0):",
        "            for j in range(ow):",
        f"                corner = (i * {sh} * wp + j * {sw}) * BLOCK",
        "                o = (i * ow + j) * BLOCK",
        "                for c in range(count):",
        f"                    v = bias[uint64(first + c)] + {total}",
        *[f"                    {line}" for line in statements],
        "                    sums[uint64(o + c)] = v",
        "        transpose(sums, 0, BLOCK, ys, target + i0 * ow, pixels, (i1 - i0) * ow, count)",
        "",
        f"@njit({FLAGS})",
        "def run(x, ws, bias, y, act, blocks, top, left, start, stop, zero):",
        "    channels, height, width = x.shape[1], x.shape[2], x.shape[3]",
        "    oh, ow = y.shape[2], y.shape[3]",
        f"    wp = (ow - 1) * {sw} + {(kw - 1) * dw} + 1",
        "    wp = max(wp, left + width)  # the far pads past the last window are never read",
        f"    reach = {(kh - 1) * dh} + 1",
        "    # output rows a band: its padded rows within BAND_BYTES of scratch (at least one)",
        "    fit = max(reach, BAND_BYTES // (wp * BLOCK * x.itemsize))",
        f"    band = min(oh, max(1, (fit - reach) // {sh} + 1))",
        f"    rows = np.empty(((band - 1) * {sh} + reach) * wp * BLOCK, x.dtype)",
        "    for t in range(rows.size):",
        "        rows[t] = zero",
        "    sums = np.empty(band * ow * BLOCK, x.dtype)",
        "    xs, wf, ys = x.reshape(-1), ws.reshape(-1), y.reshape(-1)",
        "    for u in range(start, stop):",
        "        unit(xs, wf, bias, ys, act, u, blocks, channels, height, width, oh, ow, wp,",
        "             top, left, band, rows, sums, zero)",
        "",
        *part_source([("x", 4, True), ("ws", 2, True), ("bias", 1, True), ("y", 4, True),
                      ("act", 1, True)], ["blocks", "top", "left"],
                     lambda dtype: ["run(x, ws, bias, y, act, blocks, top, left, start, stop,"
                                    f" {dtype}(0))"]),
    ])


def warm_channels(X, W, B, out, kernel, strides, dilations, begin, replays, activation):
    """As :func:`_warm_rows`, the channels form: the narrow planes' fallback (the row form
    runs a 10 x 10 plane's rows as the scalar remainders of its vector loop). Its entries
    run on the first image's first block of channels, which the node's call writes
    again."""
    geometry = (tuple(int(k) for k in kernel), tuple(int(s) for s in strides),
                tuple(int(d) for d in dilations), activation[0] or "")
    # what the entries' types follow from, read before anything is made (this is asked at
    # every call where compiling is allowed): the taps and constants are copies, the bias
    # is B itself where B is contiguous in X's dtype (read-only, it compiles apart)
    given = B is not None and B.dtype == X.dtype and B.flags.c_contiguous
    key = ("channels", *geometry, X.dtype.str, X.flags.writeable,
           not given or B.flags.writeable)
    if key in WARM:
        return
    module = _compiled_channels(*geometry)
    taps = _channel_taps(W, replays)
    bias = np.zeros(X.shape[1], X.dtype) if B is None \
        else np.ascontiguousarray(B, X.dtype).reshape(X.shape[1])
    constants = activation_constants(activation[0] or "", activation[1], X.dtype)
    if jit_cpu.native_pool() is not None:
        part_entry(module, "f" if X.dtype == np.float32 else "d")
        warm_prepared((X, taps, bias, out, constants))
    blocks = -(-X.shape[1] // CHANNEL_BLOCK)
    module.run(X[:1], taps, bias, out[:1], constants, blocks, int(begin[0]), int(begin[1]),
               0, 1, X.dtype.type(0))
    WARM.add(key)
