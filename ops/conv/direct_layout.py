"""What a direct convolution's node geometry fixes, made once per session node and input
shape (:func:`layout`): the stride phases' shape, each tap's offset into them, the packed
weight (:class:`_Layout`), and how the native driver splits an image between threads
(:class:`_NativeParts`). ``conv_direct_cpu.py`` runs calls over them; ``direct_forms.py``
chose the form they are laid out for.
"""

from __future__ import annotations

import math

import numpy as np

from mixrt.ops.compiled import jit_cpu
from mixrt.ops.compiled.parallel import intra_op_threads, thread_parts
from mixrt.ops.compiled.workspace import per_shape
from mixrt.ops.conv.direct_forms import STRIP, _left_taps, _strided_pointwise
from mixrt.ops.nn.product_parts import l2_bytes

# output rows per thread from which the threads split the image's rows (each building its
# own phase planes: an image written by one core and read by the other cost ~20%) rather
# than the output channels
ROWS_SPLIT_MIN = 8
# weight bytes per block of output channels (1x1 form): a block stays in L2 (1 MiB here)
# while the outputs pass over it
WEIGHT_BLOCK_BYTES = 1 << 18


def column_block(channels: int, itemsize: int, width: int) -> int:
    """Outputs of a 1x1 convolution that every strip of its output channels takes in turn
    (``_jit_conv_direct.pointwise_conv``), whole panels of ``width``: as many as keep their
    image columns (``channels`` of them) within a quarter of a core's L2, which the strips
    read again one after another. At the same outputs a block of twice that read its
    columns from L3 (576 -> 96 over 2,000 pixels: 1.86 ms against 1.75, one thread), and
    blocks of one panel wrote every output row 128 bytes at a time (1.83)."""
    return max(width, l2_bytes() // 4 // (channels * itemsize) // width * width)


def layout(prepacked, X, W, kernel, strides, dilations, begin, end, out_dims,
           constant=False) -> _Layout:
    """The node's :class:`_Layout` for this input shape and dtype, made on first use (a
    node's weight may change dtype between calls where it is not a constant: an imperative
    op's dict serves every call with its attributes). ``constant``: W is the node's constant
    and stays as it is, so the layout may read it in place."""
    # the strides and pads too: a node's attributes are fixed, but a call may come with pads
    # of its own (FusedConvPool's bands), and a layout made for others placed the image
    # elsewhere in its planes (a 1x1 node called strided, then padded, at one input shape
    # wrote past its output)
    key = ("direct", X.shape[1:], W.shape, X.dtype.str, tuple(strides), tuple(begin),
           tuple(end), tuple(dilations))
    if not constant:
        return per_shape(prepacked, key, lambda: _Layout(
            X, W, kernel, strides, dilations, begin, end, out_dims))
    return per_shape(prepacked, key, lambda: _shared_geometry(
        X, W, kernel, strides, dilations, begin, end, out_dims, prepacked))


# What a layout works out from the sizes alone (tap offsets, places, parts), kept for every
# node of the same geometry: a CNN's blocks of a stage repeat their convolutions, and each
# node made them again at each new image size (RegNet-Y-400MF: 28 layouts a size, ~30 us
# each, cold, of which about half repeat an earlier node's, 2026-11-29). The packed weight
# is the node's own. Kept for the last MAX_GEOMETRIES geometries, then all let go.
_GEOMETRIES: dict = {}
MAX_GEOMETRIES = 256
_OWN = ("panels", "weights")  # a layout's attributes that are its node's, not its geometry's


def _shared_geometry(X, W, kernel, strides, dilations, begin, end, out_dims, shared):
    """A :class:`_Layout` of the node's constant W (``shared``: its dict), its geometry's
    attributes those of the first layout made for the same sizes."""
    c, m = X.shape[1], W.shape[0]
    # the forms chosen as the layout would choose them (their thresholds may be changed)
    strips = _strided_pointwise(kernel, strides, c, out_dims, m)
    forms = (strips, _left_taps(math.prod(W.shape[1:]), m),
             splits_rows(out_dims[0]))
    key = (X.shape[1:], W.shape, X.dtype.str, W.dtype.str, tuple(kernel), tuple(strides),
           tuple(dilations), tuple(begin), tuple(end), tuple(out_dims), forms)
    geometry = _GEOMETRIES.get(key)
    if geometry is None:
        made = _Layout(X, W, kernel, strides, dilations, begin, end, out_dims, True, shared)
        if len(_GEOMETRIES) >= MAX_GEOMETRIES:  # a service's sizes come and go
            _GEOMETRIES.clear()
        _GEOMETRIES[key] = {name: value for name, value in made.__dict__.items()
                            if name not in _OWN}
        return made
    made = _Layout.__new__(_Layout)
    made.__dict__.update(geometry)
    made.own_weight(W, X.dtype, True, shared)
    return made


def _packed_once(shared: dict | None, key: tuple, make):
    """``make()``, kept in the node's dict (``shared``) for the layouts of every input shape
    where the weight is the node's constant: its packed forms follow from the weight and
    the input's dtype alone, and each new image size packed them again (a CNN's weights,
    copied whole at every new size a service sent, 2026-11-27)."""
    if shared is None:
        return make()
    found = shared.get(key)
    if found is None:
        found = shared.setdefault(key, make())
    return found


class _Layout:
    """What a node's geometry fixes: the stride phases' shape, each tap's offset into them,
    the packed weight. Made once per session node and input shape."""

    def __init__(self, X, W, kernel, strides, dilations, begin, end, out_dims,
                 constant=False, shared=None):
        kernels = jit_cpu.panel_kernels()
        (c, height, width), m = X.shape[1:], W.shape[0]
        (sy, sx), (dh, dw) = strides, dilations
        self.strides, self.begin = (int(sy), int(sx)), (int(begin[0]), int(begin[1]))
        self.out_dims = tuple(out_dims)
        self.width = kernels.PANEL_VECTORS * kernels.VECTOR_BYTES // X.itemsize
        # a strided 1x1 kernel on a small image, or with many channels, reads its input
        # packed into strips (:func:`_strided_pointwise`), with one tap per channel
        self.strips = _strided_pointwise(kernel, strides, c, out_dims, m)
        self.taps = math.prod(kernel) > 1 or self.strips
        ph = -(-(height + begin[0] + end[0]) // sy)
        pw = -(-(width + begin[1] + end[1]) // sx)
        self.plane_dims, self.pw = (ph, pw), pw
        # a 1x1 convolution of stride 1 reads the image where it lies
        self.in_place = not self.taps and (sy, sx) == (1, 1) and not any(begin) \
            and not any(end)
        # the phases the taps read (a 1x1 kernel reads phase (0, 0) alone); each plane
        # starts on a 64-byte boundary
        phases = (1 if kernel[0] == 1 else sy, 1 if kernel[1] == 1 else sx)
        lanes = kernels.VECTOR_BYTES // X.itemsize
        self.planes_shape = phases + (c, -(-ph * pw // lanes) * lanes)
        if self.strips:  # each strip of outputs: (C, STRIP)
            self.planes_shape = (-(-math.prod(out_dims) // STRIP), c, STRIP)
        self.halo = (kernel[0] - 1) * dh // sy  # plane rows read below an output row's own
        self.by_rows = splits_rows(out_dims[0])
        # a kernel of few taps (a stem's) puts the weight on the left (:func:`_left_taps`)
        self.left = self.taps and not self.strips and _left_taps(math.prod(W.shape[1:]), m)
        if self.taps:
            self.rows_at = np.arange(c, dtype=np.int64) * STRIP if self.strips else \
                _tap_offsets(c, self.planes_shape[3], pw, kernel, (sy, sx), (dh, dw),
                             phases[1])
            self._places: dict = {}
        self.row_block = 0 if self.taps \
            else max(STRIP, WEIGHT_BLOCK_BYTES // (c * X.itemsize) // STRIP * STRIP)
        self.column_block = 0 if self.taps else column_block(c, X.itemsize, self.width)
        self.own_weight(W, X.dtype, constant, shared)
        self._native = _NativeParts(self)  # of the sizes alone: shared with the geometry

    def own_weight(self, W, dtype, constant: bool, shared: dict | None) -> None:
        """The node's weight W packed for this layout's form (``panels``, ``weights``),
        once per node where it is a constant (``shared``: the node's dict)."""
        weight = W.reshape(W.shape[0], -1)
        if self.taps:
            self.panels = np.zeros((0, 0, 0), dtype) if self.left \
                else _packed_once(shared, ("direct panels", W.shape, W.dtype.str, self.width),
                                  lambda: _column_panels(weight, self.width))
        if self.left:
            # a copy of its own (where the weight may change: repack() writes into it)
            self.weights = _packed_once(shared, ("direct left", W.shape, W.dtype.str),
                                        weight.copy)
        elif not self.taps:
            self.weights = _packed_once(
                shared, ("direct strips", W.shape, W.dtype.str, np.dtype(dtype).str),
                lambda: _strip_weights(weight, dtype, borrow=constant))

    def repack(self, W) -> None:
        """Pack a new weight of the node's shape into the arrays made for the first one, in
        place: the kits point at them."""
        weight = W.reshape(W.shape[0], -1)
        if self.left:
            np.copyto(self.weights, weight)
        elif self.taps:
            _fill_column_panels(self.panels, weight)
        else:
            self.weights[:weight.shape[0]] = weight  # past M the strip stays zero

    def native_parts(self) -> _NativeParts:
        return self._native

    def places(self, r0, r1):
        """Where outputs r0 * ow.. r1 * ow sit in phase planes that start at plane row r0,
        padded with place 0 past a whole strip of either size and one more (made once per
        band)."""
        found = self._places.get((r0, r1))
        if found is None:
            found = self._places.setdefault((r0, r1), self._placed(r1 - r0))
        return found

    def _placed(self, rows: int) -> np.ndarray:
        """:meth:`places` of ``rows`` output rows (:func:`placed_outputs`)."""
        return placed_outputs(rows, self.out_dims[1], self.pw, self.strips, self.rows_at.size)


def placed_outputs(rows: int, ow: int, pw: int, strips: bool, channels: int) -> np.ndarray:
    """Where ``rows`` rows of ``ow`` outputs sit in phase planes of ``pw`` columns (or, in
    the ``strips`` form, in strips of STRIP outputs over ``channels``), padded with place 0
    past a whole strip of either size and one more: sums of a row's start and a column
    (the quotient and remainder of each output's index cost ~25 us a band of a stem's
    11,520 outputs at each new image size, 2026-11-29)."""
    count = rows * ow
    found = np.zeros(count + 2 * STRIP, np.int64)
    if strips:  # output q is lane q % STRIP of strip q // STRIP
        grid = np.add(np.arange(0, -(-count // STRIP) * channels * STRIP, channels * STRIP)
                      [:, None], np.arange(STRIP))
        found[:count] = grid.reshape(-1)[:count]
    else:
        np.add(np.arange(0, rows * pw, pw)[:, None], np.arange(ow),
               out=found[:count].reshape(rows, ow))
    return found


def image_parts(oh: int, ow: int, by_rows: bool, panels, weight_rows: int) -> tuple:
    """(bands of output rows, parts, chunk) of an image the native driver splits: by
    bands of rows (one a thread), else one band in runs of ``chunk`` output panels (the tap
    tile's ``panels``) or strips of the ``weight_rows`` output channels (any other form)."""
    bands = _row_parts(oh) if by_rows else [(0, oh)]
    if by_rows:
        return bands, len(bands), 0
    if panels is not None:
        count = len(thread_parts(panels.shape[0], panels.size * oh * ow))
        return bands, count, -(-panels.shape[0] // count)
    count, chunk = strip_runs(weight_rows)
    return bands, count, chunk


def band_places(rows: list, ow: int, pw: int, strips: bool, channels: int) -> np.ndarray:
    """The places of bands of these many output rows each (:func:`placed_outputs`), one
    band a row of the array, zero past its own: each band's are the first of the tallest
    band's (places count from the band's first row), so those are made once and copied."""
    tallest = placed_outputs(max(rows), ow, pw, strips, channels)
    if len(rows) == 1:
        return tallest.reshape(1, -1)
    places = np.zeros((len(rows), tallest.size), np.int64)
    for at, count in enumerate(rows):
        places[at, :count * ow] = tallest[:count * ow]
    return places


class _NativeParts:
    """How the native driver splits a node's image: ``count`` bands of rows between
    ``bounds`` (each with its row of ``places``), or ``count`` runs of ``chunk`` output
    panels (tap form) or strips (1x1) over shared planes; one part a thread, as
    ``parallel_for`` had them."""

    def __init__(self, plan):
        oh, ow = plan.out_dims
        self.row_block = 0 if plan.taps else plan.row_block
        self.column_block = 0 if plan.taps else plan.column_block
        bands, self.count, self.chunk = image_parts(
            oh, ow, plan.by_rows, plan.panels if plan.taps and not plan.left else None,
            plan.weights.shape[0] if not plan.taps or plan.left else 0)
        self.bounds = band_bounds(bands, oh)
        if plan.taps:
            self.places = band_places([r1 - r0 for r0, r1 in bands], ow, plan.pw,
                                      plan.strips, plan.rows_at.size)
            self.rows_at = plan.rows_at
        else:  # a 1x1 kernel reads neither: the shared placeholders
            self.places, self.rows_at = _NO_PLACES, _NO_ROWS
        self.shape = (0, 0, 0, 0) if plan.strips else tuple(int(v) for v in plan.planes_shape)
        self.geometry = (*plan.plane_dims, *plan.strides, *plan.begin, plan.halo, oh, ow)

    def addressed(self) -> tuple:
        """(array, its address) of ``rows_at``, ``places`` and ``bounds``, as a kit's words
        hold them (a placeholder's address read once for the process)."""
        return tuple((array, _ADDRESSES.get(id(array)) or array.__array_interface__["data"][0])
                     for array in (self.rows_at, self.places, self.bounds))


# a 1x1 kernel's parts read no tap offsets nor places: placeholders shared by all (read only),
# their addresses read once
_NO_ROWS = np.zeros(1, np.int64)
_NO_PLACES = np.zeros((1, 1), np.int64)
_NO_ROWS.flags.writeable = _NO_PLACES.flags.writeable = False
_ADDRESSES = {id(array): array.__array_interface__["data"][0] for array in (_NO_ROWS, _NO_PLACES)}
# the empty operands of a form that does not use one (its panels or its weight), per dtype
_EMPTY: dict = {}


def empty_operands(dtype) -> dict:
    """Empty arrays of 2 and 3 dimensions of ``dtype``, for the form's unused operand (shared,
    read only: they hold nothing)."""
    key = np.dtype(dtype)
    found = _EMPTY.get(key)
    if found is None:
        found = _EMPTY.setdefault(key, {2: np.zeros((0, 0), key), 3: np.zeros((0, 0, 0), key)})
    return found


def _tap_offsets(c, plane_stride, pw, kernel, strides, dilations, phases_x):
    """Offset of tap (channel, a, b), in the weight's order, from an output's place. Made
    in one pass over the (C, kh, kw) grid: a loop over the taps cost ~30 us a 3x3 kernel,
    at every new image size of every such convolution (2026-11-27)."""
    (kh, kw), (sy, sx), (dh, dw) = kernel, strides, dilations
    taps = []  # each tap's offset for channel 0
    for a in range(kh):
        qy, ry = divmod(a * dh, sy)
        for b in range(kw):
            qx, rx = divmod(b * dw, sx)
            taps.append((ry * phases_x + rx) * c * plane_stride + qy * pw + qx)
    channels = np.arange(c, dtype=np.int64)[:, None] * plane_stride
    return (channels + np.array(taps, np.int64)).reshape(-1)


def _strip_weights(weight, dtype, borrow: bool):
    """A 1x1 convolution's weight (M, C) over whole strips of output channels, zero past M.
    A constant weight that already is whole strips, of the input's dtype and contiguous, is
    used where it lies (``borrow``): ResNet-50's 1x1 filters copied were 50 MB written at its
    first run. A weight that is not the node's constant is always copied, as repack() writes
    the next one into it."""
    m, c = weight.shape
    if borrow and m % STRIP == 0 and weight.dtype == dtype and weight.flags.c_contiguous:
        return weight
    whole = np.zeros((-(-m // STRIP) * STRIP, c), dtype)
    whole[:m] = weight
    return whole


def _column_panels(weight, width):
    """The transpose of ``weight`` (M, K) as (P, K, width) panels of output channels, the
    last one zero-padded."""
    m, k = weight.shape
    panels = np.zeros((-(-m // width), k, width), weight.dtype)
    _fill_column_panels(panels, weight)
    return panels


def _fill_column_panels(panels, weight):
    """Write ``weight``'s transpose into ``panels`` (:func:`_column_panels`), leaving the last
    panel's columns past M as they are (zero)."""
    m, k = weight.shape
    width = panels.shape[2]
    whole = m // width
    np.copyto(panels[:whole], weight[:whole * width].reshape(whole, width, k).transpose(0, 2, 1))
    if whole < panels.shape[0]:
        panels[whole, :, :m - whole * width] = weight[whole * width:].T


def splits_rows(out_rows: int) -> bool:
    """Do the threads split an image's output rows between them (each building its own
    planes), rather than its output channels (ROWS_SPLIT_MIN)?"""
    return out_rows >= ROWS_SPLIT_MIN * intra_op_threads()


def band_bounds(bands, rows: int) -> np.ndarray:
    """The bands' first rows and the image's row count after them, as the parts read
    them."""
    return np.array([band[0] for band in bands] + [rows], np.int64)


def strip_runs(channels: int) -> tuple[int, int]:
    """(parts, strips a part) where the threads split ``channels`` output channels (whole
    strips) between them."""
    count = len(_strip_parts(channels))
    return count, -(-(channels // STRIP) // count)


def _row_parts(rows: int) -> list[tuple[int, int]]:
    """Output rows split evenly over the threads."""
    count = max(1, min(intra_op_threads(), rows))
    return [(rows * t // count, rows * (t + 1) // count) for t in range(count)]


def _strip_parts(rows: int) -> list[tuple[int, int]]:
    """Output channels split over the threads in whole strips."""
    strips = rows // STRIP
    count = max(1, min(intra_op_threads(), strips))
    step = -(-strips // count)
    return [(s * STRIP, min(strips, s + step) * STRIP) for s in range(0, strips, step)]
