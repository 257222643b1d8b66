"""Direct 2-D convolution on the packed-panel tile: no im2col, and the bias, residual and
activation applied as the tile is stored.

ResNet-50's convolutions through im2col (or kernel rows) and OpenBLAS spent ~6.6 ms of a
26 ms run outside the sgemm: copying columns, then one more pass over each output for the
bias, the shortcut and the Relu. Here (``ops/panels/_jit_panels.py``) the image is copied once,
into its zero-padded stride phases, and the tile reads straight out of them, in one of three
forms: outputs as the tile's rows, the weight on the left, or input packed into strips
(``direct_forms.py`` says which convolution takes which, and :func:`suits` whether one is
taken at all). What a node's geometry fixes (the phase planes' shape, the taps' offsets, the
packed weight, the parts a call splits into) is made once in ``direct_layout.py``.

The epilogue (``activation_limits``) is + bias, + residual, a slope below zero and a clamp:
Relu, LeakyRelu and Clip. HardSwish, and Swish in float32, are a gate each native part
applies to the outputs it has just stored, still in cache (``direct_forms.gated_limits``,
``_jit_conv_direct.gated``); another activation runs after, over the output.

This module runs a call. An image's parts (bands of output rows, or runs of output channels)
are split between the calling thread and a native worker thread in one compiled call
(``_jit_panels.native_conv``, its fixed arguments in a thread's kit), which hands off without
the GIL; ``parallel_for`` remains where that pool is off (``MIXRT_NATIVE_POOL=0``, one thread,
not Linux x86-64).
"""

from __future__ import annotations

import math
import threading

import numpy as np

from mixrt.ops.compiled import image_routes, jit_cpu, replay
from mixrt.ops.compiled.entry_points import fixed_call
from mixrt.ops.compiled.parallel import parallel_for, thread_parts
from mixrt.ops.conv import tap_sizes
from mixrt.ops.conv.direct_forms import POINTWISE_POSITIONS, STRIP, limits_array
from mixrt.ops.conv.direct_layout import (_row_parts, _strip_parts, band_bounds,
                                          empty_operands, layout, splits_rows, strip_runs)
# not called here: the other convolutions (conv_cpu.py, conv_pool_cpu.py, conv_grad_cpu.py,
# pointwise_rows.py, ops/nn/fused_cpu.py) import them from this module
from mixrt.ops.conv.direct_forms import NO_ACTIVATION, activation_limits  # noqa: F401
from mixrt.ops.conv.direct_forms import small_expansion, suits  # noqa: F401
from mixrt.ops.conv.direct_layout import _tap_offsets  # noqa: F401

NATIVE_POOL_PLATFORM = jit_cpu.NATIVE_POOL_PLATFORM
# a convolution whose weight is not a constant (training; a gradient's convolution) takes
# this form from this many output positions a call (images x rows x columns), its weight
# packed again on every call: ResNet's 512 x 512 x 3 x 3 (9.4 MB) took ~2 ms to pack, its
# convolution at batch 32 (1,568 positions) 25-35 ms
VARYING_MIN_POSITIONS = 1024


def varying_layouts(node: dict | None, X, geometry_of) -> dict | None:
    """Where a convolution whose weight may change between calls keeps its layouts: a dict of
    the calling thread's (a layout holds the packed weight, and two threads may run the node
    with different weights at once) in the node's dict, or None where the node has no dict or
    the call is too small to repay packing (VARYING_MIN_POSITIONS). ``geometry_of(layouts)``
    is the call's conv geometry."""
    if node is None:
        return None
    local = node.get("varying")
    if local is None:
        local = node.setdefault("varying", threading.local())
    layouts = getattr(local, "layouts", None)
    if layouts is None:
        layouts = local.layouts = {}
    out_dims = geometry_of(layouts)[-1]
    return layouts if X.shape[0] * math.prod(out_dims) >= VARYING_MIN_POSITIONS else None


