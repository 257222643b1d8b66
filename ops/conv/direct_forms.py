"""Which 2-D convolutions the direct form (``conv_direct_cpu.py``) takes, and in which of its
forms, measured against im2col (or kernel rows) and OpenBLAS:

* a kernel of several taps takes its **output positions as the tile's rows**: 8 outputs,
  each read at its taps (one broadcast per output and tap), against a panel of 32 output
  channels of the weight's transpose, packed once per session node. Every computed row is an
  output, whatever the image's width, and the tile is stored transposed: 8 consecutive
  outputs of each channel (7 where outputs come in sevens, as on a 7x7 plane). (The
  weight-on-the-left form computes the planes' padding columns too: 15 of 64 positions at
  7x7; it lost to this one at every size.) A kernel of few taps whose output channels come
  in whole strips takes the weight on the left instead (:func:`_left_taps`).
* a 1x1 convolution takes **the weight on the left** (stride 1 from 7x7 outputs, strided
  ones from 28x28): 8 output channels by 32 consecutive outputs of every input channel, read
  where they lie in the image; smaller ones stay with OpenBLAS.
* a strided 1x1 convolution of a small image takes the tap form on its input **packed into
  strips** of 8 outputs (each channel's 8 pixels side by side, read in order) instead of the
  im2col columns and OpenBLAS it took before.

And the epilogue's activations as (slope below zero, low, high) (:func:`activation_limits`),
with a gate after the tile for HardSwish and Swish (:func:`gated_limits`).
"""

from __future__ import annotations

import functools
import math

import numpy as np

from mixrt.ops.compiled import jit_cpu
from mixrt.ops.elementwise import odd_rational

# a 1x1 convolution of stride 1 takes the weight-on-the-left form from this many outputs
# (7x7: two panels of 32 computed for 49). Since the native workers it beats OpenBLAS plus
# its epilogue pass on ResNet-50's layers, in one process alternating (us): 512 -> 2048 at
# 7x7 468 -> 423, 2048 -> 512 at 7x7 439 -> 414, 1024 -> 256 at 14x14 364 -> 348, 512 ->
# 128 at 28x28 367 -> 319, SqueezeNet's 128 -> 64 at 13x13 113 -> 94; at 4x4 (one panel of
# 32 for 16 outputs) it lost, 47 -> 82
POINTWISE_POSITIONS = 7 * 7
# a strided one (its one stride phase copied out first) from 28x28 outputs, and when its
# panel (input channels x 32 outputs) stays in L1 (48 KiB here) while the output channels'
# strips pass over it; ResNet's projections to 14x14 and 7x7 ran 1.09x and 1.16x the
# packed strips (:func:`_strided_pointwise`)
STRIDED_POINTWISE_POSITIONS = 28 * 28
# a stride-1 one over a small plane takes the strips when it expands the channels
# (:func:`small_expansion`)
SMALL_STRIPS_MIN_PIXELS = 16
SMALL_STRIPS_GROWTH = 2
SMALL_STRIPS_SPARE = 1 / 6  # lanes left empty in the last strip, per pixel
POINTWISE_PANEL_BYTES = 1 << 15
PANEL_WIDTH_BYTES = 128  # two 64-byte vectors of outputs
STRIP = 8  # ops/panels/_jit_panels.py's STRIP_ROWS (read here without loading numba)
# taps (K = channels x kernel) up to which a tap conv takes the weight on the left
LEFT_TAPS_MAX_K = 128
# the epilogue's activations, as (slope below zero, low, high): anything else runs after
NO_ACTIVATION = (1.0, -math.inf, math.inf)
# HardSwish and Swish as the direct form's epilogue: no slope or clamp, then the gate (1, 2)
# its native parts apply to their outputs while they are in cache
# (``_jit_conv_direct.gated``)
HARD_SWISH = (1.0, -math.inf, math.inf, 1)
SWISH = (1.0, -math.inf, math.inf, 2)


