"""1x1 convolutions over small planes (fewer than ``direct_forms.POINTWISE_POSITIONS``
pixels, the mobile networks' last stages at 7x7 and below) as a product of pixel rows with
the packed weight.

There the weight is large and the plane small: EfficientNet-B0's 192 -> 1152 expansion at
3x3 is a 1152 x 192 weight against 9 pixels. Weight on the left (``out = W @ X`` per image,
what ``conv_cpu.conv_bands`` does) hands OpenBLAS a 9-column product it packs the whole
weight for and splits over its threads; as rows, ``out^T = X^T @ W^T``, the batch's pixels
are the rows of one product against the weight packed once into panels
(``ops/nn/matmul_cpu.py``), the bias added in its tiles. The pixels are transposed in and
out (a few thousand values). One process, one thread, the call alone (us, banded / rows):
192 -> 1152 at 3x3 60 / 41, 1152 -> 192 56 / 34, 576 -> 96 28 / 12, two images of the first
116 / 73. The call is kept as the node's replay (``ops/compiled/replay.py``).

Small products take it too: the banded form's Python (its route among the conv forms, a
matmul and an epilogue per band, none of it replayed) was most of their time. In a
session, a 1x1 convolution with HardSigmoid after it, 2026-11-25: 40 -> 120 at 6x6 (0.17M
multiply-adds) 52 -> 31 us a run, 64 -> 64 at 4x4 48 -> 26, 16 -> 16 at 6x6 46 -> 25
(onnxruntime 16, 10, 7).

Expansions of 16 pixels and more (``direct_forms.small_expansion``) go to the direct
form's packed strips instead, whose tile stores the large output transposed with its
epilogue.
"""

from __future__ import annotations

import contextlib

import numpy as np

from mixrt.ops.compiled import jit_cpu, jit_tier, replay
from mixrt.ops.compiled.entry_points import fixed_call
from mixrt.ops.compiled.workspace import packed
from mixrt.ops.conv import conv_direct_cpu
from mixrt.ops.nn import matmul_cpu
from mixrt.ops.nn.product_parts import l2_bytes
from mixrt.ops.panels import native_parts

# planes from this many pixels take the direct form's weight on the left
# (direct_forms.POINTWISE_POSITIONS); a single pixel is ops/conv/one_pixel.py's
MAX_PIXELS = 7 * 7 - 1
MIN_PIXELS = 2
# without the panel tile, larger planes take the BLAS's product with the weight on the left
# (:func:`_blas_planes_action`) up to this many bytes of output, the epilogue a pass after it;
# beyond, the banded form's epilogue on each band while it is in cache
PLANES_MAX_BYTES = 1 << 20
# a split product of at least this many strips of pixel rows a thread goes in bands of rows
# (:func:`_banded_action`), BANDS_PER_THREAD bands a thread, claimed one at a time
BAND_STRIPS = 8
BANDS_PER_THREAD = 1
# bytes of weight up to which the bands take a product, at least (band_weight_bytes): each
# band reads all of it, which a weight in the core's L2 costs little and a larger one
# (EfficientNet-B0's 1152 -> 192, 0.9 MB) more than the copies it saves (2 x 96 x 96: 7.1
# against 7.0 ms a run split by panels)
BAND_WEIGHT_BYTES = 1 << 18
BAND_PARTS = "mixrt.ops.conv._pixel_rows_parts"  # the bands' compiled parts


def suits(X, W, group, pads, strides, auto_pad, out, prepacked) -> bool:
    """Whether Conv(X, W) is a 1x1, stride-1, unpadded, one-group convolution with a constant
    weight (``prepacked``), native floats, a C-contiguous X and ``out`` apart from it, over a
    plane of MIN_PIXELS..MAX_PIXELS pixels on the panel tile; where the tile is missing, the
    BLAS's forms take small expansions too (there is no direct form to go to) and planes of
    more pixels up to PLANES_MAX_BYTES of output (:func:`_blas_planes_action`)."""
    if prepacked is None or X.ndim != 4 or W.ndim != 4 or W.shape[2:] != (1, 1) \
            or int(group) != 1 or W.shape[1] != X.shape[1] or any(pads or ()) \
            or any(int(s) != 1 for s in (strides or ())) or auto_pad not in ("NOTSET", "VALID") \
            or X.dtype != W.dtype or X.dtype not in jit_cpu.NATIVE or not X.flags.c_contiguous:
        return False
    pixels = X.shape[2] * X.shape[3]
    if jit_cpu.panel_kernels() is None:  # the BLAS's product: rows, or planes up to a size
        if pixels < MIN_PIXELS or pixels > MAX_PIXELS and \
                X.shape[0] * W.shape[0] * pixels * X.itemsize > PLANES_MAX_BYTES:
            return False
    elif not MIN_PIXELS <= pixels <= MAX_PIXELS \
            or conv_direct_cpu.small_expansion(X.shape[1], X.shape[2:], W.shape[0]):
        return False
    return out is None or (out.shape == _shape(X, W) and out.dtype == X.dtype
                           and out.flags.c_contiguous and not np.may_share_memory(out, X))