def conv(X, W, B, Z, limits, out, geometry, prepacked, replays=None, repack=False):
    """``out`` = the epilogue of Conv(X, W): + B per channel, + Z (``out``'s shape) when given,
    then the activation ``limits`` (:func:`activation_limits`). The native call is kept as
    the node's replay in ``replays`` (its prepacked dict, or None: ``ops/compiled/replay.py``).
    ``repack``: W is not the node's constant (``prepacked`` is then a thread's
    :func:`varying_layouts`): pack it again first."""
    if out.size == 0:  # an empty image (a zero-width map): nothing to compute or lay out
        return out
    kernel, strides, dilations, _, begin, end, out_dims = geometry
    native = _native_pool()
    kit = None if repack else \
        _pointwise_kit(X, W, geometry, limits) or tap_sizes.kit_at(X, W, geometry, limits)
    if kit is None or (native is None and kit.parts > 1):  # (Python's threads: the layout)
        plan = layout(prepacked, X, W, kernel, strides, dilations, begin, end, out_dims,
                      constant=not repack)
        if repack:
            plan.repack(W)
        if native is None and plan.native_parts().count > 1:
            return _conv_threads(plan, X, B, Z, limits, out)
        kit = jit_cpu.scratch_kit(plan, (X.dtype.str, limits),
                                  lambda: _Kit(plan, X.dtype, limits))
        if not repack and plan.in_place:  # the node's other image sizes start from it
            jit_cpu.scratch_kit(W, (_POINTWISE, X.dtype.str, limits),
                                lambda: _PointwiseSizes(plan, kit))
        elif not repack and plan.taps:
            tap_sizes.keep(X, W, geometry, limits, plan, kit)
    call = _kit_call(kit, native, X.dtype.itemsize)
    replay.record(replays, (X, W, B, Z, out), call, silent=True)
    image_routes.stash(replays, out, call)  # any batch of this image size may take it
    return call(X, W, B, Z, out)


def pointwise_anew(X, W, B, Z, out, limits, prepacked) -> bool:
    """The direct form's call of an in-place 1x1 convolution (stride 1, no padding: the
    caller checked the node) at an image size of POINTWISE_POSITIONS pixels or more, made
    from the node's kit at another size on this thread (:class:`_PointwiseSizes`), kept as
    the full route keeps it, and run: what the full route does there, without its checks
    among the other forms, none of which takes such a size. False, nothing done, where the
    node has no such kit on this thread (its full route makes one), or the arrays are not
    ones the kit's call takes (contiguous, of its dtype, apart, the residual of ``out``'s
    shape). The checks were ~50 of a 1x1 convolution's ~100 us of Python at a service's
    new image size, cold, 34 such nodes a MobileNetV2 (2026-12-02)."""
    sizes = jit_cpu.kept_kit(W, (_POINTWISE, X.dtype.str, limits))
    if sizes is None or X.ndim != 4 or X.shape[1] != sizes.channels:
        return False
    image = X.shape[2:]
    if image[0] * image[1] < POINTWISE_POSITIONS or out.size == 0 \
            or out.shape != (X.shape[0], W.shape[0], *image) \
            or not image_routes.fits(X.dtype, X, Z, out) \
            or jit_cpu.panel_kernels() is None:  # (a thread on the NumPy tier)
        return False
    native = _native_pool()
    kit = jit_cpu.scratch_kit(W, (_POINTWISE, image, X.dtype.str, limits),
                              lambda: sizes.at(image))
    if native is None and kit.parts > 1:  # (Python's threads: the full route's layout)
        return False
    call = _kit_call(kit, native, X.dtype.itemsize)
    replay.record(prepacked, (X, W, B, Z, out), call, silent=True)
    image_routes.stash(prepacked, out, call)
    call(X, W, B, Z, out)
    return True


