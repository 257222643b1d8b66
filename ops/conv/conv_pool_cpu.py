"""FusedConvPool's CPU form, registered beside its generic kernel
(``ops/conv/fused_conv_pool.py``): when ``ops/conv/conv_direct_cpu.py`` takes the convolution,
each thread owns a run of pooled rows and goes down it band by band (a single image of a few MB
without an LRN is computed whole instead, split between the native threads: ``_whole_image``).
The conv rows that two bands' windows share are kept: they move to the top of the band buffer
and only the new rows are computed, normalized and activated. The band buffer
(``fused_conv_pool.BAND_BYTES``) stays in L2 while the LRN and the pool read it. Otherwise the
generic bands run, through the CPU's FusedConv, LRN and pool kernels.
"""

from __future__ import annotations

import numpy as np

from mixrt.ops.compiled import jit_cpu
from mixrt.ops.compiled.parallel import intra_op_threads, parallel_for
from mixrt.ops.compiled.workspace import scratch_arrays
from mixrt.ops.conv import conv_direct_cpu
from mixrt.ops.conv.fused_conv_pool import (_Bands, _banded_any, _bands, _Stages,
                                            fused_conv_pool, stages)
from mixrt.ops.nn.fused import activate
from mixrt.ops.pool import inplace_cpu, jit_pool

# a single image whose conv output is at most this big (and has no LRN) is computed whole
# instead, split between the native threads, then pooled (see _whole_image_suits)
WHOLE_IMAGE_BYTES = 4 << 20


@fused_conv_pool.fast("cpu")
def fused_conv_pool_cpu(xp, X, W, B=None, *, auto_pad="NOTSET", dilations=None, group=1,
                        kernel_shape=None, pads=None, strides=None, activation="",
                        activation_params=None, lrn_size=0, lrn_alpha=1e-4, lrn_beta=0.75,
                        lrn_bias=1.0, pool="MaxPool", pool_kernel_shape=None,
                        pool_strides=None, pool_pads=None, pool_ceil_mode=0,
                        pool_count_include_pad=0, out=None, _prepacked=None):
    """The compiled bands where the direct convolution takes the conv, else the generic
    bands (on the CPU's kernels)."""
    conv_attributes = dict(auto_pad=auto_pad, dilations=dilations, group=group,
                           kernel_shape=kernel_shape, pads=pads, strides=strides)
    stage = stages(conv_attributes, (activation, activation_params),
                   (lrn_size, lrn_alpha, lrn_beta, lrn_bias), pool,
                   (pool_kernel_shape, pool_strides, pool_pads, pool_ceil_mode,
                    pool_count_include_pad))
    bands = _bands(X, W, stage, _prepacked)
    if out is None:
        out = np.empty((X.shape[0], W.shape[0]) + bands.pooled, dtype=X.dtype)
    if banded_cpu(X, W, B, stage, bands, out, _prepacked):
        return out
    return _banded_any(np, X, W, B, stage, bands, out, _prepacked)


def pool_cpu(pool: str):
    """The pool's CPU kernel (into ``out`` when given)."""
    return inplace_cpu.max_pool_cpu if pool == "MaxPool" else inplace_cpu.average_pool_cpu


# -- the CPU: bands of conv rows from the direct convolution ------------------------------------

