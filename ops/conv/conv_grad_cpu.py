"""The CPU fast path of ConvGrad: 2-D, ungrouped, native float convolutions, written into
the planned output.

The generic kernel (conv_grad.py) builds the columns of as much of the batch as fits in 256 MB
at once, transposed so that the batch folds into the matmul's inner axis: for ResNet's 64x56x56
layers that is a 231 MB strided copy, cold in cache when BLAS reads it, and its input gradient
scatters W^T dY back with strided adds over the same cold columns. Here:

* dW takes the panel tile (ops/panels/_jit_panels.weight_grad) where the input channels come in
  strips of 8 and the output rows give a long enough K: each image copied once into its
  stride phases, dY packed into panels of output channels, every (8 channels, tap) strip
  multiplied into them along the output positions, no columns at all;
* other dW take the batch a few images at a time, their columns written side by side into
  the per-thread workspace (im2col_cpu.py's), small enough to stay in cache for the matmul,
  whose result goes straight into the output (later parts add a small partial product);
* dX of a stride-1 convolution is itself a convolution: of dY with W's kernel flipped and its
  channel axes swapped, padded by the kernel's reach less the forward's pads. That runs
  through the forward's fast path (conv_cpu.direct, the weight packed on each call; else
  conv_cpu.conv_bands), straight into the output;
* dX of a strided convolution with large enough phase planes is one such convolution per
  output phase, of dY with the taps that reach that phase; smaller ones multiply W^T by a
  few images' dY at a time and fold each image's columns onto a padded scratch image, one
  strided add per tap, while in cache.
"""

from __future__ import annotations

import math

import numpy as np

from mixrt.ops.conv import conv as cv
from mixrt.ops.compiled import jit_cpu
from mixrt.ops.conv import conv_direct_cpu
from mixrt.ops.compiled.workspace import scratch_arrays
from mixrt.ops.conv.conv_cpu import _KernelRows, _padded, conv_bands, direct, im2col_into
from mixrt.ops.conv.conv_direct_cpu import NO_ACTIVATION, STRIP, _tap_offsets
from mixrt.ops.conv.conv_grad import conv_grad
from mixrt.ops.compiled.parallel import intra_op_threads, parallel_for

# bytes of columns per batch part: big enough that a part is one substantial BLAS call, small
# enough that the columns are still in cache when BLAS reads them
PART_BYTES = 1 << 23
# ... but never fewer columns than this in a part: the 7x7 and 14x14 layers' matmuls ran 10%
# faster at 2 threads with 32 or 16 images' columns (1568, 3136) than with 8 (392, 784)
PART_COLUMNS = 1536
TRANSPOSED_PRODUCT = 1 << 20
# dW takes the panel tile when an image's output rows, at the phase planes' width, give at
# least this long a K: ResNet's layers at batch 32, 2 threads, against the kernel rows or
# im2col and OpenBLAS (ms): 64 -> 64 at 56x56 21 / 34, 64 -> 128 stride 2 to 28x28 12 / 17,
# 128 at 28x28 21 / 28, 256 at 14x14 24 / 29 (K 224); but 512 at 7x7 (K 63) 36 / 26: so
# short a run per tile call, with the tile's sums loaded and stored around each
PANEL_WEIGHT_GRAD_MIN_K = 128
# a strided convolution's dX goes phase by phase (_phase_input_grad) from phase planes of
# this many positions: ResNet's stride-2 layers at batch 32, 2 threads, against folding W^T
# dY's columns (ms): 64 -> 128 from 56x56 25 / 34, 128 -> 256 from 28x28 24 / 29; from
# 14x14 (7x7 phases) 33 / 24
PHASE_MIN_POSITIONS = 14 * 14
# bytes of phase planes per group of images whose sums pass together, per panel of output
# channels (_jit_panels.weight_grad)
PANEL_WEIGHT_GRAD_GROUP_BYTES = 1 << 22
# a stride-1 convolution's dX is folded from W^T dY's columns, not convolved, when dY has
# fewer than 1/this of dX's positions: the flipped-kernel convolution computes every dX
# position against every tap, and only dY's positions times the taps are not padding (a
# 224x224 kernel over a 224x224 image, one output position, asked 112 GiB for the taps'
# partial products, all but one in 50176 of them zero)
FOLD_INPUT_GRAD_RATIO = 4
NATIVE = (np.dtype(np.float32), np.dtype(np.float64))