def _kit_call(kit, native, itemsize: int) -> "_KitCall":
    """``call(X, W, B, Z, out)``: the convolution through ``kit``'s words, split over the
    native pool where the kit has several parts. ``call.bound_to(arrays)`` is the call on
    those arrays alone (:class:`_Prepared`), for a bound call (``bound_calls``)."""
    split = kit.parts > 1
    kernels = _kernels()
    if split:
        kernels.job_ready(kernels.CONV_JOB, itemsize)  # the worker's side
    return _KitCall(kit, native, split, kernels)


class _KitCall:
    """:func:`_kit_call`'s call, one object with slots: a node keeps one per image size it
    met (``image_routes``), and as two closures with an attribute dict and their cells it
    was ~17 objects for the cycle collector to walk (ShuffleNetV2 after 150 new sizes: 2,118
    of them, a third of what the frozen heap left to walk; 2026-12-05)."""

    __slots__ = ("kit", "block", "run", "run_images", "threads", "waking")

    def __init__(self, kit, native, split: bool, kernels):
        self.kit = kit
        # with one part the block is never read (the kernel takes the pool for two or more)
        self.block = kit.words if native is None else native.block
        self.run, self.run_images = kernels.native_conv, kernels.native_conv_images
        self.threads = native.workers + 1 if split else 1
        self.waking = native if split else None

    def __call__(self, X, W, B, Z, out):
        if self.waking is not None:
            self.waking.wake()  # it wakes while this thread makes the arguments
        _native_calls(self.kit, self.block, self.run, self.run_images, self.threads,
                      _at_once, X, W, B, Z, out)
        return out

    def bound_to(self, arrays: tuple):
        return _Prepared(self.kit, self.block, self.run, self.run_images, self.threads,
                         self.waking, *arrays).kept()


def _at_once(kernel, *arguments) -> None:
    """A native call made as its arguments are: an unbound call's (a route kept for an
    image size, a replay before binding) keeps nothing for later."""
    kernel(*arguments)


def _native_calls(kit, block, run, run_images, threads: int, calls, X, W, B, Z,
                  out) -> tuple[list, np.ndarray]:
    """``calls(kernel, *arguments)`` for each native call of the convolution, in order (the
    whole images' run, then each other image's): their answers, and the bias the tile
    reads, which their arguments hold."""
    n, m = X.shape[0], W.shape[0]
    bias = kit.bias(B, m)
    whole = _whole_images(X, Z, n, threads)
    made = [] if not whole else [calls(run_images, *_images_arguments(
        block, kit.words, X, out, bias, Z, whole, threads))]
    y_all = out.reshape(n, m, -1)
    z_all = None if Z is None else Z.reshape(n, m, -1)
    made += [calls(run, *(block, kit.words, X[image], y_all[image], bias,
                          y_all[image] if z_all is None else z_all[image], z_all is not None))
             for image in range(whole, n)]
    return made, bias


class _Prepared:
    """A call's native calls on its arrays, their arguments made once: the whole images'
    run, then each other image's call. A bound call keeps it for its arrays, which are
    the same arena views on every run (where the bias the tile reads is not a copy of a
    B that may change, a writable one): a bound convolution spent ~2-3 us of Python a
    call on the bias, the images' views and the checks, ~60 us of a SqueezeNet's run at
    96 x 128 (2026-12-05); its calls then go to their overloads' entries, past numba's
    typing of each argument (``entry_points.py``)."""

    __slots__ = ("native", "calls", "steady")

    def __init__(self, kit, block, run, run_images, threads, native, X, W, B, Z, out):
        self.native = native  # to wake first: a sleeping worker takes ~10-15 us to run
        # each call through its overload's entry (entry_points.fixed_call: found once)
        made, bias = _native_calls(kit, block, run, run_images, threads, fixed_call, X, W, B,
                                   Z, out)
        self.calls = tuple(made)
        # (a reshape of a non-contiguous array is a copy, made for this call alone)
        self.steady = (B is None or not B.flags.writeable or np.may_share_memory(bias, B)) \
            and out.flags.c_contiguous and (Z is None or Z.flags.c_contiguous)

    def kept(self):
        """Its ``go``, where its arguments hold on every call on the same arrays."""
        return self.go if self.steady else None

    def go(self) -> None:
        if self.native is not None:
            self.native.wake()  # it wakes while this thread starts
        for call in self.calls:
            call()