_BAND_ENTRIES_WARM: set = set()  # dtypes whose bands' part entry was loaded (or tried)


def warm_bands(X, W, group, prepacked) -> None:
    """At a 1x1 convolution's full route, once per dtype: the bands' part entry (what the
    native workers call) compiled or loaded, if the node's weight is one the bands take at
    some size. Only a plane of at most MAX_PIXELS pixels in a batch large enough splits
    into bands, and a compile child that ran the model at other sizes had no reason to
    compile the entry: a MobileNetV2 service's first request of 14 images at 64 x 192 (a
    96 -> 576 expansion over 4 x 12 planes, 12 x 12 at the size compiled) found it in no
    cache, was answered on the NumPy tier (336 ms against ~40) and started a compile child
    that held a core for the next ~40 requests (2026-12-01). It compiles where compiling is
    the run's to do (the background compiler's child, a foreground session); a serving run
    of a process that compiles in the background only loads it (one compiled there would
    be ~1 s in a request), and a loading run asks nothing."""
    if X.dtype.str in _BAND_ENTRIES_WARM or jit_tier.compile_misses() is not None \
            or not _weight_the_bands_take(X, W, group, prepacked) \
            or jit_cpu.native_pool() is None or jit_cpu.panel_kernels() is None:
        return
    _BAND_ENTRIES_WARM.add(X.dtype.str)
    module = jit_cpu.load(BAND_PARTS)
    entry = native_parts.part_entry(module, "f" if X.dtype == np.float32 else "d")
    try:
        with jit_tier.loading_only() if jit_tier.background_compiles() \
                else contextlib.nullcontext():
            entry.address  # noqa: B018  (it compiles, or loads, where its address is read)
    except jit_tier.CompileForbidden:  # in no cache: a child compiles it where a size calls it
        return
    _warm_band_addresses(X.dtype)


def _weight_the_bands_take(X, W, group, prepacked) -> bool:
    """A node's constant 1x1 weight of one group, native floats, of
    :func:`band_weight_bytes` at most."""
    return (prepacked is not None and X.dtype in jit_cpu.NATIVE and int(group) == 1
            and W.ndim == 4 and W.shape[2:] == (1, 1)
            and W.shape[0] * W.shape[1] * X.itemsize <= band_weight_bytes())


