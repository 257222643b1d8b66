"""CPU fast paths for LRN, MaxPool and AveragePool that may write over their own input.

In AlexNet-like chains (Conv -> Relu -> LRN -> MaxPool) the arena's peak is one of these ops'
input and output alive together. The memory planner may place the output over the input when
the kernel never reads what it has already overwritten; these kernels keep that promise:

* LRN (output shaped like X): channels go in blocks; the squared channels that the next
  block's window still needs are kept in a small rolling scratch, so ``out`` may be ``X``.
* MaxPool / AveragePool (output no larger than X): the (n, c) planes go in order, a group at a
  time. Output plane p lies in bytes [p * out_plane, (p + 1) * out_plane) of the buffer, inside
  input planes <= p, so once a group's input planes are read its output may be written: with
  padding each group is first copied into a padded scratch (the generic kernel pads the whole
  tensor) and the windows read that copy; without, the group's result goes through an
  output-sized scratch when ``out`` overlays X. So ``out`` may start at X's first byte.

Each also runs when ``out`` is disjoint from X (pooling then accumulates straight into it) or
absent. They take native float32/float64 operands; anything else (narrow floats, the Indices
output, kernels so large the generic kernel reduces over a strided view, an ``out`` that
overlaps X in any other way) runs the generic kernel and copies its result, which is safe in
place too because the generic kernel has read all of X before the copy. The arithmetic is the
generic kernels', operation for operation and in the same order, so the results are the same
numbers (a pooled zero may differ in sign), except in 2-D pooling, which reduces columns then
rows: the same numbers for MaxPool, a last-bit difference at most for AveragePool's sums.
"""

from __future__ import annotations

import functools
import itertools
import math

import numpy as np

from mixrt.ops.compiled.bound_calls import binds, binds_replay
from mixrt.ops.compiled import replay
from mixrt.ops.pool import plane_pools
from mixrt.ops.pool import jit_pool
from mixrt.ops.conv.conv import strided_span
from mixrt.ops.conv.windows import spatial_attrs, window_geometry
from mixrt.ops.compiled.workspace import scratch_arrays as _scratch
from mixrt.ops.nn.norm import lrn
from mixrt.ops.pool.pool import average_pool, global_average_pool, global_max_pool, max_pool

NATIVE = (np.dtype(np.float32), np.dtype(np.float64))
# scratch per block or group of planes: small enough to stay in L2 while it is worked on
BLOCK_BYTES = 256 << 10
# the separable max pool's groups: its passes are short, so fewer, bigger groups (each NumPy
# call costs about a microsecond); 2 MiB ran ResNet's first pool in 0.42 ms against 0.59
SEPARABLE_BLOCK_BYTES = 2 << 20
# the generic pools reduce over a strided view past this many taps (another summation order)
MAX_TAPS = 400
# the phase-plane pools (plane_pools.py) pay a loop per tap, so they take planes with at
# least this many outputs and no fewer outputs than taps: a 7x7 pool to 1x1 over 544 planes
# took 0.19 ms there against 0.03 ms here; at 7x7 outputs of a 3x3 window they were even. The
# unrolled separable loop (jit_pool.py) takes any size it suits: SqueezeNet's last MaxPool
# (3x3/2 on 256x7x7, 3x3 outputs) 50 us here, 26 there (2026-12-05)
JIT_MIN_OUTPUTS = 16


# -- aliasing ----------------------------------------------------------------------------------

def _address(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]


def _native(X, out) -> bool:
    return (isinstance(X, np.ndarray) and X.dtype in NATIVE and X.size > 0
            and (out is None or (isinstance(out, np.ndarray) and out.dtype == X.dtype
                                 and out.flags.c_contiguous)))


def _same_memory(X, out) -> bool:
    """``out`` is X itself: same first byte, shape and strides."""
    return _address(X) == _address(out) and X.shape == out.shape and X.strides == out.strides


def _over_prefix(X, out) -> bool:
    """``out`` is X's buffer from its first byte on, both C-contiguous, ``out`` no larger."""
    return (_address(X) == _address(out) and X.flags.c_contiguous
            and out.nbytes <= X.nbytes)


def _into(out, result):
    if out is None or isinstance(result, tuple):
        return result  # the executor copies each output of a tuple into its own slot
    np.copyto(out, result)
    return out


# -- LRN ---------------------------------------------------------------------------------------