@conv_grad.fast("cpu")
def conv_grad_cpu(xp, dY, X, W, *, auto_pad="NOTSET", dilations=None, group=1,
                  kernel_shape=None, pads=None, strides=None, input_grad=1, weight_grad=1,
                  bias_grad=0, out=None, _node=None):
    attributes = dict(auto_pad=auto_pad, dilations=dilations, group=group,
                      kernel_shape=kernel_shape, pads=pads, strides=strides)
    flags = dict(input_grad=input_grad, weight_grad=weight_grad, bias_grad=bias_grad)
    if not _suits(dY, X, W, group):
        return _generic_into(out, conv_grad(xp, dY, X, W, **attributes, **flags))
    geometry = cv.conv_geometry(X, W, auto_pad, dilations, group, kernel_shape, pads, strides)
    kernel, strides, dilations, _, begin, end, out_dims = geometry
    window = _Window(kernel, strides, dilations, begin, end, out_dims)
    grads = []
    if input_grad:
        grads.append(input_grad_into(dY, W, _target(out, grads, X.shape, X.dtype), window,
                                     _node))
    if weight_grad:
        by_rows = _KernelRows.suit(X, W, kernel, strides, out_dims, forward=False)
        compute = row_weight_grad_into if by_rows else weight_grad_into
        if _panel_weight_grad_suits(dY, X, window):
            compute = panel_weight_grad_into
        grads.append(compute(dY, X, _target(out, grads, W.shape, W.dtype), window))
    if bias_grad:
        grads.append(dY.sum(axis=(0, 2, 3)))
    return grads[0] if len(grads) == 1 else tuple(grads)


def _suits(dY, X, W, group) -> bool:
    arrays = (dY, X, W)
    return (all(isinstance(a, np.ndarray) and a.ndim == 4 for a in arrays)
            and X.dtype in NATIVE and dY.dtype == X.dtype == W.dtype and int(group) == 1)


def _generic_into(out, result):
    """The generic kernel's result, its first gradient copied into ``out`` when given."""
    if out is None:
        return result
    first = result[0] if isinstance(result, tuple) else result
    np.copyto(out, first)
    return (out,) + result[1:] if isinstance(result, tuple) else out


def _target(out, done, shape, dtype):
    """``out`` for the first gradient computed, a new array for the others."""
    if out is not None and not done:
        return out
    return np.empty(shape, dtype=dtype)


class _Window:
    """A 2-D convolution's window geometry."""

    def __init__(self, kernel, strides, dilations, begin, end, out_dims):
        self.kernel, self.strides, self.dilations = kernel, strides, dilations
        self.begin, self.end, self.out = begin, end, out_dims

    @property
    def taps(self):
        return [(a, b) for a in range(self.kernel[0]) for b in range(self.kernel[1])]

    def padded_dims(self, in_dims):
        return [i + b + e for i, b, e in zip(in_dims, self.begin, self.end)]

    def im2col(self, x, cols):
        im2col_into(x, cols, self.kernel, self.strides, self.dilations, self.begin, self.end,
                    self.out)

    @property
    def positions(self):
        return [(a, b) for a in range(self.out[0]) for b in range(self.out[1])]

    def window_slices(self, position):
        """Where the window of output ``position`` lies in the padded image."""
        return tuple(slice(p * s, p * s + (k - 1) * d + 1, d) for p, s, k, d in
                     zip(position, self.strides, self.kernel, self.dilations))

    def tap_slices(self, tap):
        """Where tap ``(a, b)`` of every window lies in the padded image."""
        return tuple(cv.strided_span(t * d, s, o) for t, d, s, o in
                     zip(tap, self.dilations, self.strides, self.out))