def banded_cpu(X, W, B, stage: _Stages, bands: _Bands, out, prepacked) -> bool:
    """Each thread's run of pooled rows, band by band (see the module docstring); False
    (nothing done) when the direct convolution does not take this conv."""
    limits = conv_direct_cpu.activation_limits(*stage.activation)
    if X.dtype not in jit_cpu.NATIVE or out.dtype != X.dtype or not out.flags.c_contiguous \
            or np.may_share_memory(out, X) or not conv_direct_cpu.suits(
                X, W, stage.conv["group"], bands.conv_geometry, None, prepacked):
        return False
    after = None if limits is not None else stage.activation  # what the epilogue leaves
    if _whole_image_suits(X, W, stage, bands):
        _whole_image(X, W, B, limits or conv_direct_cpu.NO_ACTIVATION, stage, bands, after,
                     out, prepacked)
        return True
    rows = conv_direct_cpu.band_rows(X, W, B, limits or conv_direct_cpu.NO_ACTIVATION,
                                     bands.conv_geometry, prepacked)
    pooled_rows = bands.pooled[0]
    count = max(1, min(intra_op_threads(), pooled_rows))  # runs of pooled rows per image
    runs = [(image, pooled_rows * t // count, pooled_rows * (t + 1) // count)
            for image in range(X.shape[0]) for t in range(count)]
    parallel_for(runs, lambda image, q0, q1: _run_of_bands(
        rows, image, q0, q1, W.shape[0], X.dtype, stage, bands, after, out))
    return True


def _whole_image_suits(X, W, stage: _Stages, bands: _Bands) -> bool:
    """One image whose conv output fits WHOLE_IMAGE_BYTES, without an LRN, with the native
    workers at hand. The bands' runs split an image's rows between Python threads, each
    computing its share alone; the direct conv splits the whole image between the native
    threads, and so does the pool after it. In one process, ms, bands / whole image /
    unfused: Inception's stem (3.2 MB out) 1.23 / 0.92 / 0.86, its 3x3 64 -> 192 at 56x56
    (2.4 MB) 2.63 / 2.11 / 2.21 (the pool then on one thread; on the native ones the whole
    image went as fast as the unfused pair). An LRN would run on one thread over the whole
    image (AlexNet at batch 1: 12.79 against 12.49 ms banded). With more images the bands'
    runs over images win (AlexNet's stem at batch 8: 8.9 / 10.8), so only a single image is
    taken; past the bound the scratch image would cost more memory than it saves time (VGG's
    first block, 12.8 MB, for ~0.2 ms of its 173)."""
    size = W.shape[0] * bands.conv_out[0] * bands.conv_out[1] * X.itemsize
    return X.shape[0] == 1 and not stage.lrn[0] and size <= WHOLE_IMAGE_BYTES \
        and jit_cpu.native_pool() is not None


def _whole_image(X, W, B, limits, stage: _Stages, bands: _Bands, after, out, prepacked):
    """The single image's conv into a scratch image (the direct conv over the native
    threads), its activation and LRN, then the pool into ``out`` (the pool's own kernel,
    split between the native threads as well)."""
    channels, (height, width) = W.shape[0], bands.conv_out
    image = jit_cpu.scratch_array("conv_pool_image", X.dtype, (1, channels, height, width))
    conv_direct_cpu.conv(X, W, B, None, limits, image, bands.conv_geometry, prepacked)
    _after_conv(image[0], stage, after)
    pool_cpu(stage.pool)(np, image, out=out, **stage.pool_attributes)  # native threads too


def _run_of_bands(rows, image, q0, q1, channels, dtype, stage, bands, after, out) -> None:
    """Pooled rows q0..q1 of one image, band by band in this thread's band buffer. A band
    of r conv rows lies contiguous as (C, r, cols), as the pools' compiled loops want it."""
    width = bands.conv_out[1]
    capacity = (bands.rows_per_band - 1) * bands.stride + bands.window  # a band's most rows
    buffer = jit_cpu.scratch_array("conv_pool_band", dtype, (channels * capacity * width,))
    held = (0, 0)  # the conv rows the buffer holds
    for p0 in range(q0, q1, bands.rows_per_band):
        p1 = min(q1, p0 + bands.rows_per_band)
        a, b = bands.conv_rows(p0, p1)
        kept = max(0, held[1] - a) if held[0] <= a < held[1] else 0
        carry = None
        if kept:  # rows the last band computed that this one reads again
            last = buffer[:channels * (held[1] - held[0]) * width].reshape(channels, -1, width)
            carry = last[:, a - held[0]:].copy()
        band = buffer[:channels * (b - a) * width].reshape(channels, b - a, width)
        if carry is not None:
            band[:, :kept] = carry
        if b > a + kept:
            rows(image, a + kept, b, band.reshape(channels, -1), kept)
            _after_conv(band[:, kept:], stage, after)
        held = (a, b)
        _pool_band(band, p0, p1, stage, bands, out[image])


def _after_conv(fresh, stage: _Stages, after) -> None:
    """The activation the epilogue could not apply, then the LRN, on new conv rows (C, r, w)."""
    if after is not None and after[0]:
        activate(np, fresh, *after)
    size, alpha, beta, bias = stage.lrn
    if size:
        _lrn_rows(fresh, int(size), float(alpha), float(beta), float(bias))


def _lrn_rows(x, size, alpha, beta, bias) -> None:
    """LRN over the channels of ``x`` (C, rows, cols), in place, as ops/pool/inplace_cpu.py's."""
    plane = x.shape[1] * x.shape[2]
    block = max(1, min(x.shape[0], inplace_cpu.BLOCK_BYTES // (plane * x.itemsize)))
    squares, sums = scratch_arrays(x.dtype, (block + size - 1,) + x.shape[1:],
                                   (block,) + x.shape[1:])
    inplace_cpu._lrn_image(x, x, size, alpha / size, beta, bias, squares, sums)


def _pool_band(band, p0, p1, stage: _Stages, bands: _Bands, image_out) -> None:
    """Pooled rows p0..p1 of one image from the conv rows in ``band`` (C, r, w), by the
    compiled loop of ``ops/pool/jit_pool.py`` (one call; the windows' rows above the band's first
    are the pool's top padding) through a staging buffer into the output's rows."""
    kernel = tuple(stage.pool_attributes["kernel_shape"])
    strides = tuple(stage.pool_attributes["strides"])
    staged = jit_cpu.scratch_array("conv_pool_staged", band.dtype,
                                    (band.shape[0], p1 - p0, bands.pooled[1]))
    if max(kernel) > jit_pool.MAX_UNROLLED_TAPS or not jit_cpu.enabled():
        attributes = dict(stage.pool_attributes, pads=bands.pool_pads(
            p0, p1, stage.pool_attributes["pads"]))
        pool_cpu(stage.pool)(np, band[None], out=staged[None], **attributes)
    else:
        maximum = stage.pool == "MaxPool"
        run = jit_pool._compiled(kernel, strides, (1, 1), maximum).run
        width = max(bands.left + band.shape[2], (bands.pooled[1] - 1) * strides[1] + kernel[1])
        row = jit_cpu.scratch_array("conv_pool_row", band.dtype, (width,))
        top = bands.pool_pads(p0, p1, stage.pool_attributes["pads"])[0]
        run(band, staged, row, _NO_STAGING[band.dtype], _divisor(bands, p0, p1, band.dtype),
            top, bands.left, 0, band.shape[0])
    image_out[:, p0:p1] = staged


_NO_STAGING = {np.dtype(t): np.empty((0, 0), t) for t in (np.float32, np.float64)}
_ONES = {np.dtype(t): np.ones((1, 1), t) for t in (np.float32, np.float64)}


def _divisor(bands: _Bands, p0: int, p1: int, dtype):
    """What the compiled loop divides each window by: 1 for a max, else the window sizes of
    pooled rows p0..p1."""
    if bands.counts is None:
        return _ONES[dtype]
    counts = np.asarray(bands.counts, dtype)
    if counts.ndim:
        counts = counts[p0:p1]
    return np.ascontiguousarray(np.broadcast_to(counts, (p1 - p0, bands.pooled[1])))
