"""Direct 2-D convolution on the packed-panel tile: no im2col, and the bias, residual and
activation applied as the tile is stored.

ResNet-50's convolutions through im2col (or kernel rows) and OpenBLAS spent ~6.6 ms of a
26 ms run outside the sgemm: copying columns, then one more pass over each output for the
bias, the shortcut and the Relu. Here (``ops/panels/_jit_panels.py``) the image is copied once,
into its zero-padded stride phases, and the tile reads straight out of them:

* a kernel of several taps takes its **output positions as the tile's rows**: 8 outputs,
  each read at its taps (one broadcast per output and tap), against a panel of 32 output
  channels of the weight's transpose, packed once per session node. Every computed row is an
  output, whatever the image's width, and the tile is stored transposed: 8 consecutive
  outputs of each channel (7 where outputs come in sevens, as on a 7x7 plane). (The
  weight-on-the-left form computes the planes' padding columns too: 15 of 64 positions at
  7x7; it lost to this one at every size.)
* a 1x1 convolution takes **the weight on the left** (stride 1 from 7x7 outputs, strided
  ones from 28x28): 8 output channels by 32 consecutive outputs of every input channel, read
  where they lie in the image; smaller ones stay with OpenBLAS.
* a strided 1x1 convolution of a small image takes the tap form on its input **packed into
  strips** of 8 outputs (each channel's 8 pixels side by side, read in order) instead of the
  im2col columns and OpenBLAS it took before.

The epilogue (``activation_limits``) is + bias, + residual, a slope below zero and a clamp:
Relu, LeakyRelu and Clip. Another activation runs after, over the output.

An image's parts (bands of output rows, or runs of output channels) are split between the
calling thread and a native worker thread in one compiled call (``_jit_panels.native_conv``),
which hands off without the GIL; ``parallel_for`` remains where that pool is off
(``MIXRT_NATIVE_POOL=0``, one thread, not Linux x86-64).
"""

from __future__ import annotations

import math
import threading

import numpy as np

from mixrt.ops.compiled import jit_cpu, replay
from mixrt.ops.compiled.parallel import intra_op_threads, parallel_for, thread_parts

# output rows per thread from which the threads split the image's rows (each building its
# own phase planes: an image written by one core and read by the other cost ~20%) rather
# than the output channels
ROWS_SPLIT_MIN = 8
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
# weight bytes per block of output channels (1x1 form): a block stays in L2 (1 MiB here)
# while the outputs pass over it
WEIGHT_BLOCK_BYTES = 1 << 18
STRIP = 8  # ops/panels/_jit_panels.py's STRIP_ROWS (read here without loading numba)
# taps (K = channels x kernel) up to which a tap conv takes the weight on the left
LEFT_TAPS_MAX_K = 128
NATIVE_POOL_PLATFORM = jit_cpu.NATIVE_POOL_PLATFORM
# the epilogue's activations, as (slope below zero, low, high): anything else runs after
NO_ACTIVATION = (1.0, -math.inf, math.inf)
# a convolution whose weight is not a constant (training; a gradient's convolution) takes
# this form from this many output positions a call (images x rows x columns), its weight
# packed again on every call: ResNet's 512 x 512 x 3 x 3 (9.4 MB) took ~2 ms to pack, its
# convolution at batch 32 (1,568 positions) 25-35 ms
VARYING_MIN_POSITIONS = 1024


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


