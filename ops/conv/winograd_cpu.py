"""3x3 stride-1 convolutions on the CPU by Winograd's minimal filtering, F(2x2, 3x3).

Each 2x2 block of outputs is computed from a 4x4 tile of input as ``A^T [(G g G^T) * (B^T d
B)] A``: the element-wise product of a transformed filter U and a transformed tile V, summed
over the input channels. Over all tiles that sum is 16 matrix products, one per element of
the 4x4 transform: ``M[xi] (M, tiles) = U[xi] (M, C) @ V[xi] (C, tiles)``. They hold 16 * M
* C multiply-adds per tile against im2col's 36 * M * C for the same four outputs: 2.25x
fewer, and no 9x column matrix to copy. Alone, on ResNet's and Inception's layer shapes, the
16 products took 0.53-0.70 of the time of the one im2col product; inside a model the
transforms and the larger transformed weights take much of that back, so only layers with
many channels take this path (``MIN_CHANNEL_PRODUCT``; benchmarks/NOTES.md §13), and on
planes past 56x56 layers of 64 channels and more (§14).

The transforms only add and subtract (the filter's uses halves, done once per session node
in float64), so the rounding is that of a few additions: float32 outputs stay within 2e-6
of the largest output of the float64 im2col result in tests/ops/test_winograd_cpu.py. A
NaN in the input reaches exactly the outputs whose window holds it, as in im2col; an
infinity reaches them as NaN (the transforms subtract it from itself), not as +-inf.

The tiles of all images of a batch are laid side by side, so a batch of small images makes
wider products; a band of tile rows whose transformed tiles fill ``BAND_BYTES`` goes through
the three steps at a time (VGG's 224x224 layers at batch 8 would need 400 MB at once).
``MIXRT_WINOGRAD=0`` turns this path off; the convolutions then take im2col.
"""

from __future__ import annotations

import math
import os

import numpy as np

from mixrt.ops.compiled import jit_cpu

ENABLED = os.environ.get("MIXRT_WINOGRAD", "1") != "0"
# bytes of transformed tiles (and of products) per band
BAND_BYTES = 1 << 23
# Where the 16 products pay inside a model (benchmarks/NOTES.md §13): in-channels times
# out-channels at least this many (VGG's, AlexNet's and ResNet's 256-512 channel layers;
# at 128-192 channels Inception's layers came out even or slower) ...
MIN_CHANNEL_PRODUCT = 256 * 256
# ... on output planes from 10x10 to 56x56. At 7x7 the transformed weights (16/9 the bytes)
# are read from memory for too few tiles (512 -> 512: 1.35 against 1.20 ms a layer).
MIN_PIXELS = 10 * 10
MAX_PIXELS = 56 * 56
# Larger planes pay from fewer channels: VGG's 64 -> 64 at 224x224 and 128 -> 128 at 112x112
# took 11.1 and 7.9 ms against 15.5 and 11.1 alone; VGG-19 116.6 -> 107.9 ms a run at batch
# 1, 839 -> 811 at batch 8 (one process, against the 56x56 limit)
LARGE_CHANNEL_PRODUCT = 64 * 64
# G of F(2x2, 3x3): the filter transform U = G g G^T
_G = np.array([[1.0, 0.0, 0.0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0.0, 0.0, 1.0]])


def suits(X, W, kernel, strides, dilations, group, out_dims, out=None) -> bool:
    """A 2-D 3x3 convolution with stride and dilation 1 and one group, of contiguous float
    arrays, with the channels and output plane size where the path gains (``MIN_*`` and
    ``MAX_PIXELS``; ``LARGE_CHANNEL_PRODUCT`` past it)."""
    if not ENABLED or X.ndim != 4 or tuple(kernel) != (3, 3) or int(group) != 1:
        return False
    if any(int(s) != 1 for s in strides) or any(int(d) != 1 for d in dilations):
        return False
    if X.dtype not in (np.float32, np.float64) or W.dtype != X.dtype \
            or not X.flags.c_contiguous:
        return False
    if out is not None and not (out.flags.c_contiguous and out.dtype == X.dtype):
        return False
    m, c = W.shape[:2]
    pixels = math.prod(out_dims)
    if pixels > MAX_PIXELS:
        return m * c >= LARGE_CHANNEL_PRODUCT and jit_cpu.enabled()
    return m * c >= MIN_CHANNEL_PRODUCT and pixels >= MIN_PIXELS and jit_cpu.enabled()


