"""A convolution with taps at a new image size: its kit made from the node's kit at another.

A service sends a new image size per request, and at each one every convolution with taps
(a 3x3, a stem, a strided 1x1 read in strips) had its layout made anew through the direct
form's full route (``direct_layout``: the geometry, the packed weight looked up, each tap's
offset, the places of each band, the native parts) and a kit of words from it
(``conv_direct_cpu._Kit``): ~100 us a node, cold, ~2 ms of a ResNet-18's first run of an
image size, whose twenty such nodes gave it 1.34x onnxruntime's time there against 1.13x
at a size met before (2026-12-05).

Of a kit's words only the size's own change with the image: the phase planes' size, the
tap offsets, the places, the bands and parts, the geometry. The rest (the packed weight,
the spills and edges, the epilogue, the form) is the node's, as its first kit on the
thread wrote them. So that kit is kept per form (:class:`TapSizes`, as
``conv_direct_cpu._PointwiseSizes`` keeps a 1x1 node's), and a new size's words are its
copy with the size's written over: the same words the full route writes
(``tests/ops/test_tap_sizes.py`` compares them), so the same bits.

A tap's offset into the planes is ``plane * ps + row * pw + column`` for its own phase
plane, plane row and column: affine in the planes' stride ``ps`` and width ``pw``, so the
node's offsets at any size are three fixed arrays' sum, read off ``_tap_offsets`` once.
"""

from __future__ import annotations

import math

import numpy as np

from mixrt.ops.compiled import jit_cpu
from mixrt.ops.conv.direct_forms import STRIP, _strided_pointwise
from mixrt.ops.conv.direct_layout import (_tap_offsets, band_bounds, band_places,
                                          image_parts, splits_rows)

_TAPS = "tap sizes"


def kit_at(X, W, geometry: tuple, limits):
    """This thread's kit of a convolution with taps (a constant weight: the caller's
    check) at X's image size, made from the node's kit at another size of the same form;
    None where the node has no such kit on this thread yet (its full route makes one, and
    :func:`keep` keeps it)."""
    key = _form_key(X, W, geometry, limits)
    sizes = jit_cpu.kept_kit(W, key)
    if sizes is None or X.shape[1] != sizes.channels:
        return None
    generation = jit_cpu.scratch_generation()
    kit = jit_cpu.scratch_kit(W, key + X.shape[2:], lambda: sizes.at(X.shape[2:], geometry[6]))
    if jit_cpu.scratch_generation() != generation:
        # the size's planes grew this thread's buffer, which lets go of every kit: the
        # node's words here point into none of the planes, so they are a start still
        jit_cpu.scratch_kit(W, key, lambda: sizes)
    return kit


def keep(X, W, geometry: tuple, limits, plan, kit) -> None:
    """Keep the node's full-route ``kit`` (of ``plan``, a layout with taps) as the one its
    other image sizes of the same form start from (:func:`kit_at`)."""
    jit_cpu.scratch_kit(W, _form_key(X, W, geometry, limits),
                        lambda: TapSizes(plan, kit, X.dtype, X.shape[1], geometry))


def _form_key(X, W, geometry: tuple, limits) -> tuple:
    """What a kit's words other than the size's own follow from, beside the node: the
    dtype, the epilogue, the window and pads, and the form, which the output's size
    chooses (the strips of a strided 1x1, the split by rows)."""
    kernel, strides, dilations, _, begin, end, out_dims = geometry
    return (_TAPS, X.dtype.str, limits, tuple(kernel), tuple(strides), tuple(dilations),
            tuple(begin), tuple(end),
            _strided_pointwise(kernel, strides, X.shape[1], out_dims, W.shape[0]),
            splits_rows(out_dims[0]))