@lrn.fast("cpu")
def lrn_cpu(xp, X, *, size=None, alpha=1e-4, beta=0.75, bias=1.0, out=None):
    # NumPy scalars as attributes would widen the generic kernel's arithmetic: leave them to it
    plain = type(size) is int and size >= 1 \
        and all(type(v) in (int, float) for v in (alpha, beta, bias))
    if not plain or not _native(X, out) or X.ndim < 2 or (
            out is not None and np.may_share_memory(X, out) and not _same_memory(X, out)):
        return _into(out, lrn(xp, X, size=size, alpha=alpha, beta=beta, bias=bias))
    if out is None:
        out = np.empty(X.shape, dtype=X.dtype)
    plane = math.prod(X.shape[2:])
    block = max(1, min(X.shape[1], BLOCK_BYTES // max(plane * X.itemsize, 1)))
    squares, sums = _scratch(X.dtype, (block + size - 1,) + X.shape[2:],
                             (block,) + X.shape[2:])
    for image in range(X.shape[0]):
        _lrn_image(X[image], out[image], size, alpha / size, beta, bias, squares, sums)
    return out


def _lrn_image(x, y, size, scale, beta, bias, squares, sums):
    """One image ``x`` (C, *spatial) into ``y`` (which may be ``x``).

    ``squares[i]`` holds the square of channel ``c0 - before + i`` (zero outside 0..C-1):
    every channel a block's windows reach. Moving on, the last ``size - 1`` of them become the
    first, as channels below the new block may already be overwritten in ``x``.
    """
    channels, block = x.shape[0], sums.shape[0]
    before = (size - 1) // 2
    after = size - 1 - before
    for c0 in range(0, channels, block):
        count = min(block, channels - c0)
        if c0 == 0:
            _square_channels(x, squares[:count + size - 1], -before)
        else:
            squares[:size - 1] = squares[block:block + size - 1]
            _square_channels(x, squares[size - 1:count + size - 1], c0 + after)
        total = sums[:count]
        np.copyto(total, squares[:count])  # the generic kernel's sum, in its order
        for k in range(1, size):
            np.add(total, squares[k:k + count], out=total)
        total *= scale
        total += bias
        total **= beta
        np.divide(x[c0:c0 + count], total, out=y[c0:c0 + count])


def _square_channels(x, rows, first):
    """``rows[i]`` = x[first + i] squared, or zero where that channel does not exist."""
    low, high = max(first, 0), min(first + rows.shape[0], x.shape[0])
    if high <= low:
        rows.fill(0)
        return
    rows[:low - first].fill(0)
    rows[high - first:].fill(0)
    np.multiply(x[low:high], x[low:high], out=rows[low - first:high - first])


# -- pooling -----------------------------------------------------------------------------------

def _geometry(X, kernel_shape, strides, dilations, pads, auto_pad, ceil_mode):
    nd = X.ndim - 2
    kernel, strides, dilations = spatial_attrs(nd, kernel_shape, strides, dilations)
    begin, end, out_dims = window_geometry(X.shape[2:], kernel, strides, dilations, pads,
                                           auto_pad, bool(ceil_mode))
    return (tuple(kernel), tuple(strides), tuple(dilations), tuple(begin), tuple(end),
            tuple(int(o) for o in out_dims))


@functools.lru_cache(maxsize=256)
def _taps(kernel, strides, dilations, out_dims):
    """Per kernel offset, in the generic kernel's order: the slice of a group of padded planes
    that offset sees, shaped like the output."""
    return [(slice(None),) + tuple(strided_span(o * d, s, n)
                                   for o, d, s, n in zip(offset, dilations, strides, out_dims))
            for offset in itertools.product(*(range(k) for k in kernel))]


def _reach(in_dims, geometry):
    """Padding after each axis that some window reads (declared pads beyond it never are;
    ceil_mode windows may read past the declared pads)."""
    kernel, strides, dilations, begin, _, out_dims = geometry
    return tuple(max(0, (n - 1) * s + (k - 1) * d + 1 - (i + b))
                 for i, k, s, d, b, n in zip(in_dims, kernel, strides, dilations, begin,
                                             out_dims))


def _group(planes, plane_bytes, budget=None):
    return max(1, min(planes, (budget or BLOCK_BYTES) // max(plane_bytes, 1)))


def _fill_borders(buffer, begin, in_dims, value):
    """Set every element of ``buffer`` (G, *padded) outside the interior to ``value``."""
    for axis, (b, i) in enumerate(zip(begin, in_dims), start=1):
        index = [slice(None)] * buffer.ndim
        index[axis] = slice(0, b)
        buffer[tuple(index)] = value
        index[axis] = slice(b + i, None)
        buffer[tuple(index)] = value


def _pool_planes(x, y, geometry, ufunc, fill, finish=None, shrinking=False):
    """Reduce the windows of planes ``x`` (P, *in) into ``y`` (P, *out), group by group.

    With padding, each group is first copied into a padded scratch (as the generic kernel pads
    the whole tensor) and the taps read that copy, so ``y`` may be written at once even when it
    overlays ``x``. Without padding the taps read ``x``; then an overlaying ``y``
    (``shrinking``) gets each group through an output-sized scratch.
    """
    in_dims, out_dims = x.shape[1:], y.shape[1:]
    begin = geometry[3]
    after = _reach(in_dims, geometry)
    taps = _taps(*geometry[:3], out_dims)
    separable = _separable(ufunc, geometry)
    planes = x.shape[0]
    padding = any(begin) or any(after)
    shape = tuple(b + i + a for b, i, a in zip(begin, in_dims, after))
    plane_bytes = math.prod(shape if padding else out_dims) * x.itemsize
    if separable:  # its row-reduced planes and phase copies, about two more input planes
        plane_bytes += 2 * math.prod(shape) * x.itemsize
    budget = SEPARABLE_BLOCK_BYTES if separable else BLOCK_BYTES
    group = _group(planes, plane_bytes, budget) if padding or shrinking or separable else planes
    wanted = []
    if padding:
        wanted.append((group,) + shape)
    elif shrinking and not separable:
        wanted.append((group,) + out_dims)
    if separable:
        wanted.extend(_separable_shapes(group, shape, geometry))
    scratch = _scratch(x.dtype, *wanted) if wanted else []
    padded = scratch.pop(0) if padding else None
    staged = scratch.pop(0) if shrinking and not padding and not separable else None
    if padded is not None:
        _fill_borders(padded, begin, in_dims, fill)
        interior = (slice(None),) + tuple(slice(b, b + i) for b, i in zip(begin, in_dims))
    for p0 in range(0, planes, group):
        p1 = min(p0 + group, planes)
        source = x[p0:p1]
        if padded is not None:
            padded[:p1 - p0][interior] = source
            source = padded[:p1 - p0]
        acc = y[p0:p1] if staged is None else staged[:p1 - p0]
        if separable:
            # every read of this group's input happens before the first write of acc
            _reduce_separable(source, acc, geometry, ufunc, [a[:p1 - p0] for a in scratch])
        else:
            np.copyto(acc, source[taps[0]])
            for index in taps[1:]:
                ufunc(acc, source[index], out=acc)
        if finish is not None:
            finish(acc)
        if staged is not None:
            np.copyto(y[p0:p1], acc)


# -- separable 2-D max pooling -----------------------------------------------------------------
# A max over a kh x kw window is a max over kw columns, then over kh rows. Along the rows the
# taps are strided views whose inner axis is contiguous, which NumPy's SIMD loops take; along
# a strided last axis they are not, so the input is first split into ``sw`` contiguous phase
# copies (columns r, r + sw, ...), and each column tap is a shifted slice of one phase.
# ResNet's 3x3/2 max pool took 0.42 ms against 0.59 for nine strided tap passes, Inception's
# 3x3/1 average pool 0.30 against 0.46. For a max the result is the same numbers; an average
# sums in another order than the generic kernel, so it may differ in the last bit.

def _separable(ufunc, geometry) -> bool:
    return len(geometry[0]) == 2 and math.prod(geometry[0]) > 1


def _separable_shapes(group, shape, geometry) -> list[tuple]:
    """Scratch shapes: the column-reduced rows, then the phase copies (none when sw == 1)."""
    (kh, _), (sh, sw), (dh, _) = geometry[:3]
    oh, ow = geometry[5]
    rows = (oh - 1) * sh + (kh - 1) * dh + 1
    shapes = [(group, rows, ow)]
    if sw > 1:
        shapes.extend((group, rows, -(-(shape[1] - r) // sw)) for r in range(sw))
    return shapes


def _reduce_separable(source, acc, geometry, ufunc, scratch) -> None:
    (kh, kw), (sh, sw), (dh, dw) = geometry[:3]
    oh, ow = geometry[5]
    columns, phases = scratch[0], scratch[1:]
    rows = columns.shape[1]
    if sw > 1:
        for r, phase in enumerate(phases):
            np.copyto(phase, source[:, :rows, r::sw])
    else:
        phases = [source[:, :rows]]
    for kx in range(kw):
        offset = kx * dw
        tap = phases[offset % sw][:, :, offset // sw:offset // sw + ow]
        if kx == 0:
            np.copyto(columns, tap)
        else:
            ufunc(columns, tap, out=columns)
    for ky in range(kh):
        tap = columns[:, ky * dh:ky * dh + (oh - 1) * sh + 1:sh]
        if ky == 0:
            np.copyto(acc, tap)
        else:
            ufunc(acc, tap, out=acc)


def _pool_fast(X, out, geometry, ufunc, fill, finish=None):
    """Run a window reduction into ``out`` (allocated when None); None when it cannot."""
    kernel, out_dims = geometry[0], geometry[5]
    if math.prod(kernel) > MAX_TAPS or min(out_dims) <= 0:
        return None
    shape = X.shape[:2] + out_dims
    if out is None:
        out = np.empty(shape, dtype=X.dtype)
    elif out.shape != shape:
        return None
    shrinking = np.may_share_memory(X, out)
    if shrinking and not _over_prefix(X, out):
        return None
    x = X.reshape((-1,) + X.shape[2:])
    y = out.reshape((-1,) + out_dims)
    _pool_planes(x, y, geometry, ufunc, fill, finish, shrinking)
    return out


def _pool_jit(X, out, geometry, maximum, counts=None, node=None):
    """2-D pooling by the compiled loop of ``ops/compiled/jit_cpu.py`` (it copies X into its padded
    phase planes before writing, so ``out`` may overlap X any way); None when it does not
    apply. ``node``: the node's own dict, where a call into the caller's ``out`` over the
    native workers is kept as its replay (``ops/compiled/replay.py``)."""
    kernel, out_dims = geometry[0], geometry[5]
    shape = X.shape[:2] + out_dims
    if not plane_pools.pool_suits(X, geometry) or math.prod(kernel) > MAX_TAPS \
            or (out is not None and out.shape != shape):
        return None
    replays = node if out is not None else None
    target = np.empty(shape, dtype=X.dtype) if out is None else out
    if jit_pool.suits(X, target, geometry) and (not np.may_share_memory(X, target)
                                                or _over_prefix(X, target)):
        return jit_pool.pool2d(X, target, geometry, maximum, counts, replays)
    if math.prod(out_dims) < max(JIT_MIN_OUTPUTS, math.prod(kernel)):
        return None  # the phase planes' loop per tap loses to NumPy's passes there
    return plane_pools.pool2d(X, target, geometry, maximum, counts)


@max_pool.fast("cpu")
def max_pool_cpu(xp, X, *, auto_pad="NOTSET", ceil_mode=0, dilations=None, kernel_shape=None,
                 pads=None, storage_order=0, strides=None, _outputs=1, out=None, _node=None):
    if out is not None and replay.replayed(_node, (X, out)):
        return out
    replay.forget(_node)
    result = None
    if _outputs < 2 and kernel_shape is not None and _native(X, out) and X.ndim >= 3:
        geometry = _geometry(X, kernel_shape, strides, dilations, pads, auto_pad, ceil_mode)
        result = _whole_plane(X, out, geometry, True)
        if result is None:
            result = _pool_jit(X, out, geometry, True, node=_node)
        if result is None:
            result = _pool_fast(X, out, geometry, np.maximum, -np.inf)
    if result is None:
        result = _into(out, max_pool(xp, X, auto_pad=auto_pad, ceil_mode=ceil_mode,
                                     dilations=dilations, kernel_shape=kernel_shape, pads=pads,
                                     storage_order=storage_order, strides=strides,
                                     _outputs=_outputs))
    return result


@average_pool.fast("cpu")
def average_pool_cpu(xp, X, *, auto_pad="NOTSET", ceil_mode=0, count_include_pad=0,
                     dilations=None, kernel_shape=None, pads=None, strides=None, out=None,
                     _node=None):
    if out is not None and replay.replayed(_node, (X, out)):
        return out
    replay.forget(_node)
    result = None
    if kernel_shape is not None and _native(X, out) and X.ndim >= 3:
        geometry = _geometry(X, kernel_shape, strides, dilations, pads, auto_pad, ceil_mode)
        counts = _window_counts(X.shape[2:], geometry, bool(count_include_pad), X.dtype)
        result = _whole_plane(X, out, geometry, False, counts)
        if result is None:
            result = _pool_jit(X, out, geometry, False, counts, _node)

        def divide(total):
            total /= counts
        if result is None:
            result = _pool_fast(X, out, geometry, np.add, 0, divide)
    if result is None:
        result = _into(out, average_pool(xp, X, auto_pad=auto_pad, ceil_mode=ceil_mode,
                                         count_include_pad=count_include_pad,
                                         dilations=dilations, kernel_shape=kernel_shape,
                                         pads=pads, strides=strides))
    return result


def _whole_plane(X, out, geometry, maximum, counts=None):
    """A pool with one window per plane that covers all of it (the 7x7 average pools that end
    ResNet-50, ShuffleNet and the Inceptions; padding inside the window adds -inf to a max,
    and to an average only through ``counts``) as one compiled reduction per plane; None
    when it is not one, or the loop does not apply. ``out`` may start at X's first byte (the
    planner's shrinking pair): plane r's result lands at element r, in a plane already
    read."""
    kernel, _, dilations, begin, _, out_dims = geometry
    covers = all(0 <= b and k - b >= i for k, b, i in zip(kernel, begin, X.shape[2:]))
    if not covers or any(d != 1 for d in dilations) or any(o != 1 for o in out_dims):
        return None
    if out is None:
        out = np.empty(X.shape[:2] + tuple(out_dims), dtype=X.dtype)
    count = None if maximum else float(np.asarray(counts).reshape(-1)[0])
    if not _reducible_into(X, out) or not plane_pools.whole_plane_pool(X, out, maximum, count):
        return None
    return out


def _reducible_into(X, out) -> bool:
    return not np.may_share_memory(X, out) or _over_prefix(X, out)


@global_average_pool.fast("cpu")
def global_average_pool_cpu(xp, X, *, out=None):
    result = _global_pool(X, out, False)
    return _into(out, global_average_pool(xp, X)) if result is None else result


@global_max_pool.fast("cpu")
def global_max_pool_cpu(xp, X, *, out=None):
    result = _global_pool(X, out, True)
    return _into(out, global_max_pool(xp, X)) if result is None else result


def _bound_global_pool(args, out, maximum):
    """The compiled reduction per plane that :func:`_global_pool` settles on, as a call
    (its checks once: a MobileNetV3's ten squeeze-excite pools took ~5 us each through the
    kernel)."""
    X = args[0]
    if not (_native(X, out) and X.ndim >= 3 and _reducible_into(X, out)):
        return None
    reduce = plane_pools.whole_plane_call(X, out, maximum)
    if reduce is None:
        return None

    def call(X):
        reduce(X)
        return out
    return call


@binds(global_average_pool_cpu)
def bind_global_average_pool(args, out, attributes):
    return _bound_global_pool(args, out, False)


@binds(global_max_pool_cpu)
def bind_global_max_pool(args, out, attributes):
    return _bound_global_pool(args, out, True)


def _global_pool(X, out, maximum):
    """A global pool as one compiled reduction per plane; None when that does not apply."""
    if not (_native(X, out) and X.ndim >= 3):
        return None
    target = np.empty(X.shape[:2] + (1,) * (X.ndim - 2), X.dtype) if out is None else out
    if _reducible_into(X, target) and plane_pools.whole_plane_pool(X, target, maximum):
        return target
    return None


@functools.lru_cache(maxsize=256)
def _window_counts(in_dims, geometry, include_pad, dtype):
    """How many elements each window averages (the generic rule: those inside the input, plus
    the declared pads when ``include_pad``, never the ceil_mode overhang), as one number when
    every window has the full count. Separable: the product of per-axis counts."""
    kernel, strides, dilations, begin, end, out_dims = geometry
    per_axis = []
    for i, k, s, d, b, e, n in zip(in_dims, kernel, strides, dilations, begin, end, out_dims):
        low, high = (-b, i + e) if include_pad else (0, i)
        starts = np.arange(n) * s - b
        taps = starts[:, None] + np.arange(k)[None, :] * d
        per_axis.append(((taps >= low) & (taps < high)).sum(axis=1))
    if all((c == k).all() for c, k in zip(per_axis, kernel)):
        return dtype.type(math.prod(kernel))
    counts = per_axis[0].astype(np.float64)
    for c in per_axis[1:]:
        counts = np.multiply.outer(counts, c)
    counts = counts.astype(dtype)
    counts.flags.writeable = False  # shared by every call with this geometry
    return counts


# their planned calls, bound once per arena (ops/compiled/bound_calls.py): the recorded replays
binds_replay(max_pool_cpu, lambda args, out: (args[0], out))
binds_replay(average_pool_cpu, lambda args, out: (args[0], out))