class _Layout:
    """What a node's geometry fixes: the stride phases' shape, each tap's offset into them,
    the packed weight. Made once per session node and input shape."""

    def __init__(self, X, W, kernel, strides, dilations, begin, end, out_dims,
                 constant=False):
        kernels = jit_cpu.panel_kernels()
        (c, height, width), m = X.shape[1:], W.shape[0]
        (sy, sx), (dh, dw) = strides, dilations
        self.strides, self.begin = (int(sy), int(sx)), (int(begin[0]), int(begin[1]))
        self.out_dims = tuple(out_dims)
        self.width = kernels.PANEL_VECTORS * kernels.VECTOR_BYTES // X.itemsize
        # a strided 1x1 kernel on a small image, or with many channels, reads its input
        # packed into strips (:func:`_strided_pointwise`), with one tap per channel
        self.strips = _strided_pointwise(kernel, strides, c, out_dims, m)
        self.taps = math.prod(kernel) > 1 or self.strips
        ph = -(-(height + begin[0] + end[0]) // sy)
        pw = -(-(width + begin[1] + end[1]) // sx)
        self.plane_dims, self.pw = (ph, pw), pw
        # a 1x1 convolution of stride 1 reads the image where it lies
        self.in_place = not self.taps and (sy, sx) == (1, 1) and not any(begin) \
            and not any(end)
        # the phases the taps read (a 1x1 kernel reads phase (0, 0) alone); each plane
        # starts on a 64-byte boundary
        phases = (1 if kernel[0] == 1 else sy, 1 if kernel[1] == 1 else sx)
        lanes = kernels.VECTOR_BYTES // X.itemsize
        self.planes_shape = phases + (c, -(-ph * pw // lanes) * lanes)
        if self.strips:  # each strip of outputs: (C, STRIP)
            self.planes_shape = (-(-math.prod(out_dims) // STRIP), c, STRIP)
        self.halo = (kernel[0] - 1) * dh // sy  # plane rows read below an output row's own
        self.by_rows = out_dims[0] >= ROWS_SPLIT_MIN * intra_op_threads()
        weight = W.reshape(m, -1)
        # a kernel of few taps (a stem's) puts the weight on the left (:func:`_left_taps`)
        self.left = self.taps and not self.strips and _left_taps(weight.shape[1], m)
        if self.taps:
            self.rows_at = np.arange(c, dtype=np.int64) * STRIP if self.strips else \
                _tap_offsets(c, self.planes_shape[3], pw, kernel, (sy, sx), (dh, dw),
                             phases[1])
            self.panels = np.zeros((0, 0, 0), X.dtype) if self.left \
                else _column_panels(weight, self.width)
            self._places: dict = {}
        if self.left:
            # a copy of its own: repack() writes into it
            self.weights, self.row_block = weight.copy(), 0
        elif not self.taps:
            self.weights = _strip_weights(weight, X.dtype, borrow=constant)
            self.row_block = max(STRIP, WEIGHT_BLOCK_BYTES // (c * X.itemsize) // STRIP * STRIP)
        self._native = None

    def repack(self, W) -> None:
        """Pack a new weight of the node's shape into the arrays made for the first one, in
        place: the kits point at them."""
        weight = W.reshape(W.shape[0], -1)
        if self.left:
            np.copyto(self.weights, weight)
        elif self.taps:
            _fill_column_panels(self.panels, weight)
        else:
            self.weights[:weight.shape[0]] = weight  # past M the strip stays zero

    def native_parts(self) -> _NativeParts:
        if self._native is None:
            self._native = _NativeParts(self)
        return self._native

    def places(self, r0, r1):
        """Where outputs r0 * ow.. r1 * ow sit in phase planes that start at plane row r0,
        padded with place 0 past a whole strip of either size and one more (made once per
        band)."""
        found = self._places.get((r0, r1))
        if found is None:
            ow, count = self.out_dims[1], (r1 - r0) * self.out_dims[1]
            outputs = np.arange(count)
            found = np.zeros(count + 2 * STRIP, np.int64)
            if self.strips:  # output q is lane q % STRIP of strip q // STRIP
                found[:count] = outputs // STRIP * (self.rows_at.size * STRIP) + outputs % STRIP
            else:
                found[:count] = outputs // ow * self.pw + outputs % ow
            found = self._places.setdefault((r0, r1), found)
        return found


class _NativeParts:
    """How the native driver splits a node's image: ``count`` bands of rows between
    ``bounds`` (each with its row of ``places``), or ``count`` runs of ``chunk`` output
    panels (tap form) or strips (1x1) over shared planes; one part a thread, as
    ``parallel_for`` had them."""

    def __init__(self, plan):
        oh, ow = plan.out_dims
        self.row_block = 0 if plan.taps else plan.row_block
        self.bounds = np.array([0, oh], np.int64)
        bands = [(0, oh)]
        if plan.by_rows:
            bands = _row_parts(oh)
            self.count, self.chunk = len(bands), 0
            self.bounds = np.array([b[0] for b in bands] + [oh], np.int64)
        elif plan.left:
            self.count = len(_strip_parts(plan.weights.shape[0]))
            self.chunk = -(-(plan.weights.shape[0] // STRIP) // self.count)
        elif plan.taps:
            panels = plan.panels.shape[0]
            self.count = len(thread_parts(panels, plan.panels.size * oh * ow))
            self.chunk = -(-panels // self.count)
        else:
            self.count = len(_strip_parts(plan.weights.shape[0]))
            self.chunk = -(-(plan.weights.shape[0] // STRIP) // self.count)
        rows = [plan.places(r0, r1) for r0, r1 in bands] if plan.taps else [np.zeros(1, np.int64)]
        self.places = np.zeros((len(rows), max(r.size for r in rows)), np.int64)
        for i, row in enumerate(rows):
            self.places[i, :row.size] = row
        self.rows_at = plan.rows_at if plan.taps else np.zeros(1, np.int64)
        self.shape = (0, 0, 0, 0) if plan.strips else tuple(int(v) for v in plan.planes_shape)
        self.geometry = (*plan.plane_dims, *plan.strides, *plan.begin, plan.halo, oh, ow)
        self._empty: dict = {}

    def empty(self, dtype) -> dict:
        """Empty arrays of 2 and 3 dimensions, for the form's unused operand."""
        found = self._empty.get(dtype)
        if found is None:
            found = self._empty.setdefault(dtype, {2: np.zeros((0, 0), dtype),
                                                   3: np.zeros((0, 0, 0), dtype)})
        return found


def _tap_offsets(c, plane_stride, pw, kernel, strides, dilations, phases_x):
    """Offset of tap (channel, a, b), in the weight's order, from an output's place."""
    (kh, kw), (sy, sx), (dh, dw) = kernel, strides, dilations
    offsets = np.empty((c, kh, kw), np.int64)
    for a in range(kh):
        qy, ry = divmod(a * dh, sy)
        for b in range(kw):
            qx, rx = divmod(b * dw, sx)
            plane = (ry * phases_x + rx) * c
            offsets[:, a, b] = (plane + np.arange(c)) * plane_stride + qy * pw + qx
    return offsets.reshape(-1)


def _strip_weights(weight, dtype, borrow: bool):
    """A 1x1 convolution's weight (M, C) over whole strips of output channels, zero past M.
    A constant weight that already is whole strips, of the input's dtype and contiguous, is
    used where it lies (``borrow``): ResNet-50's 1x1 filters copied were 50 MB written at its
    first run. A weight that is not the node's constant is always copied, as repack() writes
    the next one into it."""
    m, c = weight.shape
    if borrow and m % STRIP == 0 and weight.dtype == dtype and weight.flags.c_contiguous:
        return weight
    whole = np.zeros((-(-m // STRIP) * STRIP, c), dtype)
    whole[:m] = weight
    return whole


def _column_panels(weight, width):
    """The transpose of ``weight`` (M, K) as (P, K, width) panels of output channels, the
    last one zero-padded."""
    m, k = weight.shape
    panels = np.zeros((-(-m // width), k, width), weight.dtype)
    _fill_column_panels(panels, weight)
    return panels


def _fill_column_panels(panels, weight):
    """Write ``weight``'s transpose into ``panels`` (:func:`_column_panels`), leaving the last
    panel's columns past M as they are (zero)."""
    m, k = weight.shape
    width = panels.shape[2]
    whole = m // width
    np.copyto(panels[:whole], weight[:whole * width].reshape(whole, width, k).transpose(0, 2, 1))
    if whole < panels.shape[0]:
        panels[whole, :, :m - whole * width] = weight[whole * width:].T


def varying_layouts(node: dict | None, X, geometry_of) -> dict | None:
    """Where a convolution whose weight may change between calls keeps its layouts: a dict of
    the calling thread's (a layout holds the packed weight, and two threads may run the node
    with different weights at once) in the node's dict, or None where the node has no dict or
    the call is too small to repay packing (VARYING_MIN_POSITIONS). ``geometry_of(layouts)``
    is the call's conv geometry."""
    if node is None:
        return None
    local = node.get("varying")
    if local is None:
        local = node.setdefault("varying", threading.local())
    layouts = getattr(local, "layouts", None)
    if layouts is None:
        layouts = local.layouts = {}
    out_dims = geometry_of(layouts)[-1]
    return layouts if X.shape[0] * math.prod(out_dims) >= VARYING_MIN_POSITIONS else None


def layout(prepacked, X, W, kernel, strides, dilations, begin, end, out_dims,
           constant=False) -> _Layout:
    """The node's :class:`_Layout` for this input shape and dtype, made on first use (a
    node's weight may change dtype between calls where it is not a constant: an imperative
    op's dict serves every call with its attributes). ``constant``: W is the node's constant
    and stays as it is, so the layout may read it in place."""
    key = ("direct", X.shape[1:], W.shape, X.dtype.str)
    plan = prepacked.get(key)
    if plan is None:
        plan = prepacked.setdefault(key, _Layout(X, W, kernel, strides, dilations, begin, end,
                                                 out_dims, constant))
    return plan


def conv(X, W, B, Z, limits, out, geometry, prepacked, replays=None, repack=False):
    """``out`` = the epilogue of Conv(X, W): + B per channel, + Z (``out``'s shape) when given,
    then the activation ``limits`` (:func:`activation_limits`). The native call is kept as
    the node's replay in ``replays`` (its prepacked dict, or None: ``ops/compiled/replay.py``).
    ``repack``: W is not the node's constant (``prepacked`` is then a thread's
    :func:`varying_layouts`): pack it again first."""
    kernel, strides, dilations, _, begin, end, out_dims = geometry
    plan = layout(prepacked, X, W, kernel, strides, dilations, begin, end, out_dims,
                  constant=not repack)
    if repack:
        plan.repack(W)
    native, split = _native_pool(), plan.native_parts().count > 1
    if native is None and split:
        return _conv_threads(plan, X, B, Z, limits, out)
    kit = jit_cpu.scratch_kit(plan, (X.dtype.str, limits), lambda: _Kit(plan, X.dtype, limits))
    # with one part the block is never read (the kernel takes the pool for two or more)
    block = kit.words if native is None else native.block
    run = _kernels().native_conv

    def call(X, W, B, Z, out):
        if split:
            native.wake()  # a sleeping worker takes ~10-15 us to run: it wakes meanwhile
        n, m = X.shape[0], W.shape[0]
        bias = kit.bias(B, m)
        y_all = out.reshape(n, m, -1)
        z_all = None if Z is None else Z.reshape(n, m, -1)
        for image in range(n):
            y = y_all[image]
            if z_all is None:
                run(block, kit.words, X[image], y, bias, y, False)
            else:
                run(block, kit.words, X[image], y, bias, z_all[image], True)
        return out
    replay.record(replays, (X, W, B, Z, out), call)
    return call(X, W, B, Z, out)


class _Kit:
    """One thread's prepared call of a node's convolution for one dtype and epilogue: the
    words ``_jit_panels.native_conv`` reads its fixed arguments from (laid out like the
    pool's block), the arrays they point to, and the bias as the tile reads it. Kept by
    ``jit_cpu.scratch_kit`` until a scratch buffer it points to is reallocated."""

    def __init__(self, plan, dtype, limits):
        kernels, parts = _kernels(), plan.native_parts()
        scratch = jit_cpu.scratch_array
        empty = parts.empty(dtype)
        flat, _ = _planes(plan, dtype)
        pointwise = not plan.taps
        edge_shape = (plan.weights.shape[1], plan.width) if pointwise else (0, 0)
        slope, low, high = limits
        arrays = {
            kernels.PLANES: flat,
            kernels.WORKER_PLANES: scratch("direct_planes_worker", dtype, flat.shape),
            kernels.ROWS_AT: parts.rows_at, kernels.PLACES: parts.places,
            kernels.BOUNDS: parts.bounds,
            kernels.PANELS: plan.panels if plan.taps and not plan.left else empty[3],
            kernels.WEIGHTS: plan.weights if plan.left or pointwise else empty[2],
            kernels.LIMITS: np.array((low, high, slope), dtype),
            kernels.NO_BIAS: np.zeros(plan.width, dtype),
            kernels.SPILL: scratch("direct_spill", dtype, (plan.width, STRIP)),
            kernels.WORKER_SPILL: scratch("direct_spill_worker", dtype, (plan.width, STRIP)),
            kernels.EDGE: scratch("direct_edge", dtype, edge_shape) if pointwise else empty[2],
            kernels.WORKER_EDGE: scratch("direct_edge_worker", dtype, edge_shape)
            if pointwise else empty[2],
        }
        self.words = np.zeros(kernels.BLOCK_WORDS, np.int64)
        for slot, array in arrays.items():
            self.words[slot] = array.ctypes.data
            self.words[slot + 1:slot + 1 + array.ndim] = array.shape
        scalars = {kernels.ITEMSIZE: dtype.itemsize, kernels.TAPS: _form(plan),
                   kernels.BY_ROWS: plan.by_rows, kernels.STRIPS: plan.strips,
                   kernels.IN_PLACE: plan.in_place, kernels.PARTS: parts.count,
                   kernels.CHUNK: parts.chunk, kernels.ROW_BLOCK: parts.row_block}
        for slot, value in scalars.items():
            self.words[slot] = int(value)
        self.words[kernels.SHAPE0:kernels.SHAPE0 + 4] = parts.shape
        self.words[kernels.PH:kernels.PH + 9] = parts.geometry
        self._arrays = arrays  # the words point into these
        length = plan.panels.shape[0] * plan.width if plan.taps and not plan.left \
            else plan.weights.shape[0]
        self._zeros, self._padded = np.zeros(length, dtype), np.zeros(length, dtype)

    def bias(self, B, m) -> np.ndarray:
        """B as the tile reads it: one per output channel, zeros past M to a whole panel."""
        if B is None:
            return self._zeros
        if self._zeros.size == m and B.dtype == self._zeros.dtype and B.flags.c_contiguous:
            return B.reshape(m)
        self._padded[:m] = B.reshape(m)  # past M it stays zero
        return self._padded


def _conv_threads(plan, X, B, Z, limits, out):
    """:func:`conv` with its parts on Python threads (``parallel_for``), where the native
    pool is off."""
    n, m, out_dims = X.shape[0], out.shape[1], plan.out_dims
    bias = _padded_bias(plan, B, m, X.dtype)
    scalars = tuple(X.dtype.type(v) for v in limits)  # compared in X's dtype, not float64
    y_all = out.reshape(n, m, -1)
    z_all = None if Z is None else Z.reshape(n, m, -1)
    run = _taps if plan.taps else _pointwise
    for image in range(n):
        y = y_all[image]
        epilogue = (bias, y if z_all is None else z_all[image], z_all is not None) + scalars
        if plan.by_rows:
            parallel_for(_row_parts(out_dims[0]), lambda r0, r1, x=X[image], y=y, e=epilogue:
                         run(plan, x, y, e, r0, r1, 0, None))
        else:
            parts = (thread_parts(plan.panels.shape[0], plan.panels.size * y.shape[1])
                     if plan.taps and not plan.left else _strip_parts(plan.weights.shape[0]))
            shared = _phase_planes(plan, X[image], 0, out_dims[0])
            parallel_for(parts, lambda c0, c1, x=X[image], y=y, e=epilogue, s=shared:
                         run(plan, x, y, e, 0, out_dims[0], c0, c1, s))
    return out


def _native_pool():
    return jit_cpu.native_pool()


def _form(plan) -> int:
    """The native driver's form: 0 a 1x1 kernel, 1 the tap tile, 2 taps, weight on the left."""
    return 2 if plan.left else int(plan.taps)


def _padded_bias(plan, B, m, dtype) -> np.ndarray:
    """B as the epilogue reads it: the tap tile reads a whole panel's biases, zeros past M."""
    bias = np.zeros(plan.panels.shape[0] * plan.width if plan.taps and not plan.left else m,
                    dtype)
    if B is not None:
        bias[:m] = B.reshape(m)
    return bias


def band_rows(X, W, B, limits, geometry, prepacked):
    """``rows(image, r0, r1, y, at)``: output rows r0..r1 of one image of Conv(X, W) + B,
    through the epilogue ``limits``, written into ``y`` (M, L) from output row ``at`` on (y's
    rows hold L / OW output rows each), on the calling thread alone. For kernels that compute a
    convolution a band of rows at a time (``ops/conv/fused_conv_pool.py``); :func:`suits` must
    hold."""
    kernel, strides, dilations, _, begin, end, out_dims = geometry
    plan = layout(prepacked, X, W, kernel, strides, dilations, begin, end, out_dims)
    bias = _padded_bias(plan, B, W.shape[0], X.dtype)
    scalars = tuple(X.dtype.type(v) for v in limits)
    run = _taps if plan.taps else _pointwise

    def rows(image, r0, r1, y, at):
        run(plan, X[image], y, (bias, y, False) + scalars, r0, r1, 0, None, at=at)
    return rows


def _taps(plan, x, y, epilogue, r0, r1, p0, p1, shared=None, at=None):
    """Output rows r0..r1 and the output-channel panels p0..p1 (None: all; with the weight
    on the left, channels p0..p1) of a kernel of several taps; its phase planes ``shared``
    by the threads, or else built here. Row r0 goes to row ``at`` of y (default r0)."""
    flat = _phase_planes(plan, x, r0, r1) if shared is None else shared
    bias, residual, has_residual, slope, low, high = epilogue
    if plan.left:  # p0..p1 are output channels here (whole strips)
        m0, m1 = (0, plan.weights.shape[0]) if p1 is None else (p0, p1)
        _kernels().left_tap_conv(plan.weights, flat, plan.rows_at, r0, r1, plan.out_dims[1],
                                 plan.pw, y, r0 if at is None else at, bias, residual,
                                 has_residual, low, high, slope, m0, m1, plan.width)
        return
    spill = jit_cpu.scratch_array("direct_spill", y.dtype, (plan.width, STRIP))
    no_bias = jit_cpu.scratch_array("direct_no_bias", y.dtype, (plan.width,))
    no_bias[:] = 0
    ow, kernels = plan.out_dims[1], _kernels()
    count = (r1 - r0) * ow
    # strips of packed input hold 8 outputs each; elsewhere 7x7 planes go 7 outputs a tile
    strip = STRIP if plan.strips else kernels.strip_rows(count)
    kernels.tap_conv(flat, plan.rows_at, plan.places(r0, r1), count, plan.panels, y,
                     (r0 if at is None else at) * ow, bias, residual, has_residual, low, high,
                     slope, p0, plan.panels.shape[0] if p1 is None else p1, spill, no_bias,
                     strip)


def _pointwise(plan, x, y, epilogue, r0, r1, m0, m1, shared=None, at=None):
    """Output rows r0..r1 and channels m0..m1 (None: all) of a 1x1 convolution, the image
    read in place or from its one phase plane (``shared`` by the threads, or built here).
    Row r0 goes to row ``at`` of y (default r0)."""
    ow = plan.out_dims[1]
    if plan.in_place:
        image, stride, offset = x.reshape(-1), plan.plane_dims[0] * plan.pw, r0 * ow
    else:
        image = _phase_planes(plan, x, r0, r1) if shared is None else shared
        stride, offset = plan.planes_shape[3], 0
    bias, residual, has_residual, slope, low, high = epilogue
    kernels = _kernels()
    channels = plan.weights.shape[1]
    edge = jit_cpu.scratch_array("direct_edge", y.dtype, (channels, plan.width))
    spill = jit_cpu.scratch_array("direct_spill", y.dtype, (STRIP, plan.width))
    kernels.pointwise_conv(plan.weights, image, stride, offset, (r1 - r0) * ow, y,
                           (r0 if at is None else at) * ow,
                           bias, residual, has_residual, low, high, slope, m0,
                           plan.weights.shape[0] if m1 is None else m1, plan.row_block, edge,
                           spill)


def _phase_planes(plan, x, r0, r1):
    """The flat phase planes of output rows r0..r1 (the image's own rows for a 1x1 read in
    place: None), in this thread's buffer."""
    if not plan.taps and plan.in_place:
        return None
    flat, shaped = _planes(plan, x.dtype)
    if plan.strips:
        _kernels().pack_strips(x, flat, r0, r1 - r0, plan.out_dims[1], *plan.strides,
                               *plan.begin)
        return flat
    _kernels().phase_planes(x, shaped, *plan.plane_dims, *plan.strides, *plan.begin, r0,
                            r1 - r0 + plan.halo)
    return flat


def _kernels():
    return jit_cpu.panel_kernels()


def _row_parts(rows: int) -> list[tuple[int, int]]:
    """Output rows split evenly over the threads."""
    count = max(1, min(intra_op_threads(), rows))
    return [(rows * t // count, rows * (t + 1) // count) for t in range(count)]


def _strip_parts(rows: int) -> list[tuple[int, int]]:
    """Output channels split over the threads in whole strips."""
    strips = rows // STRIP
    count = max(1, min(intra_op_threads(), strips))
    step = -(-strips // count)
    return [(s * STRIP, min(strips, s + step) * STRIP) for s in range(0, strips, step)]


def _planes(plan, dtype) -> tuple[np.ndarray, np.ndarray]:
    """This thread's phase-plane buffer, flat and shaped. Only the rows a call writes are
    read (not the cells that align each plane, nor rows past a band), so it is never
    cleared."""
    flat = jit_cpu.scratch_array("direct_planes", dtype, (math.prod(plan.planes_shape),))
    return flat, flat.reshape(plan.planes_shape)
