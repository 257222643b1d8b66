"""CPU kernels compiled with numba, for the ops NumPy's ufuncs can only do in many passes.

A depthwise 3x3 convolution is nine multiply-adds per output: in NumPy that is eighteen
ufunc calls over the whole tensor (or a batched matmul of 1x9 by 9xL per channel), and on
ShuffleNet's 14x14 and 7x7 layers each call is mostly overhead: 0.2-0.5 ms a layer, where
onnxruntime takes tens of microseconds. A pooling window is the same story. The loops are
written out once in ``ops/compiled/_jit_kernels.py`` and compiled by numba, over the same NumPy
arrays, one plane at a time so that each padded plane stays in L1.

Depthwise convolutions with kernels up to 7x7 and most 2-D pools now take the generated
loops of ``ops/conv/jit_depthwise.py`` and ``ops/pool/jit_pool.py``, which read the input directly;
the phase-plane kernels here keep larger kernels, narrow stride-1 pools and outputs that
overlap their inputs.

numba is imported on the first call, not with mixrt (it costs ~0.4 s); each kernel is
compiled once per dtype and cached on disk beside its source (``cache=True``), so later
processes load it in milliseconds. ``MIXRT_JIT=0`` turns these kernels off, and so does a
failed import: callers then take their NumPy paths.
"""

from __future__ import annotations

import importlib
import math
import os
import platform
import sys
import threading
import weakref

import numpy as np

from mixrt.ops.compiled.jit_cache import guard_damaged_entries
from mixrt.ops.compiled.jit_tier import compiled_allowed
from mixrt.ops.compiled.parallel import parallel_for, pinned_values, thread_parts
from mixrt.runtime.device import aligned_empty

NATIVE = (np.dtype(np.float32), np.dtype(np.float64))
_loaded: list = []
_panels: list = []
_recurrent: list = []
_lock = threading.Lock()
_scratch = threading.local()
_kits = threading.local()
# prepared calls one thread keeps (:func:`scratch_kit`); past this many they are all dropped
# (a thread that outlives many sessions would otherwise keep the dead ones' entries)
KITS_KEPT = 4096


def enabled() -> bool:
    """May compiled kernels run here? Not with ``MIXRT_JIT=0``, without numba, nor on a
    thread whose session runs its NumPy tier (``ops/compiled/jit_tier.py``). Inside a session's run
    the setting is read once (``parallel.pinned``): ~0.7 us of ``os.environ`` a kernel."""
    if not compiled_allowed():
        return False
    values = pinned_values()
    if values is None:
        return _jit_setting_on() and _kernels() is not None
    on = values.get("jit")
    if on is None:
        on = values["jit"] = _jit_setting_on() and _kernels() is not None
    return on


def _jit_setting_on() -> bool:
    return os.environ.get("MIXRT_JIT", "1") != "0"


def _kernels():
    """The compiled kernels module, or None when numba cannot be imported."""
    return _import_once(_loaded, "mixrt.ops.compiled._jit_kernels")


def recurrent_kernels():
    """ops/rnn/_jit_recurrent.py (a recurrent layer's whole sequence in one call), or None
    without numba (or on a thread running the NumPy tier)."""
    if not compiled_allowed():
        return None
    return _import_once(_recurrent, "mixrt.ops.rnn._jit_recurrent")


def _import_once(slot: list, name: str):
    """Module ``name``, imported on the first call (None if it cannot be), kept in
    ``slot``."""
    if not slot:
        with _lock:
            if not slot:
                try:
                    guard_damaged_entries()
                    slot.append(importlib.import_module(name))
                except ImportError:
                    slot.append(None)
    return slot[0]


def panel_kernels():
    """ops/panels/_jit_panels.py (the packed-panel tile: ops/nn/matmul_cpu.py's products,
    ops/conv/conv_direct_cpu.py's convolutions), or None where it does not pay: without AVX-512
    (its 64-byte vectors would be split in two), with MIXRT_JIT=0, without numba, or on a
    thread running the NumPy tier."""
    if not compiled_allowed():
        return None
    if not _panels:
        with _lock:
            if not _panels:
                _panels.append(_load_panel_kernels())
    return _panels[0]


# the native pool's futex call is Linux x86-64's system call (the panel tile is x86 already)
NATIVE_POOL_PLATFORM = sys.platform.startswith("linux") and platform.machine() == "x86_64"


