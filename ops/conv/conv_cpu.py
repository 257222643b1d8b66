"""The CPU fast path of Conv: im2col in cache-sized chunks, written into a reused workspace,
each chunk's matmul writing straight into the output (or the arena view it was given).

The generic kernel in conv.py builds the whole column matrix at once: for VGG's first layers
that is over 100 MB, freshly allocated (page faults) and cold in cache by the time BLAS reads
it. Here the columns for a band of output rows are built in a per-thread workspace that stays
allocated between runs, small enough to still be in cache when the matmul reads them, and the
matmul writes its band of the output in place: NumPy hands BLAS a strided ``out`` directly.
A 1x1 convolution with stride 1 and no padding needs no columns at all: it is one matmul.
"""

from __future__ import annotations

import math

import numpy as np

from mixrt.ops.compiled.bound_calls import binds_replay, padded
from mixrt.ops.compiled import replay
from mixrt.ops.compiled.workspace import (named_buffer, packed, scratch_arrays, workspace,
                                          workspace_state)
from mixrt.ops.conv import one_pixel, phase_planes, pointwise_rows
from mixrt.ops.conv import (conv_direct_cpu, grouped_cpu, jit_depthwise, sparse_taps,
                             winograd_cpu)
from mixrt.ops.conv.conv import conv, conv_geometry

# bytes of im2col columns (or of output, for a 1x1 convolution) per band. Measured on ResNet-50
# and VGG-19 layers, 8 MiB beat 1 MiB by 10-45%: each band is one BLAS call, and BLAS splits
# a call over its threads; narrow bands left them short of work and multiplied the epilogues.
BAND_BYTES = 1 << 23
# shift-and-add replaces im2col when input channels are at least this many times the output
# channels, or as many and the output has at least this many pixels (_shift_add_suits)
SHIFT_ADD_RATIO = 2
SHIFT_ADD_PIXELS = 28 * 28
# a stride-1 2-D convolution with more output pixels than this, and no more than
# SHIFT_ADD_RATIO times fewer output than input channels, takes _KernelRows ...
KERNEL_ROWS_PIXELS = 10 * 10
# ... when it has at least this many input channels: each kernel row's product has kw * C
# rows of columns, and with VGG's 3 input channels (K = 9) the three products ran 2.64 ms
# against im2col's one 1.16 ms product (K = 27). At 16 and 24 channels im2col was 5-8%
# faster alone but not inside SqueezeNet (4.33 against 4.27 ms), and it changes the
# rounding there: the ONNX suite's SqueezeNet case drives activations to ~1e10, where one
# ulp between channels decides its softmax
KERNEL_ROWS_CHANNELS = 8
# a strided 2-D kernel with at least this many taps per stride phase takes its columns from
# the image's phase planes (_ImageColumns)
PHASE_TAPS = 8
# images with at most this many output pixels are convolved several to a matmul
BATCH_PIXELS = 14 * 14
# ... at least this many columns to a matmul (BAND_BYTES permitting fewer)
BATCH_COLUMNS = 1536
# bytes of zero-bordered padding buffers kept per thread, one per input shape and padding
# (_padding); the most recently used one is kept whatever its size
PADDING_BYTES_KEPT = 1 << 24


@conv.fast("cpu")
def conv_cpu(xp, X, W, B=None, *, auto_pad="NOTSET", dilations=None, group=1,
             kernel_shape=None, pads=None, strides=None, out=None, _prepacked=None,
             _node=None):
    if out is not None and replay.replayed(_prepacked, (X, W, B, None, out)):
        return out
    replay.forget(_prepacked)
    attributes = dict(auto_pad=auto_pad, dilations=dilations, group=group,
                      kernel_shape=kernel_shape, pads=pads, strides=strides)
    if one_pixel.suits(X, W, group, pads, auto_pad, out) \
            and (out is None or not np.may_share_memory(out, X)):
        return one_pixel.conv(X, W, B, None, out, _bias_only, _prepacked)
    if pointwise_rows.suits(X, W, group, pads, strides, auto_pad, out, _prepacked):
        done = pointwise_rows.conv(X, W, B, None, out, _bias_only, _prepacked,
                                   conv_direct_cpu.NO_ACTIVATION)
        if done is not None:
            return done
    done = direct(X, W, B, None, conv_direct_cpu.NO_ACTIVATION, attributes, out, _prepacked,
                  node=_node)
    if done is not None:
        return done
    return conv_bands(X, W, B, auto_pad=auto_pad, dilations=dilations, group=group,
                      kernel_shape=kernel_shape, pads=pads, strides=strides, out=out,
                      prepacked=_prepacked)