def gated_limits(activation: str, dtype) -> tuple | None:
    """``activation`` as the direct form's epilogue with a gate after the tile: HardSwish
    (:data:`HARD_SWISH`), or Swish in float32 (:data:`SWISH`; its compiled pass is float32's
    alone, through the sigmoid rational); None for any other. Each was a compiled pass of its
    own over the whole output after the convolution: MobileNetV3-small's stem and nine
    expansions, EfficientNet-B0's stem, head and sixteen expansions (2026-12-04)."""
    if activation == "HardSwish":
        return HARD_SWISH
    return SWISH if activation == "Swish" and np.dtype(dtype) == np.float32 else None


def limits_array(limits: tuple, dtype) -> np.ndarray:
    """The native drivers' epilogue words (``_jit_conv_direct.GATE`` and after): low, high,
    slope, the gate (0: none), HardSigmoid's alpha and beta (1/6, 0.5), zero, one, a half,
    then the float32 sigmoid rational's clip limits, scale and coefficients (P, Q), in
    ``dtype``: the constants the passes the gates stand for computed with."""
    slope, low, high = limits[:3]
    gate = limits[3] if len(limits) > 3 else 0
    return np.array((low, high, slope, gate, 1 / 6, 0.5, 0, 1, 0.5, *_sigmoid_constants()),
                    dtype)


@functools.cache
def _sigmoid_constants() -> tuple:
    """The sigmoid rational's (-limit, limit, 1 / limit^2, P's five, Q's five), as
    ``odd_rational.numba_source`` writes them into a compiled pass."""
    p, q = odd_rational.coefficients("Sigmoid")
    if (len(p), len(q)) != (5, 5):  # the gate's Horner forms are written for these
        raise AssertionError(f"the sigmoid rational's degrees changed: {len(p)}, {len(q)}")
    bound = odd_rational.limit("Sigmoid")
    return (-bound, bound, 1.0 / bound ** 2, *(float(v) for v in p), *(float(v) for v in q))


def activation_limits(activation: str, params) -> tuple | None:
    """``activation`` (FusedConv's name and params) as the epilogue's (slope, low, high), or
    None when it is not a piecewise-linear one the epilogue computes."""
    params = list(params or ())
    if not activation:
        return NO_ACTIVATION
    if activation == "Relu":
        return 1.0, 0.0, math.inf
    if activation == "LeakyRelu" and len(params) == 1:
        return float(params[0]), -math.inf, math.inf
    if activation == "Clip" and len(params) == 2:
        return 1.0, float(params[0]), float(params[1])
    return None


def layer_limits(activation: str, params, dtype) -> np.ndarray | None:
    """A dense layer's activation as the panel tile applies it after the bias, (low, high,
    slope) in ``dtype`` (Relu, LeakyRelu, Clip: :func:`activation_limits`), or None
    where it has none, one the tile does not compute, or a dtype the panels do not take
    (float32 and float64 alone). Kept per activation, so that a node's calls pass the same
    array (its rows route compares it by identity); writable like the biases the kernels
    take, so that no second signature of theirs is compiled for a read-only one."""
    if not activation or np.dtype(dtype).char not in "fd":
        return None
    key = (activation, tuple(float(p) for p in params or ()), np.dtype(dtype).char)
    found = _LAYER_LIMITS.get(key)
    if found is None:
        limits = activation_limits(activation, params)
        if limits is None:
            return None
        slope, low, high = limits
        found = _LAYER_LIMITS.setdefault(key, np.array((low, high, slope), dtype))
    return found


_LAYER_LIMITS: dict = {}


def suits(X, W, group, geometry, out, prepacked) -> bool:
    """A 2-D convolution of one group, native floats, a weight with a home for its packed
    layout (``prepacked``: the node's dict for a constant, a thread's :func:`varying_layouts`
    for one that varies), contiguous input and output (``out`` None: one will be made), on a
    machine that runs the panel tile: any kernel of several taps, and 1x1 kernels on large
    images (POINTWISE_*)."""
    if prepacked is None or X.ndim != 4 or int(group) != 1 or X.dtype not in jit_cpu.NATIVE \
            or W.dtype != X.dtype or not X.flags.c_contiguous \
            or jit_cpu.panel_kernels() is None:
        return False
    if out is not None and (out.dtype != X.dtype or not out.flags.c_contiguous
                            or np.may_share_memory(out, X)):
        return False
    kernel, strides, out_dims = geometry[0], geometry[1], geometry[6]
    return math.prod(kernel) > 1 or _weight_on_the_left(X.shape[1], strides, out_dims) \
        or _strided_pointwise(kernel, strides, X.shape[1], out_dims, W.shape[0])


