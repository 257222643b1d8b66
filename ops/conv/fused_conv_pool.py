"""``mixrt::FusedConvPool``: a convolution, its activation, an optional LRN and a 2-D pool,
computed in bands of rows so that the convolution's output never exists whole.

A CNN's stem (ZFNet's 7x7 conv -> Relu -> LRN -> MaxPool, ResNet's conv -> Relu -> MaxPool)
makes the model's largest tensor and pools it away at once: ZFNet-512's first conv output
is 4.35 MiB a image, more than the rest of its arena together. Here each band of pooled rows
is made from just the conv rows its windows read, in a per-thread band buffer, then pooled
into the output; the arena holds the input and the pooled output only.

On the CPU (``ops/conv/conv_pool_cpu.py``, registered with ``.fast("cpu")``), when
``ops/conv/conv_direct_cpu.py`` takes the convolution, each thread owns a run of pooled rows and
goes down it band by band, keeping the conv rows that two bands' windows share; the band buffer
(``BAND_BYTES``) stays in L2 while the LRN and the pool read it. Otherwise (a grouped conv, a
weight that is not a constant, CuPy) the generic kernel's ``_banded_any`` slices the input rows
each band needs and runs the device's FusedConv, LRN and pool kernels on the slice, computing
the shared rows again.

The optimizer (``runtime/passes/bands.py``) makes these nodes at opt_level 2; the exporter
writes them back as FusedConv -> LRN -> pool.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mixrt.ops.pool import inplace_cpu
from mixrt.ops.conv.conv import conv
from mixrt.ops.conv.windows import CONV_ATTRIBUTES, spatial_attrs, window_geometry
from mixrt.ops.compiled.workspace import per_shape
from mixrt.ops.conv.conv_cpu import geometry as conv_geometry
from mixrt.ops.ir.dtypes import FUSED_DTYPES
from mixrt.ops.device import device_kind
from mixrt.ops.ir.registry import MIXRT
from mixrt.ops.nn.fused import fused_conv
from mixrt.ops.nn.norm import lrn
from mixrt.ops.pool.pool import _pool_infer, average_pool, max_pool
from mixrt.ops.ir.registry import op

POOLS = ("MaxPool", "AveragePool")
# the conv rows a CPU band holds (the LRN and pool read them back from L2, 1 MiB a core
# here): ResNet-50's stem took 1.81 ms in bands of 1 pooled row, 0.81 in 512 KiB bands, 0.73
# in 1 MiB ones and 0.70 in one band a thread (0.72 unbanded); each band costs ~15-40 us of
# Python and of the conv's setup
BAND_BYTES = 1 << 20
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
    stage = stages(conv_attributes, (activation, activation_params),
                   (lrn_size, lrn_alpha, lrn_beta, lrn_bias), pool,
                   (pool_kernel_shape, pool_strides, pool_pads, pool_ceil_mode,
                    pool_count_include_pad))
    bands = _bands(X, W, stage, _prepacked)
    if out is None:
        out = xp.empty((X.shape[0], W.shape[0]) + bands.pooled, dtype=X.dtype)
    return _banded_any(xp, X, W, B, stage, bands, out, _prepacked)


def stages(conv_attributes: dict, activation: tuple, lrn_attributes: tuple, pool: str,
           pool_attributes: tuple) -> "_Stages":
    """The node's stages from its attributes (``pool_attributes``: kernel_shape, strides,
    pads, ceil_mode, count_include_pad as the node names them ``pool_*``)."""
    return _Stages(conv_attributes, activation, lrn_attributes, pool,
                   _pool_attributes(*pool_attributes, pool))


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
    return per_shape(prepacked, ("bands", X.shape, W.shape),
                     lambda: _make_bands(X, W, stage, prepacked))


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
    kernel, device = lrn.kernels[-1], device_kind(xp)
    attributes = dict(size=int(size), alpha=float(alpha), beta=float(beta), bias=float(bias))
    if kernel.writes_into(device):
        attributes["out"] = y
    return kernel.for_device(device)(xp, y, **attributes)


def _pool(xp, pool: str):
    return (max_pool if pool == "MaxPool" else average_pool).kernels[-1].for_device(
        device_kind(xp))


@fused_conv_pool.infer
def _(X, W, B=None, *, pool="MaxPool", pool_kernel_shape=None, pool_strides=None,
      pool_pads=None, pool_ceil_mode=0, pool_count_include_pad=0, **attributes):
    conv_attributes = {k: v for k, v in attributes.items() if k in CONV_ATTRIBUTES}
    y = conv.kernels[0].infer_fn(X, W, B, **conv_attributes)[0]
    return [_pool_infer(y, kernel_shape=pool_kernel_shape, strides=pool_strides,
                        pads=pool_pads, ceil_mode=pool_ceil_mode)[0]]


__all__ = ["BAND_BYTES", "POOLS", "fused_conv_pool"]