def _whole_images(X, Z, n: int, threads: int) -> int:
    """How many of the batch's ``n`` images a split convolution hands out whole, in one run
    of consecutive images a thread (:func:`_images_arguments`): as many as divide evenly among the
    ``threads``; the rest are split inside each image. 0 where one thread runs it, or where
    the input or the residual would have to be copied to be read as one run of images."""
    if threads < 2 or n < threads or not X.flags.c_contiguous \
            or (Z is not None and not Z.flags.c_contiguous):
        return 0
    return n - n % threads


def _images_arguments(block, words, X, out, bias, Z, whole: int, threads: int) -> tuple:
    """The arguments of ``_jit_conv_direct.native_conv_images`` for the first ``whole``
    images of the convolution in ``threads`` runs of consecutive images, each run on one
    thread: the runs a depthwise convolution or a pool before it splits its planes into,
    so an image stays on the core that wrote it."""
    n, c, m = X.shape[0], X.shape[1], out.shape[1]
    x = X.reshape(n * c, *X.shape[2:])[:whole * c]
    y = out.reshape(n * m, -1)
    z = y if Z is None else Z.reshape(n * m, -1)
    return (block, words, x, y[:whole * m], bias, z[:whole * m], Z is not None, whole,
            threads)


class _Kit:
    """One thread's prepared call of a node's convolution for one dtype and epilogue at one
    image size: the words ``_jit_panels.native_conv`` reads its fixed arguments from (laid
    out like the pool's block), the arrays they point to, and the bias as the tile reads
    it. Kept by ``jit_cpu.scratch_kit`` until a scratch buffer it points to is reallocated.

    What does not change with the image size (the spills, the edges, the packed weight,
    the epilogue's limits, the bias buffers) is the node's :class:`_KitBase`, made once per
    thread; a kit copies its words and writes the size's own: its phase planes, its parts.
    A CNN makes a kit per convolution at each new image size, and making the whole of one
    cost ~38 us (RegNet-Y-400MF: ~28 a new size, 2026-11-29)."""

    def __init__(self, plan, dtype, limits):
        base = jit_cpu.scratch_kit(_weight_of(plan), ("kit base", dtype.str, limits,
                                                      _form(plan), plan.strips),
                                   lambda: _KitBase(plan, dtype, limits))
        parts = plan.native_parts()
        self._zeros, self._padded = base.zeros, base.padded
        words = base.words.copy()
        for slot, values in jit_cpu.scratch_kit(parts, ("size words", dtype.str),
                                                lambda: _size_words(plan, dtype)):
            words[slot:slot + len(values)] = values
        self.words = np.array(words, np.int64)
        self.parts = parts.count
        self._kept = (base, parts)  # the words point into their arrays


    def bias(self, B, m) -> np.ndarray:
        """B as the tile reads it: one per output channel, zeros past M to a whole panel;
        always a writable array. The drivers are compiled per argument type, and a read-only
        bias (a constant read from the model's file) is another type: its twin was loaded
        from the cache at a service's request the first time a node of the other kind met
        a batch the images split over (MobileNetV3-small's 22nd new shape, ~25-40 ms;
        2026-12-04)."""
        if B is None:
            return self._zeros
        if self._zeros.size == m and B.dtype == self._zeros.dtype and B.flags.c_contiguous \
                and B.flags.writeable:
            return B.reshape(m)
        self._padded[:m] = B.reshape(m)  # past M it stays zero (one thread's calls in turn)
        return self._padded


