"""Convolution by im2col in cache-sized chunks, written into a reused workspace, each chunk's
matmul writing straight into the output (or the arena view it was given): one image and
group at a time (:func:`_conv_image`, which sends a 1x1 stride-1 convolution to one matmul
and a stride-1 one with few output channels to shift-and-add), or several small images'
columns side by side in one matmul (:func:`_conv_batched`). ``conv_cpu.py`` chooses among
these forms; the columns are taken here.

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

from mixrt.ops.compiled.workspace import named_buffer, scratch_arrays, workspace
from mixrt.ops.conv.padding_cpu import _padded, _padding
from mixrt.ops.conv.shifted_cpu import _conv_shift_add, _shift_add_suits

# bytes of im2col columns (or of output, for a 1x1 convolution) per band. Measured on ResNet-50
# and VGG-19 layers, 8 MiB beat 1 MiB by 10-45%: each band is one BLAS call, and BLAS splits
# a call over its threads; narrow bands left them short of work and multiplied the epilogues.
BAND_BYTES = 1 << 23
# a strided 2-D kernel with at least this many taps per stride phase takes its columns from
# the image's phase planes (_ImageColumns)
PHASE_TAPS = 8
# images with at most this many output pixels are convolved several to a matmul
BATCH_PIXELS = 14 * 14
# ... at least this many columns to a matmul (BAND_BYTES permitting fewer)
BATCH_COLUMNS = 1536


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


def _windows(x, kernel, strides, dilations, out_dims):
    nd = len(kernel)
    step = x.strides[1:]
    shape = (x.shape[0],) + tuple(kernel) + tuple(out_dims)
    strides_ = ((x.strides[0],) + tuple(t * d for t, d in zip(step, dilations))
                + tuple(t * s for t, s in zip(step, strides)))
    del nd
    return np.lib.stride_tricks.as_strided(x, shape=shape, strides=strides_, writeable=False)