def _weight_on_the_left(channels, strides, out_dims) -> bool:
    """Whether a 1x1 convolution takes the weight-on-the-left form (POINTWISE_*; else it is
    not taken: as the tap form, ResNet-50's 14x14 and 7x7 ones ran 1.09x, DenseNet's 1.4x
    the BLAS)."""
    if all(int(s) == 1 for s in strides):
        return math.prod(out_dims) >= POINTWISE_POSITIONS
    return math.prod(out_dims) >= STRIDED_POINTWISE_POSITIONS \
        and channels * PANEL_WIDTH_BYTES <= POINTWISE_PANEL_BYTES


def _left_taps(k_len, channels) -> bool:
    """Whether a kernel of several taps takes the weight on the left: ``channels`` output
    channels (whole strips of 8) as a tile's rows and 32 outputs of one row as its panel,
    each panel row read in the phase planes at its tap's offset. With few taps the tap
    tile's transposed store of 32 x 8 sums weighs on its short K loop; here every store is
    a row. One process alternating, 2 threads (us, tap tile / weight on the left): 3 -> 24
    channels 3x3 s2 at 224 (ShuffleNet's stem, K 27) 116 / 84, 3 -> 64 (SqueezeNet's) 218 /
    168, K 75 389 / 352, K 108 124 / 106; from K 144 even (ResNet's 7x7 stem, K 147: 619 /
    620), and past 200 the tap tile wins (K 216 223 / 233, K 576 556 / 591)."""
    return k_len <= LEFT_TAPS_MAX_K and channels % STRIP == 0


def _strided_pointwise(kernel, strides, channels, out_dims, out_channels) -> bool:
    """Whether a 1x1 convolution runs the tap tile on its input packed into strips of outputs
    (``_jit_panels.pack_strips``): one of stride > 1 that the weight-on-the-left form does
    not take (ResNet's projections to 14x14 and 7x7: 2048 x 1024 to 7x7 680-785 us against
    815-913 through im2col and OpenBLAS, 1024 x 512 to 14x14 600-731 against 680-815, 2
    threads, in one process), or a small plane's expansion (:func:`small_expansion`).
    Packing costs as much as a larger stride-1 layer's whole gain: those stay with OpenBLAS
    (1024 x 256 at 14x14 346 against 513 packed)."""
    if math.prod(kernel) != 1 or _weight_on_the_left(channels, strides, out_dims):
        return False
    return any(int(s) > 1 for s in strides) or small_expansion(channels, out_dims, out_channels)


def small_expansion(channels, out_dims, out_channels) -> bool:
    """A stride-1 1x1 convolution over a plane of SMALL_STRIPS_MIN_PIXELS up to
    POINTWISE_POSITIONS pixels that at least doubles the channels (a mobile block's
    expansion), its pixels filling whole strips but for SMALL_STRIPS_SPARE of them: the tile
    stores its outputs transposed with the bias and activation, where the pixel-row product
    (``ops/conv/pointwise_rows.py``) transposes them back and runs its epilogue as passes
    over the large output. One process, 2 threads, FusedConv alone (us, rows / strips),
    2026-11-25: 96 -> 576 at 6x6 + Clip 58.5 / 31.6, at 8 x 6x6 335 / 231; 40 -> 240 at 4x4
    + HardSwish 18.8 / 10.5; 24 -> 72 at 7x6 12.5 / 9.4. The rows keep the rest: 576 -> 96
    at 6x6 42.4 / 49.0, anything at 3x3 (9 pixels fill two strips: 960 -> 160 26.9 / 41.4),
    112 -> 672 over 8 x 5x5 232 / 258."""
    pixels = math.prod(out_dims)
    padded = -(-pixels // STRIP) * STRIP
    return SMALL_STRIPS_MIN_PIXELS <= pixels < POINTWISE_POSITIONS \
        and out_channels >= SMALL_STRIPS_GROWTH * channels \
        and padded - pixels <= pixels * SMALL_STRIPS_SPARE
