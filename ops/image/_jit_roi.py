"""RoiAlign's bilinear sampling compiled by numba (``ops/pool/pool.roi_align``).

The NumPy form gathers every channel of every sample of every bin as a fancy index and
reduces it, one RoI at a time. Here each output value reads its samples' four corners
directly. The taps and their weights (float64 products cast to the image's dtype) come
from NumPy, so each sample's weighted corners are the NumPy form's bits; an average sums its
samples in row order, which may differ from NumPy's reduction by rounding.
"""

from __future__ import annotations

from numba import njit


@njit(nogil=True, cache=True)
def roi_align(images, batches, rows, cols, weights, grids, average, out):
    """out [R, C, out_h, out_w]. images [N, C, H, W]; rows[r] (y_lo, y_hi) and cols[r]
    (x_lo, x_hi) per sample along each axis (bins padded to the largest grid); weights[r, k] the
    corner k weights (lo-lo, lo-hi, hi-lo, hi-hi) per (sample y, sample x); grids[r] the samples
    per bin."""
    count, channels, out_h, out_w = out.shape
    # the samples of bin (ph, pw) start at ph * stride_h, pw * stride_w (padded grids)
    stride_h, stride_w = rows.shape[2] // out_h, cols.shape[2] // out_w
    for r in range(count):
        image = images[batches[r]]
        grid_h, grid_w = grids[r, 0], grids[r, 1]
        for c in range(channels):
            plane = image[c]
            for ph in range(out_h):
                for pw in range(out_w):
                    out[r, c, ph, pw] = _bin(plane, rows[r], cols[r], weights[r], ph * stride_h,
                                             pw * stride_w, grid_h, grid_w, average)


@njit(nogil=True, cache=True, inline="always")
def _bin(plane, rows, cols, weights, y0, x0, grid_h, grid_w, average):
    total = plane[0, 0] * 0
    for sy in range(y0, y0 + grid_h):
        y_lo, y_hi = rows[0, sy], rows[1, sy]
        for sx in range(x0, x0 + grid_w):
            x_lo, x_hi = cols[0, sx], cols[1, sx]
            c0 = plane[y_lo, x_lo] * weights[0, sy, sx]
            c1 = plane[y_lo, x_hi] * weights[1, sy, sx]
            c2 = plane[y_hi, x_lo] * weights[2, sy, sx]
            c3 = plane[y_hi, x_hi] * weights[3, sy, sx]
            if average:
                total += c0 + c1 + c2 + c3
            else:  # onnxruntime's max mode: the largest weighted corner of the bin's samples
                sample = max(max(c0, c1), max(c2, c3))
                total = sample if sy == y0 and sx == x0 else max(total, sample)
    if average:
        return total / (grid_h * grid_w)
    return total