def _bias_only(y, bias, residual):
    """A plain Conv's epilogue in the one-pixel and pixel-row forms (no residual there)."""
    if bias is not None:
        np.add(y, bias, out=y)


def conv_bands(X, W, B=None, *, auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None,
               pads=None, strides=None, out=None, epilogue=None, prepacked=None):
    """Conv into ``out``; ``epilogue(y, image, start, stop)``, when given, runs on each band
    of output columns ``y`` ((M, stop - start) of image ``image``) right after its matmul,
    while the band is still in cache (FusedConv adds its residual and activation there).
    ``prepacked``: a dict in which the reordered weights of a constant ``W`` are kept between
    runs (:func:`packed`); None when ``W`` may change from one call to the next."""
    xp = np
    # depthwise convolutions and narrow groups take a compiled loop, grouped 1x1 ones one
    # batched matmul; other grouped ones the generic kernel, whose one batched matmul over
    # the groups beats a Python loop of tiny per-group matmuls
    if phase_planes.depthwise_suits(X, W, group) or _narrow_groups(X, W, group, out):
        return _depthwise(X, W, B, auto_pad, dilations, group, kernel_shape, pads, strides,
                          out, epilogue, prepacked)
    if _grouped_pointwise(X, W, group, kernel_shape, pads, strides, auto_pad, out):
        return _conv_grouped_pointwise(X, W, B, int(group), out, epilogue)
    if X.dtype not in (np.float32, np.float64) or W.dtype != X.dtype or X.ndim < 3 \
            or int(group) > 1:
        Y = conv(xp, X, W, B, auto_pad=auto_pad, dilations=dilations, group=group,
                 kernel_shape=kernel_shape, pads=pads, strides=strides)
        Y = Y if out is None else _copied(out, Y)
        if epilogue is not None:
            flat = Y.reshape(Y.shape[0], Y.shape[1], -1)
            for image in range(Y.shape[0]):
                epilogue(flat[image], image, 0, flat.shape[2])
        return Y
    kernel, strides, dilations, group, begin, end, out_dims = geometry(
        prepacked, X, W, auto_pad, dilations, group, kernel_shape, pads, strides)
    (n, c), m = X.shape[:2], W.shape[0]
    if out is None:
        out = np.empty((n, m) + tuple(out_dims), dtype=X.dtype)
    # only for a constant weight: transforming it took 10x a 256-channel 14x14 convolution
    if prepacked is not None and \
            winograd_cpu.suits(X, W, kernel, strides, dilations, group, out_dims, out):
        U = packed(prepacked, "winograd", lambda: winograd_cpu.transformed_weights(W))
        return winograd_cpu.conv(X, U, B, out, begin, out_dims, epilogue)
    weights = W.reshape(group, m // group, -1)
    Y = out.reshape(n, group, m // group, -1)
    bias = None if B is None else B.reshape(group, m // group, 1)
    if _batches_suit(kernel, strides, begin, end, out_dims, weights.shape[2], X.itemsize) \
            and not _shift_add_suits(X[0], weights[0], kernel, strides, out_dims) \
            and not _KernelRows.suit(X, W, kernel, strides, out_dims):
        _conv_batched(X, weights[0], Y.reshape(n, m, -1), kernel, strides, dilations, begin,
                      end, out_dims, bias, epilogue)
        return out
    kernel_rows = _KernelRows.suited(X, W, kernel, strides, dilations, out_dims, prepacked)
    for image in range(n):
        for g in range(group):
            channels = X[image, g * (c // group):(g + 1) * (c // group)]

            def finish(y, start, stop, g=g, image=image):
                if bias is not None:
                    y += bias[g]
                if epilogue is not None and group == 1:
                    epilogue(y, image, start, stop)
            if kernel_rows is not None:
                kernel_rows.conv(channels, Y[image, g], begin, end)
                finish(Y[image, g], 0, Y.shape[3])
                continue
            _conv_image(channels, weights[g], Y[image, g], kernel, strides, dilations, begin,
                        end, out_dims, finish, prepacked if group == 1 else None)
        if epilogue is not None and group > 1:
            whole = out[image].reshape(m, -1)
            epilogue(whole, image, 0, whole.shape[1])
    return out


def direct(X, W, B, Z, limits, attributes, out, prepacked, found=None, node=None):
    """``out`` = limits(Conv(X, W, B) + Z) through ops/conv/conv_direct_cpu.py when it suits this
    convolution (None when it does not: nothing is computed). ``limits``: the activation as
    ``conv_direct_cpu.activation_limits`` gives it; ``found``: the :func:`geometry`, when the
    caller has it. ``prepacked`` None (W is not a constant): the direct form still takes a
    large enough call, packing W on each, where the session gave the node a ``node`` dict."""
    if X.ndim != 4 or W.ndim != 4 or not isinstance(X, np.ndarray):
        return None
    varying = prepacked is None
    if varying:
        prepacked = conv_direct_cpu.varying_layouts(
            node, X, lambda layouts: geometry(layouts, X, W, **attributes))
        if prepacked is None:
            return None
    if found is None:
        found = geometry(prepacked, X, W, **attributes)
    if sparse_taps.suits(X, W, attributes["group"], found, out):  # taps mostly over padding
        done = sparse_taps.conv(X, W, B, Z, limits, out, found,
                                None if varying else prepacked)
        if done is not None:
            return done
    grouped = not varying and grouped_cpu.suits(X, W, attributes["group"], found, out, Z)
    if not grouped and not conv_direct_cpu.suits(X, W, attributes["group"], found, out,
                                                 prepacked):
        return None
    # only a call into the caller's own out, with a constant W, is kept as the node's replay
    # (ops/compiled/replay.py): a W that varies may change in place, under the same address
    replays = prepacked if out is not None and not varying else None
    if out is None:
        out = np.empty((X.shape[0], W.shape[0], *found[-1]), X.dtype)
    if grouped:
        return grouped_cpu.conv(X, W, B, Z, limits, out, replays)
    return conv_direct_cpu.conv(X, W, B, Z, limits, out, found, prepacked, replays,
                                repack=varying)


def geometry(prepacked, X, W, auto_pad, dilations, group, kernel_shape, pads, strides):
    """``conv_geometry``, kept in the session node's ``prepacked`` dict per input and weight
    shape (a node's attributes never change): computing it again took ~2.5 us of every
    call, as long as a ShuffleNet layer's epilogue. The pads are part of the key: a
    FusedConvPool's bands (ops/conv/fused_conv_pool.py) call one node's kernel with pads of
    their own."""
    key = ("geometry", X.shape, W.shape, None if pads is None else tuple(pads))
    return packed(prepacked, key, lambda: conv_geometry(
        X, W, auto_pad, dilations, group, kernel_shape, pads, strides))


def _narrow_groups(X, W, group, out) -> bool:
    """A grouped convolution of narrow groups that the compiled loop of
    ``ops/conv/jit_depthwise.py`` takes (its flat form), into ``out`` or a new array; not a
    1x1 one (ShuffleNet's), which ``grouped_cpu`` computes as one product per group."""
    return jit_depthwise.narrow_groups(X, W, group) and X.flags.c_contiguous \
        and 1 < W.shape[2] * W.shape[3] and max(W.shape[2:]) <= jit_depthwise.MAX_TAPS \
        and (out is None or (out.dtype == X.dtype and out.flags.c_contiguous
                             and not np.may_share_memory(X, out)))


def depthwise_activated(X, W, B, attributes: dict, activation: tuple, out, prepacked):
    """FusedConv's depthwise (or narrow grouped) convolution without a residual: the bias
    and ``activation`` ((name, params)) applied by the compiled loop of
    ``ops/conv/jit_depthwise.py`` as it stores each output, into ``out`` (made when None);
    None, nothing computed, where that loop does not take it (the caller then adds them in
    a pass of its own)."""
    if not (phase_planes.depthwise_suits(X, W, attributes["group"])
            or _narrow_groups(X, W, attributes["group"], out)) \
            or jit_depthwise.activation_constants(*activation, X.dtype) is None:
        return None
    kernel, strides, dilations, _, begin, _, out_dims = geometry(prepacked, X, W, **attributes)
    shape = (X.shape[0], W.shape[0]) + tuple(out_dims)
    replays = prepacked if out is not None else None  # only a call into the caller's out
    if out is None:
        out = np.empty(shape, X.dtype)
    if out.shape != shape or not jit_depthwise.suits(X, W, out, kernel):
        return None
    return jit_depthwise.depthwise_conv(X, W, B, out, kernel, strides, dilations, begin,
                                        out_dims, replays, activation)


def _depthwise(X, W, B, auto_pad, dilations, group, kernel_shape, pads, strides, out,
               epilogue, prepacked=None):
    """ShuffleNet's and MobileNet's depthwise convolutions, by the direct compiled loop of
    ``ops/conv/jit_depthwise.py`` or else the phase-plane one of ``ops/compiled/jit_cpu.py``
    (3-4x the generic kernel's batched 1x9 matmuls on ShuffleNet)."""
    kernel, strides, dilations, _, begin, _, out_dims = geometry(
        prepacked, X, W, auto_pad, dilations, group, kernel_shape, pads, strides)
    # a call into the caller's out with nothing after it is the node's whole call: replayable
    replays = prepacked if epilogue is None and out is not None else None
    if out is None:
        out = np.empty((X.shape[0], W.shape[0]) + tuple(out_dims), dtype=X.dtype)
    if jit_depthwise.suits(X, W, out, kernel):
        jit_depthwise.depthwise_conv(X, W, B, out, kernel, strides, dilations, begin, out_dims,
                                     replays)
    else:
        phase_planes.depthwise_conv(X, W, B, out, kernel, strides, dilations, begin, out_dims)
    if epilogue is not None:
        flat = out.reshape(out.shape[0], out.shape[1], -1)
        for image in range(out.shape[0]):
            epilogue(flat[image], image, 0, flat.shape[2])
    return out


def _grouped_pointwise(X, W, group, kernel_shape, pads, strides, auto_pad, out) -> bool:
    """A grouped 1x1 convolution with stride 1 and no padding (ShuffleNet's): with no columns
    to build it is one batched matmul over the groups, straight into ``out``."""
    if int(group) < 2 or X.dtype not in (np.float32, np.float64) or W.dtype != X.dtype \
            or X.ndim < 3 or not X.flags.c_contiguous or W.shape[1] * int(group) != X.shape[1]:
        return False
    if W.ndim != X.ndim or any(k != 1 for k in W.shape[2:]) or W.shape[0] % int(group):
        return False
    if kernel_shape is not None and any(int(k) != 1 for k in kernel_shape):
        return False
    if any(int(p) for p in pads or ()) or any(int(t) != 1 for t in strides or ()):
        return False
    if out is not None and not (out.flags.c_contiguous and out.dtype == X.dtype):
        return False
    # SAME_* with a 1x1 kernel and stride 1 pads nothing; VALID and NOTSET neither (an
    # unknown name goes to the generic kernel, which reports it)
    name = auto_pad.decode() if isinstance(auto_pad, bytes) else str(auto_pad)
    return name in ("NOTSET", "VALID", "SAME_UPPER", "SAME_LOWER")


def _conv_grouped_pointwise(X, W, B, group, out, epilogue):
    (n, c), m = X.shape[:2], W.shape[0]
    if out is None:
        out = np.empty((n, m) + X.shape[2:], dtype=X.dtype)
    length = math.prod(X.shape[2:])
    products = out.reshape(n, group, m // group, length)
    if np.may_share_memory(out, X):
        products[...] = np.matmul(W.reshape(group, m // group, c // group),
                                  X.reshape(n, group, c // group, length))
    else:
        np.matmul(W.reshape(group, m // group, c // group),
                  X.reshape(n, group, c // group, length), out=products)
    flat = out.reshape(n, m, length)
    for image in range(n):
        if B is not None:
            flat[image] += B.reshape(m, 1)
        if epilogue is not None:
            epilogue(flat[image], image, 0, length)
    return out


def _copied(out, Y):
    np.copyto(out, Y)
    return out


def _conv_image(x, w, y, kernel, strides, dilations, begin, end, out_dims, finish,
                prepacked=None):
    """One image, one group: ``x`` (C, *in), ``w`` (M, C*prod(kernel)), ``y`` (M, L);
    ``finish(band, start, stop)`` runs on each band of columns once it is computed."""
    if all(k == 1 for k in kernel) and not any(begin) and not any(end) \
            and all(s == 1 for s in strides):
        source = x.reshape(x.shape[0], -1)
        length = source.shape[1]
        step = max(1, min(length, BAND_BYTES // max(w.shape[0] * x.itemsize, 1)))
        for start in range(0, length, step):
            stop = min(start + step, length)
            np.matmul(w, source[:, start:stop], out=y[:, start:stop])
            finish(y[:, start:stop], start, stop)
        return
    if _shift_add_suits(x, w, kernel, strides, out_dims):
        _conv_shift_add(x, w, y, kernel, dilations, begin, end, out_dims, prepacked)
        finish(y, 0, y.shape[1])
        return
    image = _ImageColumns(x, kernel, strides, dilations, begin, end, out_dims)
    rows = w.shape[1]
    row_length = math.prod(out_dims[1:])  # outputs per step of the first spatial axis
    band = max(1, BAND_BYTES // max(rows * row_length * x.itemsize, 1))
    first = out_dims[0]
    band = min(band, first)
    scratch = workspace(rows * band * row_length * x.itemsize)
    scratch = scratch[:rows * band * row_length * x.itemsize].view(x.dtype)
    for start in range(0, first, band):
        stop = min(start + band, first)
        count = (stop - start) * row_length
        columns = scratch[:rows * count].reshape((x.shape[0],) + tuple(kernel)
                                                 + (stop - start,) + tuple(out_dims[1:]))
        image.copy_rows(columns, start, stop)
        band_out = y[:, start * row_length:stop * row_length]
        np.matmul(w, columns.reshape(rows, count), out=band_out)
        finish(band_out, start * row_length, stop * row_length)


def _batches_suit(kernel, strides, begin, end, out_dims, rows, itemsize) -> bool:
    """Whether images are small enough that one matmul per image leaves BLAS short of work
    (ResNet's 7x7 and 14x14 stages: 49 or 196 columns per image), so several images' columns
    go side by side into one matmul. A 1x1 stride-1 convolution needs no columns at all."""
    pointwise = all(k == 1 for k in kernel) and all(s == 1 for s in strides) \
        and not any(begin) and not any(end)
    return not pointwise and math.prod(out_dims) <= BATCH_PIXELS \
        and 2 * rows * math.prod(out_dims) * itemsize <= BAND_BYTES


def _conv_batched(X, w, Y, kernel, strides, dilations, begin, end, out_dims, bias, epilogue):
    """Y (N, M, L) = w (M, rows) times the columns of a few images at a time, the product
    reordered from (M, images, L) into Y's (images, M, L)."""
    n, (m, rows), length = X.shape[0], w.shape, math.prod(out_dims)
    step = max(1, BAND_BYTES // (rows * length * X.itemsize), -(-BATCH_COLUMNS // length))
    step = min(n, step)
    column_space, product_space = scratch_arrays(X.dtype, (rows * step * length,),
                                                 (m * step * length,))
    for start in range(0, n, step):
        count = min(step, n - start)
        columns = column_space[:rows * count * length].reshape(rows, count, length)
        product = product_space[:m * count * length].reshape(m, count, length)
        for offset in range(count):
            im2col_into(X[start + offset], columns[:, offset], kernel, strides, dilations,
                        begin, end, out_dims)
        if count == 1:  # one image's product is already in Y's layout: no reordering copy
            np.matmul(w, columns.reshape(rows, length), out=Y[start])
        else:
            np.matmul(w, columns.reshape(rows, count * length),
                      out=product.reshape(m, count * length))
            np.copyto(Y[start:start + count], product.transpose(1, 0, 2))
        for image in range(start, start + count):
            if bias is not None:
                Y[image] += bias[0]
            if epilogue is not None:
                epilogue(Y[image], image, 0, length)


def im2col_into(x, cols, kernel, strides, dilations, begin, end, out_dims):
    """The columns (C * prod(kernel), prod(out_dims)) of image ``x`` (C, *in) into ``cols``
    (any strides), padding through a per-thread buffer."""
    image = _ImageColumns(x, kernel, strides, dilations, begin, end, out_dims)
    image.copy_rows(cols.reshape((x.shape[0],) + tuple(kernel) + tuple(out_dims)), 0,
                    out_dims[0])


class _ImageColumns:
    """The im2col columns of one image (C, *in), copied out a band of output rows at a time.

    A strided window view reads the image at the convolution's stride, which NumPy copies
    several times slower than unit-stride rows. When a 2-D kernel has many taps per stride
    phase (a 7x7 stride-2 stem: 49 taps over 4 phases), the padded image is first split into
    its stride phases, plane (ry, rx) holding pixels (i*sy + ry, j*sx + rx); tap (a, b) of
    every window is then a block of unit-stride rows of one plane (twice as fast there)."""

    def __init__(self, x, kernel, strides, dilations, begin, end, out_dims):
        padded = _padded(x, begin, end)
        self.kernel, self.out_dims = tuple(kernel), tuple(out_dims)
        self.phases = None
        if _phases_suit(kernel, strides):
            self.phases = _phase_planes(padded, strides)
            self.taps = [(divmod(a * dilations[0], strides[0]),
                          divmod(b * dilations[1], strides[1]))
                         for a in range(kernel[0]) for b in range(kernel[1])]
        elif padded is x:
            self.windows = _windows(padded, kernel, strides, dilations, out_dims)
        else:  # a kept padding: its windows view is made once (3.7 us a call)
            views = _padding(x.shape, x.dtype, tuple(begin), tuple(end)).views
            key = (self.kernel, tuple(strides), tuple(dilations), self.out_dims)
            self.windows = views.get(key)
            if self.windows is None:
                self.windows = views[key] = _windows(padded, kernel, strides, dilations,
                                                     out_dims)

    def copy_rows(self, columns, start, stop):
        """Output rows start..stop of the columns into ``columns`` (C, *kernel, rows, ...).
        One thread: split over the intra-op threads, the copies ran 5% slower (they are
        bound by memory, and the BLAS threads spin between calls)."""
        if self.phases is None:
            rest = (slice(None),) * (len(self.kernel) - 1)
            np.copyto(columns, self.windows[(Ellipsis, slice(start, stop)) + rest])
            return
        width = self.out_dims[1]
        for tap, ((qy, ry), (qx, rx)) in enumerate(self.taps):
            a, b = divmod(tap, self.kernel[1])
            np.copyto(columns[:, a, b],
                      self.phases[ry, rx][:, qy + start:qy + stop, qx:qx + width])


def _phases_suit(kernel, strides) -> bool:
    return len(kernel) == 2 and math.prod(strides) > 1 \
        and math.prod(kernel) >= PHASE_TAPS * math.prod(strides)


def _phase_planes(padded, strides):
    """(sy, sx, C, ceil(Hp/sy), ceil(Wp/sx)) stride phases of ``padded`` (C, Hp, Wp), in a
    per-thread buffer; the cells past a plane's last pixel are never read."""
    (c, hp, wp), (sy, sx) = padded.shape, strides
    shape = (sy, sx, c, -(-hp // sy), -(-wp // sx))
    planes = named_buffer("phases", math.prod(shape) * padded.itemsize).view(padded.dtype)
    planes = planes.reshape(shape)
    for ry in range(sy):
        for rx in range(sx):
            source = padded[:, ry::sy, rx::sx]
            np.copyto(planes[ry, rx][:, :source.shape[1], :source.shape[2]], source)
    return planes


class _KernelRows:
    """A stride-1 2-D convolution as one matmul per kernel row, over copies of the padded
    image shifted along its rows.

    With ``shifted[b, c, r, j] = padded[c, r, j + b*dw]`` (kw copies of the image, each
    already cropped to the output width), the window tap (a, b) of output (i, j) reads
    ``shifted[b, c, i + a*dh, j]``: for a fixed kernel row a, all of its taps for all outputs
    are the contiguous column range starting at ``a*dh*ow`` of ``shifted`` viewed as a
    (kw*C, Hp*ow) matrix. So Y = sum over a of W_a (M, kw*C) times that range: kh matmuls,
    kh - 1 adds, and a copy of kw (not kh*kw) times the image. On ResNet's 56x56 and 28x28
    layers (64 and 128 channels, 2 threads) it took 0.83 and 0.94 of shift-and-add's time,
    and 0.87 of the batched columns' time at 14x14; at 7x7 the batched columns win (a matmul
    per image is too small there), and shift-and-add keeps the layers with far fewer output
    than input channels."""

    def __init__(self, W, dilations, prepacked=None):
        m, c, kh, kw = W.shape
        self.dilations = dilations
        # W_a[m, b*C + c] = W[m, c, a, b]: 256 KB to 9 MB, made once per session node for a
        # constant weight (remade on every call it cost ResNet-50 1.4 ms a run)
        self.weights = packed(prepacked, "kernel_rows", lambda: np.ascontiguousarray(
            W.transpose(2, 0, 3, 1)).reshape(kh, m, kw * c))

    @classmethod
    def suit(cls, X, W, kernel, strides, out_dims, forward=True) -> bool:
        """Whether a convolution suits kernel rows. ``forward``: the forward's choice, which
        also weighs shift-and-add and im2col (channel counts); the weight gradient's
        (ops/conv/conv_grad_cpu.py) looks at the geometry only."""
        if X.ndim != 4 or any(s != 1 for s in strides) or math.prod(kernel) == 1:
            return False
        m, c = W.shape[:2]
        return math.prod(out_dims) > KERNEL_ROWS_PIXELS and (
            not forward or (SHIFT_ADD_RATIO * m > c and c >= KERNEL_ROWS_CHANNELS))

    @classmethod
    def suited(cls, X, W, kernel, strides, dilations, out_dims, prepacked=None):
        if not cls.suit(X, W, kernel, strides, out_dims):
            return None
        return cls(W, dilations, prepacked)

    def conv(self, x, y, begin, end):
        """One image: ``x`` (C, H, W) into ``y`` (M, oh*ow)."""
        kh, m, rows = self.weights.shape
        c, (dh, dw) = x.shape[0], self.dilations
        padded = _padded(x, begin, end)
        hp, wp = padded.shape[1:]
        kw = rows // c
        ow = wp - (kw - 1) * dw
        oh = y.shape[1] // ow
        shifted, partial = scratch_arrays(x.dtype, (kw, c, hp, ow), (m, oh * ow))
        for b in range(kw):
            np.copyto(shifted[b], padded[:, :, b * dw:b * dw + ow])
        flat = shifted.reshape(kw * c, hp * ow)
        for a in range(kh):
            start = a * dh * ow
            np.matmul(self.weights[a], flat[:, start:start + oh * ow],
                      out=y if a == 0 else partial)
            if a:
                y += partial


def _shift_add_suits(x, w, kernel, strides, out_dims) -> bool:
    """Whether a stride-1 2-D convolution costs less as shift-and-add than as im2col: the
    column matrix has ``C * kh * kw`` rows, the shifted partial products ``M * kh * kw``, so
    it pays when the output channels M are fewer than the input channels C (DenseNet's
    128 -> 32 layers: 0.37-0.53x the time), and for M = C on large images (0.81-0.86x at
    56x56 and 28x28). On small images with many channels the per-call reordering of the
    weights costs more than the columns it saves (2.2x slower at 512 channels, 7x7)."""
    if len(kernel) != 2 or any(s != 1 for s in strides) or math.prod(kernel) == 1:
        return False
    m, c = w.shape[0], x.shape[0]
    return SHIFT_ADD_RATIO * m <= c or (m <= c and math.prod(out_dims) >= SHIFT_ADD_PIXELS)


def _conv_shift_add(x, w, y, kernel, dilations, begin, end, out_dims, prepacked=None):
    """Convolution as one matmul of every kernel tap's weights against the zero-padded image,
    its rows laid end to end, then a sum of shifted slices: in that flat layout tap
    ``(dy, dx)`` of output ``(oy, ox)`` reads input element ``(oy + dy) * Wp + ox + dx``, so
    each tap's partial products for all outputs are one contiguous run shifted by
    ``dy * Wp + dx``. No im2col copy; the matmul is (M*kh*kw, C) x (C, Hp*Wp)."""
    (c, height, width), m = x.shape, w.shape[0]
    (kh, kw), (dh, dw) = kernel, dilations
    hp, wp = height + begin[0] + end[0], width + begin[1] + end[1]
    oh, ow = out_dims
    spill = (kw - 1) * dw  # the last tap's run reads this far past the last padded row
    span = hp * wp + spill
    # the padded planes laid end to end, each followed by its spill: a kept zeroed buffer
    # (:func:`_padding`) of which only the image's cells are written
    padding = _padding(x.shape, x.dtype, tuple(begin), tuple(end), spill)
    padding.array[padding.interior] = x
    flat = padding.flat
    taps = packed(prepacked, "shift_add", lambda: np.ascontiguousarray(
        w.reshape(m, c, kh, kw).transpose(2, 3, 0, 1)).reshape(kh * kw * m, c))
    partial = workspace(kh * kw * m * span * x.itemsize)[:kh * kw * m * span * x.itemsize]
    partial = partial.view(x.dtype).reshape(kh * kw * m, span)
    np.matmul(taps, flat, out=partial)
    out = y.reshape(m, oh, ow)
    for tap, (dy, dx) in enumerate((dy, dx) for dy in range(kh) for dx in range(kw)):
        shift = dy * dh * wp + dx * dw
        run = partial[tap * m:(tap + 1) * m, shift:shift + oh * wp].reshape(m, oh, wp)[..., :ow]
        if tap == 0:
            np.copyto(out, run)
        else:
            np.add(out, run, out=out)


def _padded(x, begin, end):
    """``x`` zero-padded on its spatial axes, in a per-thread buffer (:func:`_padding`)."""
    if not any(begin) and not any(end):
        return x
    padding = _padding(x.shape, x.dtype, tuple(begin), tuple(end))
    padding.array[padding.interior] = x
    return padding.array


class _Padding:
    """A zeroed buffer for one input shape and padding, and the views made of it. Only its
    interior is ever written (the same cells every time), so its border stays zero and is
    never written again; windows over it are made once. ``flat`` is the buffer as (C, plane
    + spill): each channel's padded plane followed by ``spill`` zeros."""

    def __init__(self, shape, dtype, begin, end, spill=0):
        dims = tuple(d + b + e for d, b, e in zip(shape[1:], begin, end))
        plane = math.prod(dims)
        self.flat = np.zeros((shape[0], plane + spill), dtype)
        self.array = self.flat[:, :plane].reshape((shape[0],) + dims)
        self.interior = (slice(None),) + tuple(slice(b, b + d)
                                               for b, d in zip(begin, shape[1:]))
        self.views: dict = {}


def _padding(shape, dtype, begin, end, spill=0) -> _Padding:
    """This thread's :class:`_Padding` for the input ``shape``/``dtype`` and ``begin``/``end``
    pads (plus ``spill`` zeros per channel after the padded planes, for shift-and-add). A
    zeroed padding per call cost 5-8 us on 7x7 and 8x8 planes (four border writes) and
    DenseNet's shift-and-add zeroed its whole buffer. A model has a handful of paddings;
    the most recently used ones are kept, up to :data:`PADDING_BYTES_KEPT` per thread."""
    key = (tuple(shape), np.dtype(dtype).str, begin, end, spill)
    kept = workspace_state().setdefault("paddings", {})
    padding = kept.pop(key, None)
    if padding is None:
        padding = _Padding(shape, dtype, begin, end, spill)
        total = padding.flat.nbytes + sum(p.flat.nbytes for p in kept.values())
        while kept and total > PADDING_BYTES_KEPT:
            total -= kept.pop(next(iter(kept))).flat.nbytes
    kept[key] = padding  # most recently used last
    return padding


def _windows(x, kernel, strides, dilations, out_dims):
    nd = len(kernel)
    step = x.strides[1:]
    shape = (x.shape[0],) + tuple(kernel) + tuple(out_dims)
    strides_ = ((x.strides[0],) + tuple(t * d for t, d in zip(step, dilations))
                + tuple(t * s for t, s in zip(step, strides)))
    del nd
    return np.lib.stride_tricks.as_strided(x, shape=shape, strides=strides_, writeable=False)


# its planned call, bound once per arena (ops/compiled/bound_calls.py): the recorded replay
binds_replay(conv_cpu, lambda args, out: padded(args, 3) + (None, out), "_prepacked")