def band_weight_bytes() -> int:
    """The largest weight the bands take: three quarters of a core's L2
    (``product_parts.l2_bytes``), from which every band reads it beside its own rows and
    products, and never less than BAND_WEIGHT_BYTES. On a 2-core Xeon with 2 MB of L2 a core
    (2026-12-03), six images of MobileNetV2's 3 x 9 planes, us, split by panels -> in bands
    (onnxruntime): 576 -> 160 (0.4 MB) 292-299 -> 215-220 (116), 960 -> 160 (0.6 MB)
    370-416 -> 287-296 (188), 160 -> 960 366-383 -> 351-364 (200), 960 -> 320 (1.2 MB)
    554-563 -> 442-445 (334); its eight 1x1 layers there 3.37-3.39 -> 2.92-2.95 ms; 320 ->
    1280 (1.6 MB) 706-748 against 652-740, not taken. Half the L2 had left the 1.2 MB one
    out (3.0 ms); the 0.9 MB one above lost on a core with 1 MB."""
    return max(BAND_WEIGHT_BYTES, l2_bytes() * 3 // 4)


def conv(X, W, B, Z, out, epilogue, prepacked, limits=None, gate=None):
    """``out`` = epilogue(Conv(X, W, B), Z), ``epilogue(y, bias, residual)`` as
    ``one_pixel.conv`` takes it, called on the (N, M, pixels) output with no bias (the
    panels added it); None (nothing done) where the bias or residual does not fit (a
    broadcast residual: the planar forms add it). With ``limits`` (the direct forms'
    (slope, low, high): Relu, Clip, LeakyRelu, or none, the same as ``epilogue``): the whole
    call compiled in one (:func:`_compiled_action`) where it is there (the native pool),
    else the forms with ``epilogue``, or None, nothing done, when that is None. ``gate``:
    (name, alpha, beta) of a HardSigmoid or HardSwish after the clamp, which only the bands
    (:func:`_banded_action`) make; elsewhere ``epilogue`` (which then includes it) does."""
    shape = _shape(X, W)
    if Z is not None and Z.shape != shape or B is not None and (
            B.shape != (W.shape[0],) or B.dtype != X.dtype or not B.flags.c_contiguous):
        return None
    kept = out is not None
    if out is None:
        out = np.empty(shape, X.dtype)
    action = None
    if limits is not None:
        action = _banded_action(X, W, B, Z, prepacked, limits, gate)
        if action is None and gate is None:
            action = _compiled_action(X, W, B, Z, prepacked, limits)
    if action is None:
        if epilogue is None:
            return None
        action = _epilogue_action(X, W, B, prepacked, epilogue)
    action(X, W, B, Z, out)
    if kept:
        replay.record(prepacked, (X, W, B, Z, out), action)
    return out


def _epilogue_action(X, W, B, prepacked, epilogue):
    """The call of the form these arrays take, its output finished by ``epilogue``: the
    panel tile's pixel rows, else the BLAS's rows or planes."""
    if jit_cpu.panel_kernels() is not None:
        return _action(X, W, B, prepacked, epilogue)
    if X.shape[2] * X.shape[3] <= MAX_PIXELS:
        return _blas_action(X, W, B, epilogue)
    return _blas_planes_action(X, W, B, epilogue)


def _compiled_action(X, W, B, Z, prepacked, limits):
    """The pixel rows, their product (split as the panel products split) and the epilogue
    ``limits`` in one compiled call (``_jit_dense.pixel_rows_conv``), where the panel tile and
    the native pool are there; else None. A chain of 64 -> 64 layers at 6 x 6 with Relu:
    9.5 us a layer, 10.9 through the separate calls."""
    if jit_cpu.panel_kernels() is None:
        return None
    n, c, m = X.shape[0], X.shape[1], W.shape[0]
    pixels = X.shape[2] * X.shape[3]
    # the panels of W^T under their own key: the conv forms keep other layouts in this dict
    own = prepacked.setdefault("_pointwise_rows", {})
    arguments = matmul_cpu.native_call_arguments(n * pixels, W.reshape(m, c).T, own, X.dtype, B)
    if arguments is None:
        return None
    block, parts, panels, bounds, spill, worker_spill, bias = arguments
    slope, low, high = (X.dtype.type(v) for v in limits)  # compared in X's dtype
    kernel = jit_cpu.panel_kernels().pixel_rows_conv
    dtype, total = X.dtype, n * pixels

    def arguments_of(X, Z, out) -> tuple:
        y = out.reshape(n, m, pixels)
        rows, products = _rows_scratch(dtype, (total, c), (total, m))
        return (block, parts, X.reshape(n, c, pixels), rows, panels, products, y, bounds,
                spill, worker_spill, bias, y if Z is None else Z.reshape(n, m, pixels),
                Z is not None, low, high, slope)

    def run(X, W, B, Z, out):
        kernel(*arguments_of(X, Z, out))
        return out

    def bound_to(arrays):
        """The call on these arrays alone, its arguments made once, for a bound call
        (``bound_calls``): where no reshape is a copy (contiguous arrays)."""
        X, _, _, Z, out = arrays
        if not all(a is None or a.flags.c_contiguous for a in (X, Z, out)):
            return None
        return fixed_call(kernel, *arguments_of(X, Z, out))
    run.bound_to = bound_to
    return run


def _rows_scratch(dtype, rows_shape: tuple, products_shape: tuple) -> tuple:
    """The pixel rows and their products, of these shapes, as this thread's scratch: one
    pair of buffers for every node and size, warm in the cache. Buffers of each call's own
    were kept by its replay and bound calls, so a size's second run (the first that keeps
    them) wrote them fresh from the allocator: MobileNetV2's 1x1 layers over 2 x 5 to
    6 x 8 planes, four to fourteen images, took 0.3-3 ms more a layer in that run than in
    the next, 66-440 page faults each (2026-12-03)."""
    return (jit_cpu.scratch_array("pixel_rows", dtype, rows_shape),
            jit_cpu.scratch_array("pixel_products", dtype, products_shape))


def _banded_action(X, W, B, Z, prepacked, limits, gate=None):
    """The call of ``ops/conv/_pixel_rows_parts.py``: bands of whole strips of pixel rows,
    each copied in, multiplied by the whole weight and written out with the epilogue
    ``limits`` by the thread that took it, where the product would be split over the native
    workers, there are at least BAND_STRIPS strips a thread and the weight is at most
    :func:`band_weight_bytes`; else None."""
    native = jit_cpu.native_pool()
    n, c, m = X.shape[0], X.shape[1], W.shape[0]
    pixels = X.shape[2] * X.shape[3]
    total = n * pixels
    kernels = jit_cpu.panel_kernels()
    if native is None or kernels is None or c * m * X.itemsize > band_weight_bytes():
        return None
    # a node whose weight the bands take takes them at a batch large enough: their compiled
    # parts are loaded at its first call (a session's warm-up), not at the first request
    # with that batch (a SqueezeNet's first batch of ten 64 x 160 images: ~60 of its 90 ms)
    module = jit_cpu.load(BAND_PARTS)
    _warm_band_addresses(X.dtype)
    threads = native.workers + 1
    # the bands' threshold counts strips of 8 rows, as when it was chosen; the bands are cut
    # in the product's strips of DENSE_ROWS
    if not matmul_cpu._split(total, c, m, X.itemsize) \
            or -(-total // kernels.STRIP_ROWS) < BAND_STRIPS * threads:
        return None
    strips = -(-total // kernels.DENSE_ROWS)
    own = prepacked.setdefault("_pointwise_rows", {})
    weight = W.reshape(m, c).T
    panels = packed(own, "panels", lambda: matmul_cpu.pack_panels(weight))
    bands = min(strips, BANDS_PER_THREAD * threads)
    edges = [strips * q // bands * kernels.DENSE_ROWS for q in range(bands)] + [total]
    parts = list(zip(edges[:-1], edges[1:]))
    dtype = X.dtype
    kind, alpha, beta = module.CLAMP, 0.0, 0.0
    if gate is not None:
        name, alpha, beta = gate
        kind = {"HardSigmoid": module.HARD_SIGMOID, "HardSwish": module.HARD_SWISH}[name]
    spill = np.empty(bands * kernels.DENSE_ROWS * panels.shape[2], dtype)
    limits_array = np.array([*limits, alpha, beta, 1.0], dtype)
    no_bias = np.zeros(0, dtype)
    # (the arrays X, B, Z, out of the last call, their layouts, its prepared call, the
    # thread's scratch generation it was prepared at)
    last = None

    def prepare(arrays):
        X, B, Z, out = arrays
        # their addresses as they are now
        rows, products = _rows_scratch(dtype, (total * c,), (total * m,))
        flat = (X.reshape(-1), rows, panels.reshape(-1), products, out.reshape(-1),
                no_bias if B is None else B, no_bias if Z is None else Z.reshape(-1), spill,
                limits_array)
        return native_parts.prepared(native, module, flat,
                                     (n, c, pixels, m, c, panels.shape[2], kind), parts,
                                     keep=flat)

    def run(X, W, B, Z, out):
        # the prepared call holds the arrays' addresses: the same objects take it at once,
        # new ones over the same memory (a reshape's view each run) once their layouts match
        # and again where the thread's scratch buffers were reallocated since
        nonlocal last
        arrays, scratch = (X, B, Z, out), jit_cpu.scratch_generation()
        if last is None or last[3] != scratch \
                or any(a is not b for a, b in zip(arrays, last[0])):
            layouts = tuple(None if a is None else _layout(a) for a in arrays)
            fresh = last is None or last[3] != scratch or layouts != last[1]
            last = (arrays, layouts, prepare(arrays) if fresh else last[2], scratch)
        last[2]()
        return out
    return run


_BAND_ADDRESSES_WARM: set = set()  # dtypes whose bands' address fill was warmed (or tried)


def _warm_band_addresses(dtype) -> None:
    """The address fill of the bands' arrays (nine flat ones of ``dtype``), compiled or
    loaded once per process and dtype at a node's first call: the bands are taken only at
    batches large enough, which a session's warm-up and its compile child may never run,
    and a run that may not compile then read the addresses one by one after a failed look
    into numba's cache (~0.3 ms a node, at each new size)."""
    if dtype.str in _BAND_ADDRESSES_WARM:
        return
    _BAND_ADDRESSES_WARM.add(dtype.str)
    # (in a run that may not compile and a cache without it, the fill answers anyway)
    native_parts.warm_prepared(tuple(np.empty(1, dtype) for _ in range(9)))


def _layout(array) -> tuple:
    return array.__array_interface__["data"][0], array.shape, array.strides, array.dtype.str


def _action(X, W, B, prepacked, epilogue):
    """The pixel rows' product on the panel tile, the bias added in its tiles."""
    m, c = W.shape[0], W.shape[1]
    rows = _pixel_rows(X)
    # the panels of W^T under their own key: the conv forms keep other layouts in this dict
    own = prepacked.setdefault("_pointwise_rows", {})
    product = matmul_cpu.panel_call(rows, W.reshape(m, c).T, own, B)
    return _rows_form(X, m, rows, lambda B, products: product(rows, products), epilogue,
                      jit_cpu.panel_kernels().swap_last_axes)


def _blas_action(X, W, B, epilogue):
    """:func:`_action` where the panel tile is missing (no AVX-512): the pixel rows' product
    through the BLAS (``rows @ W^T``, W read transposed in place), the bias added after it,
    then the same transposes and epilogue, the call replayed. On an AVX2 EPYC (Zen 3, a
    noisy 2-core guest, FusedConv alone, medians) the banded form's route and per-band
    epilogue were most of a small plane's call: 96 -> 576 at 3x3 + HardSwish 137 -> 87 us,
    40 -> 240 at 6x6 106 -> 58, 8 images of the first 527 -> 210."""
    m, c = W.shape[0], W.shape[1]
    rows = _pixel_rows(X)
    weight = W.reshape(m, c).T  # the constant's view: the replay is on this very W

    def multiply(B, products):
        np.matmul(rows, weight, out=products)
        if B is not None:
            np.add(products, B, out=products)
    return _rows_form(X, m, rows, multiply, epilogue)


def _pixel_rows(X) -> np.ndarray:
    """A buffer for X's pixels as rows (N * pixels, C), kept by the form's call."""
    return np.empty((X.shape[0] * X.shape[2] * X.shape[3], X.shape[1]), X.dtype)


def _rows_form(X, m, rows, multiply, epilogue, swap=None):
    """The call both row forms make: X's pixels copied into ``rows``, ``multiply(B,
    products)`` into the (N * pixels, M) products, those copied back as the (N, M, pixels)
    output, then the epilogue (bound once, :class:`_BoundEpilogue`). ``swap(source,
    target)`` writes a batch of matrices transposed (the panel kernels'
    ``swap_last_axes``); without it NumPy copies the transposed views."""
    n, c = X.shape[0], X.shape[1]
    pixels = X.shape[2] * X.shape[3]
    products = np.empty((n * pixels, m), X.dtype)
    into_rows, from_rows = rows.reshape(n, pixels, c), products.reshape(n, pixels, m)
    finish = _BoundEpilogue(epilogue)
    if swap is None:
        def swap(source, target):
            np.copyto(target, source.transpose(0, 2, 1))

    def run(X, W, B, Z, out):
        swap(X.reshape(n, c, pixels), into_rows)
        multiply(B, products)
        y = out.reshape(n, m, pixels)
        swap(from_rows, y)
        finish(y, Z)
        return out
    return run


class _BoundEpilogue:
    """The epilogue of a form's (N, M, pixels) output, the bias already added (by the panels'
    tiles or the BLAS forms): on the first call bound to its arrays as one compiled pass
    where it is one (a replay then calls just that), else run as the epilogue each call."""

    def __init__(self, epilogue):
        self.epilogue, self.bound = epilogue, None  # bound: the pass, or False

    def __call__(self, y, Z):
        if self.bound:
            self.bound()
            return
        residual = None if Z is None else Z.reshape(y.shape)
        if self.bound is None and hasattr(self.epilogue, "bind"):
            self.bound = self.epilogue.bind(y, None, residual) or False
        else:
            self.epilogue(y, None, residual)


def _blas_planes_action(X, W, B, epilogue):
    """:func:`_blas_action` for planes of more than MAX_PIXELS pixels: ``W @ X`` per image
    straight into ``out`` (one broadcast matmul, no transposes), the bias added after it
    along the channels, then the epilogue, the call replayed. 16 -> 72 at 24 x 24 + Relu
    on that EPYC: 193 -> 164 us."""
    n, c, m = X.shape[0], X.shape[1], W.shape[0]
    pixels = X.shape[2] * X.shape[3]
    weight = W.reshape(m, c)
    bias = None if B is None else B.reshape(m, 1)
    finish = _BoundEpilogue(epilogue)

    def run(X, W, B, Z, out):
        y = out.reshape(n, m, pixels)
        np.matmul(weight, X.reshape(n, c, pixels), out=y)
        if bias is not None:
            np.add(y, bias, out=y)
        finish(y, Z)
        return out
    return run


def _shape(X, W) -> tuple:
    return (X.shape[0], W.shape[0]) + tuple(X.shape[2:])