def transformed_weights(W) -> np.ndarray:
    """U (16, M, C): element (i, j) of G g G^T for every filter g = W[m, c], in float64
    then rounded once to W's dtype."""
    m, c = W.shape[:2]
    # two BLAS contractions, kernel rows then columns: 3x the one einsum (256 x 256: 3.4
    # against 10.2 ms)
    rows = np.tensordot(_G, W.astype(np.float64), axes=(1, 2))  # (4, M, C, 3)
    u = np.tensordot(rows, _G, axes=(3, 1))  # (4, M, C, 4)
    return np.ascontiguousarray(u.transpose(0, 3, 1, 2).reshape(16, m, c).astype(W.dtype))


def conv(X, U, B, out, begin, out_dims, epilogue=None):
    """Y = conv(X, W) + B into ``out`` (N, M, oh, ow), U = :func:`transformed_weights` (W);
    ``epilogue(y, image, start, stop)`` runs on each band of output columns once written."""
    kernels = jit_cpu.load("mixrt.ops.conv._jit_winograd")
    (n, c, h, w), m = X.shape, U.shape[1]
    oh, ow = out_dims
    th, tw = -(-oh // 2), -(-ow // 2)
    bias = np.zeros(m, X.dtype) if B is None else np.ascontiguousarray(B, X.dtype).reshape(m)
    rows = max(1, min(n * th, BAND_BYTES // (16 * max(c, m) * (tw + 1) * X.itemsize)))
    x, y = X.reshape(-1), out.reshape(-1)
    flat = out.reshape(n, m, oh * ow)
    for g0 in range(0, n * th, rows):
        g1 = min(g0 + rows, n * th)
        columns = (g1 - g0) * (tw + 1)
        v, products, v_plane, m_plane = _planes(c, m, columns, X.dtype)
        phases = jit_cpu.scratch_array("winograd_phases", X.dtype,
                                        4 * ((min(rows, th) + 1) * (tw + 1) + 1))
        combined = jit_cpu.scratch_array("winograd_combined", X.dtype, 12 * columns + 8)
        kernels.winograd_input(x, v, c, h, w, begin[0], begin[1], th, tw, g0, g1, v_plane,
                               phases, combined)
        np.matmul(U, _stack(v, c, columns, v_plane), out=_stack(products, m, columns, m_plane))
        kernels.winograd_output(products, y, bias, m, oh, ow, th, tw, g0, g1, m_plane,
                                combined)
        if epilogue is not None:
            for image, start, stop in _band_images(g0, g1, th, oh, ow):
                epilogue(flat[image][:, start:stop], image, start, stop)
    return out


def _band_images(g0, g1, th, oh, ow):
    """(image, first output column, end column) of each image the tile rows g0..g1 cover."""
    for image in range(g0 // th, (g1 - 1) // th + 1):
        first = max(g0, image * th) - image * th
        last = min(g1, (image + 1) * th) - image * th
        yield image, 2 * first * ow, min(2 * last, oh) * ow


def _planes(c, m, tiles, dtype):
    """Flat buffers for the 16 planes of V (C, tiles) and of the products (M, tiles), and
    the distance between planes: each plane starts 64 bytes past a 4 KiB boundary after
    the previous one, so the 16 streams of the transforms spread over the cache sets."""
    itemsize = np.dtype(dtype).itemsize
    v_plane, m_plane = (_staggered(count * tiles, itemsize) for count in (c, m))
    v = jit_cpu.scratch_array("winograd_v", dtype, 16 * v_plane)
    products = jit_cpu.scratch_array("winograd_products", dtype, 16 * m_plane)
    return v, products, v_plane, m_plane


def _staggered(elements: int, itemsize: int) -> int:
    return (-(-elements * itemsize // 4096) * 4096 + 64) // itemsize


def _stack(flat, rows, columns, plane):
    """The (16, rows, columns) matrices of a flat plane buffer, ``plane`` elements apart."""
    item = flat.itemsize
    return np.lib.stride_tricks.as_strided(flat, (16, rows, columns),
                                           (plane * item, columns * item, item))
