"""Depthwise convolution over stride-phase planes: the input padded and split into its
stride phases in NumPy (one strided copy per phase, in a per-thread scratch), then one
compiled loop (``_jit_depthwise_pool.py``) per plane, so each padded plane stays in L1.
Kernels up to 7x7 take the generated loops of ``jit_depthwise.py`` instead; these keep
larger kernels and outputs that overlap their inputs. The pools of ``ops/pool`` use the same
planes (``plane_pools.py``).
"""

from __future__ import annotations

import numpy as np

from mixrt.ops.compiled import jit_cpu
from mixrt.ops.compiled.jit_cpu import NATIVE

KERNELS = "mixrt.ops.conv._jit_depthwise_pool"


def phase_planes(x, kernel, strides, dilations, begin, out_dims, fill):
    """``x`` (N, C, H, W) padded with ``fill`` and split into stride phases: (N, sh*sw, C,
    ph, pw) in a per-thread scratch, where [n, ry * sw + rx, c, i, j] is padded pixel
    (i * sh + ry, j * sw + rx) of image n, channel c. The planes hold every tap of every
    output window (cells past the padded image hold ``fill`` too), so the kernels' runs
    never read uninitialized memory."""
    (n, c), (sh, sw) = x.shape[:2], strides
    ph, pw = (max((size + b - 1) // s + 1, (k - 1) * d // s + o)
              for size, k, s, d, b, o in zip(x.shape[2:], kernel, strides, dilations, begin,
                                             out_dims))
    planes = jit_cpu.scratch_array("planes", x.dtype, (n, sh * sw, c, ph, pw))
    for ry in range(sh):
        for rx in range(sw):
            # input rows y with (y + top) % sh == ry start at (ry - top) % sh, and land in
            # phase row (y + top) // sh; the same along the columns
            y0, x0 = (ry - begin[0]) % sh, (rx - begin[1]) % sw
            rows = x[:, :, y0::sh, x0::sw]
            i0, j0 = (y0 + begin[0]) // sh, (x0 + begin[1]) // sw
            columns = planes[:, ry * sw + rx, :, i0:i0 + rows.shape[2], j0:j0 + rows.shape[3]]
            np.copyto(columns, rows)
            fill_around(planes[:, ry * sw + rx], i0, i0 + rows.shape[2], j0,
                         j0 + rows.shape[3], fill)
    return planes


def fill_around(planes, top, bottom, left, right, fill):
    """``fill`` into the cells of ``planes`` (..., ph, pw) outside rows top..bottom and
    columns left..right (the copied image): the border only, not the whole buffer twice."""
    planes[..., :top, :] = fill
    planes[..., bottom:, :] = fill
    planes[..., top:bottom, :left] = fill
    planes[..., top:bottom, right:] = fill


def depthwise_suits(X, W, group) -> bool:
    """A 2-D convolution whose every group has one input channel (depthwise, with any channel
    multiplier), in float32 or float64."""
    return (isinstance(X, np.ndarray) and X.ndim == 4 and X.dtype in NATIVE
            and W.dtype == X.dtype and int(group) > 1 and int(group) == X.shape[1]
            and W.shape[1] == 1 and jit_cpu.enabled())


def depthwise_conv(X, W, B, out, kernel, strides, dilations, begin, out_dims):
    """Depthwise Conv of X (N, C, H, W) with W (C*k, 1, kh, kw), plus the bias B (or None),
    into ``out`` (N, C*k, oh, ow)."""
    m = W.shape[0]
    bias = np.zeros(m, X.dtype) if B is None else np.ascontiguousarray(B, X.dtype)
    planes = phase_planes(X, kernel, strides, dilations, begin, out_dims, 0)
    acc = jit_cpu.scratch_array("acc", X.dtype, (planes.shape[3] * planes.shape[4],))
    jit_cpu.load(KERNELS).depthwise(planes.reshape(-1), np.array(planes.shape, np.int64),
                         np.ascontiguousarray(W).reshape(-1), np.array(kernel, np.int64), bias,
                         out.reshape(-1), np.array(out_dims, np.int64), strides[0],
                         strides[1], dilations[0], dilations[1], acc)
    return out