# An in-place 1x1 convolution's kit at a new image size, from its kit at another (the
# node's first on this thread): a MobileNetV2 has 34 such nodes, and each new image size a
# service sent made each a layout and a kit, ~100 us a node, ~3 ms of a size's first run
# (2026-11-30). Only the parts and the plane's size change with the image: the rest of the
# kit's words (the weight, its strips' blocks, the spills, the epilogue, no planes read)
# is the node's.
_POINTWISE = "in-place 1x1 sizes"


def _pointwise_kit(X, W, geometry, limits):
    """This thread's kit of an in-place 1x1 convolution (stride 1, no padding, its input
    read where it lies) at X's image size, made from the node's kit at another size
    (:class:`_PointwiseSizes`); None where the node has no kit on this thread yet, or the
    convolution is not one (its full route decides, ``direct_layout``)."""
    kernel, strides, _, _, begin, end, out_dims = geometry
    if kernel[0] != 1 or kernel[1] != 1 or strides[0] != 1 or strides[1] != 1 \
            or any(begin) or any(end):
        return None
    sizes = jit_cpu.kept_kit(W, (_POINTWISE, X.dtype.str, limits))
    if sizes is None or X.shape[1] != sizes.channels:
        return None
    image = X.shape[2:]
    if out_dims[0] != image[0] or out_dims[1] != image[1] \
            or small_expansion(sizes.channels, image, W.shape[0]):  # (read in strips)
        return None
    return jit_cpu.scratch_kit(W, (_POINTWISE, image, X.dtype.str, limits),
                               lambda: sizes.at(image))


class _PointwiseSizes:
    """A node's in-place 1x1 kit as every image size's starts: its words, and what
    ``direct_layout._NativeParts`` works out from the node alone (the channels, the parts
    when they split the output channels)."""

    def __init__(self, plan, kit):
        self.kit, self.channels = kit, plan.planes_shape[2]
        self.lanes = _kernels().VECTOR_BYTES // plan.weights.itemsize
        self.count, self.chunk = strip_runs(plan.weights.shape[0])

    def at(self, image) -> "_SizedKit":
        """The kit at an image of ``image`` (rows, columns), as the full route makes it."""
        return _SizedKit(self, *image)