class TapSizes:
    """A node's kit of one form as every image size's starts: its words, its bias, and
    what its layout (``direct_layout._Layout``) has that no size changes."""

    def __init__(self, plan, kit, dtype, channels: int, geometry: tuple):
        kernel, _, dilations, _, begin, end, _ = geometry
        self.kit, self.words, self.bias = kit, kit.words.copy(), kit.bias
        self.channels, self.dtype = channels, np.dtype(dtype)
        self.strips, self.by_rows = plan.strips, plan.by_rows
        self.panels = None if plan.left else plan.panels
        self.weight_rows = plan.weights.shape[0] if plan.left else 0
        self.strides, self.begin, self.halo = plan.strides, plan.begin, plan.halo
        self.padding = (int(begin[0]) + int(end[0]), int(begin[1]) + int(end[1]))
        self.phases = tuple(plan.planes_shape[:2])
        self.kernels = jit_cpu.panel_kernels()
        self.lanes = self.kernels.VECTOR_BYTES // self.dtype.itemsize
        self.rows_at = plan.rows_at  # the strips' offsets: the channels', at every size
        if not plan.strips:
            self.offsets = _affine_offsets(channels, kernel, plan.strides, dilations,
                                           self.phases[1])
            self._term = np.empty_like(self.offsets[0])  # (one thread's: a kit is)

    def at(self, image, out_dims) -> "SizedTaps":
        """The kit at an input image of ``image`` (rows, columns) and output ``out_dims``."""
        kernels = self.kernels
        (oh, ow), (sy, sx) = out_dims, self.strides
        ph = -(-(image[0] + self.padding[0]) // sy)
        pw = -(-(image[1] + self.padding[1]) // sx)
        if self.strips:
            planes = (-(-oh * ow // STRIP), self.channels, STRIP)
            rows_at, shape = self.rows_at, (0, 0, 0, 0)
        else:
            planes = self.phases + (self.channels, -(-ph * pw // self.lanes) * self.lanes)
            rows_at, shape = self._offsets(planes[3], pw), planes
        bands, parts, chunk = image_parts(oh, ow, self.by_rows, self.panels, self.weight_rows)
        bounds = band_bounds(bands, oh)
        places = band_places([r1 - r0 for r0, r1 in bands], ow, pw, self.strips,
                             self.channels)
        flat = math.prod(planes)
        words = self.words.copy()
        for slot, name in ((kernels.PLANES, "direct_planes"),
                           (kernels.WORKER_PLANES, "direct_planes_worker")):
            words[slot] = jit_cpu.scratch_address(name, self.dtype, (flat,))[1]
            words[slot + 1] = flat
        for slot, array in ((kernels.ROWS_AT, rows_at), (kernels.PLACES, places),
                            (kernels.BOUNDS, bounds)):
            words[slot] = array.__array_interface__["data"][0]
            words[slot + 1:slot + 1 + array.ndim] = array.shape
        words[kernels.PARTS], words[kernels.CHUNK] = parts, chunk
        words[kernels.SHAPE0:kernels.SHAPE0 + 4] = shape
        words[kernels.PH:kernels.PH + 9] = (ph, pw, sy, sx, *self.begin, self.halo, oh, ow)
        return SizedTaps(words, parts, self.bias, (rows_at, places, bounds, self))

    def _offsets(self, plane_stride: int, pw: int) -> np.ndarray:
        """The taps' offsets (``direct_layout._tap_offsets``) at planes of this stride and
        width: one array made, the other terms added into it in place."""
        plane, row, column = self.offsets
        offsets = plane * plane_stride
        offsets += np.multiply(row, pw, out=self._term)
        offsets += column
        return offsets


class SizedTaps:
    """A kit (``conv_direct_cpu._Kit``'s words, parts and bias) of one image size made by
    :meth:`TapSizes.at`; ``kept``: the arrays its words point into."""

    __slots__ = ("words", "parts", "bias", "kept")

    def __init__(self, words, parts: int, bias, kept: tuple):
        self.words, self.parts, self.bias, self.kept = words, parts, bias, kept


def _affine_offsets(channels: int, kernel, strides, dilations, phases_x: int) -> tuple:
    """``_tap_offsets`` as (plane, row, column) arrays whose sum ``plane * ps + row * pw +
    column`` gives the offsets at planes of stride ``ps`` and width ``pw``."""
    window = (tuple(kernel), tuple(strides), tuple(dilations), phases_x)
    base = _tap_offsets(channels, 0, 0, *window)
    return (_tap_offsets(channels, 1, 0, *window) - base,
            _tap_offsets(channels, 0, 1, *window) - base, base)
