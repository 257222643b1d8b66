"""2-D MaxPool and AveragePool as generated numba loops, separably, straight from the input.

Each output row of a plane is two passes over one row buffer: the ``kh`` input rows of its
windows are reduced column by column into the buffer (contiguous loads, one vectorized loop),
then each output is the reduction of ``kw`` buffer cells ``sw`` apart. The buffer's cells left
and right of the image hold the padding value (-inf or 0), so padding costs nothing, and
input rows above or below the image are skipped. Nothing is copied first: the phase-plane
kernel this replaced copied the whole input into stride-phase planes (ops/compiled/jit_cpu.py), and
on SqueezeNet's first MaxPool (64x111x111, 3x3 stride 2) those copies alone took longer than
this whole loop (measured in benchmarks/NOTES.md §10).

Stride-1 pools whose output planes are as large as their input's (the Inception pools, 3x3
pad 1 on 6x6 to 28x28 planes) take a second loop that runs each pass over a chunk of planes
laid end to end and then recomputes the planes' edge rows and columns (:func:`_whole_source`);
per plane, those small planes' edges and loop entries cost more than their interiors.

The taps are unrolled: a kernel is generated per (kh, kw, strides, dilations, max or average) from
fixed templates and integer literals, and compiled and cached on disk the way
``ops/elementwise/jit_elementwise.py`` caches FusedElementwise programs (the same ``kernel``
function). With the tap counts known, LLVM keeps the loads in registers; the same loop with runtime
tap counts ran 2.5x slower.

NaN: ``a if a > b else b`` is one vector instruction, but it drops a NaN in ``a``, and a max
pool must pass NaNs on (as np.maximum does). The NaN-propagating select costs twice as much,
so the fast loop only notes whether it read a NaN, and a plane that had one is computed again
with the careful select (the chunked loop redoes the chunk's passes, before writing it). An
average needs no care: a NaN propagates through a sum.

``out`` may start at X's first byte (the planner's shrinking in-place pair): each plane is then
computed into a staging row block and copied out after its last input row was read, and an
output plane never reaches past its own input plane, so no input is overwritten before use.
"""

from __future__ import annotations

import functools

import numpy as np

from mixrt.ops.compiled import jit_cpu, replay
from mixrt.ops.compiled.entry_points import fixed_call
from mixrt.ops.compiled.generated import kernel_module as compiled
from mixrt.ops.panels.native_parts import IMPORTS, part_source, prepared, split
from mixrt.ops.compiled.parallel import MIN_ELEMENTS, parallel_for, thread_parts

MAX_UNROLLED_TAPS = 64  # per axis; longer windows keep the phase-plane kernel
# stride-1 pools with output rows shorter than this keep the phase-plane kernel, unless the
# chunked loop below takes them (stride and dilation 1, same-size planes: 1024x7x7 3x3 pad 1
# 47 us against the phase planes' 154). The separable per-plane loop spends too much of a
# narrow plane on its edges; with stride 2 it won at every width measured (13 to 111 wide).
NARROW_ROWS = 8
# without the native workers (ops/panels/native_parts.py, which split from SPLIT_ELEMENTS there),
# inputs from this size are split over the Python threads by planes. Handing work to
# another thread costs ~30-40 us on this machine (a woken core; numba's own prange pays the
# same), so 256x27x27 broke even (108 against 110 us) and 128x55x55 gained (94 against 126)
SPLIT_ELEMENTS = 4 * MIN_ELEMENTS
# elements per chunk of planes in the stride-1 loop (_whole_source): 16 KB of scratch stays
# in L1 (AveragePool 576x14x14: 59 us, against 63 at 64 KB and 66 unchunked; 256x28x28: 69,
# 74, 81)
CHUNK_ELEMENTS = 1 << 12


def suits(X, out, geometry) -> bool:
    """Contiguous 4-D arrays whose windows this loop can unroll. The caller checks that
    ``out`` is either apart from X or starts at its first byte (shrinking in place)."""
    kernel, strides, out_dims = geometry[0], geometry[1], geometry[5]
    if not (X.flags.c_contiguous and out.flags.c_contiguous and len(kernel) == 2
            and max(kernel) <= MAX_UNROLLED_TAPS):
        return False
    if strides[1] == 1 and out_dims[1] < NARROW_ROWS \
            and not _whole_suits(geometry, X, out):
        return False  # the phase planes' runs over whole planes win there (no copy to save)
    return True


