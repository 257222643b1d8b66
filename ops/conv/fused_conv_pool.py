"""``mixrt::FusedConvPool``: a convolution, its activation, an optional LRN and a 2-D pool,
computed in bands of rows so that the convolution's output never exists whole.

A CNN's stem (ZFNet's 7x7 conv -> Relu -> LRN -> MaxPool, ResNet's conv -> Relu -> MaxPool)
makes the model's largest tensor and pools it away at once: ZFNet-512's first conv output
is 4.35 MiB a image, more than the rest of its arena together. Here each band of pooled rows
is made from just the conv rows its windows read, in a per-thread band buffer, then pooled
into the output; the arena holds the input and the pooled output only.

On the CPU (``_banded_cpu``), when ``ops/conv/conv_direct_cpu.py`` takes the convolution, each
thread owns a run of pooled rows and goes down it band by band (a single image of a few MB
without an LRN is computed whole instead, split between the native threads:
``_whole_image``). The conv rows that two
bands' windows share are kept: they move to the top of the band buffer and only the new
rows are computed, normalized and activated. The band buffer (``BAND_BYTES``) stays in L2
while the LRN and the pool read it. Otherwise (a grouped conv, a weight that is not a
constant, CuPy) ``_banded_any`` slices the input rows each band needs and runs the ordinary
kernels on the slice, computing the shared rows again.

The optimizer (``runtime/passes/bands.py``) makes these nodes at opt_level 2; the exporter
writes them back as FusedConv -> LRN -> pool.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mixrt.ops.compiled import jit_cpu
from mixrt.ops.conv import conv_direct_cpu
from mixrt.ops.pool import inplace_cpu, jit_pool
from mixrt.ops.conv.conv import CONV_ATTRIBUTES, conv, spatial_attrs, window_geometry
from mixrt.ops.compiled.workspace import scratch_arrays
from mixrt.ops.conv.conv_cpu import geometry as conv_geometry
from mixrt.ops.ir.dtypes import FUSED_DTYPES
from mixrt.ops.device import device_kind
from mixrt.ops.ir.registry import MIXRT
from mixrt.ops.nn.fused import activate, fused_conv
from mixrt.ops.nn.norm import lrn
from mixrt.ops.compiled.parallel import intra_op_threads, parallel_for
from mixrt.ops.pool.pool import _pool_infer, average_pool, max_pool
from mixrt.ops.ir.registry import op

POOLS = ("MaxPool", "AveragePool")
# the conv rows a CPU band holds (the LRN and pool read them back from L2, 1 MiB a core
# here): ResNet-50's stem took 1.81 ms in bands of 1 pooled row, 0.81 in 512 KiB bands, 0.73
# in 1 MiB ones and 0.70 in one band a thread (0.72 unbanded); each band costs ~15-40 us of
# Python and of the conv's setup
BAND_BYTES = 1 << 20
# a single image whose conv output is at most this big (and has no LRN) is computed whole
# instead, split between the native threads, then pooled (see _whole_image_suits)
WHOLE_IMAGE_BYTES = 4 << 20
# on a GPU a band is a few kernel launches, so bands are big: they only bound the memory
GPU_BAND_BYTES = 64 << 20


@op("FusedConvPool", since=1, domain=MIXRT, dtypes=FUSED_DTYPES)
def fused_conv_pool(xp, X, W, B=None, *, auto_pad="NOTSET", dilations=None, group=1,
                    kernel_shape=None, pads=None, strides=None, activation="",
                    activation_params=None, lrn_size=0, lrn_alpha=1e-4, lrn_beta=0.75,
                    lrn_bias=1.0, pool="MaxPool", pool_kernel_shape=None, pool_strides=None,
                    pool_pads=None, pool_ceil_mode=0, pool_count_include_pad=0, out=None,
                    _prepacked=None):
    """pool(LRN(activation(Conv(X, W, B)))) for a 4-D X: ``lrn_size`` 0 means no LRN,
    ``pool`` is MaxPool or AveragePool with the ``pool_*`` attributes (explicit pads)."""
    conv_attributes = dict(auto_pad=auto_pad, dilations=dilations, group=group,
                           kernel_shape=kernel_shape, pads=pads, strides=strides)
    stage = _Stages(conv_attributes, (activation, activation_params),
                    (lrn_size, lrn_alpha, lrn_beta, lrn_bias), pool,
                    _pool_attributes(pool_kernel_shape, pool_strides, pool_pads,
                                     pool_ceil_mode, pool_count_include_pad, pool))
    bands = _bands(X, W, stage, _prepacked)
    if out is None:
        out = xp.empty((X.shape[0], W.shape[0]) + bands.pooled, dtype=X.dtype)
    # the CPU's compiled bands stay in this function, beside the device-neutral ones they
    # fall back to band by band
    if xp is np and _banded_cpu(X, W, B, stage, bands, out, _prepacked):
        return out
    return _banded_any(xp, X, W, B, stage, bands, out, _prepacked)


def _pool_attributes(kernel_shape, strides, pads, ceil_mode, count_include_pad, pool):
    if pool not in POOLS:
        raise ValueError(f"FusedConvPool: pool must be one of {POOLS}, got {pool!r}")
    if kernel_shape is None or len(kernel_shape) != 2:
        raise ValueError(f"FusedConvPool: pool_kernel_shape must have 2 values, got "
                         f"{kernel_shape!r}")
    attributes = dict(kernel_shape=[int(k) for k in kernel_shape],
                      strides=[int(s) for s in strides or (1, 1)],
                      pads=[int(p) for p in pads or (0, 0, 0, 0)], ceil_mode=int(ceil_mode))
    if pool == "AveragePool":
        attributes["count_include_pad"] = int(count_include_pad)
    return attributes


@dataclass(frozen=True)
class _Stages:
    """What runs on each band, after the convolution."""

    conv: dict
    activation: tuple  # (name, params) as FusedConv takes them
    lrn: tuple  # (size, alpha, beta, bias); size 0: none
    pool: str
    pool_attributes: dict


@dataclass(frozen=True)
class _Bands:
    """The geometry of one input shape: the conv's, its output (rows, cols), the pool's
    window along the rows and its output (rows, cols)."""

    conv_geometry: tuple
    conv_out: tuple
    window: int
    stride: int
    top: int  # the pool's top padding
    pooled: tuple
    rows_per_band: int
    left: int  # the pool's left padding
    counts: object  # AveragePool's window sizes over the whole output (one number or rows)

    def conv_rows(self, p0: int, p1: int) -> tuple[int, int]:
        """The conv output rows that pooled rows p0..p1 read."""
        first = p0 * self.stride - self.top
        last = (p1 - 1) * self.stride - self.top + self.window
        return max(0, first), min(self.conv_out[0], last)

    def pool_pads(self, p0: int, p1: int, declared: list) -> list:
        """The pool's [top, left, bottom, right] pads on the band of pooled rows p0..p1: its
        windows' rows outside the conv output (the declared pads, or ceil_mode's overhang),
        and across, the ``declared`` ones."""
        a, b = self.conv_rows(p0, p1)
        top = a - (p0 * self.stride - self.top)
        bottom = (p1 - 1) * self.stride - self.top + self.window - b
        return [top, declared[1], bottom, declared[3]]


def _bands(X, W, stage: _Stages, prepacked) -> _Bands:
    key = ("bands", X.shape, W.shape)
    found = None if prepacked is None else prepacked.get(key)
    if found is None:
        found = _make_bands(X, W, stage, prepacked)
        if prepacked is not None:
            found = prepacked.setdefault(key, found)
    return found


def _make_bands(X, W, stage: _Stages, prepacked) -> _Bands:
    if X.ndim != 4:
        raise ValueError(f"FusedConvPool takes a 4-D input, got shape {tuple(X.shape)}")
    geometry = conv_geometry(prepacked, X, W, **stage.conv)
    conv_out = tuple(int(d) for d in geometry[-1])
    attributes = stage.pool_attributes
    kernel, strides, dilations = spatial_attrs(2, attributes["kernel_shape"],
                                               attributes["strides"])
    begin, end, pooled = window_geometry(conv_out, kernel, strides, dilations,
                                         attributes["pads"], "NOTSET",
                                         bool(attributes["ceil_mode"]))
    pooled = tuple(int(p) for p in pooled)
    row_bytes = W.shape[0] * conv_out[1] * X.itemsize
    budget = BAND_BYTES if isinstance(X, np.ndarray) else GPU_BAND_BYTES
    rows_per_band = max(1, (budget // max(row_bytes, 1) - kernel[0]) // strides[0] + 1)
    counts = None
    if "count_include_pad" in attributes:  # the whole output's, so the overhang is not padding
        counts = inplace_cpu._window_counts(
            conv_out, (tuple(kernel), tuple(strides), tuple(dilations), tuple(begin),
                       tuple(end), pooled), bool(attributes["count_include_pad"]),
            np.dtype(X.dtype))
    return _Bands(geometry, conv_out, kernel[0], strides[0], begin[0], pooled,
                  rows_per_band, begin[1], counts)


# -- the CPU: bands of conv rows from the direct convolution ------------------------------------

def _banded_cpu(X, W, B, stage: _Stages, bands: _Bands, out, prepacked) -> bool:
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
    _pool(np, stage.pool)(np, image, out=out, **stage.pool_attributes)  # native threads too


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
        _pool(np, stage.pool)(np, band[None], out=staged[None], **attributes)
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


# -- anywhere: bands of input rows through the ordinary kernels ------------------------------

def _banded_any(xp, X, W, B, stage: _Stages, bands: _Bands, out, prepacked):
    """Band by band: the input rows each band's conv rows read, with the pads they need,
    through FusedConv, LRN and the pool (on the CPU their fast paths)."""
    # auto_pad resolved for the full input: each band gets its own explicit pads
    conv_attributes = dict(stage.conv, auto_pad="NOTSET")
    begin, end = bands.conv_geometry[4], bands.conv_geometry[5]
    span = (bands.conv_geometry[0][0] - 1) * bands.conv_geometry[2][0] + 1
    stride = bands.conv_geometry[1][0]
    height = X.shape[2]
    # FusedConv's kernel for the device, as a FusedConv node there runs (on the CPU its
    # direct or banded convolution, ops/nn/fused_cpu.py)
    conv_kernel = fused_conv.kernels[-1].for_device(device_kind(xp))
    for p0 in range(0, bands.pooled[0], bands.rows_per_band):
        p1 = min(bands.pooled[0], p0 + bands.rows_per_band)
        a, b = bands.conv_rows(p0, p1)
        first, last = a * stride - begin[0], (b - 1) * stride - begin[0] + span
        pads = [max(0, -first), begin[1], max(0, last - height), end[1]]
        rows = xp.ascontiguousarray(X[:, :, max(0, first):min(height, last)])
        y = conv_kernel(xp, rows, W, B, activation=stage.activation[0],
                        activation_params=stage.activation[1],
                        _prepacked=prepacked, **dict(conv_attributes, pads=pads))
        y = _normalize(xp, y, stage.lrn)
        attributes = dict(stage.pool_attributes, pads=bands.pool_pads(
            p0, p1, stage.pool_attributes["pads"]))
        out[:, :, p0:p1] = _pool(xp, stage.pool)(xp, y, **attributes)
    return out


# These two pick the kernel LRN and the pool register for the device (their CPU ones write in
# place, into the band's own buffer), as a node of that op would run there.

def _normalize(xp, y, lrn_attributes):
    size, alpha, beta, bias = lrn_attributes
    if not size:
        return y
    if xp is np:
        return inplace_cpu.lrn_cpu(np, y, size=int(size), alpha=float(alpha),
                                   beta=float(beta), bias=float(bias), out=y)
    return lrn(xp, y, size=int(size), alpha=float(alpha), beta=float(beta), bias=float(bias))


def _pool(xp, pool: str):
    if xp is np:
        return inplace_cpu.max_pool_cpu if pool == "MaxPool" else inplace_cpu.average_pool_cpu
    return max_pool if pool == "MaxPool" else average_pool


@fused_conv_pool.infer
def _(X, W, B=None, *, pool="MaxPool", pool_kernel_shape=None, pool_strides=None,
      pool_pads=None, pool_ceil_mode=0, pool_count_include_pad=0, **attributes):
    conv_attributes = {k: v for k, v in attributes.items() if k in CONV_ATTRIBUTES}
    y = conv.kernels[0].infer_fn(X, W, B, **conv_attributes)[0]
    return [_pool_infer(y, kernel_shape=pool_kernel_shape, strides=pool_strides,
                        pads=pool_pads, ceil_mode=pool_ceil_mode)[0]]


__all__ = ["BAND_BYTES", "POOLS", "fused_conv_pool"]