class _SizedKit:
    """:class:`_Kit`'s words for one image size of an in-place 1x1 convolution, the
    node's own copied from its first kit; its bias from that kit (they share one base)."""

    def __init__(self, sizes: _PointwiseSizes, rows: int, columns: int):
        kernels = _kernels()
        words = sizes.kit.words.copy()
        if splits_rows(rows):  # by bands of output rows
            bands = _row_parts(rows)
            self.bounds = band_bounds(bands, rows)
            self.parts, chunk, by_rows = len(bands), 0, 1
        else:
            self.bounds = band_bounds([(0, rows)], rows)
            self.parts, chunk, by_rows = sizes.count, sizes.chunk, 0
        words[kernels.BOUNDS] = self.bounds.__array_interface__["data"][0]
        words[kernels.BOUNDS + 1] = self.bounds.size
        words[kernels.BY_ROWS], words[kernels.PARTS], words[kernels.CHUNK] = \
            by_rows, self.parts, chunk
        plane = -(-rows * columns // sizes.lanes) * sizes.lanes
        words[kernels.SHAPE0:kernels.SHAPE0 + 4] = (1, 1, sizes.channels, plane)
        words[kernels.PH:kernels.PH + 9] = (rows, columns, 1, 1, 0, 0, 0, rows, columns)
        self.words, self.bias = words, sizes.kit.bias


def _size_words(plan, dtype) -> tuple:
    """A kit's words that follow from the image size alone, as (first slot, values): this
    thread's phase planes, the parts and their arrays, the geometry. Made once per thread for
    the nodes that share a geometry (``direct_layout._shared_geometry``: their parts are
    one object). Tuples of ints, which the cycle collector stops tracking: lists, kept as
    long as their parts (by every image size's kept call, ``image_routes``), were ~27
    tracked objects a layout."""
    kernels, parts = _kernels(), plan.native_parts()
    # a 1x1 convolution read in place never writes planes: it asks for none. Its planes
    # would be the whole input (C x H x W), so a new image size's 1x1 convolutions grew
    # the thread's buffer, and every growth let go of every kit of the thread and every
    # node's kept call (MobileNetV2, 60 new sizes: 3 requests of ~52 ms against ~19)
    flat_size = 0 if plan.in_place else math.prod(plan.planes_shape)
    words = [(slot, (jit_cpu.scratch_address(name, dtype, (flat_size,))[1], flat_size))
             for slot, name in ((kernels.PLANES, "direct_planes"),
                                (kernels.WORKER_PLANES, "direct_planes_worker"))]
    words += [(slot, (address, *array.shape)) for slot, (array, address) in
              zip((kernels.ROWS_AT, kernels.PLACES, kernels.BOUNDS), parts.addressed())]
    words += [(slot, (int(value),)) for slot, value in (
        (kernels.BY_ROWS, plan.by_rows), (kernels.STRIPS, plan.strips),
        (kernels.IN_PLACE, plan.in_place), (kernels.PARTS, parts.count),
        (kernels.CHUNK, parts.chunk), (kernels.ROW_BLOCK, parts.row_block),
        (kernels.COLUMN_BLOCK, parts.column_block))]
    return tuple(words) + ((kernels.SHAPE0, tuple(parts.shape)),
                           (kernels.PH, tuple(parts.geometry)))


def _weight_of(plan):
    """The packed weight a layout computes with: the node's, shared by its layouts of every
    image size (``direct_layout._packed_once``), so it keys what they share."""
    return plan.panels if plan.taps and not plan.left else plan.weights


class _KitBase:
    """What a node's kits share on one thread for one dtype and epilogue (see
    :class:`_Kit`): the words of its scratch spills and edges, its packed weight, limits,
    and the bias buffers."""

    def __init__(self, plan, dtype, limits):
        kernels = self.kernels = _kernels()
        scratch = jit_cpu.scratch_address
        empty = empty_operands(dtype)
        pointwise = not plan.taps
        edge_shape = (plan.weights.shape[1], plan.width) if pointwise else (0, 0)
        length = plan.panels.shape[0] * plan.width if plan.taps and not plan.left \
            else plan.weights.shape[0]
        self.zeros, self.padded = np.zeros(length, dtype), np.zeros(length, dtype)
        # this thread's scratch arrays come with their addresses (jit_cpu keeps both)
        placed = {
            kernels.SPILL: scratch("direct_spill", dtype, (plan.width, STRIP)),
            kernels.WORKER_SPILL: scratch("direct_spill_worker", dtype, (plan.width, STRIP)),
        }
        if pointwise:
            placed[kernels.EDGE] = scratch("direct_edge", dtype, edge_shape)
            placed[kernels.WORKER_EDGE] = scratch("direct_edge_worker", dtype, edge_shape)
        arrays = {
            kernels.PANELS: plan.panels if plan.taps and not plan.left else empty[3],
            kernels.WEIGHTS: plan.weights if plan.left or pointwise else empty[2],
            kernels.LIMITS: limits_array(limits, dtype),
            kernels.NO_BIAS: np.zeros(plan.width, dtype),
        }
        if not pointwise:
            arrays[kernels.EDGE] = arrays[kernels.WORKER_EDGE] = empty[2]
        # filled as a list and made an array by each kit: ~12 slots written one by one into
        # the int64 array, each address through ``ndarray.ctypes``, cost ~50 us a kit
        # (2026-11-27)
        words = [0] * kernels.BLOCK_WORDS
        for slot, (array, address) in placed.items():
            words[slot] = address
            words[slot + 1:slot + 1 + array.ndim] = array.shape
        for slot, array in arrays.items():
            words[slot] = array.__array_interface__["data"][0]
            words[slot + 1:slot + 1 + array.ndim] = array.shape
        words[kernels.ITEMSIZE] = dtype.itemsize
        words[kernels.TAPS] = _form(plan)
        self.words = words
        arrays.update((slot, array) for slot, (array, _) in placed.items())
        self._arrays = arrays  # the words point into these


def _conv_threads(plan, X, B, Z, limits, out):
    """:func:`conv` with its parts on Python threads (``parallel_for``), where the native
    pool is off."""
    n, m, out_dims = X.shape[0], out.shape[1], plan.out_dims
    bias = _padded_bias(plan, B, m, X.dtype)
    scalars = tuple(X.dtype.type(v) for v in limits[:3])  # compared in X's dtype, not float64
    y_all = out.reshape(n, m, -1)
    z_all = None if Z is None else Z.reshape(n, m, -1)
    run = _taps if plan.taps else _pointwise
    gate = limits_array(limits, X.dtype) if len(limits) > 3 else None
    for image in range(n):
        y = y_all[image]
        epilogue = (bias, y if z_all is None else z_all[image], z_all is not None) + scalars
        if plan.by_rows:
            parallel_for(_row_parts(out_dims[0]), lambda r0, r1, x=X[image], y=y, e=epilogue:
                         run(plan, x, y, e, r0, r1, 0, None))
        else:
            parts = (thread_parts(plan.panels.shape[0], plan.panels.size * y.shape[1])
                     if plan.taps and not plan.left else _strip_parts(plan.weights.shape[0]))
            shared = _phase_planes(plan, X[image], 0, out_dims[0])
            parallel_for(parts, lambda c0, c1, x=X[image], y=y, e=epilogue, s=shared:
                         run(plan, x, y, e, 0, out_dims[0], c0, c1, s))
        if gate is not None:  # the gate the native parts apply, here after the image
            _kernels().gated(y, 0, m, 0, y.shape[1], gate)
    return out


def _native_pool():
    return jit_cpu.native_pool()


def _form(plan) -> int:
    """The native driver's form: 0 a 1x1 kernel, 1 the tap tile, 2 taps, weight on the left."""
    return 2 if plan.left else int(plan.taps)


def _padded_bias(plan, B, m, dtype) -> np.ndarray:
    """B as the epilogue reads it: the tap tile reads a whole panel's biases, zeros past M."""
    bias = np.zeros(plan.panels.shape[0] * plan.width if plan.taps and not plan.left else m,
                    dtype)
    if B is not None:
        bias[:m] = B.reshape(m)
    return bias


def band_rows(X, W, B, limits, geometry, prepacked):
    """``rows(image, r0, r1, y, at)``: output rows r0..r1 of one image of Conv(X, W) + B,
    through the epilogue ``limits``, written into ``y`` (M, L) from output row ``at`` on (y's
    rows hold L / OW output rows each), on the calling thread alone. For kernels that compute a
    convolution a band of rows at a time (``ops/conv/fused_conv_pool.py``); :func:`suits` must
    hold."""
    kernel, strides, dilations, _, begin, end, out_dims = geometry
    plan = layout(prepacked, X, W, kernel, strides, dilations, begin, end, out_dims)
    bias = _padded_bias(plan, B, W.shape[0], X.dtype)
    scalars = tuple(X.dtype.type(v) for v in limits)
    run = _taps if plan.taps else _pointwise

    def rows(image, r0, r1, y, at):
        run(plan, X[image], y, (bias, y, False) + scalars, r0, r1, 0, None, at=at)
    return rows


def _taps(plan, x, y, epilogue, r0, r1, p0, p1, shared=None, at=None):
    """Output rows r0..r1 and the output-channel panels p0..p1 (None: all; with the weight
    on the left, channels p0..p1) of a kernel of several taps; its phase planes ``shared``
    by the threads, or else built here. Row r0 goes to row ``at`` of y (default r0)."""
    flat = _phase_planes(plan, x, r0, r1) if shared is None else shared
    bias, residual, has_residual, slope, low, high = epilogue
    if plan.left:  # p0..p1 are output channels here (whole strips)
        m0, m1 = (0, plan.weights.shape[0]) if p1 is None else (p0, p1)
        _kernels().left_tap_conv(plan.weights, flat, plan.rows_at, r0, r1, plan.out_dims[1],
                                 plan.pw, y, r0 if at is None else at, bias, residual,
                                 has_residual, low, high, slope, m0, m1, plan.width)
        return
    spill = jit_cpu.scratch_array("direct_spill", y.dtype, (plan.width, STRIP))
    no_bias = jit_cpu.scratch_array("direct_no_bias", y.dtype, (plan.width,))
    no_bias[:] = 0
    ow, kernels = plan.out_dims[1], _kernels()
    count = (r1 - r0) * ow
    # strips of packed input hold 8 outputs each; elsewhere 7x7 planes go 7 outputs a tile
    strip = STRIP if plan.strips else kernels.strip_rows(count)
    kernels.tap_conv(flat, plan.rows_at, plan.places(r0, r1), count, plan.panels, y,
                     (r0 if at is None else at) * ow, bias, residual, has_residual, low, high,
                     slope, p0, plan.panels.shape[0] if p1 is None else p1, spill, no_bias,
                     strip)


def _pointwise(plan, x, y, epilogue, r0, r1, m0, m1, shared=None, at=None):
    """Output rows r0..r1 and channels m0..m1 (None: all) of a 1x1 convolution, the image
    read in place or from its one phase plane (``shared`` by the threads, or built here).
    Row r0 goes to row ``at`` of y (default r0)."""
    ow = plan.out_dims[1]
    if plan.in_place:
        image, stride, offset = x.reshape(-1), plan.plane_dims[0] * plan.pw, r0 * ow
    else:
        image = _phase_planes(plan, x, r0, r1) if shared is None else shared
        stride, offset = plan.planes_shape[3], 0
    bias, residual, has_residual, slope, low, high = epilogue
    kernels = _kernels()
    channels = plan.weights.shape[1]
    edge = jit_cpu.scratch_array("direct_edge", y.dtype, (channels, plan.width))
    spill = jit_cpu.scratch_array("direct_spill", y.dtype, (STRIP, plan.width))
    kernels.pointwise_conv(plan.weights, image, stride, offset, (r1 - r0) * ow, y,
                           (r0 if at is None else at) * ow,
                           bias, residual, has_residual, low, high, slope, m0,
                           plan.weights.shape[0] if m1 is None else m1, plan.row_block,
                           plan.column_block, edge, spill)


def _phase_planes(plan, x, r0, r1):
    """The flat phase planes of output rows r0..r1 (the image's own rows for a 1x1 read in
    place: None), in this thread's buffer."""
    if not plan.taps and plan.in_place:
        return None
    flat, shaped = _planes(plan, x.dtype)
    if plan.strips:
        _kernels().pack_strips(x, flat, r0, r1 - r0, plan.out_dims[1], *plan.strides,
                               *plan.begin)
        return flat
    _kernels().phase_planes(x, shaped, *plan.plane_dims, *plan.strides, *plan.begin, r0,
                            r1 - r0 + plan.halo)
    return flat


def _kernels():
    return jit_cpu.panel_kernels()


def _planes(plan, dtype) -> tuple[np.ndarray, np.ndarray]:
    """This thread's phase-plane buffer, flat and shaped. Only the rows a call writes are
    read (not the cells that align each plane, nor rows past a band), so it is never
    cleared."""
    flat = jit_cpu.scratch_array("direct_planes", dtype, (math.prod(plan.planes_shape),))
    return flat, flat.reshape(plan.planes_shape)