def native_pool():
    """The native workers' pool of ops/panels/_jit_panels.py (its drivers hand parts to a worker
    thread without the GIL), or None: one thread, no panel kernels, not Linux x86-64, or
    turned off with ``MIXRT_NATIVE_POOL=0`` (callers then split through ``parallel_for``).
    Looked up once per ``parallel.pinned`` block (a session's run)."""
    values = pinned_values()
    if values is None:
        return _native_pool()
    found = values.get("native_pool", values)  # the dict itself: not looked up yet
    if found is values:
        found = values["native_pool"] = _native_pool()
    return found


def wake_native_workers() -> None:
    """Wake the native workers if they sleep (once this process has loaded them). A session's
    run calls it as it starts: a worker asleep since the last run takes 10-15 us (far more
    on a busy host) to run again, and meanwhile the first kernel's caller takes the parts.
    With 2 ms between requests, SqueezeNet's first conv went 736 -> 668 us."""
    if "mixrt.ops.panels._jit_panels" not in sys.modules:
        return
    pool = native_pool()
    if pool is not None:
        pool.wake()


def _native_pool():
    if os.environ.get("MIXRT_NATIVE_POOL", "1") == "0" or not NATIVE_POOL_PLATFORM:
        return None
    kernels = panel_kernels()
    return None if kernels is None else kernels.native_pool()


def _load_panel_kernels():
    if os.environ.get("MIXRT_JIT", "1") == "0":
        return None
    try:
        from llvmlite import binding  # noqa: PLC0415  (with numba, on first use)
        if not binding.get_host_cpu_features().get("avx512f", False):
            return None
        guard_damaged_entries()
        return importlib.import_module("mixrt.ops.panels._jit_panels")
    except ImportError:
        return None


