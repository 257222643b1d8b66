"""Direct 2-D convolution on the packed-panel tile: no im2col, the bias, residual and
activation applied as the tile is stored.

ResNet-50's convolutions through im2col (or kernel rows) and OpenBLAS spent ~6.6 ms of a
26 ms run outside the sgemm: copying columns, then one more pass over each output for the
bias, the shortcut and the Relu. Here (``ops/_jit_panels.py``'s ``direct_conv``) the tile
reads its 32 output positions straight out of the image's stride phases, and its sums go
through the epilogue on their way out of the registers' scratch. The image is copied once,
into its zero-padded phase planes.
"""

from __future__ import annotations

import math

import numpy as np

from mixrt.ops import jit_cpu
from mixrt.ops.parallel import intra_op_threads, parallel_for

# weight bytes per block of output channels: a block stays in L2 (1 MiB here) while the
# image's positions pass over it
WEIGHT_BLOCK_BYTES = 1 << 18
# output rows per thread from which the threads split the image's rows (each building its
# own phase planes) rather than the output channels
ROWS_SPLIT_MIN = 8
# outputs per computed position (output width / phase-plane width) from which the direct
# form is taken; ResNet-50's 3x3 layers, 2 threads, against the im2col or kernel-row path:
# 56x56 0.77, 28x28 0.86, 14x14 1.07-1.13 (where Winograd takes the 256-channel ones)
MIN_USE = 0.9
# ... and images with at most this many outputs, which leave OpenBLAS short of columns:
# ResNet-50's 7x7 3x3 layers 0.76
FEW_POSITIONS = 64
# a 1x1 convolution takes the direct form from this many output positions; ResNet-50's, 2
# threads, against OpenBLAS plus its epilogue pass: 56x56 0.56-0.92, 28x28 0.74-1.06,
# 14x14 1.24-1.32, 7x7 1.19-1.24 (the weight, up to 4 MiB, is read again for every panel
# of positions, and a last partial panel is a larger share)
POINTWISE_POSITIONS = 28 * 28
# ... when its panel (input channels x 32 positions) stays in L1 (48 KiB here) while the
# output channels' strips pass over it: with 512 input channels ResNet-50's 28x28 layers
# took 1.07-1.16x OpenBLAS's time (plus its epilogue), with 64-256 0.56-0.92x
POINTWISE_PANEL_BYTES = 1 << 15
PANEL_WIDTH_BYTES = 128  # two 64-byte vectors of positions
# the epilogue's activations, as (slope below zero, low, high): anything else runs after
NO_ACTIVATION = (1.0, -math.inf, math.inf)


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
    """A 2-D convolution of one group with a kernel of several taps, native floats, a
    constant weight (``prepacked`` is its node's dict), contiguous input and output, on a
    machine that runs the panel tile; and either most computed positions are outputs (the
    phase planes' extra columns are computed and dropped: 2 of 58 at 56x56, 2 of 16 at
    14x14, where Winograd or OpenBLAS win) or the image is too small for the BLAS (7x7)."""
    if prepacked is None or X.ndim != 4 or int(group) != 1 or X.dtype not in jit_cpu.NATIVE \
            or W.dtype != X.dtype or out.dtype != X.dtype or not X.flags.c_contiguous \
            or not out.flags.c_contiguous or np.may_share_memory(out, X):
        return False
    kernel, strides, begin, end, out_dims = (geometry[i] for i in (0, 1, 4, 5, 6))
    if jit_cpu.panel_kernels() is None:
        return False
    if math.prod(kernel) == 1:
        return math.prod(out_dims) >= POINTWISE_POSITIONS \
            and X.shape[1] * PANEL_WIDTH_BYTES <= POINTWISE_PANEL_BYTES
    pw = -(-(X.shape[3] + begin[1] + end[1]) // strides[1])
    return out_dims[1] >= MIN_USE * pw or math.prod(out_dims) <= FEW_POSITIONS


class _Layout:
    """What a node's geometry fixes: the stride phases' shape, each tap's offset into them,
    the weight padded to whole strips. Made once per session node and input shape."""

    def __init__(self, X, W, kernel, strides, dilations, begin, end, out_dims):
        kernels = jit_cpu.panel_kernels()
        (c, height, width), m = X.shape[1:], W.shape[0]
        (sy, sx), (dh, dw) = strides, dilations
        self.strides, self.begin = (int(sy), int(sx)), (int(begin[0]), int(begin[1]))
        ph = -(-(height + begin[0] + end[0]) // sy)
        pw = -(-(width + begin[1] + end[1]) // sx)
        # the phases the taps read: a 1x1 kernel reads phase (0, 0) alone
        phases = (1 if kernel[0] == 1 else sy, 1 if kernel[1] == 1 else sx)
        # a pointwise convolution of stride 1 reads the image where it lies
        self.in_place = all(k == 1 for k in kernel) and (sy, sx) == (1, 1) \
            and not any(begin) and not any(end)
        # else each plane starts on a 64-byte boundary (a pointwise convolution's panels,
        # runs of one plane, are then aligned loads)
        lanes = kernels.VECTOR_BYTES // X.itemsize
        stride = ph * pw if self.in_place else -(-ph * pw // lanes) * lanes
        self.planes_shape = phases + (c, stride)
        self.plane_dims = (ph, pw)
        self.out_dims, self.pw = tuple(out_dims), pw
        self.q_len = out_dims[0] * pw
        self.halo = (kernel[0] - 1) * dh // sy  # plane rows read below an output row's own
        self.by_rows = out_dims[0] >= ROWS_SPLIT_MIN * intra_op_threads()
        self.width = kernels.PANEL_VECTORS * kernels.VECTOR_BYTES // X.itemsize
        # reads run a panel's width past a position, and a tap's column offset past that
        self.spill = self.width + pw
        self.rows_at = self._tap_offsets(c, self.planes_shape[3], pw, kernel, (sy, sx),
                                        (dh, dw), phases[1])
        # the last, partial panel of an image read in place is copied out (its reads would
        # run past the image): a (K, width) panel
        self.edge_rows_at = np.arange(self.rows_at.size, dtype=np.int64) * self.width
        strip = kernels.STRIP_ROWS
        rows = -(-m // strip) * strip
        self.weights = np.zeros((rows, self.rows_at.size), X.dtype)
        self.weights[:m] = W.reshape(m, -1)
        per_row = self.rows_at.size * X.itemsize
        self.row_block = max(strip, WEIGHT_BLOCK_BYTES // per_row // strip * strip)

    @staticmethod
    def _tap_offsets(c, plane_stride, pw, kernel, strides, dilations, phases_x):
        """Offset of tap (channel, a, b), in weight order, from a position's q."""
        (kh, kw), (sy, sx), (dh, dw) = kernel, strides, dilations
        offsets = np.empty((c, kh, kw), np.int64)
        for a in range(kh):
            qy, ry = divmod(a * dh, sy)
            for b in range(kw):
                qx, rx = divmod(b * dw, sx)
                plane = (ry * phases_x + rx) * c
                offsets[:, a, b] = (plane + np.arange(c)) * plane_stride + qy * pw + qx
        return offsets.reshape(-1)


def layout(prepacked, X, W, kernel, strides, dilations, begin, end, out_dims) -> _Layout:
    """The node's :class:`_Layout` for this input shape, made on first use."""
    key = ("direct", X.shape[1:], W.shape)
    plan = prepacked.get(key)
    if plan is None:
        plan = prepacked.setdefault(key, _Layout(X, W, kernel, strides, dilations, begin, end,
                                                 out_dims))
    return plan


def conv(X, W, B, Z, limits, out, geometry, prepacked):
    """``out`` = the epilogue of Conv(X, W): + B per channel, + Z (``out``'s shape) when given,
    then the activation ``limits`` (:func:`activation_limits`)."""
    kernel, strides, dilations, _, begin, end, out_dims = geometry
    plan = layout(prepacked, X, W, kernel, strides, dilations, begin, end, out_dims)
    n, m = X.shape[0], W.shape[0]
    bias = np.zeros(m, X.dtype) if B is None else B.reshape(m).astype(X.dtype, copy=False)
    scalars = tuple(X.dtype.type(v) for v in limits)  # compared in X's dtype, not float64
    y_all = out.reshape(n, m, -1)
    z_all = None if Z is None else Z.reshape(n, m, -1)
    for image in range(n):
        y = y_all[image]
        epilogue = (bias, y if z_all is None else z_all[image], z_all is not None) + scalars
        if plan.by_rows:
            parallel_for(_row_parts(out_dims[0]), lambda r0, r1, x=X[image], y=y:
                         _band(plan, x, y, epilogue, r0, r1))
            continue
        if plan.in_place:
            source = X[image].reshape(-1)
        else:
            flat, shaped = _planes(plan, X.dtype)
            _kernels().phase_planes(X[image], shaped, *plan.plane_dims, *plan.strides,
                                    *plan.begin, 0, plan.plane_dims[0])
            source = flat
        parallel_for(_strip_parts(plan.weights.shape[0]), lambda m0, m1, y=y, x=source:
                     _tiles(plan, x, plan.q_len, y, 0, epilogue, m0, m1))
    return out


def _band(plan, x, y, epilogue, r0, r1):
    """Output rows r0..r1, all channels, on this thread: its own phase planes for those rows
    (an image written by one core and read by the other cost the 3x3 layers ~20%)."""
    first, q_len = r0 * plan.out_dims[1], (r1 - r0) * plan.pw
    if plan.in_place:
        _tiles(plan, x.reshape(-1), q_len, y, first, epilogue, 0, plan.weights.shape[0])
        return
    flat, shaped = _planes(plan, x.dtype)
    _kernels().phase_planes(x, shaped, *plan.plane_dims, *plan.strides, *plan.begin, r0,
                            r1 - r0 + plan.halo)
    _tiles(plan, flat, q_len, y, first, epilogue, 0, plan.weights.shape[0])


def _tiles(plan, source, q_len, y, first, epilogue, m0, m1):
    """Channels m0..m1 at the q_len positions from output ``first`` on. An image read in
    place (``source`` the whole image) takes its whole panels there and the last, partial
    one from a zero-padded copy; phase planes (``source`` a band's) are readable past it."""
    kernels = _kernels()
    spill = jit_cpu._scratch_array("panel_spill", y.dtype, (kernels.STRIP_ROWS, plan.width))
    bias, residual, has_residual, slope, low, high = epilogue
    ow = plan.out_dims[1]

    def run(rows_at, source, start, count):
        kernels.direct_conv(plan.weights, rows_at, source, count, plan.pw, ow, y, start, bias,
                            residual, has_residual, low, high, slope, m0, m1, plan.row_block,
                            spill)
    if not plan.in_place:
        run(plan.rows_at, source, first, q_len)
        return
    whole = q_len // plan.width * plan.width
    if whole:
        run(plan.rows_at, source[first:], first, whole)
    if whole < q_len:
        run(plan.edge_rows_at, _edge(plan, source, first + whole, q_len - whole),
            first + whole, q_len - whole)


def _edge(plan, image, start, count):
    """Positions start..start + count of every channel of the flat ``image``, as a flat
    zero-padded (K, width) panel in this thread's scratch."""
    channels = plan.rows_at.size
    edge = jit_cpu._scratch_array("direct_edge", image.dtype, (channels, plan.width))
    edge[:, count:] = 0
    np.copyto(edge[:, :count], image.reshape(channels, -1)[:, start:start + count])
    return edge.reshape(-1)


def _kernels():
    return jit_cpu.panel_kernels()


def _row_parts(rows: int) -> list[tuple[int, int]]:
    """Output rows split evenly over the threads."""
    count = max(1, min(intra_op_threads(), rows))
    return [(rows * t // count, rows * (t + 1) // count) for t in range(count)]


def _strip_parts(rows: int) -> list[tuple[int, int]]:
    """Output channels split over the threads in whole strips."""
    strip = _kernels().STRIP_ROWS
    strips = rows // strip
    count = max(1, min(intra_op_threads(), strips))
    step = -(-strips // count)
    return [(s * strip, min(strips, s + step) * strip) for s in range(0, strips, step)]


def _planes(plan, dtype) -> tuple[np.ndarray, np.ndarray]:
    """This thread's phase-plane buffer, flat and shaped: zeroed when made, and readable a
    spill past the planes (kept zero: never written)."""
    elements = math.prod(plan.planes_shape)
    total = elements + plan.spill
    held = jit_cpu._scratch.__dict__.setdefault("direct_planes", {})
    buffer = held.get(np.dtype(dtype).str)
    if buffer is None or buffer.size < total:
        buffer = held[np.dtype(dtype).str] = np.zeros(total, dtype)
    buffer[elements:total] = 0  # a larger layer's planes may have been there
    return buffer[:total], buffer[:elements].reshape(plan.planes_shape)