def _parts(n: int, bytes_per_image: int, length: int):
    """Ranges of images whose columns take about PART_BYTES, but at least PART_COLUMNS
    columns (a matmul's inner or outer axis), and the part size."""
    step = max(1, PART_BYTES // max(bytes_per_image, 1), -(-PART_COLUMNS // max(length, 1)))
    step = min(n, step)
    return [(start, min(start + step, n)) for start in range(0, n, step)], step


# -- dW -----------------------------------------------------------------------------------

def row_weight_grad_into(dY, X, dw, window: _Window):
    """dW of a stride-1 convolution by kernel rows (shifted_cpu._KernelRows read backwards):
    with ``shifted[b, c, r, j] = padded[c, r, j + b*dw]``, dW[:, :, a, :] is dY times the
    column range of ``shifted`` that starts a*dh rows down. A part's images sit one after
    another in the columns, dY laid on the same grid (zeros in the rows past each image's
    output), so each kernel row is one matmul per part. The copies are kw times the input,
    not im2col's kh*kw: 0.82-0.86 of its time on ResNet's 56x56 to 14x14 layers."""
    (n, c, h, w), m = X.shape, dY.shape[1]
    (kh, kw), (dh, dw_) = window.kernel, window.dilations
    hp, wp = window.padded_dims((h, w))
    oh, ow = window.out
    tail = (kh - 1) * dh * ow  # read past the last image by the lower kernel rows
    parts, step = _parts(n, kw * c * hp * ow * X.itemsize, hp * ow)
    shifted, grads, total, partial = scratch_arrays(
        X.dtype, (kw, c, step * hp * ow + tail), (m, step, hp, ow), (kh, kw * c, m),
        (kw * c, m))
    shifted[:, :, step * hp * ow:] = 0
    grads[:, :, oh:] = 0
    for index, (start, stop) in enumerate(parts):
        count = stop - start
        for image in range(start, stop):
            padded = _padded(X[image], window.begin, window.end)
            laid = shifted[:, :, (image - start) * hp * ow:(image - start + 1) * hp * ow]
            for b in range(kw):
                np.copyto(laid[b].reshape(c, hp, ow), padded[:, :, b * dw_:b * dw_ + ow])
        np.copyto(grads[:, :count, :oh], dY[start:stop].transpose(1, 0, 2, 3))
        if count < step:  # rows the shorter last part leaves over must add nothing
            shifted[:, :, count * hp * ow:count * hp * ow + tail] = 0
        columns, length = shifted.reshape(kw * c, -1), count * hp * ow
        grid = grads[:, :count].reshape(m, length)
        for a in range(kh):
            first = a * dh * ow
            product = total[a] if index == 0 else partial
            np.matmul(columns[:, first:first + length], grid.T, out=product)
            if index:
                total[a] += partial
    np.copyto(dw, total.reshape(kh, kw, c, m).transpose(3, 2, 0, 1))
    return dw


def weight_grad_into(dY, X, dw, window: _Window):
    """dW (M, C, kh, kw) = sum over images of dY (M, L) times the image's columns (C*kh*kw, L)
    transposed; a part's images sit side by side in the columns' inner axis."""
    (n, c), m = X.shape[:2], dY.shape[1]
    rows, length = c * math.prod(window.kernel), math.prod(window.out)
    parts, step = _parts(n, rows * length * X.itemsize, length)
    # BLAS ran columns x dY^T (a (C*kh*kw, M) product) 10-40% faster than dY x columns^T
    # when M is small, but the product must then be transposed into dW: worth it up to
    # about a million elements (ResNet's 64- to 256-channel layers)
    transposed = rows * m <= TRANSPOSED_PRODUCT
    column_space, grad_space, total, partial = scratch_arrays(
        X.dtype, (rows * step * length,), (m * step * length,), (rows * m,), (rows * m,))
    total = total.reshape(rows, m) if transposed else dw.reshape(m, rows)
    partial = partial.reshape(total.shape)
    for index, (start, stop) in enumerate(parts):
        count = stop - start
        cols = column_space[:rows * count * length].reshape(rows, count, length)
        grads = grad_space[:m * count * length].reshape(m, count, length)
        for image in range(start, stop):
            window.im2col(X[image], cols[:, image - start])
        if count == 1:  # one image's dY is already (M, L): no copy (the stem's 103 MB)
            grads = dY[start].reshape(m, length)
        else:
            np.copyto(grads, dY[start:stop].reshape(count, m, length).transpose(1, 0, 2))
        cols, grads = cols.reshape(rows, count * length), grads.reshape(m, count * length)
        product = total if index == 0 else partial
        if transposed:
            np.matmul(cols, grads.T, out=product)
        else:
            np.matmul(grads, cols.T, out=product)
        if index:
            total += partial
    if transposed:
        np.copyto(dw.reshape(m, rows), total.T)
    return dw


def _panel_weight_grad_suits(dY, X, window: _Window) -> bool:
    """Whether dW takes the panel tile: a kernel of several taps, input channels in whole
    strips of 8 (a tile's rows), an image's output rows long enough a run of K
    (PANEL_WEIGHT_GRAD_MIN_K), contiguous arrays, on a machine that runs the tile."""
    oh, ow = window.out
    pw = -(-window.padded_dims(X.shape[2:])[1] // window.strides[1])
    return math.prod(window.kernel) > 1 and X.shape[1] % STRIP == 0 \
        and oh * pw >= PANEL_WEIGHT_GRAD_MIN_K \
        and X.flags.c_contiguous and dY.flags.c_contiguous \
        and jit_cpu.panel_kernels() is not None


def panel_weight_grad_into(dY, X, dw, window: _Window):
    """dW through the panel tile (``_jit_panels.weight_grad``): each image copied once into
    its zero-padded stride phases (as the direct forward reads it), dY packed into panels of
    32 output channels, and every (8 channels, tap) strip of the input multiplied into them
    along the output positions, no im2col. The threads take halves of the batch, each
    summing into its own (taps, M) table (or, with fewer images than two a thread, halves of
    the output channels); the tables are added and transposed into dW at the end."""
    kernels = jit_cpu.panel_kernels()
    (n, c, h, w), m = X.shape, dY.shape[1]
    (kh, kw), (sy, sx), (dh, dwd) = window.kernel, window.strides, window.dilations
    oh, ow = window.out
    hp, wp = window.padded_dims((h, w))
    ph, pw = -(-hp // sy), -(-wp // sx)
    phases = (1 if kh == 1 else sy, 1 if kw == 1 else sx)
    lanes = kernels.VECTOR_BYTES // X.itemsize
    stride = -(-ph * pw // lanes) * lanes  # each plane on a 64-byte boundary
    width = kernels.PANEL_VECTORS * lanes
    panel_count = -(-m // width)
    offsets = _tap_offsets(c, stride, pw, (kh, kw), (sy, sx), (dh, dwd), phases[1])
    offsets = offsets.reshape(c, kh, kw)
    strips = [(c0, a, b) for c0 in range(0, c, STRIP) for a in range(kh) for b in range(kw)]
    strip_at = np.array([offsets[c0, a, b] for c0, a, b in strips], np.int64)
    strip_row = np.array([(a * kw + b) * c + c0 for c0, a, b in strips], np.int64)
    # the columns past ow read up to a row and the kernel's reach past the last plane
    slack = ((kh - 1) * dh // sy + 1) * pw + (kw - 1) * dwd // sx
    slot = -(-(math.prod(phases) * c * stride + slack) // lanes) * lanes
    parts = _weight_grad_parts(n, panel_count)
    group = max(1, min(max(n1 - n0 for n0, n1, _, _ in parts),
                       PANEL_WEIGHT_GRAD_GROUP_BYTES // (slot * X.itemsize)))
    tables = [np.empty((kh * kw * c, panel_count * width), X.dtype) for _ in parts]
    no_bias = np.zeros(STRIP, X.dtype)

    def part(index, n0, n1, p0, p1):
        buffer = jit_cpu.scratch_array("weight_grad_planes", X.dtype, (group * slot,))
        panels = jit_cpu.scratch_array("weight_grad_panels", X.dtype,
                                        (group, panel_count, oh * pw, width))
        kernels.weight_grad(X, dY, n0, n1, p0, p1, group, buffer, slot, phases[0], phases[1],
                            panels, tables[index], strip_at, strip_row, stride, ph, pw, sy,
                            sx, window.begin[0], window.begin[1], oh, ow, no_bias)
    parallel_for([(i,) + bounds for i, bounds in enumerate(parts)], part)
    total = tables[0]
    for table in tables[1:]:
        total += table
    np.copyto(dw, total[:, :m].reshape(kh, kw, c, m).transpose(3, 2, 0, 1))
    return dw


def _weight_grad_parts(n: int, panels: int) -> list[tuple[int, int, int, int]]:
    """(n0, n1, p0, p1) per thread: halves of the batch, or of the output panels when there
    are fewer than two images a thread."""
    threads = intra_op_threads()
    if threads < 2 or (n < 2 * threads and panels < 2):
        return [(0, n, 0, panels)]
    if n >= 2 * threads:
        bounds = [n * t // threads for t in range(threads + 1)]
        return [(bounds[t], bounds[t + 1], 0, panels) for t in range(threads)]
    count = min(threads, panels)
    bounds = [panels * t // count for t in range(count + 1)]
    return [(0, n, bounds[t], bounds[t + 1]) for t in range(count)]


# -- dX -----------------------------------------------------------------------------------

def input_grad_into(dY, W, dx, window: _Window, node=None):
    """dX; ``node``: the session's dict for this node, where the stride-1 case's convolution
    keeps its layouts for the direct form (conv_cpu.direct)."""
    flipped = _flipped_pads(window)
    if flipped is not None and _mostly_padding(dx, window):
        return _folded_input_grad(dY, W, dx, window)
    if flipped is None:
        phases = _phase_convolutions(dY.shape, dx.shape, window)
        if node is not None and phases is not None and _phases_suit(dx, window):
            return _phase_input_grad(dY, W, dx, phases, window.strides, node)
        return _folded_input_grad(dY, W, dx, window)
    weights = np.ascontiguousarray(W.transpose(1, 0, 2, 3)[:, :, ::-1, ::-1])
    return _stride_one_conv(dY, weights, flipped, window.dilations, dx, node)


def _mostly_padding(dx, window: _Window) -> bool:
    """Whether dX's stride-1 convolution would multiply padding nearly everywhere: the
    forward's output has under 1/FOLD_INPUT_GRAD_RATIO of the input's positions (a kernel
    about as large as the image)."""
    return math.prod(window.out) * FOLD_INPUT_GRAD_RATIO < math.prod(dx.shape[2:])


def _stride_one_conv(dY, weights, pads, dilations, out, node):
    """``out`` = the stride-1 convolution of dY with ``weights``: the direct form (its
    layouts in ``node``) where it takes the call, else conv_bands."""
    attributes = dict(auto_pad="NOTSET", dilations=dilations, group=1,
                      kernel_shape=weights.shape[2:], pads=pads, strides=(1, 1))
    done = direct(dY, weights, None, None, NO_ACTIVATION, attributes, out, None, node=node)
    if done is not None:
        return done
    return conv_bands(dY, weights, out=out, **attributes)


def _flipped_pads(window: _Window):
    """Pads of the stride-1 convolution of dY with the flipped kernel that gives dX, or None
    when the forward is strided or padded past the kernel's reach (negative pads)."""
    if any(s != 1 for s in window.strides):
        return None
    reach = [(k - 1) * d for k, d in zip(window.kernel, window.dilations)]
    begin = [r - b for r, b in zip(reach, window.begin)]
    end = [r - e for r, e in zip(reach, window.end)]
    if min(begin + end) < 0:
        return None
    return begin + end


class _Phase:
    """One output phase (ry, rx) of a strided convolution's dX: dX[:, :, ry::sy, rx::sx] is
    the stride-1 convolution of dY with the taps ``rows`` x ``columns`` of W (those that
    reach this phase, the kernel flipped), padded by ``pads``, its first ``size`` outputs."""

    def __init__(self, ry, rx, rows, columns, pads, size):
        self.ry, self.rx, self.rows, self.columns = ry, rx, rows, columns
        self.pads, self.size = pads, size


def _phases_suit(dx, window: _Window) -> bool:
    """Whether a strided convolution's dX goes phase by phase: where each phase's
    convolution takes the direct path (the panel tile, enough positions) on planes of at
    least PHASE_MIN_POSITIONS."""
    positions = math.prod(-(-size // s) for size, s in zip(dx.shape[2:], window.strides))
    return positions >= PHASE_MIN_POSITIONS \
        and dx.shape[0] * positions >= conv_direct_cpu.VARYING_MIN_POSITIONS \
        and jit_cpu.panel_kernels() is not None


def _phase_convolutions(dy_shape, dx_shape, window: _Window):
    """The :class:`_Phase` list of a strided, undilated 2-D convolution's dX, or None where
    a phase would read dY from past its first row or column (a crop: not taken)."""
    if all(s == 1 for s in window.strides) or any(d != 1 for d in window.dilations):
        return None
    phases = []
    for ry in range(window.strides[0]):
        for rx in range(window.strides[1]):
            axes = [_phase_axis(r, begin, k, s, out, size) for r, begin, k, s, out, size in
                    zip((ry, rx), window.begin, window.kernel, window.strides, dy_shape[2:],
                        dx_shape[2:])]
            if any(axis is False for axis in axes):
                return None
            if any(axis is None for axis in axes):  # no tap reaches it: zeros
                phases.append(_Phase(ry, rx, [], [], None, None))
                continue
            (rows, top, bottom, height), (columns, left, right, width) = axes
            phases.append(_Phase(ry, rx, rows, columns, [top, left, bottom, right],
                                 (height, width)))
    return phases


def _phase_axis(r, begin, k, s, out, size):
    """Along one axis, phase ``r`` of ``size`` input positions: its taps (in the flipped
    kernel's order), the padding of dY before and after, and the phase's length; None when
    no tap or no position falls in it, False when dY would need cropping."""
    length = len(range(r, size, s))
    taps = [a for a in range(k) if (r + begin - a) % s == 0]
    if not taps or not length:
        return None
    # input r + s * y reads dY[y + (r + begin - a) // s] through tap a: the taps in order of
    # that offset, lowest first, are the flipped kernel's
    offsets = {a: (r + begin - a) // s for a in taps}
    taps.sort(key=offsets.get)
    first = offsets[taps[0]]
    if first > 0:
        return False
    before = -first
    after = max(0, length - out - before + len(taps) - 1)
    return taps, before, after, length


def _phase_input_grad(dY, W, dx, phases, strides, node):
    """dX of a strided convolution, one stride-1 convolution of dY per output phase
    (conv_cpu.direct, else conv_bands), each written into a scratch and copied into its
    phase of dX: every multiply-add is one the forward makes, where folding W^T dY's
    columns back added each of dX's values kh * kw / (sy * sx) times through strided adds."""
    sy, sx = strides
    for phase in phases:
        target = dx[:, :, phase.ry::sy, phase.rx::sx]
        if phase.pads is None:
            target.fill(0)
            continue
        weights = np.ascontiguousarray(
            W[:, :, phase.rows][:, :, :, phase.columns].transpose(1, 0, 2, 3))
        top, left, bottom, right = phase.pads
        shape = (dY.shape[0], W.shape[1], dY.shape[2] + top + bottom - len(phase.rows) + 1,
                 dY.shape[3] + left + right - len(phase.columns) + 1)
        out = jit_cpu.scratch_array("phase_input_grad", dY.dtype, shape)
        _stride_one_conv(dY, weights, phase.pads, (1, 1), out,
                         node.setdefault(("phase", phase.ry, phase.rx), {}))
        np.copyto(target, out[:, :, :phase.size[0], :phase.size[1]])
    return dx


def _folded_input_grad(dY, W, dx, window: _Window):
    """dX by columns: W^T (C*kh*kw, M) times a part's dY, folded image by image."""
    (n, m), (c, h, w) = dY.shape[:2], dx.shape[1:]
    rows, length = c * math.prod(window.kernel), math.prod(window.out)
    padded_dims = window.padded_dims((h, w))
    parts, step = _parts(n, rows * length * dY.itemsize, length)
    column_space, grad_space, image = scratch_arrays(
        dY.dtype, (rows * step * length,), (m * step * length,), (c, *padded_dims))
    weights_t = W.reshape(m, rows).T
    crop = (slice(None),) + tuple(slice(b, b + i) for b, i in zip(window.begin, (h, w)))
    for start, stop in parts:
        count = stop - start
        cols = column_space[:rows * count * length].reshape(rows, count, length)
        grads = grad_space[:m * count * length].reshape(m, count, length)
        np.copyto(grads, dY[start:stop].reshape(count, m, length).transpose(1, 0, 2))
        np.matmul(weights_t, grads.reshape(m, count * length),
                  out=cols.reshape(rows, count * length))
        for offset in range(count):
            _col2im(cols[:, offset], image, dx[start + offset], crop, window)
    return dx


def _col2im(cols, image, dx, crop, window: _Window):
    """Sum the columns (C*kh*kw, oh*ow) back onto the padded ``image`` (C, Hp, Wp) and crop
    it into ``dx`` (C, H, W)."""
    c = image.shape[0]
    kh, kw = window.kernel
    view = cols.reshape(c, kh, kw, *window.out)
    image.fill(0)
    # one strided add per tap, or per output position when there are fewer of those (a
    # kernel nearly the image's size)
    if len(window.taps) <= math.prod(window.out):
        for tap in window.taps:
            image[(slice(None),) + window.tap_slices(tap)] += view[:, tap[0], tap[1]]
    else:
        for position in window.positions:
            image[(slice(None),) + window.window_slices(position)] += \
                view[:, :, :, position[0], position[1]]
    np.copyto(dx, image[crop])