def _phase_planes(x, kernel, strides, dilations, begin, out_dims, fill):
    """``x`` (N, C, H, W) padded with ``fill`` and split into stride phases: (N, sh*sw, C,
    ph, pw) in a per-thread scratch, where [n, ry * sw + rx, c, i, j] is padded pixel
    (i * sh + ry, j * sw + rx) of image n, channel c. The planes hold every tap of every
    output window (cells past the padded image hold ``fill`` too), so the kernels' runs
    never read uninitialized memory."""
    (n, c), (sh, sw) = x.shape[:2], strides
    ph, pw = (max((size + b - 1) // s + 1, (k - 1) * d // s + o)
              for size, k, s, d, b, o in zip(x.shape[2:], kernel, strides, dilations, begin,
                                             out_dims))
    planes = _scratch_array("planes", x.dtype, (n, sh * sw, c, ph, pw))
    for ry in range(sh):
        for rx in range(sw):
            # input rows y with (y + top) % sh == ry start at (ry - top) % sh, and land in
            # phase row (y + top) // sh; the same along the columns
            y0, x0 = (ry - begin[0]) % sh, (rx - begin[1]) % sw
            rows = x[:, :, y0::sh, x0::sw]
            i0, j0 = (y0 + begin[0]) // sh, (x0 + begin[1]) // sw
            columns = planes[:, ry * sw + rx, :, i0:i0 + rows.shape[2], j0:j0 + rows.shape[3]]
            np.copyto(columns, rows)
            _fill_around(planes[:, ry * sw + rx], i0, i0 + rows.shape[2], j0,
                         j0 + rows.shape[3], fill)
    return planes


def _fill_around(planes, top, bottom, left, right, fill):
    """``fill`` into the cells of ``planes`` (..., ph, pw) outside rows top..bottom and
    columns left..right (the copied image): the border only, not the whole buffer twice."""
    planes[..., :top, :] = fill
    planes[..., bottom:, :] = fill
    planes[..., top:bottom, :left] = fill
    planes[..., top:bottom, right:] = fill


def _scratch_array(name, dtype, shape) -> np.ndarray:
    """A per-thread scratch array (its buffer kept between calls)."""
    held = _scratch.__dict__.setdefault(name, {})
    size = math.prod(shape) if isinstance(shape, (tuple, list)) else int(shape)
    key = np.dtype(dtype).str
    array = held.get(key)
    if array is None or array.size < size:
        array = held[key] = aligned_empty(size * np.dtype(dtype).itemsize).view(dtype)
        _thread_kits().clear()  # they may hold the old buffer: rebuilt from the new one
        _kits.generation = scratch_generation() + 1
    return array[:size].reshape(shape)


def scratch_kit(owner, key, make):
    """``make()``, kept for this thread per (``owner``, ``key``): a kernel's prepared call,
    the addresses of its fixed arrays and of this thread's scratch arrays written out once
    (``conv_direct_cpu``'s kits). Working those out again on every call cost a small
    convolution more than its kernel (~13 of 24 us). A kit is rebuilt when any scratch
    buffer of the thread is reallocated (so none keeps an old one alive), and is never
    returned for another ``owner`` (held weakly: its id may be reused once it is gone)."""
    kits = _thread_kits()
    found = kits.get((id(owner), key))
    if found is not None and found[0]() is owner:
        return found[1]
    kit = make()
    if len(kits) >= KITS_KEPT:
        kits.clear()
    kits[(id(owner), key)] = (weakref.ref(owner), kit)
    return kit


def scratch_generation() -> int:
    """How many times this thread's scratch buffers were reallocated (what a kept kit was
    made from is current while this holds)."""
    return getattr(_kits, "generation", 0)


def _thread_kits() -> dict:
    table = getattr(_kits, "table", None)
    if table is None:
        table = _kits.table = {}
    return table


# -- depthwise convolution ---------------------------------------------------------------------

def depthwise_suits(X, W, group) -> bool:
    """A 2-D convolution whose every group has one input channel (depthwise, with any channel
    multiplier), in float32 or float64."""
    return (isinstance(X, np.ndarray) and X.ndim == 4 and X.dtype in NATIVE
            and W.dtype == X.dtype and int(group) > 1 and int(group) == X.shape[1]
            and W.shape[1] == 1 and enabled())


def depthwise_conv(X, W, B, out, kernel, strides, dilations, begin, out_dims):
    """Depthwise Conv of X (N, C, H, W) with W (C*k, 1, kh, kw), plus the bias B (or None),
    into ``out`` (N, C*k, oh, ow)."""
    m = W.shape[0]
    bias = np.zeros(m, X.dtype) if B is None else np.ascontiguousarray(B, X.dtype)
    planes = _phase_planes(X, kernel, strides, dilations, begin, out_dims, 0)
    acc = _scratch_array("acc", X.dtype, (planes.shape[3] * planes.shape[4],))
    _kernels().depthwise(planes.reshape(-1), np.array(planes.shape, np.int64),
                         np.ascontiguousarray(W).reshape(-1), np.array(kernel, np.int64), bias,
                         out.reshape(-1), np.array(out_dims, np.int64), strides[0],
                         strides[1], dilations[0], dilations[1], acc)
    return out


# -- 2-D pooling -------------------------------------------------------------------------------

def pool_suits(X, geometry) -> bool:
    return X.ndim == 4 and X.dtype in NATIVE and len(geometry[0]) == 2 and enabled()


def pool2d(X, out, geometry, maximum: bool, counts=None):
    """MaxPool (``maximum``) or AveragePool (the window sums divided by ``counts``, one number
    or an (oh, ow) array) of X (N, C, H, W) into the C-contiguous ``out`` (N, C, oh, ow).
    X is copied into the phase planes first, so ``out`` may overlap it."""
    kernel, strides, dilations, begin, _, out_dims = geometry
    n, c = X.shape[:2]
    planes = _phase_planes(X.reshape((1, n * c) + X.shape[2:]), kernel, strides, dilations,
                           begin, out_dims, -np.inf if maximum else 0)[0]
    acc = _scratch_array("acc", X.dtype, (planes.shape[2] * planes.shape[3],))
    divisor = np.ones(out_dims, X.dtype) if counts is None else np.ascontiguousarray(
        np.broadcast_to(np.asarray(counts, X.dtype), out_dims))
    _kernels().pool(planes.reshape(-1), np.array(planes.shape, np.int64),
                    np.array(kernel, np.int64), out.reshape(-1),
                    np.array(out_dims, np.int64), strides[0], strides[1],
                    dilations[0], dilations[1], acc, maximum, divisor.reshape(-1))
    return out


# -- layer normalization -------------------------------------------------------------------------

def layer_norm_suits(X, Scale, B, out) -> bool:
    """float32 arrays (stash_type 1: float32 statistics), contiguous, normalized over the
    trailing axes that ``Scale`` (and ``B``) cover exactly; ``out`` may be ``X`` itself."""
    arrays = [a for a in (X, Scale, B, out) if a is not None]
    return (X.dtype == np.float32 and all(isinstance(a, np.ndarray) and a.dtype == X.dtype
                                      and a.flags.c_contiguous for a in arrays)
            and out.shape == X.shape and Scale.size > 0
            and (B is None or B.size == Scale.size) and enabled())


def layer_norm(X, Scale, B, out, axis: int, epsilon: float) -> bool:
    """LayerNormalization of X over its axes from ``axis`` on into ``out``; False (nothing
    written) when Scale does not span exactly those axes (broadcast scales stay in NumPy)."""
    n = math.prod(X.shape[axis:])
    if Scale.size != n or X.size == 0:
        return False
    bias = np.zeros(n, X.dtype) if B is None else B.reshape(-1)
    _kernels().layer_norm(X.reshape(-1), Scale.reshape(-1), bias, out.reshape(-1),
                          X.size // n, n, X.dtype.type(epsilon))
    return True


def rms_norm(X, scale, out, axis: int, epsilon: float) -> bool:
    """SimplifiedLayerNormalization of float32 X over its axes from ``axis`` on into
    ``out`` (:func:`layer_norm_suits` holds for them); False (nothing written) when
    ``scale`` does not span exactly those axes."""
    n = math.prod(X.shape[axis:])
    if scale.size != n or X.size == 0:
        return False
    _kernels().rms_norm(X.reshape(-1), scale.reshape(-1), out.reshape(-1), X.size // n, n,
                        X.dtype.type(epsilon))
    return True


# -- softmax -------------------------------------------------------------------------------------

def softmax_suits(rows, target) -> bool:
    """Contiguous (R, n) float32/float64 views, ``target`` either apart from ``rows`` or the
    same memory (in place)."""
    return (rows.dtype == target.dtype and rows.dtype in NATIVE
            and rows.flags.c_contiguous and target.flags.c_contiguous and enabled())


def softmax_rows(rows, target, start: int, stop: int) -> None:
    """Softmax of rows start..stop of ``rows`` (R, n) into ``target``: shift by the row max
    (compiled), NumPy's vectorized exp in place, then divide by the row sum (compiled)."""
    n = rows.shape[1]
    x = rows[start:stop].reshape(-1)
    y = target[start:stop].reshape(-1)
    kernels = _kernels()
    kernels.softmax_shift(x, y, stop - start, n)
    np.exp(y, out=y)
    kernels.softmax_scale(y, stop - start, n)


# -- whole-plane pools ---------------------------------------------------------------------------

def whole_plane_pool(X, out, maximum: bool, count=None) -> bool:
    """A pool whose one window holds each whole plane of X (N, C, *spatial) into ``out``
    (N, C, 1, ...): GlobalAveragePool / GlobalMaxPool, and Average/MaxPool windows that
    cover the input (an average divides by ``count``, the plane's size by default). False
    (nothing written) when the compiled loop does not apply."""
    if not (X.dtype in NATIVE and out.dtype == X.dtype and X.ndim >= 3 and X.size > 0
            and X.flags.c_contiguous and out.flags.c_contiguous
            and out.size == X.shape[0] * X.shape[1] and enabled()):
        return False
    rows = X.shape[0] * X.shape[1]
    n = X.size // rows
    if maximum:
        _kernels().row_maxima(X.reshape(-1), out.reshape(-1), rows, n)
    else:
        _kernels().row_means(X.reshape(-1), out.reshape(-1), rows, n, count or n)
    return True


# -- products with a few rows --------------------------------------------------------------------

EIGHT_ROWS = 8  # rows the compiled product computes at once (fewer are padded with zeros)
# weight elements from which the product is split over the intra-op threads by columns
SPLIT_WEIGHT = 1 << 19


def few_rows_suits(a, bt, out) -> bool:
    """a (rows <= 8, K), bt (N, K) and out (rows, N): contiguous, one native float dtype."""
    return (a.ndim == bt.ndim == out.ndim == 2 and 1 <= a.shape[0] <= EIGHT_ROWS
            and a.dtype == bt.dtype == out.dtype and a.dtype in NATIVE
            and bt.flags.c_contiguous and out.flags.c_contiguous
            and a.shape[1] == bt.shape[1] and out.shape == (a.shape[0], bt.shape[0])
            and enabled())


def few_rows_product(a, bt, out) -> None:
    """``out = a @ bt.T`` for a few rows (:func:`few_rows_suits`): the rows padded to eight in
    a scratch, the columns split over the intra-op threads for a large weight."""
    rows, n = a.shape[0], bt.shape[0]
    padded = _scratch_array("few_rows_a", a.dtype, (EIGHT_ROWS, a.shape[1]))
    padded[:rows] = a
    padded[rows:] = 0
    target = out if rows == EIGHT_ROWS else _scratch_array("few_rows_out", a.dtype,
                                                          (EIGHT_ROWS, n))
    kernel = _kernels().eight_rows

    def part(start, stop):
        kernel(padded, bt, target, start, stop)
    if bt.size < SPLIT_WEIGHT:
        part(0, n)
    else:
        parallel_for(thread_parts(n, bt.size), part)
    if target is not out:
        np.copyto(out, target[:rows])