def pool2d(X, out, geometry, maximum: bool, counts=None, replays=None):
    """MaxPool (``maximum``) or AveragePool (window sums / ``counts``, one number or an
    (oh, ow) array) of X (N, C, H, W) into ``out`` (N, C, oh, ow); see :func:`suits`. A
    call over the native workers, or on this thread alone, is kept as the node's replay in
    ``replays`` (its dict, or None: ``ops/compiled/replay.py``)."""
    kernel, strides, dilations, begin, _, out_dims = geometry
    (height, width), (oh, ow) = X.shape[2:], out_dims
    x = X.reshape(-1, height, width)
    y = out.reshape(-1, oh, ow)
    divisor = np.ones((1, 1), X.dtype) if maximum else np.ascontiguousarray(
        np.broadcast_to(np.asarray(counts, X.dtype), out_dims))
    whole = _whole_suits(geometry, X, out)  # safe over its own input: no staging
    in_place = not whole and np.may_share_memory(X, out)
    if whole:
        module = _compiled_whole(tuple(kernel), tuple(begin), bool(maximum))
        chunk = max(1, CHUNK_ELEMENTS // (height * width))
        scalars = (chunk,)

        def arguments(start, stop):
            v = np.empty(min(chunk, stop - start) * height * width, X.dtype)
            return x, y, v, divisor, start, stop, chunk
    else:
        # the padded row as far as the last window reaches (ceil_mode can reach past the pads)
        row_cells = max(begin[1] + width,
                        (ow - 1) * strides[1] + (kernel[1] - 1) * dilations[1] + 1)
        module = _compiled(tuple(kernel), tuple(strides), tuple(dilations), bool(maximum))
        scalars = (row_cells, begin[0], begin[1])

        def arguments(start, stop):
            row = np.empty(row_cells, X.dtype)
            staged = np.empty((oh, ow) if in_place else (0, 0), X.dtype)
            return x, y, row, staged, divisor, begin[0], begin[1], start, stop
    planes = x.shape[0]
    native = jit_cpu.native_pool()
    parts = split(planes, X.size, native)
    if parts is not None:
        go = _native_call(native, module, x, y, divisor, in_place, parts, scalars)
    elif in_place or X.size < SPLIT_ELEMENTS:
        go = _alone_call(module.run, arguments(0, planes))
    else:
        parallel_for(thread_parts(planes, X.size),
                     lambda start, stop: module.run(*arguments(start, stop)))
        return out
    replay.record(replays, (X, out), go, silent=True)
    go(X, out)
    return out


def _alone_call(run, arguments: tuple):
    """``go(X, out)``: the pool's one call over all planes on this thread, its arguments
    (the scratch too) made once: what a replay of the node calls. A small pool's route
    through :func:`pool2d` every run cost more than its loop (SqueezeNet's last MaxPool, 3x3
    stride 2 on 256x7x7: ~37 us a run against a loop of ~19; 2026-12-05)."""
    call = fixed_call(run, *arguments)
    return lambda X, out: call()


def _native_call(native, module, x, y, divisor, in_place, parts, scalars):
    """``go(X, out)``: the pool's parts over the native workers, into ``y`` (out's planes)
    or, in place, into a scratch copied over the input once all of it is read (a part's
    output planes would overwrite input planes the other thread has yet to read: MaxPool
    3x3/2 on 128x55x55 in place, 116 us staged per plane on one thread, 71 so)."""
    if not in_place:  # the divisor is made per call: kept with the call (no view of out)
        return prepared(native, module, (x, y, divisor), scalars, parts, keep=divisor)
    target = jit_cpu.scratch_array("pool_in_place", x.dtype, y.shape)
    run = prepared(native, module, (x, target, divisor), scalars, parts, keep=divisor)
    shape = y.shape

    def go(X, out):
        run()
        out.reshape(shape)[...] = target
    return go


def _whole_suits(geometry, X, out) -> bool:
    """Stride and dilation 1, output planes as large as the input's and at least as large as
    the window. ``out`` may be X itself (the planner puts a same-size pool's output over its
    input): a chunk's input rows are all read, into the scratch, before its outputs are
    written, and a chunk reads no other chunk's planes."""
    kernel, strides, dilations, _, _, out_dims = geometry
    image = X.shape[2:]
    apart = not np.may_share_memory(X, out) or out.ctypes.data == X.ctypes.data
    return apart and tuple(strides) == (1, 1) and tuple(dilations) == (1, 1) \
        and tuple(out_dims) == tuple(image) and all(d >= k for d, k in zip(image, kernel))


@functools.lru_cache(maxsize=64)
def _compiled(kernel: tuple, strides: tuple, dilations: tuple, maximum: bool):
    # generating the source costs ~10 µs a call; the cache makes a call a dict lookup
    return compiled(source(kernel, strides, dilations, maximum), prefix="mixrt_pool")


@functools.lru_cache(maxsize=64)
def _compiled_whole(kernel: tuple, begin: tuple, maximum: bool):
    return compiled(whole_source(kernel, begin, maximum), prefix="mixrt_pool")


# -- the generated source ----------------------------------------------------------------------

def _fold(values: list[str], maximum: bool, careful: bool) -> list[str]:
    """Statements that leave the reduction of ``values`` in ``m``."""
    lines = [f"m = {values[0]}"]
    for v in values[1:]:
        if not maximum:
            lines.append(f"m = m + {v}")
        elif careful:  # NaN in either operand gives NaN, as np.maximum does
            lines.append(f"m = m if (m > {v} or m != m) else {v}")
        else:
            lines.append(f"m = m if m > {v} else {v}")
    return lines


def _nan_check(values: list[str]) -> str:
    return "seen |= " + " | ".join(f"({v} != {v})" for v in values)


def _plane_source(name, kernel, strides, dilations, maximum, careful) -> list[str]:
    """One plane p of x into ``target`` (oh, ow); returns whether a NaN was read (the fast
    max only: the caller then runs the careful variant on the plane). Elements are indexed
    in place (``x[p, r, j]``, ``target[i, k]``), not through a view per row: making those
    views took about half the time on small planes (MaxPool 3x3 stride 2 on 832x14x14: 170
    us with views, 79 without; 256x27x27: 87 and 51). ``even`` and ``odd`` are the scratch
    of a stride-2 horizontal pass (:func:`_stride_two_pass`)."""
    (kh, kw), (sh, sw), (dh, dw) = kernel, strides, dilations
    check = maximum and not careful
    rows = [f"x[p, y0 + {a * dh}, j]" for a in range(kh)]
    cells = [f"row[b + {b * dw}]" for b in range(kw)]
    horizontal = _stride_two_pass(kw, maximum, careful) if (sw, dw) == (2, 1) else [
        "        for k in range(target.shape[1]):",
        f"            b = k * {sw}",
        *[f"            {line}" for line in _fold(cells, maximum, careful)]]
    body = [
        f"def {name}(x, p, target, row, inner, top, divisor, even, odd):",
        "    height, width = x.shape[1], x.shape[2]",
        "    seen = False",
        "    for i in range(target.shape[0]):",
        f"        y0 = i * {sh} - top",
        f"        if y0 >= 0 and y0 + {(kh - 1) * dh} < height:",
        "            for j in range(width):",
        *[f"                {line}" for line in _fold(rows, maximum, careful)],
        *([f"                {_nan_check(rows)}"] if check else []),
        "                inner[j] = m",
        "        else:",
        "            first = True",
        f"            for a in range({kh}):",
        f"                r = y0 + a * {dh}",
        "                if r < 0 or r >= height:",
        "                    continue",
        "                for j in range(width):",
        "                    v = x[p, r, j]",
        *([f"                    {_nan_check(['v'])}"] if check else []),
        "                    if first:",
        "                        inner[j] = v",
        "                    else:",
        "                        m = inner[j]",
        *[f"                        {line}" for line in _fold(["m", "v"], maximum, careful)[1:]],
        "                        inner[j] = m",
        "                first = False",
        "            if first:  # every row of these windows is padding",
        "                for j in range(width):",
        f"                    inner[j] = {'-np.inf' if maximum else '0.0'}",
        *horizontal,
        ("            target[i, k] = m" if maximum else
         "            target[i, k] = m / divisor[i, k]"),
        "    return seen",
        "",
    ]
    return body


def _stride_two_pass(kw, maximum, careful) -> list[str]:
    """The horizontal pass of stride 2 (dilation 1), ending in a loop over k with the window's
    reduction in ``m``: the row's even and odd cells are first split into ``even`` and
    ``odd`` (a pair of loads LLVM deinterleaves with shuffles), so that each tap reads
    consecutive cells. Read in place, ``row[2 * k + b]`` took a gather per tap (this CPU has
    AVX-512): MaxPool 3x3/2 on 64x111x111, one thread, 150 -> 119 us; 128x55x55 86 -> 68."""
    cells = [f"{'odd' if b % 2 else 'even'}[k + {b // 2}]" for b in range(kw)]
    return [
        "        half = row.size // 2",
        "        for q in range(half):",
        "            even[q] = row[2 * q]",
        "            odd[q] = row[2 * q + 1]",
        "        if row.size % 2:",
        "            even[half] = row[row.size - 1]",
        "        for k in range(target.shape[1]):",
        *[f"            {line}" for line in _fold(cells, maximum, careful)],
    ]


def _whole_source(kernel, begin, maximum) -> list[str]:
    """Stride 1, dilation 1, output planes as large as the input's (3x3 pad 1: the Inception
    pools): ``run(x, y, v, divisor, start, stop, chunk)`` pools planes start..stop of x
    (P, H, W) into y, a chunk of planes at a time through the scratch ``v``. The planes are
    small (6x6 to 28x28), so per-plane loops spent their time on edges and loop entries;
    here each pass runs over the chunk's planes laid end to end:

    * vertical: ``v[n] = fold over a of x[n + (a - top) * W]``, one flat run; the rows at a
      plane's top and bottom edges (whose windows that run took partly from the neighbouring
      plane) are then computed again from their rows inside the image;
    * horizontal: ``y[n] = fold over b of v[n + b - left]``, one flat run; the edge columns
      are computed again, every row's in one loop; an average is then divided by its window
      counts plane by plane.

    A chunk's input is all read before its output is written, so ``y`` may be ``x`` itself.
    For that, a max redoes a chunk's vertical run with the careful select as soon as the
    fast run read a NaN (before anything of the chunk is written), and its horizontal run
    follows suit; the few edge rows and columns always take the careful select.

    The pads are literals here, so each edge row and column's taps are unrolled. The caller
    guarantees H >= kh and W >= kw (every edge window then ends inside the image) and pads
    below the kernel size (every window holds its own row and column, never only padding).
    The edges index with ``uint64`` offsets: with signed ones numba's check for negative
    indices made LLVM gather and scatter them (AVX-512), and those few rows and columns took
    40% of the call (AveragePool 3x3 pad 1 on 576x14x14, one thread: 55 -> 31 us)."""
    (kh, kw), (top, left) = kernel, begin
    bottom, right = kh - 1 - top, kw - 1 - left
    rows = [f"s{a}[n]" for a in range(kh)]
    cells = [f"h{b}[n]" for b in range(kw)]
    # (edge row offset from the plane's start, its taps a): rows above, rows below
    edge_rows = [(f"{i} * width", range(top - i, kh)) for i in range(top)] + [
        (f"(height - {bottom - e}) * width", range(0, kh - 1 - e)) for e in range(bottom)]
    edge_columns = [(f"{k}", range(left - k, kw)) for k in range(left)] + [
        (f"width - {right - e}", range(0, kw - 1 - e)) for e in range(right)]

    def loop(indent, target, values, careful, check=False):
        pad = " " * indent
        return [f"{pad}for n in range(count):",
                *[f"{pad}    {line}" for line in _fold(values, maximum, careful)],
                *([f"{pad}    {_nan_check(values)}"] if check else []),
                f"{pad}    {target}[n] = m"]

    def redo_if_nan(indent, target, values):
        if not maximum:
            return []
        return [" " * indent + "if seen:", *loop(indent + 4, target, values, True)]

    body = [
        "def run(x, y, v, divisor, start, stop, chunk):",
        "    height, width = x.shape[1], x.shape[2]",
        "    area = height * width",
        "    xs = x.reshape(-1)",
        "    ys = y.reshape(-1)",
        "    scale = divisor.reshape(-1)",
        "    for c0 in range(start, stop, chunk):",
        "        c1 = min(c0 + chunk, stop)",
        "        base = c0 * area",
        "        total = (c1 - c0) * area",
        "        seen = False",
        f"        count = total - {kh - 1} * width",
        "        if count > 0:",
        *[f"            s{a} = xs[base + {a} * width:base + {a} * width + count]"
          for a in range(kh)],
        f"            inner = v[{top} * width:{top} * width + count]",
        *loop(12, "inner", rows, False, check=maximum),
        *redo_if_nan(12, "inner", rows),
    ]
    if edge_rows:  # (none for a one-row window)
        body.append("        for r0 in range(0, total, area):  # each plane's edge rows")
    for offset, taps in edge_rows:
        sources = [f"xs[uint64(base + r0 + {offset} + {a - top} * width + j)]" for a in taps]
        body += [
            "            for j in range(width):",
            *[f"                {line}" for line in _fold(sources, maximum, True)],
            f"                v[uint64(r0 + {offset} + j)] = m",
        ]
    body += [
        f"        count = total - {kw - 1}",
        "        if count > 0:",
        *[f"            h{b} = v[{b}:{b} + count]" for b in range(kw)],
        f"            whole = ys[base + {left}:base + {left} + count]",
        *(["            if seen:", *loop(16, "whole", cells, True), "            else:",
           *loop(16, "whole", cells, False)] if maximum else loop(12, "whole", cells, False)),
    ]
    if edge_columns:
        body.append("        for r0 in range(0, total, width):  # each row's edge columns")
    for column, taps in edge_columns:
        sources = [f"v[uint64(r0 + {column} + {b - left})]" for b in taps]
        body += [*[f"            {line}" for line in _fold(sources, maximum, True)],
                 f"            ys[uint64(base + r0 + {column})] = m"]
    if not maximum:
        body += [
            "        for p0 in range(base, base + total, area):",
            "            plane = ys[p0:p0 + area]",
            "            for q in range(area):",
            "                plane[q] = plane[q] / scale[q]",
        ]
    return body + [""]


def whole_source(kernel: tuple, begin: tuple, maximum: bool) -> str:
    """The module of a stride-1 pool whose output planes are as large as its input's:
    ``run(x, y, v, divisor, start, stop, chunk)`` (:func:`_whole_source`)."""
    for value in (*kernel, *begin):
        if not (isinstance(value, int) and value >= 0):
            raise ValueError(f"pool geometry must be integers >= 0, got {value!r}")
    flags = "nogil=True, cache=True, boundscheck=False, error_model='numpy'"
    lines = ["import numpy as np", "from numba import njit, uint64", *IMPORTS, "",
             f"@njit({flags})", *_whole_source(kernel, begin, maximum),
             *part_source([("x", 3, True), ("y", 3, True), ("divisor", 2, True)], ["chunk"],
                          lambda dtype: [
                              "v = np.empty(min(chunk, stop - start) * x.shape[1] * x.shape[2],"
                              f" {dtype})",
                              "run(x, y, v, divisor, start, stop, chunk)"])]
    return "\n".join(lines)


def source(kernel: tuple, strides: tuple, dilations: tuple, maximum: bool) -> str:
    """The module for one window geometry: ``run(x, y, row, staged, divisor, top, left,
    start, stop)`` pools planes start..stop of x (P, H, W) into y (P, oh, ow)."""
    for value in (*kernel, *strides, *dilations):
        if not (isinstance(value, int) and value >= 1):
            raise ValueError(f"pool geometry must be positive integers, got {value!r}")
    flags = "nogil=True, cache=True, boundscheck=False, error_model='numpy'"
    halves = "row.size // 2 + 1" if (strides[1], dilations[1]) == (2, 1) else "0"
    lines = ["import numpy as np", "from numba import njit", *IMPORTS, ""]
    lines += [f"@njit({flags})", *_plane_source("fast", kernel, strides, dilations, maximum,
                                                False)]
    if maximum:
        lines += [f"@njit({flags})", *_plane_source("careful", kernel, strides, dilations,
                                                    True, True)]
    lines += [
        f"@njit({flags})",
        "def run(x, y, row, staged, divisor, top, left, start, stop):",
        f"    row[:] = {'-np.inf' if maximum else '0.0'}",
        "    inner = row[left:left + x.shape[2]]",
        f"    even = np.empty({halves}, row.dtype)",
        f"    odd = np.empty({halves}, row.dtype)",
        "    for p in range(start, stop):",
        "        target = staged if staged.shape[0] > 0 else y[p]",
        "        if fast(x, p, target, row, inner, top, divisor, even, odd):",
        *(["            careful(x, p, target, row, inner, top, divisor, even, odd)"] if maximum
          else ["            pass"]),
        "        if staged.shape[0] > 0:",
        "            y[p] = staged",
        "",
    ]
    # a part on the native pool never shares its input (the in-place pool is not split)
    lines += part_source([("x", 3, True), ("y", 3, True), ("divisor", 2, True)],
                         ["cells", "top", "left"], lambda dtype: [
                             f"row = np.empty(cells, {dtype})",
                             f"staged = np.empty((0, 0), {dtype})",
                             "run(x, y, row, staged, divisor, top, left, start, stop)"])
    return "\n".join(lines)

